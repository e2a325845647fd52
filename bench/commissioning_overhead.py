"""Benchmark: wall time of a fit with three commissioning milestones vs the same fit without.

Owns: the measurement only (SPEC §8, target ratio <= 1.10). Generates a TRAIN population of a
preset once (in a temporary directory), then runs the same ``fit_recipe`` alternately without
and with ``QhCommissioningMilestonesCallback`` (milestones 1, budget/2, budget), takes the
median wall time of each and prints ONE JSON line. Both variants pay the same fixed costs
(cold init, offline W&B, final state); the gated variant additionally publishes three state
files and receipts and reloads three scorers strictly.

``callback_ratio`` adds the median seconds spent inside the gate callback's own hooks to the
plain median: the same overhead, measured so that load from other processes does not blur it.

Run: ``.venv/bin/python bench/commissioning_overhead.py [--updates 300] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "examples" / "tiny-recipe.toml"))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--profile", default="cpu-fp32")
    parser.add_argument("--updates", type=int, default=300, help="update budget of every fit")
    parser.add_argument("--repeats", type=int, default=3, help="fits per variant (alternating)")
    args = parser.parse_args(argv)

    from qhlab.finite_horizon.diagnostics.commissioning import (
        QhCommissioningMilestonesCallback,
        QhCommissioningMilestonesConfig,
        read_commissioning_milestones,
    )
    from qhlab.finite_horizon.fit import fit_recipe
    from qhlab.finite_horizon.recipe import load_recipe
    from qhlab.scenes import generate_population

    class _TimedGate(QhCommissioningMilestonesCallback):
        """The gate callback with the seconds spent in its own hooks accumulated."""

        seconds = 0.0

        def _timed(self, hook, *hook_args, **hook_kwargs):
            start = time.perf_counter()
            try:
                return getattr(super(), hook)(*hook_args, **hook_kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        def setup(self, *a, **k):
            return self._timed("setup", *a, **k)

        def on_train_start(self, *a, **k):
            return self._timed("on_train_start", *a, **k)

        def on_train_batch_end(self, *a, **k):
            return self._timed("on_train_batch_end", *a, **k)

        def on_fit_end(self, *a, **k):
            return self._timed("on_fit_end", *a, **k)

    warnings.filterwarnings("ignore")
    recipe = load_recipe(args.recipe).model_copy(update={"updates": args.updates})
    milestones = (1, args.updates // 2, args.updates)
    times: dict[str, list[float]] = {"plain": [], "gated": []}
    callback_seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="qhlab-bench-") as tmp:
        root = Path(tmp)
        train = generate_population(args.preset, "train", 0, root / "train", workers=1)
        for i in range(args.repeats):
            for variant in ("plain", "gated"):
                callbacks = []
                if variant == "gated":
                    config = QhCommissioningMilestonesConfig(
                        milestones=milestones, expected_device="cpu", context_ids=("bench",)
                    )
                    gate_dir = root / f"gates-{i}"
                    callbacks.append(_TimedGate(config, gate_dir))
                start = time.perf_counter()
                result = fit_recipe(
                    recipe, profile=args.profile, output=root / f"{variant}-{i}", train=train,
                    evaluate=False, progress=False, extra_callbacks=callbacks,
                )
                times[variant].append(time.perf_counter() - start)
                if callbacks:
                    callback_seconds.append(callbacks[0].seconds)
                if result.observed_updates != args.updates:
                    raise SystemExit(f"bench: {variant} fit observed {result.observed_updates} updates")
                if variant == "gated" and len(read_commissioning_milestones(config, gate_dir)) != 3:
                    raise SystemExit("bench: the gated fit did not authenticate three milestones")
    plain, gated = statistics.median(times["plain"]), statistics.median(times["gated"])
    ratio = gated / plain
    gate_cost = statistics.median(callback_seconds)
    print(json.dumps({
        "bench": "commissioning_overhead",
        "ratio": round(ratio, 4),
        "target": 1.10,
        "meets_target": ratio <= 1.10,
        "median_plain_s": round(plain, 3),
        # Seconds spent inside the gate callback's own hooks (gates + per-batch counting):
        # the overhead itself, robust to load from other processes on the machine.
        "median_callback_s": round(gate_cost, 3),
        "callback_ratio": round((plain + gate_cost) / plain, 4),
        "median_gated_s": round(gated, 3),
        "plain_s": [round(t, 3) for t in times["plain"]],
        "gated_s": [round(t, 3) for t in times["gated"]],
        "updates": args.updates,
        "milestones": list(milestones),
        "preset": args.preset,
        "profile": args.profile,
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
