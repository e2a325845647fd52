"""Step 6, the report: compare every charged final cell, once, and publish report/ whole.

Owns: ``write_report`` (``Study.report``: authenticate every cell receipt against this freeze and
development, collect the benchmarks when all exist, publish ``report/`` through
``qhlab.evidence.publish_directory`` with its receipt inside); the report's sections: a ``Section``
is one statistic of the report and owns its computation (``build``: its fields of ``report.json``
and its entries of the summary), its lines of ``report.md`` and its W&B tables; ``SECTIONS`` is
their registry, in report order; ``build_report`` is a loop over it. Does not own: the section
contract (``sections``: ``ReportInputs``, ``Section``, ``Tables``), the statistics (``statistics``,
``replication``), the references (``references``), the seed-aware section's code (``seed_aware``),
the answer section's (``answer``), the figures and writing the files (``render``) or the W&B run
(``wandb_run``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.design.study_records import StudyReportReceipt
from qhlab.evidence import EvidenceError, PublishConflictError, exclusive_lock, publish_directory, write_receipt
from qhlab.evidence.layout import (
    DEVELOPMENT_RECEIPT,
    REPORT_DIR,
    REPORT_LOCK,
    REPORT_RECEIPT,
    REPORT_SCHEMA_VERSION,
    cell_name,
)
from qhlab.report import answer, seed_aware
from qhlab.report import preparation_section as preparation
from qhlab.report.references import reference_comparisons
from qhlab.report.render import bounds, ci, fmt, per_horizon, table, write_report_files
from qhlab.report.sections import ReportInputs, Section, Tables
from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE, pooled_seed_values, retention_margins, seed_disagreement
from qhlab.study.authentication import FrozenStudy, authenticate_cells, authenticate_development, read_benchmarks

__all__ = ["SECTIONS", "build_report", "write_report"]


def write_report(frozen: FrozenStudy) -> dict:
    """``report_study`` on an authenticated study (its development record authenticated once on it).

    Raises:
        LockHeldError: another process is writing this study's report (exit 3).
    """
    with exclusive_lock(
        frozen.output / REPORT_LOCK,
        hint="another `qhlab study report` (or `study run`) is writing this study's report; wait for it",
    ):
        return _write_report_locked(frozen)


def _write_report_locked(frozen: FrozenStudy) -> dict:
    development = authenticate_development(frozen, "report_study")
    cells = authenticate_cells(frozen, "report_study")
    directory = frozen.output / REPORT_DIR
    if (directory / REPORT_RECEIPT).exists():
        raise PublishConflictError(
            f"report_study: {directory / REPORT_RECEIPT} already exists; the report is written once."
        )
    benchmarks = read_benchmarks(frozen)
    # The report is a pure function over the receipts' JSON records, read above as typed models.
    report = build_report(
        frozen.config,
        frozen.receipt.body_record(),
        development.body_record(),
        {k: v["document"].body_record() for k, v in cells.items()},
        {k: v["document"].body_record() for k, v in benchmarks.items()},
    )
    if directory.exists() and any(directory.iterdir()):
        raise PublishConflictError(
            f"report_study: {directory} holds a partial report; remove it by hand after inspection."
        )
    inputs = {"freeze": frozen.receipt_path, "development": frozen.output / DEVELOPMENT_RECEIPT}
    inputs.update({f"cell/{cell_name(a, s)}": v["path"] for (a, s), v in cells.items()})
    inputs.update({f"benchmark/{cell_name(a, s)}": v["path"] for (a, s), v in benchmarks.items()})

    def write(staging: Path) -> None:
        # The receipt is written inside the staging directory, so its output paths are
        # relative ("report.json") and stay valid once the directory is renamed to report/.
        outputs = write_report_files(report, staging, SECTIONS)
        write_receipt(
            staging / REPORT_RECEIPT,
            StudyReportReceipt,
            body={"study": frozen.config.name, "summary": report["summary"]},
            inputs=inputs,
            outputs=outputs,
        )

    publish_directory(directory, write)
    return report


def build_report(
    config: QhArchitectureStudyConfig,
    freeze: dict,
    development: dict,
    cells: dict[tuple[str, int], dict],
    benchmarks: dict[tuple[str, int], dict],
) -> dict:
    """Every number of the report from the authenticated receipt bodies: each of ``SECTIONS`` in turn.

    Args:
        config, freeze, development, cells, benchmarks: as in ``ReportInputs``.

    Returns:
        The JSON-able report (the content of ``report.json``).
    """
    inputs = ReportInputs(config, freeze, development, cells, benchmarks)
    report: dict[str, Any] = {"summary": {}}
    for section in SECTIONS:
        section.build(inputs, report)
    return report


# ---------------------------------------------------------------------------------------------
# The sections (each: build, markdown, tables).


def _overview(inputs: ReportInputs, report: dict) -> None:
    config = inputs.config
    report.update(
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "study": config.name,
            "profile": config.profile,
            "horizon": inputs.horizon,
            "primary_horizon": inputs.horizon,
            # Every reward-valued number of the report (labels, MAE, regret, margins) is in it.
            "unit": inputs.freeze["train"]["reward_unit"],
            "n_scenes": len(inputs.scene_ids),
            "statistical_unit": "scene (candidates within state, states within scene, scenes equally)",
            "states_used": "final states of charged cells only; no intermediate checkpoint",
            "thresholds": inputs.freeze["thresholds"],
            "bootstrap": config.bootstrap.model_dump(mode="json"),
            "seeds": list(config.seeds),
        }
    )


def _overview_markdown(report: dict) -> list[str]:
    lines = [
        f"Lane `{report['profile']}`; {report['n_scenes']} validation scenes; horizon H={report['horizon']} is "
        f"primary; seeds {report['seeds']}. Statistical unit: the scene. {report['states_used']}. "
        + (
            f"Rewards, labels, MAE and regret are in {report['unit']}."
            if report["unit"]
            else "Rewards, labels, MAE and regret are in the environment's own reward, which names no unit."
        ),
        f"Thresholds: tie_band={report['thresholds']['tie_band']}, regret_fraction="
        f"{report['thresholds']['regret_fraction']}, mae_fraction={report['thresholds']['mae_fraction']}. "
        f"Intervals: {report['bootstrap']['confidence']:.0%} scene bootstrap (BCa unless noted), "
        f"{report['bootstrap']['resamples']} resamples, seed {report['bootstrap']['seed']}.",
        "",
    ]
    if report["n_scenes"] < MIN_SCENES_TO_DECIDE:
        # Said once, up front, in plain words: a reader must not mistake a retention table on a
        # handful of scenes for evidence (statistics reads every such decision as undecided).
        lines += [
            f"There are fewer than {MIN_SCENES_TO_DECIDE} validation scenes ({report['n_scenes']}), "
            "so no seed's reading decides: every seed reads undecided.",
            "",
        ]
    return lines


def _cells(inputs: ReportInputs, report: dict) -> None:
    config, horizon, primary = inputs.config, inputs.horizon, inputs.primary
    constant = inputs.development["constant_on_validation"]
    constant_scene = {m: np.asarray(constant["per_scene"][m], dtype=np.float64) for m in ("mae", "regret")}
    report["constant"] = {
        "train_constant": inputs.development["train_constant"],
        "mae": constant["mae"],
        "regret": constant["regret"],
        **{f"{m}_interval": config.bootstrap.interval(constant_scene[m][:, primary]) for m in ("mae", "regret")},
    }
    report["cells"] = []
    for arm, seed in config.cells:
        body, values = inputs.cells[(arm, seed)], inputs.per_scene[(arm, seed)]
        report["cells"].append(
            {
                "arm": arm,
                "seed": seed,
                "role": inputs.roles[arm]["role"],
                "cell": body["cell"],
                "mae": [float(v) for v in values["mae"].mean(axis=0)],
                "regret": [float(v) for v in values["regret"].mean(axis=0)],
                "mae_intervals": [config.bootstrap.interval(values["mae"][:, h]) for h in range(horizon)],
                "regret_intervals": [config.bootstrap.interval(values["regret"][:, h]) for h in range(horizon)],
                **{k: body[k] for k in ("observed_updates", "final_state_sha256", "attempt", "previous_attempts")},
                "wall_seconds": body.get("wall_seconds"),
                # [{updates, mae [H], regret [H]}]: the validation learning curve (display only).
                "curve": body["evaluation"].get("curve") or [],
            }
        )
    report["summary"].update(
        {
            "n_cells": len(report["cells"]),
            **{f"{m}_primary": {c["cell"]: c[m][primary] for c in report["cells"]} for m in ("mae", "regret")},
            **{f"constant_{m}_primary": constant[m][primary] for m in ("mae", "regret")},
        }
    )


def _cells_markdown(report: dict) -> list[str]:
    h, k = report["horizon"], report["constant"]
    columns = [
        "arm",
        "role",
        "seed",
        *(f"MAE_{i}" for i in range(1, h + 1)),
        *(f"regret_{i}" for i in range(1, h + 1)),
        f"MAE_{h} 95% CI",
        f"regret_{h} 95% CI",
        "updates",
    ]
    rows = [
        [
            c["arm"],
            c["role"],
            c["seed"],
            *map(fmt, c["mae"]),
            *map(fmt, c["regret"]),
            ci(c["mae_intervals"][-1]),
            ci(c["regret_intervals"][-1]),
            c["observed_updates"],
        ]
        for c in report["cells"]
    ]
    rows.append(
        [
            "TRAIN constant",
            "reference",
            "-",
            *map(fmt, k["mae"]),
            *map(fmt, k["regret"]),
            ci(k["mae_interval"]),
            ci(k["regret_interval"]),
            "-",
        ]
    )
    return ["## Every arm and seed (final states)", "", *table(columns, rows)]


def _cells_tables(report: dict) -> Tables:
    h = report["horizon"]
    rows = [[c["arm"], c["seed"], c["role"], *c["mae"], *c["regret"], c["observed_updates"]] for c in report["cells"]]
    return {
        "cells": (["arm", "seed", "role", *per_horizon("mae", h), *per_horizon("regret", h), "observed_updates"], rows)
    }


def _references(inputs: ReportInputs, report: dict) -> None:
    config, development = inputs.config, inputs.development
    if "references" not in development:
        raise EvidenceError(
            "report_study: the development receipt carries no heuristic references. "
            "HINT: it was sealed by an older qhlab; freeze a new study."
        )
    compared = reference_comparisons(
        development["references"],
        {s: inputs.per_scene[(config.baseline_arm, s)]["regret"] for s in config.seeds},
        scene_ids=inputs.scene_ids,
        bootstrap=config.bootstrap,
        baseline_arm=config.baseline_arm,
    )
    report["headline"], report["references"] = compared["headline"], compared["references"]
    report["summary"].update(
        {
            "reference_regret_primary": {
                name: ref["regret"][inputs.primary] for name, ref in report["references"].items()
            },
            "headline": compared["headline"]["text"],
            "beats_best_heuristic_every_seed": compared["headline"]["beats_every_seed"],
        }
    )


def _slot_zero_words(report: dict) -> str:
    """What candidate 0 is, in the report's words (the puck world's straight strike, or the
    environment's own reference candidate)."""
    reference = report["references"].get("candidate_0", {})
    if reference.get("label", "").startswith("straight strike"):
        return "the straight strike is candidate 0 (the target struck at the goal centre)"
    name = reference.get("label", "first candidate").split(" (index")[0]
    return f"candidate 0 ({name}) is the environment's reference candidate"


