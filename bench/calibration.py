"""Benchmark: the coverage of the report's 95% intervals, by simulation of whole pilot-and-study pairs.

Every comparison and retention margin of a pilot record (default: the demo's), in two scenarios:
its true seed and TRAIN-draw effects as the pilot estimated them, and both zero. Each simulated
pair draws a pilot of the record's layout and a two-seed study on a fresh draw, its scenes and
residuals resampled from the record's fits, and reads the study's interval exactly as a report
does (``tests/calibration_model.py``). The target: every coverage in [0.93, 0.975].

Then the suite of what ``qhlab pilot`` admits (``ADMITTED``): the smallest layouts (two seeds on one
draw; two seeds on each of three draws) and the record's, with normal and t3 (heavy-tailed) seed and
draw effects. Per case: the mean coverage over every row (of the difference on the study's own draw
for a one-draw pilot, which is what its interval states), the lowest row's, and the wrong-retention
rate at the margin (a variant whose D_reg truth is exactly 0 is retained when D_reg's interval lies
wholly below it), the mean over the four retention margins. Targets: mean coverage in [0.93, 0.975],
wrong retention at most 0.025 (within the simulation's error: 0.029 at 6000 pairs a case).
The suite's arm cases (``ARMS``) simulate every arm's fits with the arm's own seed and TRAIN-draw
effects and form the rows from them, so rows that share an arm share its effects
(``simulate_arms``), at the same targets, on 4000 pairs a case.

Prints ONE JSON line: ``ratio`` = the lowest coverage / 0.95, the range, every case's coverage,
true components and median MDE and degrees of freedom, and ``suite``. Run:
``python bench/calibration.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tests"))

import numpy as np  # noqa: E402

from calibration_model import contrasts, coverage, simulate, simulate_arms  # noqa: E402

LOW, HIGH = 0.93, 0.975
# Wrong retention at the margin: 2.5% promised, read within two standard errors of 6000 pairs.
WRONG_RETENTION = 0.029
# (name, simulate's keywords, what the case's interval states it covers).
ADMITTED = [
    ("1x2", {"layout": (1, 2)}, "on_draw"),
    ("1x2 t3", {"layout": (1, 2), "effects": "t3"}, "on_draw"),
    ("3x2", {"layout": (3, 2)}, ""),
    ("3x2 t3", {"layout": (3, 2), "effects": "t3"}, ""),
    ("record", {}, ""),
    ("record t3", {"effects": "t3"}, ""),
]

# Arm-specific effects: (name, simulate_arms' keywords). ARM_REPS pairs a case: 16000 margin reads,
# where 2.5% is read within 0.12 points (one standard error).
ARM_REPS = 4000
# "baseline 3x": the arm in most rows (every baseline comparison and each D_mae's matched arm) with
# seed and draw effects three times the record's.
ARMS = [
    ("arms 1x2", {"layout": (1, 2)}),
    ("arms 3x2", {"layout": (3, 2)}),
    ("arms 3x2 t3, baseline 3x", {"layout": (3, 2), "effects": "t3", "scales": {"baseline": 3.0}}),
    ("arms record", {}),
    ("arms record, baseline 3x, no shared draw", {"scales": {"baseline": 3.0}, "shared_draw": 0.0}),
]


def _arm_suite(record: dict, reps: int) -> list[dict]:
    """Every arm case: mean and lowest row coverage, and the margins' wrong retention (``simulate_arms``)."""
    suite = []
    for i, (name, case) in enumerate(ARMS):
        found = simulate_arms(record, reps=reps, seed=500 + i, **case)
        rows = found["covered"].mean(axis=0)
        margins = [j for j, row in enumerate(found["rows"]) if row.startswith("D_")]
        wrong = float(found["below"][:, margins].mean())
        suite.append(
            {
                "case": name,
                "coverage": round(float(rows.mean()), 4),
                "lowest_row": round(float(rows.min()), 4),
                "wrong_retention": round(wrong, 4),
                "meets_target": bool(LOW <= rows.mean() <= HIGH and wrong <= WRONG_RETENTION),
            }
        )
    return suite


def _suite(rows: list, reps: int) -> list[dict]:
    """Every admitted case: mean and lowest coverage over the rows, and the margins' wrong retention."""
    suite = []
    for name, case, on in ADMITTED:
        covered, below = [], []
        for i, (row, _, values, draws) in enumerate(rows):
            found = simulate(values, draws, reps=reps, seed=31 + i, **case)
            covered.append(float(found["covered_on_draw" if on else "covered"].mean()))
            if row.startswith("D_"):
                below.append(float(found["below_on_draw" if on else "below"].mean()))
        suite.append(
            {
                "case": name,
                "coverage": round(float(np.mean(covered)), 4),
                "lowest_row": round(min(covered), 4),
                "wrong_retention": round(float(np.mean(below)), 4),
                "meets_target": bool(LOW <= np.mean(covered) <= HIGH and np.mean(below) <= WRONG_RETENTION),
            }
        )
    return suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilot", type=Path, default=_ROOT / "examples" / "preparation" / "demo-pilot" / "pilot.json")
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    started = time.perf_counter()
    record = json.loads(args.pilot.read_text())
    cases = []
    for index, (name, metric, values, draws) in enumerate(contrasts(record)):
        for scenario in ("pilot", "zero"):
            found = coverage(values, draws, scenario=scenario, reps=args.reps, seed=1000 * index + len(scenario))
            cases.append({"row": name, "metric": metric, "scenario": scenario, **found})
    covered = [c["coverage"] for c in cases]
    suite = _suite(list(contrasts(record)), reps=1500) + _arm_suite(record, reps=ARM_REPS)
    print(
        json.dumps(
            {
                "bench": "calibration",
                "pilot": str(args.pilot.relative_to(_ROOT) if args.pilot.is_relative_to(_ROOT) else args.pilot),
                "reps": args.reps,
                "ratio": round(min(covered) / 0.95, 4),
                "coverage_range": [min(covered), max(covered)],
                "target": [LOW, HIGH],
                "meets_target": all(LOW <= c <= HIGH for c in covered) and all(c["meets_target"] for c in suite),
                "cases": cases,
                "suite": suite,
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
