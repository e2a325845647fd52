"""The report's seed-aware section: pooled comparisons, replication labels, verdicts and MDEs.

Owns one section of the report (registered in ``report.SECTIONS`` as "seed_aware"): its computation
from the per-scene arrays (``build``), its markdown (``markdown``) and its W&B tables (``tables``).
It is built after the per-seed ``paired`` and ``retention`` sections, which it reads and extends.
Does not own: the arithmetic (``qhlab.statistics.replication``), the per-seed scene bootstrap and
retention margins (``statistics``) or the section mechanism (``report``).

What it adds to ``report.json``:

* ``replication``: for every paired comparison and metric at H, the seed-pooled estimate (the
  mean over both seeds of the per-scene paired differences), its interval including the
  between-seed variance (source stated: the config's pilot, else the study's own seeds), the
  replication label (replicated / seed-dependent / inconclusive) and the minimum detectable
  effect (80% power at the report's level);
* per variant in ``retention``: the study-level ``verdict`` (retained / rejected / not
  replicated), the decision's ``replication`` label, the seed-pooled margins (one-sided bounds
  in the verdict's direction; two-sided for a split) and their MDEs (two-sided, as every MDE of
  the report), and a ``sensitivity``
  sentence. When the seeds reach opposite decisions and each is robust on its own seed, both
  per-seed labels become "seed-dependent" (kept as ``seed_label``), here and in the summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qhlab.statistics.replication import (
    pooled_difference,
    replication_label,
    retention_replication,
    study_verdict,
)
from qhlab.study.preparation import frozen_pilot
from qhlab.study.render import bounds, ci, fmt, table

if TYPE_CHECKING:
    from qhlab.study.sections import ReportInputs, Tables

__all__ = ["POWER", "build", "markdown", "tables"]

POWER = 0.8
"""The power at which every MDE of the report is stated."""


def build(inputs: ReportInputs, report: dict) -> None:
    """Add ``replication`` to ``report`` and the study-level fields to each ``retention`` entry.

    Args:
        inputs: the report's inputs (config: seeds, bootstrap confidence, seed_variance;
            per-scene arrays; the paired comparisons).
        report: the report being built; its ``paired`` (per-seed intervals) and ``retention``
            (per-seed decisions) entries are read, the new fields written (and the summary's
            ``verdicts``, ``seed_variance_source`` and relabelled per-seed labels).
    """
    config = inputs.config
    confidence = config.bootstrap.confidence
    intervals = {(p["arm"], p["against"], p["seed"], p["metric"]): p["interval"] for p in report["paired"]}
    rows = []
    for arm, against, relation in inputs.comparisons:
        for metric in ("regret", "mae"):
            diffs = np.stack([inputs.at_h(arm, s, metric) - inputs.at_h(against, s, metric) for s in config.seeds])
            pooled = pooled_difference(
                diffs, **frozen_pilot(config, inputs.freeze, metric), confidence=confidence, power=POWER
            )
            per_seed = {s: intervals[(arm, against, s, metric)] for s in config.seeds}
            rows.append(
                {
                    "arm": arm,
                    "against": against,
                    "relation": relation,
                    "metric": metric,
                    "per_seed": {
                        str(s): {"estimate": i["estimate"], "low": i["low"], "high": i["high"]}
                        for s, i in per_seed.items()
                    },
                    "pooled": pooled.as_dict(),
                    "label": replication_label([(i["low"], i["high"]) for i in per_seed.values()], pooled),
                }
            )
    report["replication"] = rows
    for entry in report["retention"]:
        decisions = [entry["per_seed"][str(s)] for s in config.seeds]
        verdict = study_verdict({s: d["retained"] for s, d in zip(config.seeds, decisions)})
        # The bound that could confirm the verdict: upper bounds for a retention, lower ones for a
        # rejection; a split has no direction, so its pooled margins are two-sided.
        alternative = {"retained": "less", "rejected": "greater"}.get(verdict, "two-sided")
        pooled, mde = {}, {}
        for name, metric in (("D_reg", "regret"), ("D_mae", "mae")):
            key = "d_reg" if name == "D_reg" else "d_mae"
            margin = np.stack([np.asarray(d[key]["per_scene"], dtype=np.float64) for d in decisions])
            options = dict(**frozen_pilot(config, inputs.freeze, metric), confidence=confidence, power=POWER)
            pooled[name] = pooled_difference(margin, **options, alternative=alternative)
            # One MDE definition for the whole report: two-sided at its level, whatever the verdict.
            mde[name] = pooled_difference(margin, **options, alternative="two-sided").mde
        label = retention_replication(decisions, pooled)
        if label == "seed-dependent":
            for seed, d in zip(config.seeds, decisions):
                d["seed_label"], d["label"] = d["label"], "seed-dependent"
                report["summary"]["retention"][entry["variant"]]["label"][str(seed)] = "seed-dependent"
        entry["verdict"] = verdict
        entry["replication"] = label
        entry["pooled_margins"] = {name: {**p.as_dict(), "mde": mde[name]} for name, p in pooled.items()}
        entry["sensitivity"] = (
            f"{verdict}; {label}; a |D_reg| below {mde['D_reg']:.4f} m or a |D_mae| below "
            f"{mde['D_mae']:.4f} m could not be detected ({POWER:.0%} power, two-sided {confidence:.0%}, both seeds)"
        )
    report["summary"]["verdicts"] = {
        e["variant"]: {"verdict": e["verdict"], "replication": e["replication"]} for e in report["retention"]
    }
    report["summary"]["seed_variance_source"] = rows[0]["pooled"]["seed_sd_source"] if rows else None


def markdown(report: dict) -> list[str]:
    """The section's markdown lines (seed-pooled comparisons, then study-level verdicts)."""
    rows, seeds = report["replication"], report["seeds"]
    level = f"{report['bootstrap']['confidence']:.0%}"
    source = rows[0]["pooled"]["seed_sd_source"] if rows else "-"
    pooled = [
        [
            r["arm"],
            r["against"],
            r["metric"],
            *(f"{fmt(i['estimate'])} {ci(i)}" for i in (r["per_seed"][str(s)] for s in seeds)),
            fmt(r["pooled"]["estimate"]),
            ci(r["pooled"]),
            r["pooled"]["distribution"],
            r["label"],
            fmt(r["pooled"]["mde"]),
        ]
        for r in rows
    ]
    verdicts = [
        [
            e["variant"],
            e["verdict"],
            e["replication"],
            *(fmt(e["pooled_margins"][m][k]) for m in ("D_reg", "D_mae") for k in ("estimate", "mde")),
        ]
        for e in report["retention"]
    ]
    return [
        "",
        f"## Seed-pooled paired differences at H={report['horizon']} (both seeds; the interval carries the seed "
        "variance)",
        "",
        f"Pooled: mean over seeds {seeds} of the per-scene paired differences; its {level} interval adds the "
        f"between-seed variance to the scene variance (seed variance source: {source}) and uses Student's t "
        "(quantile: the Welch-Satterthwaite degrees of freedom of the scene and pilot terms, or the study's "
        "own seeds - 1). Replicated: every "
        "seed's scene interval excludes 0 on the same side and so does the pooled interval; seed-dependent: "
        "two seeds exclude 0 on opposite sides; otherwise inconclusive. MDE, for every comparison and margin "
        f"alike: the smallest true difference this design detects with {POWER:.0%} power in a two-sided "
        f"{level} test.",
        "",
        *table(
            [
                "arm",
                "against",
                "metric",
                *(f"seed {s}" for s in seeds),
                "pooled",
                f"{level} CI",
                "quantile",
                "replication",
                "MDE",
            ],
            pooled,
        ),
        "",
        "## Study-level retention verdicts",
        "",
        "Retained: both seeds retain; rejected: both seeds reject; not replicated: the seeds split. A "
        "decision is replicated when every seed reaches it robustly and the seed-pooled margins confirm "
        "it; a per-seed robust label contradicted by the other seed is shown as seed-dependent.",
        "",
        *table(
            ["variant", "verdict", "replication", "pooled D_reg", "MDE D_reg", "pooled D_mae", "MDE D_mae"], verdicts
        ),
        *(f"\n`{e['variant']}`: {e['sensitivity']}." for e in report["retention"]),
    ]


def tables(report: dict) -> Tables:
    """The section's W&B tables as (columns, rows): ``replication`` and ``verdicts``."""
    replication = [
        [r["arm"], r["against"], r["relation"], r["metric"], *bounds(r["pooled"]), r["label"], r["pooled"]["mde"]]
        for r in report.get("replication") or []
    ]
    verdicts = [
        [
            e["variant"],
            e["verdict"],
            e["replication"],
            e["pooled_margins"]["D_reg"]["mde"],
            e["pooled_margins"]["D_mae"]["mde"],
        ]
        for e in report["retention"]
        if "verdict" in e
    ]
    return {
        "replication": (["arm", "against", "relation", "metric", "pooled", "low", "high", "label", "mde"], replication),
        "verdicts": (["variant", "verdict", "replication", "mde_d_reg", "mde_d_mae"], verdicts),
    }