def _references_markdown(report: dict) -> list[str]:
    """The headline sentence (the report's first paragraph) and the heuristic references table."""
    h, seeds = report["horizon"], report["seeds"]
    level = f"{report['bootstrap']['confidence']:.0%}"
    lines = [
        report["headline"]["text"],
        "",
        "## Heuristic references (validation chain rows, scenes weighted equally)",
        "",
        f"The fixed index was chosen on TRAIN only; {_slot_zero_words(report)}; the myopic oracle acts on the "
        "exact Q*_1 labels, so it reads "
        "validation labels and is no deployable policy. Paired columns: per seed, (baseline - "
        f"reference) regret_{h} on the same scenes with its {level} scene-bootstrap interval; below 0 "
        "favours the baseline.",
        "",
    ]
    columns = [
        "reference",
        *(f"regret_{i}" for i in range(1, h + 1)),
        f"regret_{h} {level} CI",
        *(f"baseline - reference, seed {s}" for s in seeds),
    ]
    rows = []
    for ref in report["references"].values():
        paired = {p["seed"]: p["interval"] for p in ref["paired"]}
        rows.append(
            [
                f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"],
                *map(fmt, ref["regret"]),
                ci(ref["regret_interval"]),
                *(f"{fmt(paired[s]['estimate'])} {ci(paired[s])}" for s in seeds),
            ]
        )
    return lines + table(columns, rows) + [""]


