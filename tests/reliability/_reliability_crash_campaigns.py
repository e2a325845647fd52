"""The two crash campaigns of the reliability suite (helpers; the tests are in test_reliability_crash.py).

Owns: the seeded kill schedules and their drivers. The fit campaign kills ``qhlab fit`` of one
logical run at points from "during start-up" to "between the final state and the fit
receipt", then continues the interrupted lineage with ``--resume`` and runs one fresh
attempt. The study campaign walks one tiny study through freeze, admit-canaries,
prepare-development, run-fit, benchmark and report, killing each step at least once (mostly
when a given file appears, plus a seeded delay), and finishes with ``qhlab study run``.
``run_campaigns`` runs both at once (two threads, each driving its own subprocesses).

After every kill: no published file is partial (every non-temporary ``.json`` parses, every
``.safetensors`` opens, every ``.parquet`` reads, every PNG is complete), every receipt
present authenticates with every file it binds, and the next run proceeds (the writer lock
died with the process). Every point (trigger, planned delay, elapsed time, newest files on
disk) is written to ``kill-points.json``. Does not own: the code under test.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _reliability_support import TEMP_MARKER, KillPoint, assert_nothing_partial, kill_when, matches, run_to_end

from qhlab.design.study_records import StudyCellReceipt, StudyE0Receipt
from qhlab.training.records import FitReceipt

SEED = 20251130
FIT_UPDATES = 60
FIT_CHECKPOINT_EVERY = 5


class CampaignFailure(AssertionError):
    """A check failed after a kill point; the message names the point."""


def _verify_if_any_receipt(root: Path, context: str) -> int:
    from qhlab.evidence import verify_directory

    if not any(p.name.endswith(".receipt.json") and ".tmp-" not in p.as_posix() for p in root.rglob("*")):
        return 0
    try:
        return len(verify_directory(root)["receipts"])
    except Exception as exc:  # noqa: BLE001 - re-raised with the kill point named
        raise CampaignFailure(f"{context}: qhlab verify {root} failed: {exc}") from exc


def _check_after_kill(point: KillPoint, root: Path) -> None:
    context = f"after kill point {point.label!r} (trigger {point.trigger}, {point.seconds} s)"
    try:
        assert_nothing_partial(root, context=context)
    except Exception as exc:  # noqa: BLE001
        raise CampaignFailure(f"{context}: a published file is partial: {exc}") from exc
    _verify_if_any_receipt(root, context)


class _Campaign:
    """One sequence of kills and completions; records every point, stops at the first failure."""

    def __init__(self, name: str, root: Path, log: Path, rng: random.Random) -> None:
        self.name, self.root, self.log, self.rng = name, root, log, rng
        self.points: list[KillPoint] = []
        self.finished_steps: set[str] = set()
        self.completions: list[dict] = []
        self.error: BaseException | None = None
        # step -> the receipt that proves it finished; a kill landing just after that receipt
        # was published still counts as a kill, but the step must not be started again.
        self.done_for: Callable[[str], Path | None] = lambda step: None

    def kill(
        self, label: str, argv: list, *, pattern: str | None, new: int = 1, delay: tuple[float, float] = (0.0, 0.0)
    ) -> KillPoint:
        planned = round(self.rng.uniform(*delay), 3)
        step = label.split(":")[0]
        done = self.done_for(step)
        if step in self.finished_steps or (done is not None and done.exists()):
            self.finished_steps.add(step)
            return None  # the step already finished before an earlier kill point landed
        trigger = "delay only" if pattern is None else f"{new} new file(s) matching {pattern!r}"
        point = KillPoint(label=label, argv=[str(a) for a in argv], trigger=trigger, planned_delay=planned)
        count = new + (len(matches(self.root, pattern)) if pattern is not None else 0)
        kill_when(point, root=self.root, log=self.log, pattern=pattern, count=count)
        self.points.append(point)
        if not point.killed and point.returncode != 0:
            raise CampaignFailure(
                f"{self.name}: {label} exited {point.returncode} before its kill point:\n{point.stderr_tail}"
            )
        if not point.killed:
            # Finished before its kill point (a fast machine): its later kill points are moot.
            self.finished_steps.add(step)
        _check_after_kill(point, self.root)
        return point

    def complete(self, label: str, argv: list, *, done: Path | None = None) -> None:
        """Run ``argv`` to the end (exit 0 required); skipped when ``done`` exists already,
        i.e. the last killed run had published its final receipt before the kill landed."""
        done = done if done is not None else self.done_for(label)
        if label in self.finished_steps or (done is not None and done.exists()):
            self.completions.append(
                {
                    "label": label,
                    "argv": [str(a) for a in argv],
                    "returncode": None,
                    "seconds": 0.0,
                    "skipped": "already finished before a kill point",
                }
            )
            return
        started = time.monotonic()
        result = run_to_end([str(a) for a in argv], log=self.log)
        self.completions.append(
            {
                "label": label,
                "argv": [str(a) for a in argv],
                "returncode": result.returncode,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
        if result.returncode != 0:
            raise CampaignFailure(
                f"{self.name}: re-running {label} after the kills failed with exit "
                f"{result.returncode}:\n{result.stderr[-3000:]}"
            )
        _check_after_kill(KillPoint(label=f"{label} (completed)", argv=[], trigger="none", planned_delay=0), self.root)

    @property
    def killed(self) -> list[KillPoint]:
        return [p for p in self.points if p.killed]


# ----------------------------------------------------------------------------- fit campaign


def _fit_campaign(campaign: _Campaign, recipe: Path) -> dict:
    out = campaign.root
    fit = [
        "fit",
        recipe,
        "--profile",
        "cpu-fp32",
        "--output",
        out,
        "--no-progress",
        "--checkpoint-every",
        FIT_CHECKPOINT_EVERY,
    ]
    attempt = "*/*/"
    campaign.kill("fit: start-up", fit, pattern=None, delay=(1.0, 4.0))
    campaign.kill("fit: cold init state written", fit, pattern=attempt + "cold_init.safetensors", delay=(0.0, 0.05))
    campaign.kill("fit: cold init receipt written", fit, pattern=attempt + "cold_init.receipt.json", delay=(0.0, 0.3))
    campaign.kill(
        "fit: first segment checkpoint", fit, pattern=attempt + "segment_checkpoint_u*.safetensors", delay=(0.0, 0.2)
    )
    campaign.kill(
        "fit: second checkpoint receipt",
        fit,
        pattern=attempt + "segment_checkpoint_u*.receipt.json",
        new=2,
        delay=(0.0, 0.5),
    )
    campaign.kill("fit: final state written", fit, pattern=attempt + "final_state.safetensors", delay=(0.0, 0.0))
    campaign.kill("fit: fit receipt written", fit, pattern=attempt + "fit.receipt.json", delay=(0.0, 0.3))

    # Continue an interrupted segment: the newest attempt with a checkpoint and no final state.
    candidates = sorted(
        (
            p.parent
            for p in out.glob(attempt + "segment_checkpoint_u*.receipt.json")
            if not (p.parent / "final_state.safetensors").exists()
        ),
        key=lambda d: d.stat().st_mtime_ns,
    )
    if not candidates:
        raise CampaignFailure("fit campaign: no killed attempt holds a segment checkpoint to resume")
    resumed_from = candidates[-1]
    before = {p for p in resumed_from.parent.iterdir() if p.is_dir()}
    campaign.complete(f"fit --resume {resumed_from.name}", [*fit, "--resume", resumed_from.name])
    new = [p for p in resumed_from.parent.iterdir() if p.is_dir() and p not in before]
    if len(new) != 1:
        raise CampaignFailure(f"fit campaign: --resume made {len(new)} new attempt directories")
    from qhlab.evidence import read_receipt

    receipt = read_receipt(new[0] / "fit.receipt.json", FitReceipt).record()
    body = receipt["body"]
    if (
        body["observed_updates"] != FIT_UPDATES
        or body["lineage"]["kind"] != "resumed"
        or body["lineage"]["previous_local_attempt_id"] != resumed_from.name
    ):
        raise CampaignFailure(
            f"fit campaign: resumed fit receipt is wrong: {json.dumps(body['lineage'])}, "
            f"observed_updates={body['observed_updates']}"
        )
    # A completely fresh attempt of the same logical run also completes after all the kills.
    campaign.complete("fit (new attempt)", fit)
    finished = sorted(p.parent.name for p in out.glob(attempt + "fit.receipt.json"))
    return {
        "resumed_from": resumed_from.name,
        "resumed_into": new[0].name,
        "start_updates": body["lineage"]["start_updates"],
        "finished_attempts": finished,
    }


# ----------------------------------------------------------------------------- study campaign


def _study_campaign(campaign: _Campaign, config: Path) -> dict:
    from qhlab.evidence import read_receipt

    out = campaign.root

    def step(name: str, *extra) -> list:
        return ["study", name, config, "--output", out, *extra]

    def done_for(step_label: str) -> Path | None:
        name, _, cell = step_label.partition(" ")
        receipts = {
            "freeze": out / "freeze.receipt.json",
            "admit-canaries": out / "canaries" / "e0.receipt.json",
            "prepare-development": out / "development.receipt.json",
        }
        if name == "run-fit" and cell:
            return out / "cells" / cell / "cell.receipt.json"
        return receipts.get(name)

    campaign.done_for = done_for

    # 1. freeze
    campaign.kill("freeze: start-up", step("freeze"), pattern=None, delay=(0.2, 1.2))
    campaign.kill(
        "freeze: config copy published, receipt not yet", step("freeze"), pattern="study-config.toml", delay=(0.0, 0.0)
    )
    campaign.complete("freeze", step("freeze"))
    # 2. canaries (E0)
    campaign.kill("admit-canaries: start-up", step("admit-canaries"), pattern=None, delay=(0.5, 2.0))
    campaign.kill(
        "admit-canaries: selection published",
        step("admit-canaries"),
        pattern="canaries/selection.json",
        delay=(0.0, 0.2),
    )
    campaign.kill(
        "admit-canaries: canary training",
        step("admit-canaries"),
        pattern="canaries/e0-*/*/cold_init.receipt.json",
        delay=(0.3, 2.0),
    )
    campaign.kill(
        "admit-canaries: canary final state, no fit receipt",
        step("admit-canaries"),
        pattern="canaries/e0-*/*/final_state.safetensors",
        delay=(0.0, 0.0),
    )
    campaign.kill(
        "admit-canaries: one canary cell receipt",
        step("admit-canaries"),
        pattern="canaries/e0-*/cell.receipt.json",
        delay=(0.0, 0.3),
    )
    campaign.complete("admit-canaries", step("admit-canaries"))
    # 3. development
    campaign.kill("prepare-development: mid step", step("prepare-development"), pattern=None, delay=(0.5, 2.0))
    campaign.complete("prepare-development", step("prepare-development"))
    # 4. one broad cell, killed at four points, then finished
    cell = ("run-fit", "--variant", "baseline", "--seed", "0")
    cell_glob = "cells/baseline-s0/*/"
    campaign.kill(
        "run-fit baseline-s0: cold init", step(*cell), pattern=cell_glob + "cold_init.safetensors", delay=(0.0, 0.5)
    )
    # At once: an idle host runs the tiny cell's remaining updates in a fraction of a second, so a
    # delay could let it finish before the kill (a zero-width range still draws from the RNG).
    campaign.kill(
        "run-fit baseline-s0: segment checkpoint",
        step(*cell),
        pattern=cell_glob + "segment_checkpoint_u*.receipt.json",
        delay=(0.0, 0.0),
    )
    campaign.kill(
        "run-fit baseline-s0: fit receipt, no cell receipt",
        step(*cell),
        pattern=cell_glob + "fit.receipt.json",
        delay=(0.0, 0.0),
    )
    campaign.kill(
        "run-fit baseline-s0: evaluation receipt",
        step(*cell),
        pattern=cell_glob + "evaluation.receipt.json",
        delay=(0.0, 0.2),
    )
    campaign.complete("run-fit baseline-s0", step(*cell), done=out / "cells" / "baseline-s0" / "cell.receipt.json")
    campaign.kill(
        "run-fit control_global_readout-s0: cold init",
        step("run-fit", "--variant", "control_global_readout", "--seed", "0"),
        pattern="cells/control_global_readout-s0/*/cold_init.receipt.json",
        delay=(0.0, 1.0),
    )
    campaign.kill(
        "run-fit control_global_readout-s1: final state",
        step("run-fit", "--variant", "control_global_readout", "--seed", "1"),
        pattern="cells/control_global_readout-s1/*/final_state.safetensors",
        delay=(0.0, 0.0),
    )
    campaign.kill(
        "run-fit variant_deep-s1: seeded delay",
        step("run-fit", "--variant", "variant_deep", "--seed", "1"),
        pattern=None,
        delay=(1.0, 4.0),
    )
    # 5. the remaining cells in one `study run`, killed in the benchmark step; then `benchmark`.
    # No delay after a benchmark receipt: a fast host publishes all ten benchmarks
    # of the tiny study within 0.3 s, and then nothing is left for the benchmark step to be
    # killed in. A zero-width range still draws from the seeded RNG, so later delays are unchanged.
    campaign.kill(
        "run: killed at the first benchmark", step("run"), pattern="benchmarks/*.receipt.json", delay=(0.0, 0.0)
    )
    campaign.kill(
        "benchmark: one more benchmark", step("benchmark"), pattern="benchmarks/*.receipt.json", delay=(0.0, 0.0)
    )
    campaign.kill("benchmark: seeded delay", step("benchmark"), pattern=None, delay=(1.0, 3.0))
    campaign.complete("benchmark", step("benchmark"))
    # 6. report: staged in a hidden temporary sibling of report/ and renamed into place whole
    staged = f".report{TEMP_MARKER}*/"
    campaign.kill(
        "report: report.json staged, nothing published",
        step("report"),
        pattern=staged + "report.json",
        delay=(0.0, 0.0),
    )
    campaign.kill("report: a figure staged", step("report"), pattern=staged + "arms.png", delay=(0.0, 0.0))
    campaign.kill(
        "report: receipt staged, not yet renamed",
        step("report"),
        pattern=staged + "report.receipt.json",
        delay=(0.0, 0.0),
    )
    # The main job finishes whatever is left and verifies the rest.
    campaign.complete("study run", step("run"))

    from qhlab.evidence import verify_directory

    verified = verify_directory(out)
    cell_receipt = read_receipt(out / "cells" / "baseline-s0" / "cell.receipt.json", StudyCellReceipt).record()
    e0 = read_receipt(out / "canaries" / "e0.receipt.json", StudyE0Receipt).record()
    return {
        "receipts": len(verified["receipts"]),
        "temporary_files": len(verified["temporary_files"]),
        "baseline_s0_previous_attempts": cell_receipt["body"]["previous_attempts"],
        "baseline_s0_attempt": cell_receipt["body"]["attempt"],
        "e0_passed": e0["body"]["passed"],
    }


def run_campaigns(root: Path, recipe_writer: Callable[..., Path], study_config: Path) -> dict:
    """Run both campaigns at once (fit in a thread, study in the caller); return their records.

    Returns:
        ``{"fit": _Campaign, "study": _Campaign, "results": {name: dict}, "record": Path,
        "wall_seconds": float}``; a campaign that failed carries ``error``.
    """
    rng = random.Random(SEED)
    # Each campaign gets its own seeded stream, drawn up front so thread timing cannot change it.
    fit = _Campaign("fit campaign", root / "fit-out", root / "fit.log", random.Random(rng.getrandbits(64)))
    study = _Campaign("study campaign", root / "study", root / "study.log", random.Random(rng.getrandbits(64)))
    recipe = recipe_writer(root / "recipe", updates=FIT_UPDATES)
    results: dict = {}

    def run(campaign: _Campaign, body, *args) -> None:
        try:
            results[campaign.name] = body(campaign, *args)
        except BaseException as exc:  # noqa: BLE001 - reported by the tests
            campaign.error = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, args=(fit, _fit_campaign, recipe), daemon=True)
    thread.start()
    run(study, _study_campaign, study_config)
    thread.join(timeout=900)
    wall = round(time.monotonic() - started, 1)
    record = {
        "seed": SEED,
        "wall_seconds": wall,
        "campaigns": {
            c.name: {
                "points": [p.as_dict() for p in c.points],
                "completions": c.completions,
                "result": results.get(c.name),
                "error": None if c.error is None else str(c.error),
            }
            for c in (fit, study)
        },
    }
    (root / "kill-points.json").write_text(json.dumps(record, indent=2))
    print(
        f"\ncrash campaigns: {len(fit.killed) + len(study.killed)} kill points survived "
        f"(fit {len(fit.killed)}, study {len(study.killed)}) in {wall} s; record {root / 'kill-points.json'}"
    )
    return {"fit": fit, "study": study, "results": results, "record": root / "kill-points.json", "wall_seconds": wall}
