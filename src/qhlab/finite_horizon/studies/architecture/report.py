"""Step 6, the report: compare every charged final cell, once, and publish report/ whole.

Owns: ``report_study`` (authenticate every cell receipt against this freeze and development,
collect the benchmarks when all exist, publish ``report/`` through
``qhlab.evidence.publish_directory`` with its receipt inside) and ``build_report``, every
number of ``report.json`` from the authenticated receipt bodies (per-cell and seed-mean
intervals, paired differences, retention decisions, the heuristic references and headline).
Does not own: the statistics (``statistics``), the references (``references``) or the
markdown and figures (``render``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from qhlab.evidence import EvidenceError, PublishConflictError, publish_directory, read_receipt, write_receipt
from qhlab.finite_horizon.studies.architecture.authentication import (
    authenticate_cells,
    authenticate_development,
    authenticate_freeze,
    within_study,
)
from qhlab.finite_horizon.studies.architecture.config import QhArchitectureStudyConfig
from qhlab.finite_horizon.studies.architecture.layout import (
    DEVELOPMENT_RECEIPT,
    REPORT_DIR,
    REPORT_RECEIPT,
    SCHEMA_VERSION,
    benchmark_receipt_path,
    cell_name,
)
from qhlab.finite_horizon.studies.architecture.references import reference_comparisons
from qhlab.finite_horizon.studies.architecture.render import write_report_files
from qhlab.finite_horizon.studies.architecture.seed_aware import seed_aware_section

__all__ = ["build_report", "report_study"]


@within_study
def report_study(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Compare all ten charged final cells; never select an intermediate checkpoint.

    Requires every declared cell's final receipt (authenticated, chained to this freeze and
    development). Publishes ``report/`` whole: ``report.json``, ``report.md``, the PNG figures
    and ``report.receipt.json`` binding every cell receipt (and every benchmark receipt when
    all cells have one). A crash leaves no partial ``report/``.

    Args:
        config_path: the study TOML (its bytes must be the frozen ones).
        output: the study directory.

    Returns:
        The report (the content of ``report.json``).

    Raises:
        PublishConflictError: the report exists, or ``report/`` holds anything.
    """
    frozen = authenticate_freeze(config_path, output, "report_study")
    development = authenticate_development(frozen, "report_study")
    cells = authenticate_cells(frozen, "report_study")
    directory = frozen.output / REPORT_DIR
    if (directory / REPORT_RECEIPT).exists():
        raise PublishConflictError(f"report_study: {directory / REPORT_RECEIPT} already exists; the report is written once.")
    benchmarks = {}
    for arm, seed in frozen.config.cells:
        path = benchmark_receipt_path(frozen.output, arm, seed)
        if path.is_file():
            benchmarks[(arm, seed)] = {"path": path, "document": read_receipt(path, kind="study_benchmark", schema_version=SCHEMA_VERSION)}
    if len(benchmarks) != len(frozen.config.cells):
        benchmarks = {}
    report = build_report(frozen.config, frozen.body, development["body"],
                          {k: v["document"]["body"] for k, v in cells.items()},
                          {k: v["document"]["body"] for k, v in benchmarks.items()})
    if directory.exists() and any(directory.iterdir()):
        raise PublishConflictError(f"report_study: {directory} holds a partial report; remove it by hand after inspection.")
    inputs = {"freeze": frozen.receipt_path, "development": frozen.output / DEVELOPMENT_RECEIPT}
    inputs.update({f"cell/{cell_name(a, s)}": v["path"] for (a, s), v in cells.items()})
    inputs.update({f"benchmark/{cell_name(a, s)}": v["path"] for (a, s), v in benchmarks.items()})

    def write(staging: Path) -> None:
        # The receipt is written inside the staging directory, so its output paths are
        # relative ("report.json") and stay valid once the directory is renamed to report/.
        outputs = write_report_files(report, staging)
        write_receipt(staging / REPORT_RECEIPT, kind="study_report", schema_version=SCHEMA_VERSION,
                      body={"study": frozen.config.name, "summary": report["summary"]},
                      inputs=inputs, outputs=outputs)

    publish_directory(directory, write)
    return report