def _references_tables(report: dict) -> Tables:
    rows = [
        [name, r["label"], bool(r["oracle"]), *r["regret"], *[p["interval"]["estimate"] for p in r["paired"]]]
        for name, r in sorted(report["references"].items())
    ]
    seeds = [p["seed"] for p in next(iter(report["references"].values()))["paired"]]
    differences = [f"baseline_minus_reference_s{s}" for s in seeds]
    return {
        "references": (["reference", "label", "oracle", *per_horizon("regret", report["horizon"]), *differences], rows)
    }


def _arms(inputs: ReportInputs, report: dict) -> None:
    config, primary = inputs.config, inputs.primary
    report["arms"] = []
    for arm in config.arms:
        # [n_scenes, H]: each scene's value averaged over the seeds, horizon by horizon.
        pooled = {
            m: np.stack(
                [
                    pooled_seed_values({s: inputs.per_scene[(arm, s)][m][:, h] for s in config.seeds})
                    for h in range(inputs.horizon)
                ],
                axis=1,
            )
            for m in ("mae", "regret")
        }
        role = inputs.roles[arm]
        report["arms"].append(
            {
                "arm": arm,
                "role": role["role"],
                "control": role["control"],
                "matched": role["matched"],
                "seed_mean_mae": [float(v) for v in pooled["mae"].mean(axis=0)],
                "seed_mean_regret": [float(v) for v in pooled["regret"].mean(axis=0)],
                "seed_mean_mae_interval": config.bootstrap.interval(pooled["mae"][:, primary]),
                "seed_mean_regret_interval": config.bootstrap.interval(pooled["regret"][:, primary]),
            }
        )


