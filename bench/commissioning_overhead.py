"""Benchmark: wall time of a fit with three commissioning milestones vs the same fit without.

Owns: the measurement only (SPEC §8, target ratio <= 1.10). Generates a TRAIN population of a
preset once (in a temporary directory), then times the same ``fit_recipe`` without and with
``QhCommissioningMilestonesCallback`` (milestones 1, budget/2, budget) and prints ONE JSON
line. Both variants pay the same fixed costs (cold init, offline W&B, final state); the gated
variant additionally publishes three state files and receipts and reloads three scorers
strictly.

How it stays trustworthy on a small, shared machine:

* warm-up: untimed (plain, gated) pairs first, at least ``--min-warmup`` and until neither
  variant got more than 10% faster than in the pair before (imports, lazy initialization and
  the first W&B starts made the first fits of a process several times slower, and the very
  first plain fit the slowest, so a cold start biased the ratio low);
* pairs: every round runs one plain and one gated fit back to back, alternating which goes
  first, and the ratio is taken per pair, so slow drift in machine load cancels;
* stopping: rounds continue until the running median of the per-pair ratios has moved less
  than ``--tolerance`` (relative) over the last ``--window`` rounds, at least ``--min-rounds``
  and at most ``--max-rounds`` rounds (``converged`` says which ended it);
* spread: the min, max, quartiles and IQR of the per-pair ratios are printed beside the ratio.

``callback_ratio`` adds the median seconds spent inside the gate callback's own hooks to the
plain median: the same overhead, measured so that load from other processes does not blur it.

Run: ``.venv/bin/python bench/commissioning_overhead.py [--updates 300] [--max-rounds 12]``.
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


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _stable(medians: list[float], *, window: int, tolerance: float) -> bool:
    """Whether the running median moved less than ``tolerance`` over the last ``window`` rounds."""
    if len(medians) < window + 1:
        return False
    recent = medians[-(window + 1) :]
    return max(recent) / min(recent) - 1.0 < tolerance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "examples" / "tiny-recipe.toml"))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--profile", default="cpu-fp32")
    parser.add_argument("--updates", type=int, default=300, help="update budget of every fit")
    parser.add_argument("--min-warmup", type=int, default=2, help="untimed (plain, gated) pairs at least")
    parser.add_argument("--max-warmup", type=int, default=5, help="untimed (plain, gated) pairs at most")
    parser.add_argument("--min-rounds", type=int, default=5, help="timed (plain, gated) pairs at least")
    parser.add_argument("--max-rounds", type=int, default=12, help="timed (plain, gated) pairs at most")
    parser.add_argument("--window", type=int, default=3, help="rounds over which the median must be stable")
    parser.add_argument("--tolerance", type=float, default=0.02, help="relative movement of the median allowed")
    args = parser.parse_args(argv)
    if (
        not 1 <= args.min_rounds <= args.max_rounds
        or not 1 <= args.min_warmup <= args.max_warmup
        or args.window < 1
        or args.tolerance <= 0
    ):
        parser.error(
            "need 1 <= --min-rounds <= --max-rounds, 1 <= --min-warmup <= --max-warmup, "
            "--window >= 1 and --tolerance > 0"
        )

    from qhlab.design.config_files import load_recipe
    from qhlab.finite_horizon.diagnostics.commissioning import (
        QhCommissioningMilestonesCallback,
        QhCommissioningMilestonesConfig,
        read_commissioning_milestones,
    )
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe
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
    config = QhCommissioningMilestonesConfig(milestones=milestones, expected_device="cpu", context_ids=("bench",))

    with tempfile.TemporaryDirectory(prefix="qhlab-bench-") as tmp:
        root = Path(tmp)
        train = generate_population(args.preset, "train", 0, root / "train", workers=1)

        def timed_fit(variant: str, tag: str) -> tuple[float, float]:
            """(wall seconds, seconds inside the gate's hooks) of one fit of ``variant``."""
            gate = _TimedGate(config, root / f"gates-{tag}") if variant == "gated" else None
            start = time.perf_counter()
            result = fit_recipe(
                FitRequest(
                    recipe=recipe,
                    profile=args.profile,
                    output=root / f"{variant}-{tag}",
                    train=train,
                    evaluate=False,
                    progress=False,
                    extra_callbacks=[gate] if gate else [],
                )
            )
            wall = time.perf_counter() - start
            if result.observed_updates != args.updates:
                raise SystemExit(f"bench: {variant} fit observed {result.observed_updates} updates")
            if gate and len(read_commissioning_milestones(config, root / f"gates-{tag}")) != 3:
                raise SystemExit("bench: the gated fit did not authenticate three milestones")
            return wall, gate.seconds if gate else 0.0

        warmup: dict[str, list[float]] = {"plain": [], "gated": []}
        for i in range(args.max_warmup):
            for variant in ("plain", "gated"):
                warmup[variant].append(timed_fit(variant, f"warmup-{i}")[0])
            settled = i > 0 and all(w[-1] >= 0.9 * w[-2] for w in warmup.values())
            if i + 1 >= args.min_warmup and settled:
                break
        times: dict[str, list[float]] = {"plain": [], "gated": []}
        ratios: list[float] = []
        medians: list[float] = []
        callback_seconds: list[float] = []
        converged = False
        for i in range(args.max_rounds):
            order = ("plain", "gated") if i % 2 == 0 else ("gated", "plain")
            pair = {}
            for variant in order:
                pair[variant], gate_seconds = timed_fit(variant, str(i))
                times[variant].append(pair[variant])
                if variant == "gated":
                    callback_seconds.append(gate_seconds)
            ratios.append(pair["gated"] / pair["plain"])
            medians.append(statistics.median(ratios))
            if len(ratios) >= args.min_rounds and _stable(medians, window=args.window, tolerance=args.tolerance):
                converged = True
                break

    ratio = medians[-1]
    q1, _, q3 = _quartiles(ratios)
    plain, gated = statistics.median(times["plain"]), statistics.median(times["gated"])
    gate_cost = statistics.median(callback_seconds)
    print(
        json.dumps(
            {
                "bench": "commissioning_overhead",
                # Median of the per-pair gated/plain ratios, and how widely the pairs spread around it.
                "ratio": round(ratio, 4),
                "ratio_spread": {
                    "min": round(min(ratios), 4),
                    "q1": round(q1, 4),
                    "q3": round(q3, 4),
                    "max": round(max(ratios), 4),
                    "iqr": round(q3 - q1, 4),
                },
                "target": 1.10,
                "meets_target": ratio <= 1.10,
                "rounds": len(ratios),
                "converged": converged,
                "stopping_rule": (
                    f"running median moved < {args.tolerance:.0%} over the last {args.window} rounds "
                    f"(rounds {args.min_rounds}..{args.max_rounds})"
                ),
                "running_median": [round(m, 4) for m in medians],
                "pair_ratios": [round(r, 4) for r in ratios],
                "median_plain_s": round(plain, 3),
                "median_gated_s": round(gated, 3),
                # Seconds spent inside the gate callback's own hooks (gates + per-batch counting):
                # the overhead itself, robust to load from other processes on the machine.
                "median_callback_s": round(gate_cost, 3),
                "callback_ratio": round((plain + gate_cost) / plain, 4),
                "warmup_s": {variant: [round(t, 3) for t in values] for variant, values in warmup.items()},
                "plain_s": [round(t, 3) for t in times["plain"]],
                "gated_s": [round(t, 3) for t in times["gated"]],
                "updates": args.updates,
                "milestones": list(milestones),
                "preset": args.preset,
                "profile": args.profile,
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
