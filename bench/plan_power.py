"""Benchmark: the plan judged against pilots it was not built from, by simulation.

For every comparison and retention margin of a pilot record (default: the demo's), independent
pilots of the record's layout are drawn from one truth (its scene and residual pools, its seed
and TRAIN-draw components); each plans the study's MDE alone, as ``qhlab plan`` does, and a study
whose true difference is that MDE is simulated and read as a report reads it
(``tests/calibration_model.py``: ``planned_power``). A plan that kept its promise would detect
its MDE with the power it planned (0.8).

Prints ONE JSON line: ``ratio`` = the mean power over every row / 0.8 (1.0: the plan keeps its
promise on average), the range of powers, and each row's power and the 5th, 50th and 95th
percentiles of the MDE its pilots planned (how far one pilot's plan can be from another's).
Run: ``python bench/plan_power.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tests"))

from calibration_model import contrasts, planned_power  # noqa: E402

POWER = 0.8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilot", type=Path, default=_ROOT / "examples" / "preparation" / "demo-pilot" / "pilot.json")
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    started = time.perf_counter()
    record = json.loads(args.pilot.read_text())
    rows = []
    for index, (name, metric, values, draws) in enumerate(contrasts(record)):
        rows.append({"row": name, "metric": metric, **planned_power(values, draws, reps=args.reps, seed=index)})
    powers = [r["power"] for r in rows]
    print(
        json.dumps(
            {
                "bench": "plan_power",
                "pilot": str(args.pilot.relative_to(_ROOT) if args.pilot.is_relative_to(_ROOT) else args.pilot),
                "reps": args.reps,
                "ratio": round(statistics.mean(powers) / POWER, 4),
                "planned_power": POWER,
                "power_range": [min(powers), max(powers)],
                "rows": rows,
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
