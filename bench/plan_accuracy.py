"""Benchmark: how well a plan made from an independent pilot predicted a finished study's MDEs.

Reads a finished study's ``report/report.json`` (one that names a plan in ``[preparation]``:
``make demo``'s) and a second pilot record of the same design (``--independent-pilot``: other TRAIN
draws, other seeds, another tuning validation draw, made with ``qhlab pilot``). For every
comparison and retention margin it sets three MDEs side by side: the one the study achieved, the
one the study's bound plan predicted from its own pilot, and the one the independent pilot plans
(``planned_difference`` on its components, the study's seeds and validation size, as ``qhlab
plan`` computes it). The study's achieved MDE reads its bound pilot's fit-noise components, so
achieved against the bound plan compares two numbers built on one pilot (circular); achieved
against the independent plan is the test of a plan's accuracy.

Prints ONE JSON line:
* ``ratio``: the median of achieved / independently planned MDE over every row (1.0: the
  independent pilot plans what the study achieved; above 1: it was optimistic);
* ``spread``: the smallest and largest of those ratios, and ``bound_ratio_spread`` the same for
  achieved / the bound plan (the circular figure, for comparison);
* ``rows``: each row's ``achieved``, ``bound_plan`` and ``independent_plan`` MDE.

Run: ``python bench/plan_accuracy.py --study runs/demo-study --independent-pilot DIR/pilot.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from qhlab.design.plan_record import POWER, plan_components, row_key
from qhlab.statistics.replication import planned_difference
from qhlab.statistics.variance import FitNoise


def _achieved(report: dict) -> dict[str, tuple[float, float]]:
    """{row key: (the bound plan's MDE, the achieved MDE)} of every comparison and margin."""
    rows = {
        f"{r['arm']} - {r['against']} ({r['metric']})": (r["planned_mde"], r["pooled"]["mde"])
        for r in report["replication"]
    }
    rows.update(
        {
            f"{name} {e['variant']}": (e["pooled_margins"][name]["planned_mde"], e["pooled_margins"][name]["mde"])
            for e in report["retention"]
            for name in ("D_reg", "D_mae")
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="runs/demo-study", help="a finished study's output directory")
    parser.add_argument("--independent-pilot", required=True, type=Path, help="another pilot record of the design")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    path = Path(args.study) / "report" / "report.json"
    if not path.is_file():
        print(f"error: --study={args.study!r}: {path} does not exist; run `make demo` first", file=sys.stderr)
        return 2
    if not args.independent_pilot.is_file():
        print(
            f"error: --independent-pilot={str(args.independent_pilot)!r} is no file; name a pilot.json", file=sys.stderr
        )
        return 2
    report = json.loads(path.read_text())
    freeze = json.loads((Path(args.study) / "freeze.receipt.json").read_text())["body"]
    pilot = json.loads(args.independent_pilot.read_text())
    bound = (freeze.get("preparation") or {}).get("pilot") or {}
    if pilot.get("design") is None or bound.get("layout") == pilot.get("layout"):
        print("error: --independent-pilot must be another pilot record of the study's design", file=sys.stderr)
        return 2
    achieved = _achieved(report)
    if any(planned is None for planned, _ in achieved.values()):
        print(f"error: --study={args.study!r} names no plan in [preparation]; nothing to compare", file=sys.stderr)
        return 2
    components = plan_components(pilot, None)
    noise = components["recipes"][0]["noise"]
    rows = []
    for row in components["rows"]:
        key = row_key(row)
        planned = planned_difference(
            FitNoise.from_dict(noise[key]),
            n_seeds=len(report["seeds"]),
            n_scenes=report["n_scenes"],
            confidence=report["bootstrap"]["confidence"],
            power=POWER,
        )["mde"]
        bound_plan, mde = achieved[key]
        rows.append({"row": key, "achieved": mde, "bound_plan": bound_plan, "independent_plan": planned})
    ratios = [r["achieved"] / r["independent_plan"] for r in rows]
    circular = [r["achieved"] / r["bound_plan"] for r in rows]
    print(
        json.dumps(
            {
                "bench": "plan_accuracy",
                "study": report["study"],
                "independent_pilot": {"name": pilot["name"], "layout": pilot["layout"]},
                "ratio": round(statistics.median(ratios), 4),
                "spread": [round(min(ratios), 4), round(max(ratios), 4)],
                "bound_ratio_spread": [round(min(circular), 4), round(max(circular), 4)],
                "rows": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
