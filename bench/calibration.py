"""Benchmark: the coverage of the report's 95% intervals, by simulation of whole pilot-and-study pairs.

Every comparison and retention margin of a pilot record (default: the demo's), in two scenarios:
its true seed and TRAIN-draw effects as the pilot estimated them, and both zero. Each simulated
pair draws a pilot of the record's layout and a two-seed study on a fresh draw, its scenes and
residuals resampled from the record's fits, and reads the study's interval exactly as a report
does (``tests/calibration_model.py``). The target: every coverage in [0.93, 0.975].

Prints ONE JSON line: ``ratio`` = the lowest coverage / 0.95, the range, and every case's coverage,
true components and median MDE and degrees of freedom. Run: ``python bench/calibration.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tests"))

from calibration_model import contrasts, coverage  # noqa: E402

LOW, HIGH = 0.93, 0.975


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
    print(
        json.dumps(
            {
                "bench": "calibration",
                "pilot": str(args.pilot.relative_to(_ROOT) if args.pilot.is_relative_to(_ROOT) else args.pilot),
                "reps": args.reps,
                "ratio": round(min(covered) / 0.95, 4),
                "coverage_range": [min(covered), max(covered)],
                "target": [LOW, HIGH],
                "meets_target": all(LOW <= c <= HIGH for c in covered),
                "cases": cases,
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
