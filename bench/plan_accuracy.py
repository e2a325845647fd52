"""Benchmark: how well `qhlab plan` predicted a finished study's MDEs.

Reads a finished study's ``report/report.json`` (one that names a plan in ``[preparation]``:
``make demo``'s) and sets every comparison's and retention margin's planned MDE, which the plan
predicted from the pilot before any of the study's fits, beside the MDE the study achieved.

Prints ONE JSON line:
* ``ratio``: the largest |achieved / planned - 1| over every comparison and margin (target
  <= 0.25), and ``meets_target``;
* ``rows``: each row's ``planned`` and ``achieved`` MDE and their ``ratio`` (achieved / planned);
* ``median_ratio``: the middle of those ratios (above 1: the plan was optimistic).

The achieved MDE reads the study's own scene variance and the pilot's fit-noise terms, so the
two differ by the scene variance of a fresh validation draw against the pilot's; a study whose
fit-noise floor was hit differs more.
Run: ``python bench/plan_accuracy.py --study runs/demo-study``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TARGET = 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="runs/demo-study", help="a finished study's output directory")
    args = parser.parse_args(argv)
    path = Path(args.study) / "report" / "report.json"
    if not path.is_file():
        print(f"error: --study={args.study!r}: {path} does not exist; run `make demo` first", file=sys.stderr)
        return 2
    report = json.loads(path.read_text())
    rows = [
        (f"{r['arm']} - {r['against']} ({r['metric']})", r["planned_mde"], r["pooled"]["mde"])
        for r in report["replication"]
    ]
    rows += [
        (f"{name} {e['variant']}", e["pooled_margins"][name]["planned_mde"], e["pooled_margins"][name]["mde"])
        for e in report["retention"]
        for name in ("D_reg", "D_mae")
    ]
    if any(planned is None for _, planned, _ in rows):
        print(f"error: --study={args.study!r} names no plan in [preparation]; nothing to compare", file=sys.stderr)
        return 2
    ratios = [achieved / planned for _, planned, achieved in rows]
    worst = max(abs(r - 1.0) for r in ratios)
    print(
        json.dumps(
            {
                "bench": "plan_accuracy",
                "study": report["study"],
                "ratio": round(worst, 4),
                "target_ratio": TARGET,
                "meets_target": worst <= TARGET,
                "median_ratio": round(statistics.median(ratios), 4),
                "rows": [
                    {"row": n, "planned": round(p, 6), "achieved": round(a, 6), "ratio": round(a / p, 4)}
                    for n, p, a in rows
                ],
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