def build_report(config: QhArchitectureStudyConfig, freeze: dict, development: dict,
                 cells: dict[tuple[str, int], dict], benchmarks: dict[tuple[str, int], dict]) -> dict:
    """Every number of the report from the authenticated receipt bodies (pure of files).

    Per-scene arrays are [n_scenes][H] in the evaluation's scene order, which must be the same
    for every cell (the same sealed validation population).

    Args:
        config: the study config.
        freeze: the freeze receipt body.
        development: the development receipt body (with ``references``).
        cells: {(arm, seed): cell receipt body} for every declared cell.
        benchmarks: {(arm, seed): benchmark receipt body} for every cell, or empty.

    Returns:
        The JSON-able report (the content of ``report.json``).
    """
    from qhlab.finite_horizon.studies.statistics import retention_margins, seed_disagreement

    horizon = int(freeze["train"]["support"]["H"])
    reference = None
    per_scene: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for key, body in cells.items():
        ev = body["evaluation"]
        if reference is None:
            reference = ev["scene_ids"]
        elif ev["scene_ids"] != reference:
            raise EvidenceError(f"report_study: cell {body['cell']} was evaluated on other scenes.")
        per_scene[key] = {m: np.asarray(ev[f"scene_{m}"], dtype=np.float64).reshape(len(reference), horizon)
                          for m in ("mae", "regret")}
    roles = {a["arm"]: a for a in freeze["arms"]}
    primary = horizon - 1
    constant = development["constant_on_validation"]
    constant_scene = {m: np.asarray(constant["per_scene"][m], dtype=np.float64) for m in ("mae", "regret")}
    if "references" not in development:
        raise EvidenceError("report_study: the development receipt carries no heuristic references. "
                            "HINT: it was sealed by an older qhlab; freeze a new study.")
    compared = reference_comparisons(
        development["references"], {s: per_scene[(config.baseline_arm, s)]["regret"] for s in config.seeds},
        scene_ids=reference, bootstrap=config.bootstrap, baseline_arm=config.baseline_arm,
    )
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "study": config.name,
        "headline": compared["headline"],
        "profile": config.profile,
        "horizon": horizon,
        "primary_horizon": horizon,
        "n_scenes": len(reference),
        "statistical_unit": "scene (candidates within state, states within scene, scenes equally)",
        "states_used": "final states of charged cells only; no intermediate checkpoint",
        "thresholds": freeze["thresholds"],
        "bootstrap": config.bootstrap.model_dump(mode="json"),
        "seeds": list(config.seeds),
        "constant": {
            "train_constant": development["train_constant"],
            "mae": constant["mae"], "regret": constant["regret"],
            "mae_interval": config.bootstrap.interval(constant_scene["mae"][:, primary]),
            "regret_interval": config.bootstrap.interval(constant_scene["regret"][:, primary]),
        },
        "references": compared["references"],
        "cells": [],
        "arms": [],
        "paired": [],
        "retention": [],
    }
    for arm, seed in config.cells:
        body = cells[(arm, seed)]
        values = per_scene[(arm, seed)]
        entry = {
            "arm": arm, "seed": seed, "role": roles[arm]["role"], "cell": body["cell"],
            "mae": [float(v) for v in values["mae"].mean(axis=0)],
            "regret": [float(v) for v in values["regret"].mean(axis=0)],
            "mae_intervals": [config.bootstrap.interval(values["mae"][:, h]) for h in range(horizon)],
            "regret_intervals": [config.bootstrap.interval(values["regret"][:, h]) for h in range(horizon)],
            "observed_updates": body["observed_updates"],
            "final_state_sha256": body["final_state_sha256"],
            "attempt": body["attempt"],
            "previous_attempts": body["previous_attempts"],
            "wall_seconds": body.get("wall_seconds"),
        }
        if (arm, seed) in benchmarks:
            b = benchmarks[(arm, seed)]
            entry["benchmark"] = {
                "median_forward_seconds": b["median_forward_seconds"],
                "parameters_receiving_gradients": len(b["parameters_receiving_gradients"]),
                "encoder_seconds": b["module_timings"]["encoder_seconds"],
                "readout_seconds": b["module_timings"]["readout_seconds"],
                "memory": b["memory"],
            }
        report["cells"].append(entry)
    for arm in config.arms:
        pooled = {m: np.mean([per_scene[(arm, s)][m] for s in config.seeds], axis=0) for m in ("mae", "regret")}
        report["arms"].append({
            "arm": arm, "role": roles[arm]["role"], "control": roles[arm]["control"],
            "matched": roles[arm]["matched"],
            "seed_mean_mae": [float(v) for v in pooled["mae"].mean(axis=0)],
            "seed_mean_regret": [float(v) for v in pooled["regret"].mean(axis=0)],
            "seed_mean_mae_interval": config.bootstrap.interval(pooled["mae"][:, primary]),
            "seed_mean_regret_interval": config.bootstrap.interval(pooled["regret"][:, primary]),
        })
    comparisons = []
    baseline = config.baseline_arm
    for a in config.experiment.arms:
        if a.role == "control":
            comparisons.append((baseline, a.arm, "baseline minus control"))
    for a in config.experiment.arms:
        if a.role == "variant":
            comparisons.append((a.arm, a.control, "variant minus structural control"))
            comparisons.append((a.arm, a.matched or baseline, "variant minus matched control"))
    for arm, against, relation in comparisons:
        for seed in config.seeds:
            for metric in ("regret", "mae"):
                x = per_scene[(arm, seed)][metric][:, primary]
                y = per_scene[(against, seed)][metric][:, primary]
                report["paired"].append({"arm": arm, "against": against, "relation": relation,
                                         "seed": seed, "metric": metric, "horizon": horizon,
                                         "interval": config.bootstrap.interval(x, y)})
    for a in config.experiment.arms:
        if a.role != "variant":
            continue
        matched = a.matched or baseline
        decisions = {}
        for seed in config.seeds:
            decision = retention_margins(
                per_scene[(a.arm, seed)]["regret"][:, primary], per_scene[(a.control, seed)]["regret"][:, primary],
                per_scene[(a.arm, seed)]["mae"][:, primary], per_scene[(matched, seed)]["mae"][:, primary],
                regret_fraction=config.regret_fraction, mae_fraction=config.mae_fraction,
                rng_seed=config.bootstrap.seed, n_resamples=config.bootstrap.resamples,
                confidence=config.bootstrap.confidence,
            )
            decisions[seed] = decision
        disagree = seed_disagreement({s: d.retained for s, d in decisions.items()})
        report["retention"].append({
            "variant": a.arm, "structural_control": a.control, "matched_control": matched,
            "per_seed": {str(s): d.as_dict() for s, d in decisions.items()},
            "seeds_disagree": disagree,
            "retained_every_seed": all(d.retained for d in decisions.values()),
        })
    report["summary"] = {
        "n_cells": len(report["cells"]),
        "mae_primary": {c["cell"]: c["mae"][primary] for c in report["cells"]},
        "regret_primary": {c["cell"]: c["regret"][primary] for c in report["cells"]},
        "constant_mae_primary": constant["mae"][primary],
        "constant_regret_primary": constant["regret"][primary],
        "reference_regret_primary": {name: ref["regret"][primary] for name, ref in report["references"].items()},
        "headline": compared["headline"]["text"],
        "beats_best_heuristic_every_seed": compared["headline"]["beats_every_seed"],
        "retention": {r["variant"]: {"retained": {s: d["retained"] for s, d in r["per_seed"].items()},
                                     "label": {s: d["label"] for s, d in r["per_seed"].items()},
                                     "seeds_disagree": r["seeds_disagree"]}
                      for r in report["retention"]},
    }
    seed_aware_section(config, per_scene, comparisons, report, primary)
    return report
