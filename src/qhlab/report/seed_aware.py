"""The report's seed-aware section: pooled comparisons, replication labels, decisions and MDEs.

Owns one section of the report (registered in ``report.SECTIONS`` as "seed_aware"): its computation
from the per-scene arrays (``build``), its markdown (``markdown``) and its W&B tables (``tables``).
It is built after the per-seed ``paired`` and ``retention`` sections, which it reads and extends.
Does not own: the arithmetic (``qhlab.statistics.replication``), the per-seed scene bootstrap and
retention margins (``statistics``) or the section mechanism (``report``).

What it adds to ``report.json``:

* ``replication``: for every paired comparison and metric at H, the seed-pooled estimate (the
  mean over both seeds of the per-scene paired differences), its interval carrying this
  comparison's own fit noise (its source stated: the pilot record's components of this row, a
  typed seed variance, else the study's own seeds), the replication label (replicated /
  seed-dependent / inconclusive: how the seeds' scene intervals and the pooled one lie) and the
  minimum detectable effect (80% power, two-sided at the report's level);
* per variant in ``retention``: the study's ``decision`` (``qhlab.statistics.bootstrap.DECISIONS``:
  retained / not retained / undecided, from the seed-pooled margins' two-sided intervals), its
  reason, whether every seed's own reading (``per_seed[s]["decision"]``, the same words) agrees,
  the seed-pooled margins with their MDEs, and a ``sensitivity`` sentence;
* with a pilot, each pooled record's ``floored`` (its interval sits on the scene-only floor) and
  ``seed_check`` (the study's own seeds against the pilot's seed component: statistic, dof,
  p-value, verdict), and ``summary["seed_check"]``: the family's reading of those checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qhlab.report.render import bounds, ci, fmt, table
from qhlab.statistics.replication import pooled_difference, replication_label, retention_decision
from qhlab.statistics.seed_check import family_seed_check
from qhlab.study.preparation import frozen_noise

if TYPE_CHECKING:
    from qhlab.report.sections import ReportInputs, Tables

__all__ = ["POWER", "build", "markdown", "tables"]

POWER = 0.8
"""The power at which every MDE of the report is stated."""


def build(inputs: ReportInputs, report: dict) -> None:
    """Add ``replication`` to ``report`` and the study-level decision to each ``retention`` entry.

    Args:
        inputs: the report's inputs (config: seeds, bootstrap confidence; the freeze's pilot; the
            per-scene arrays; the paired comparisons).
        report: the report being built; its ``paired`` (per-seed intervals) and ``retention``
            (per-seed readings) entries are read, the new fields written (and the summary's
            ``decisions`` and ``seed_variance_source``).
    """
    config = inputs.config
    confidence = config.bootstrap.confidence
    unit = f" {report['unit']}" if report["unit"] else ""
    plan = (inputs.freeze.get("preparation") or {}).get("plan")
    planned = None if plan is None else plan["planned"]["rows"]
    intervals = {(p["arm"], p["against"], p["seed"], p["metric"]): p["interval"] for p in report["paired"]}
    rows, scene_means = [], []
    for arm, against, relation in inputs.comparisons:
        for metric in ("regret", "mae"):
            diffs = np.stack([inputs.at_h(arm, s, metric) - inputs.at_h(against, s, metric) for s in config.seeds])
            scene_means.append(diffs.mean(axis=0))
            pooled = pooled_difference(
                diffs,
                **frozen_noise(config, inputs.freeze, (arm, against), metric),
                confidence=confidence,
                power=POWER,
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
                    "planned_mde": None if planned is None else planned[f"{arm} - {against} ({metric})"]["mde"],
                }
            )
    report["replication"] = rows
    report["replication_correlation"] = _scene_correlation(scene_means)
    for entry in report["retention"]:
        readings = [entry["per_seed"][str(s)] for s in config.seeds]
        pooled = {}
        for name, metric in (("D_reg", "regret"), ("D_mae", "mae")):
            key = "d_reg" if name == "D_reg" else "d_mae"
            margin = np.stack([np.asarray(d[key]["per_scene"], dtype=np.float64) for d in readings])
            pooled[name] = pooled_difference(
                margin,
                **frozen_noise(config, inputs.freeze, entry["variant"], metric),
                confidence=confidence,
                power=POWER,
            )
        decision, reason = retention_decision(pooled["D_reg"], pooled["D_mae"])
        entry["decision"] = decision
        entry["decision_reason"] = reason
        entry["seeds_agree"] = len({d["decision"] for d in readings}) == 1
        entry["pooled_margins"] = {
            name: {
                **p.as_dict(),
                "planned_mde": None if planned is None else planned[f"{name} {entry['variant']}"]["mde"],
            }
            for name, p in pooled.items()
        }
        entry["sensitivity"] = (
            f"{decision}: {reason}; a |D_reg| below {pooled['D_reg'].mde:.4f}{unit} or a |D_mae| below "
            f"{pooled['D_mae'].mde:.4f}{unit} could not be detected ({POWER:.0%} power, two-sided {confidence:.0%}, "
            "both seeds)"
        )
    report["summary"]["decisions"] = {e["variant"]: e["decision"] for e in report["retention"]}
    report["summary"]["seed_variance_source"] = rows[0]["pooled"]["seed_sd_source"] if rows else None
    report["summary"]["seed_check"] = _family_check(report)


def _scene_correlation(scene_means: list[np.ndarray]) -> list[list[float]]:
    """The correlation of the replication rows' estimates as their scenes give it.

    Args:
        scene_means: one float [n_scenes] per row of ``replication``: the row's seed-averaged paired
            difference per scene (the rows share scenes, cells and fits, so they covary).

    Returns:
        float [K, K] as nested lists, K = the rows; a row constant over scenes correlates 0 with the
        others. ``qhlab study replicate`` reads it to place its agreement statistic.
    """
    if not scene_means:
        return []
    stacked = np.stack(scene_means)
    centred = stacked - stacked.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=1))
    scale = np.where(norms > 0, norms, 1.0)
    correlation = (centred @ centred.T) / np.outer(scale, scale)
    np.fill_diagonal(correlation, 1.0)
    return [[float(v) for v in np.clip(row, -1.0, 1.0)] for row in correlation]


def _family_check(report: dict) -> dict | None:
    """The study's check of its pilot over every comparison and margin (None: no pilot, nothing checked).

    Each row's own check (``pooled["seed_check"]``: statistic, dof, p-value, verdict) stays where its
    interval's components are; this is the family's reading, by Bonferroni's bound
    (``family_seed_check``), with the rows whose seeds contradicted the pilot.
    """
    checks = [
        (f"{r['arm']} - {r['against']} ({r['metric']})", r["pooled"]["seed_check"]) for r in report["replication"]
    ]
    checks += [
        (f"{name} {e['variant']}", e["pooled_margins"][name]["seed_check"])
        for e in report["retention"]
        for name in ("D_reg", "D_mae")
    ]
    checks = [(row, check) for row, check in checks if check is not None]
    if not checks:
        return None
    family = family_seed_check([c["p_value"] for _, c in checks], threshold=checks[0][1]["threshold"])
    contradicted = [
        {"row": row, **{k: c[k] for k in ("statistic", "dof_observed", "dof_predicted", "p_value")}}
        for row, c in checks
        if c["contradicts"]
    ]
    return {**family, "contradicted_rows": contradicted}


def markdown(report: dict) -> list[str]:
    """The section's markdown lines (seed-pooled comparisons, then the study's decisions)."""
    rows, seeds = report["replication"], report["seeds"]
    level = f"{report['bootstrap']['confidence']:.0%}"
    source = rows[0]["pooled"]["seed_sd_source"] if rows else "-"
    # One flag for every row and header: a bound plan adds its column to both tables, whole.
    has_plan = any(r.get("planned_mde") is not None for r in rows)
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
            *([fmt(r.get("planned_mde"))] if has_plan else []),
        ]
        for r in rows
    ]
    decisions = [
        [
            e["variant"],
            e["decision"],
            ", ".join(f"seed {s}: {e['per_seed'][str(s)]['decision']}" for s in seeds),
            *(f"{fmt(e['pooled_margins'][m]['estimate'])} {ci(e['pooled_margins'][m])}" for m in ("D_reg", "D_mae")),
            *(fmt(e["pooled_margins"][m]["mde"]) for m in ("D_reg", "D_mae")),
            *(
                []
                if not has_plan
                else [" / ".join(fmt(e["pooled_margins"][m].get("planned_mde")) for m in ("D_reg", "D_mae"))]
            ),
        ]
        for e in report["retention"]
    ]
    return [
        "",
        f"## Seed-pooled paired differences at H={report['horizon']} (both seeds; the interval carries the fits' "
        "noise)",
        "",
        f"Pooled: mean over seeds {seeds} of the per-scene paired differences; its {level} interval adds this "
        f"comparison's own seed and TRAIN-draw variance to the scene variance (source: {source}) and uses "
        "Student's t (quantile: Satterthwaite's degrees of freedom of the scene and pilot terms, or the study's "
        "own seeds - 1). A pilot's interval is never narrower than the scene-only one, and where the study's own "
        "seeds contradict the pilot's seed component it carries their seed term instead. Replicated: every "
        "seed's scene interval excludes 0 on the same side and so does the pooled interval; seed-dependent: "
        "two seeds exclude 0 on opposite sides; otherwise inconclusive. MDE, "
        f"for every comparison and margin alike: the smallest true difference this design detects with "
        f"{POWER:.0%} power in a two-sided {level} test.",
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
                *(["planned MDE"] if has_plan else []),
            ],
            pooled,
        ),
        *(
            [
                "",
                "Planned MDE: the plan's prediction for this design from the pilot alone, made before the study's "
                "fits; the MDE beside it is what the study achieved.",
            ]
            if has_plan
            else []
        ),
        "",
        "## The rule's decision",
        "",
        f"Retained: both seed-pooled margins' {level} intervals lie at or below 0; not retained: a margin's "
        "interval lies above 0; otherwise undecided. Each seed's reading applies the same rule to that seed's "
        "scene intervals, which do not see the seed variance.",
        "",
        *table(
            [
                "variant",
                "decision",
                "each seed",
                f"D_reg ({level} CI)",
                f"D_mae ({level} CI)",
                "MDE D_reg",
                "MDE D_mae",
                *(["planned MDE (D_reg / D_mae)"] if has_plan else []),
            ],
            decisions,
        ),
        *(f"\n`{e['variant']}`: {e['sensitivity']}." for e in report["retention"]),
    ]


def tables(report: dict) -> Tables:
    """The section's W&B tables as (columns, rows): ``replication`` and ``decisions``."""
    replication = [
        [r["arm"], r["against"], r["relation"], r["metric"], *bounds(r["pooled"]), r["label"], r["pooled"]["mde"]]
        for r in report.get("replication") or []
    ]
    decisions = [
        [
            e["variant"],
            e["decision"],
            e["seeds_agree"],
            e["pooled_margins"]["D_reg"]["mde"],
            e["pooled_margins"]["D_mae"]["mde"],
        ]
        for e in report["retention"]
        if "decision" in e
    ]
    return {
        "replication": (["arm", "against", "relation", "metric", "pooled", "low", "high", "label", "mde"], replication),
        "decisions": (["variant", "decision", "seeds_agree", "mde_d_reg", "mde_d_mae"], decisions),
    }