def _arms_markdown(report: dict) -> list[str]:
    h = report["horizon"]
    rows = [
        [
            a["arm"],
            a["role"],
            fmt(a["seed_mean_mae"][-1]),
            ci(a["seed_mean_mae_interval"]),
            fmt(a["seed_mean_regret"][-1]),
            ci(a["seed_mean_regret_interval"]),
        ]
        for a in report["arms"]
    ]
    return [
        "",
        "## Seed-mean per arm (per-scene values averaged over both seeds)",
        "",
        *table(["arm", "role", f"MAE_{h}", "95% CI", f"regret_{h}", "95% CI"], rows),
    ]


def _paired(inputs: ReportInputs, report: dict) -> None:
    report["paired"] = [
        {
            "arm": arm,
            "against": against,
            "relation": relation,
            "seed": seed,
            "metric": metric,
            "horizon": inputs.horizon,
            "interval": inputs.config.bootstrap.interval(
                inputs.at_h(arm, seed, metric), inputs.at_h(against, seed, metric)
            ),
        }
        for arm, against, relation in inputs.comparisons
        for seed in inputs.config.seeds
        for metric in ("regret", "mae")
    ]


def _paired_markdown(report: dict) -> list[str]:
    rows = []
    for p in report["paired"]:
        iv = p["interval"]
        rows.append(
            [p["arm"], p["against"], p["relation"], p["seed"], p["metric"], fmt(iv["estimate"]), ci(iv), iv["method"]]
        )
    return [
        "",
        f"## Paired differences at H={report['horizon']} (same scenes, same seed)",
        "",
        *table(["arm", "against", "relation", "seed", "metric", "difference", "95% CI", "method"], rows),
    ]


def _paired_tables(report: dict) -> Tables:
    rows = [
        [p["arm"], p["against"], p["relation"], p["seed"], p["metric"], *bounds(p["interval"])]
        for p in report["paired"]
    ]
    return {"paired": (["arm", "against", "relation", "seed", "metric", "difference", "low", "high"], rows)}


def _retention(inputs: ReportInputs, report: dict) -> None:
    config = inputs.config
    report["retention"] = []
    for a in config.experiment.arms:
        if a.role != "variant":
            continue
        matched = a.matched or config.baseline_arm
        decisions = {
            seed: retention_margins(
                inputs.at_h(a.arm, seed, "regret"),
                inputs.at_h(a.control, seed, "regret"),
                inputs.at_h(a.arm, seed, "mae"),
                inputs.at_h(matched, seed, "mae"),
                regret_fraction=config.regret_fraction,
                mae_fraction=config.mae_fraction,
                rng_seed=config.bootstrap.seed,
                n_resamples=config.bootstrap.resamples,
                confidence=config.bootstrap.confidence,
            )
            for seed in config.seeds
        }
        report["retention"].append(
            {
                "variant": a.arm,
                "structural_control": a.control,
                "matched_control": matched,
                "per_seed": {str(s): d.as_dict() for s, d in decisions.items()},
                "seeds_disagree": seed_disagreement({s: d.retained for s, d in decisions.items()}),
                "retained_every_seed": all(d.retained for d in decisions.values()),
            }
        )
    report["summary"]["retention"] = {
        r["variant"]: {
            "retained": {s: d["retained"] for s, d in r["per_seed"].items()},
            "decision": {s: d["decision"] for s, d in r["per_seed"].items()},
            "seeds_disagree": r["seeds_disagree"],
        }
        for r in report["retention"]
    }


def _retention_markdown(report: dict) -> list[str]:
    level = f"{report['bootstrap']['confidence']:.0%}"
    lines = [
        "",
        "## Retention rule, seed by seed",
        "",
        "D_reg = mean_s(r_v,s - regret_fraction * r_c,s) against the structural control; "
        "D_mae = mean_s(m_v,s - mae_fraction * m_m,s) against the matched control. The rule retains iff "
        f"both <= 0. Each seed's reading, with its two-sided {level} scene-bootstrap intervals: retained iff "
        "both intervals lie at or below 0, not retained iff a margin's interval lies above 0, otherwise "
        f"undecided (always on fewer than {MIN_SCENES_TO_DECIDE} scenes). A seed's reading is that seed's fits; "
        "the study's decision (below) reads the seed-pooled margins, whose intervals carry the seed variance.",
        "",
    ]
    columns = ["variant", "control", "matched", "seed", "D_reg", "low", "high", "D_mae", "low", "high", "reading"]
    lines += table(columns, [])
    for r in report["retention"]:
        lines += table(
            columns,
            [
                [
                    r["variant"],
                    r["structural_control"],
                    r["matched_control"],
                    seed,
                    *(
                        fmt(v)
                        for m in ("d_reg", "d_mae")
                        for v in (d[m]["estimate"], d[m]["lower"]["low"], d[m]["upper"]["high"])
                    ),
                    d["decision"],
                ]
                for seed, d in r["per_seed"].items()
            ],
        )[2:]  # the rows, under one header
        if r["seeds_disagree"]:
            lines.append(f"\nThe seeds' point estimates disagree for `{r['variant']}`.\n")
    return lines


def _retention_tables(report: dict) -> Tables:
    rows = [
        [r["variant"], seed, d["retained"], d["decision"]]
        for r in report["retention"]
        for seed, d in sorted(r["per_seed"].items())
    ]
    return {"retention": (["variant", "seed", "retained", "decision"], rows)}


def _benchmark(inputs: ReportInputs, report: dict) -> None:
    for entry in report["cells"]:
        b = inputs.benchmarks.get((entry["arm"], entry["seed"]))
        if b is not None:
            entry["benchmark"] = {
                "median_forward_seconds": b["median_forward_seconds"],
                "parameters_receiving_gradients": len(b["parameters_receiving_gradients"]),
                "encoder_seconds": b["module_timings"]["encoder_seconds"],
                "readout_seconds": b["module_timings"]["readout_seconds"],
                "memory": b["memory"],
            }


def _milliseconds(seconds: float | None) -> str:
    return "unavailable" if seconds is None else f"{seconds * 1e3:.3f}"


def _benchmark_markdown(report: dict) -> list[str]:
    rows = [
        [
            c["arm"],
            c["seed"],
            f"{b['median_forward_seconds'] * 1e3:.3f}",
            _milliseconds(b["encoder_seconds"]),
            _milliseconds(b["readout_seconds"]),
            b["parameters_receiving_gradients"],
        ]
        for c in report["cells"]
        if (b := c.get("benchmark"))
    ]
    columns = [
        "arm",
        "seed",
        "median forward (ms)",
        "encoder (ms, hooked)",
        "readout (ms, hooked)",
        "tensors with grad",
    ]
    heading = ["", "## Scorer benchmark (canonical first TRAIN chain, no updates)", ""]
    return heading + table(columns, rows) if rows else []


SECTIONS: tuple[Section, ...] = (
    Section("overview", _overview, _overview_markdown),
    Section("cells", _cells, _cells_markdown, _cells_tables),
    Section("references", _references, _references_markdown, _references_tables, lead=1),
    Section("arms", _arms, _arms_markdown),
    Section("paired", _paired, _paired_markdown, _paired_tables),
    Section("retention", _retention, _retention_markdown, _retention_tables),
    Section("seed_aware", seed_aware.build, seed_aware.markdown, seed_aware.tables),
    Section("benchmark", _benchmark, _benchmark_markdown),
    Section("preparation", preparation.build, preparation.markdown, preparation.tables),
    Section("question", answer.build, answer.markdown, answer.tables, lead=2),
)
"""The report's sections, in build order (a section may extend what the sections before it
wrote); ``report.md`` follows this order after the lead section, and the W&B tables follow it."""
