"""The lane-replication report: is a study run on lane B the same science as on lane A?

Owns: ``compare_lanes`` (``qhlab study compare-lanes A B --output DIR --margin M``): re-authenticate
two finished studies (freeze, cells, report receipt); refuse them unless their frozen decisions are
identical but for the profile; compare (``lane_comparison``: per-cell paired B - A differences at H,
lane effect beside seed effect, a TOST verdict per arm, agreement of each seed's retention and of
the study's decisions, observed updates, final-state drift per tensor group); publish ``lanes.json``, ``lanes.md``,
``lanes.png`` and ``lanes.receipt.json`` as one write-once directory. Does not own: how the
comparison is shown (``render``), the scene bootstrap and seed pooling (``statistics``),
authenticating a study (``qhlab.report.finished``), the study layout (``layout``) or the report it
reads (``qhlab.report``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qhlab.design.study_config import EXECUTION_FIELDS
from qhlab.evidence import (
    authentication_roots,
    canonical_json,
    differing_keys,
    input_error,
    publish_bytes,
    publish_directory,
    publish_file,
    publish_json,
    sha256_bytes,
    sha256_file,
    write_receipt,
)
from qhlab.evidence.layout import (
    DOCUMENT_SCHEMA_VERSION,
    FINAL_STATE,
    LANES_FIGURE,
    LANES_JSON,
    LANES_MARKDOWN,
    LANES_RECEIPT,
    cell_name,
)
from qhlab.evidence.source import runtime_versions
from qhlab.lanes.records import LaneComparisonReceipt
from qhlab.lanes.render import figure, markdown
from qhlab.report.finished import finished_study
from qhlab.statistics.bootstrap import paired_scene_bootstrap
from qhlab.statistics.replication import pooled_difference
from qhlab.training.terminal import console as study_console

__all__ = ["LANE_FILES", "compare_lanes", "lane_comparison", "study_regret_mde", "tost_verdict"]

CALL = "compare_lanes"
LANE_FILES = (LANES_JSON, LANES_MARKDOWN, LANES_FIGURE, LANES_RECEIPT)
# Not decisions: where and how a study ran. The lanes differ in the profile by construction.
_NOT_COMPARED = (*EXECUTION_FIELDS, "profile")


def compare_lanes(
    a: str | Path,
    b: str | Path,
    output: str | Path,
    *,
    margin: float | None = None,
    margin_mde_multiple: float = 1.0,
    resamples: int | None = None,
    seed: int | None = None,
    populations: Sequence[str | Path] = (),
) -> dict:
    """Compare two finished lanes of one study and publish ``output`` whole.

    Args:
        a, b: lane A's and lane B's finished study directories (each holds its config copy).
        output: a new (or empty) directory for ``lanes.json``, ``lanes.md``, ``lanes.png`` and
            ``lanes.receipt.json``.
        margin: the TOST equivalence margin on regret_H, in the reward's unit (finite, > 0); None:
            ``margin_mde_multiple`` x lane A's regret MDE (``study_regret_mde``).
        margin_mde_multiple: the multiple of the MDE used when ``margin`` is None (> 0).
        resamples: bootstrap resamples; None: the studies' frozen ``bootstrap.resamples``.
        seed: bootstrap seed; None: the studies' frozen ``bootstrap.seed``.
        populations: directories the studies' populations were copied to (``--populations``;
            a study made on another machine names paths of that machine).

    Returns:
        The comparison (the content of ``lanes.json``).

    Raises:
        QhInputError: a bad margin, an existing non-empty output, studies whose decisions differ
            (every differing field named with both values) or that were evaluated on other
            scenes; EvidenceError: a study does not authenticate. Nothing is written.
    """
    _check_margin(margin, margin_mde_multiple)
    output = Path(output)
    _check_output(output)
    with authentication_roots(Path(a), populations):  # each study's own roots inherit these
        lanes = {"A": _read_lane(Path(a)), "B": _read_lane(Path(b))}
    _refuse_other_decisions(lanes)
    frozen = lanes["A"]["resolved"]["bootstrap"]  # a decision: the same in both lanes
    resamples, seed = int(resamples or frozen["resamples"]), int(frozen["seed"] if seed is None else seed)
    margin, margin_source = _margin_and_source(lanes["A"], margin, margin_mde_multiple)
    # Both lanes fit the same TRAIN draw, so a pilot's TRAIN-draw term cancels in their difference.
    seed_variance = lanes["A"]["seed_variance"]
    comparison = lane_comparison(
        lanes["A"],
        lanes["B"],
        margin=float(margin),
        resamples=resamples,
        seed=seed,
        seed_variance=seed_variance,
        margin_source=margin_source,
    )
    inputs = {f"{k.lower()}/{name}": lanes[k][name] for k in lanes for name in ("freeze", "report")}
    _publish(output, comparison, inputs)
    return comparison


def _check_margin(margin: float | None, margin_mde_multiple: float) -> None:
    """Refuse a margin or an MDE multiple that is not a finite positive number (the multiple at most 100)."""
    if margin is not None and (
        isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0
    ):
        raise input_error(
            CALL,
            "margin",
            margin,
            "a finite number > 0 (in the reward's unit)",
            "declare the largest regret_H difference that is still the same science, or leave it "
            "out to use the study's MDE",
        )
    if (
        isinstance(margin_mde_multiple, bool)
        or not isinstance(margin_mde_multiple, (int, float))
        or not math.isfinite(margin_mde_multiple)
        or not 0 < margin_mde_multiple <= 100
    ):
        raise input_error(
            CALL,
            "margin_mde_multiple",
            margin_mde_multiple,
            "a finite number in (0, 100]",
            "1 uses the study's MDE itself as the margin",
        )


def _check_output(output: Path) -> None:
    """Refuse an ``output`` that exists and is not an empty directory."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise input_error(
            CALL,
            "output",
            str(output),
            "a new or empty directory",
            "the lane report is written once; choose a fresh --output",
        )


def _refuse_other_decisions(lanes: dict[str, dict[str, Any]]) -> None:
    """Refuse two lanes whose frozen decisions or TRAIN manifests differ, naming every difference."""
    changed = decision_differences(lanes["A"]["resolved"], lanes["B"]["resolved"])
    if lanes["A"]["train_manifest"] != lanes["B"]["train_manifest"]:
        changed.append(f"train.manifest_sha256 (A: {lanes['A']['train_manifest']}, B: {lanes['B']['train_manifest']})")
    if changed:
        raise input_error(
            CALL,
            "decisions",
            "; ".join(changed),
            f"identical frozen decisions except the profile (and the execution fields {', '.join(EXECUTION_FIELDS)})",
            "compare two lanes of the same study: freeze the same config with only `profile` changed",
        )


def _margin_and_source(lane: dict[str, Any], margin: float | None, margin_mde_multiple: float) -> tuple[float, str]:
    """The TOST margin and how it was chosen: ``margin`` itself, or a multiple of ``lane``'s regret MDE."""
    if margin is None:
        mde = study_regret_mde(lane["report_json"])
        margin = float(margin_mde_multiple) * mde
        unit = lane["report_json"]["unit"]
        margin_source = (
            f"{margin_mde_multiple:g} x the study's regret MDE ({mde:.4g}{' ' + unit if unit else ''}, lane A's "
            "largest D_reg MDE)"
        )
    else:
        margin_source = "explicit (--margin)"
    return margin, margin_source


def _publish(output: Path, comparison: dict, inputs: dict[str, Path]) -> None:
    """Publish ``lanes.json``, ``lanes.md``, ``lanes.png`` and their receipt as the one directory ``output``."""

    def write(staging: Path) -> None:
        outputs = {name: staging / name for name in (LANES_JSON, LANES_MARKDOWN, LANES_FIGURE)}
        publish_json(outputs[LANES_JSON], comparison)
        publish_bytes(outputs[LANES_MARKDOWN], markdown(comparison).encode("utf-8"))
        publish_file(outputs[LANES_FIGURE], lambda path: figure(comparison, path))
        body = {
            "study": comparison["study"],
            "margin": comparison["margin"],
            "summary": comparison["summary"],
            "profiles": {k: v["profile"] for k, v in comparison["lanes"].items()},
        }
        write_receipt(staging / LANES_RECEIPT, LaneComparisonReceipt, body=body, inputs=inputs, outputs=outputs)

    publish_directory(output, write)


def _read_lane(directory: Path) -> dict[str, Any]:
    """Re-authenticate one finished study (freeze, cells, report receipt) and read what is compared.

    Returns:
        {"directory", "profile", "resolved" (frozen config), "train_manifest", "freeze"/"report"
        (receipt paths), "study", "study_id", "report_json", "cells": {(arm, seed): cell receipt
        body}, "states": {(arm, seed): final-state path}}.
    """
    # Another lane is often another machine with other package versions: they are reported
    # (``versions``), not refused; the source package, config and every receipt still must hold.
    finished = finished_study(directory, CALL, runs=False)
    frozen, cells = finished.frozen, finished.cells
    return {
        "directory": directory,
        "profile": frozen.config.profile,
        "resolved": frozen.body.config["resolved"],
        "train_manifest": frozen.body.train["manifest_sha256"],
        "freeze": frozen.receipt_path,
        "report": finished.report_receipt,
        "study": frozen.config.name,
        "study_id": frozen.body.study_id,
        "report_json": finished.report,
        "cells": {k: c["document"].body_record() for k, c in cells.items()},
        "versions": frozen.body.versions,
        "seed_variance": _lane_seed_variance(frozen.config, frozen.body.preparation),
        "states": {k: c["path"].parent / c["document"].body.attempt / FINAL_STATE for k, c in cells.items()},
    }


def _lane_seed_variance(config: Any, preparation: dict | None) -> dict[str, Any] | None:
    """``pooled_difference``'s typed seed arguments for a lane difference, or None (the study's own seeds).

    No pilot fits one arm on two lanes, so the seed effect of a lane difference is not measured;
    the largest regret seed effect of the pilot's comparisons (or the typed ``[seed_variance]``)
    stands in for it, with that row's within-draw degrees of freedom.
    """
    pilot = (preparation or {}).get("pilot")
    if pilot is not None:
        rows = [r["noise"]["regret"] for r in pilot["comparisons"] + pilot["margins"]]
        largest = max(rows, key=lambda n: n["tau"])
        return {
            "seed_sd": float(largest["tau"]),
            "seed_sd_dof": int(largest["dof_within"]),
            "seed_sd_source": f"pilot record {pilot['name']}: its largest comparison's regret seed effect",
        }
    typed = config.seed_variance
    if typed is None:
        return None
    return {"seed_sd": float(typed.regret), "seed_sd_source": typed.source, "seed_sd_dof": typed.seeds - 1}


def decision_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Every field in which two frozen configs differ, profile and execution fields excluded.

    Args:
        a, b: two freeze receipts' ``config.resolved``.
        prefix: the dotted path of ``a`` and ``b`` (for recursion).

    Returns:
        ``"field (A: value, B: value)"`` for every differing leaf (dotted paths), sorted.
    """
    changed = []
    for key in sorted(set(a) | set(b)):
        if not prefix and key in _NOT_COMPARED:
            continue
        left, right, name = a.get(key), b.get(key), f"{prefix}{key}"
        if isinstance(left, dict) and isinstance(right, dict):
            changed += decision_differences(left, right, f"{name}.")
        elif left != right:
            changed.append(f"{name} (A: {json.dumps(left)}, B: {json.dumps(right)})")
    return changed


def tost_verdict(differences: Any, margin: float, *, seed_variance: dict[str, Any] | None = None) -> dict:
    """Two one-sided tests of |mean| < margin on seed-pooled paired differences (B - A).

    The intervals are the report's seed-aware ones (``replication.pooled_difference``): the
    scene part of the variance plus tau^2 / S, where tau is the pilot's frozen seed sd or,
    without a pilot, the estimate from the study's own seeds. A lane difference that changes
    sign from seed to seed therefore widens the interval instead of averaging away.
    "equivalent" when the 90% interval lies inside [-margin, margin] (both one-sided 5% tests
    reject a difference of at least the margin); "not equivalent" when the 95% interval lies
    entirely outside it; otherwise "inconclusive".

    Args:
        differences: float [n_seeds, n_scenes], per seed the per-scene paired differences
            (B - A) of regret_H, same scenes.
        margin: the equivalence margin (in the reward's unit, > 0).
        seed_variance: ``pooled_difference``'s ``seed_sd``, ``seed_sd_source`` and
            ``seed_sd_dof`` (the pilot); None or empty: the study's own seeds.

    Returns:
        {"verdict", "margin", "estimate", "interval_90", "interval_95"} (intervals as
        ``PooledDifference.as_dict()``).
    """
    pilot = seed_variance or {}
    i90 = pooled_difference(differences, confidence=0.90, **pilot).as_dict()
    i95 = pooled_difference(differences, confidence=0.95, **pilot).as_dict()
    if -margin <= i90["low"] and i90["high"] <= margin:
        verdict = "equivalent"
    elif i95["low"] > margin or i95["high"] < -margin:
        verdict = "not equivalent"
    else:
        verdict = "inconclusive"
    return {"verdict": verdict, "margin": margin, "estimate": i90["estimate"], "interval_90": i90, "interval_95": i95}


def study_regret_mde(report: dict) -> float:
    """The study's minimum detectable effect on regret: the largest D_reg MDE of its variants.

    It is the smallest regret difference the study's own retention decisions can resolve, so a
    lane difference below it cannot change a decision the study could detect.

    Args:
        report: a finished study's ``report.json``.

    Raises:
        QhInputError: the report holds no seed-pooled D_reg margin (made by an older qhlab).
    """
    mdes = [entry.get("pooled_margins", {}).get("D_reg", {}).get("mde") for entry in report.get("retention", [])]
    mdes = [float(m) for m in mdes if isinstance(m, (int, float)) and math.isfinite(m) and m > 0]
    if not mdes:
        raise input_error(
            CALL,
            "margin",
            None,
            "an explicit --margin (> 0, in the reward's unit)",
            "lane A's report has no seed-pooled D_reg MDE to default to; pass --margin",
        )
    return max(mdes)


def _at_h(body: dict, metric: str) -> np.ndarray:
    """float [n_scenes]: one cell's per-scene ``metric`` at the final horizon."""
    return np.asarray(body["evaluation"][f"scene_{metric}"], dtype=np.float64)[:, -1]


def _seed_effect(values: dict[int, float]) -> float:
    """Mean |s_i - s_j| over pairs of seeds of one lane (|s1 - s0| with two seeds)."""
    seeds = sorted(values)
    pairs = [abs(values[t] - values[s]) for i, s in enumerate(seeds) for t in seeds[i + 1 :]]
    return float(np.mean(pairs)) if pairs else 0.0


def lane_comparison(
    a: dict,
    b: dict,
    *,
    margin: float,
    resamples: int,
    seed: int,
    seed_variance: dict[str, Any] | None = None,
    margin_source: str = "explicit",
) -> dict:
    """Every number of ``lanes.json`` from two lanes read by ``_read_lane`` (pure but for the states).

    Args:
        a, b: the lanes (``cells``: {(arm, seed): cell receipt body}; ``report_json``;
            ``states``: {(arm, seed): final-state path}; identities).
        margin: the TOST margin on regret_H (in the reward's unit).
        resamples, seed: the scene bootstrap's settings (per-cell differences).
        seed_variance: the frozen pilot's regret tau for the TOST (``tost_verdict``); None:
            the study's own seeds.
        margin_source: how the margin was chosen (recorded).

    Returns:
        The JSON-able comparison.

    Raises:
        QhInputError: a cell of the two lanes was evaluated on other scenes or in another order.
    """
    keys = list(a["cells"])
    arms, seeds = list(dict.fromkeys(k[0] for k in keys)), sorted({k[1] for k in keys})
    options = dict(n_resamples=resamples, rng_seed=seed)
    scene_ids = a["cells"][keys[0]]["evaluation"]["scene_ids"]
    cells, drift = _paired_cells(a, b, keys, scene_ids, options)
    checks = [_updates_check(cells)]
    arm_rows = _arm_rows(a, b, cells, arms, seeds, margin=margin, seed_variance=seed_variance)
    checks.append(_states_check(drift))
    retention = _retention_agreement(a["report_json"], b["report_json"])
    checks.append(
        {
            "check": "every seed's retention and the study's decision agree",
            "passed": retention["agree"],
            "detail": "; ".join(retention["disagreements"]) or "all agree",
        }
    )
    worst = max((g["relative_l2"] or 0.0 for d in drift for g in d["groups"].values()), default=0.0)
    lanes = _lane_records(a, b)
    record = {k: v for k, v in a["resolved"].items() if k not in _NOT_COMPARED}
    return {
        "schema_version": DOCUMENT_SCHEMA_VERSION,
        "study": a["study"],
        "lanes": lanes,
        "versions_differ": differing_keys(a["versions"], b["versions"]),
        "compared_under": runtime_versions(),  # the bootstrap and drift ran here
        "decision_sha256_without_profile": sha256_bytes(canonical_json(record)),
        "difference": "B - A",
        "horizon": int(np.asarray(a["cells"][keys[0]]["evaluation"]["scene_mae"]).shape[1]),
        "n_scenes": len(scene_ids),
        "scene_ids": scene_ids,
        "seeds": seeds,
        "margin": margin,
        "margin_source": margin_source,
        "unit": a["report_json"]["unit"],
        "tost_seed_variance": (
            f"pilot: {seed_variance['seed_sd_source']} (tau {seed_variance['seed_sd']:.4g})"
            if seed_variance
            else f"study: its own {len(seeds)} seeds"
        ),
        "bootstrap": {"resamples": resamples, "seed": seed, "confidence": 0.95, "method": "paired scene bootstrap"},
        "definitions": _definitions(),
        "cells": cells,
        "arms": arm_rows,
        "retention": retention,
        "drift": drift,
        "checks": checks,
        "summary": {
            "tost": {r["arm"]: r["tost_regret_h"]["verdict"] for r in arm_rows},
            "retention_agree": retention["agree"],
            "checks_passed": all(c["passed"] for c in checks),
            "max_relative_drift": worst,
        },
    }


def _paired_cells(
    a: dict, b: dict, keys: list[tuple], scene_ids: list, options: dict[str, Any]
) -> tuple[list[dict], list[dict]]:
    """Per cell, in ``keys`` order: the paired B - A row and the final-state drift.

    Raises:
        QhInputError: a cell of either lane was evaluated on other scenes than ``scene_ids``.
    """
    cells, drift = [], []
    for key in keys:
        # Checked cell by cell, before that cell's bootstrap and drift, so a refusal names the first bad cell.
        for lane in (a, b):
            if lane["cells"][key]["evaluation"]["scene_ids"] != scene_ids:
                raise input_error(
                    CALL,
                    f"{cell_name(*key)}.evaluation.scene_ids",
                    lane["cells"][key]["evaluation"]["scene_ids"],
                    f"{scene_ids}, the scene order of lane A's first cell",
                    "both lanes evaluate every cell on the same sealed validation scenes",
                )
        cells.append(_cell_row(key, a["cells"][key], b["cells"][key], options))
        drift.append({"cell": cell_name(*key), "groups": state_drift(a["states"][key], b["states"][key])})
    return cells, drift


def _cell_row(key: tuple, body_a: dict, body_b: dict, options: dict[str, Any]) -> dict[str, Any]:
    """One cell's MAE_H and regret_H on both lanes, their bootstrapped B - A and both update counts."""
    return {
        "arm": key[0],
        "seed": key[1],
        "cell": cell_name(*key),
        **{
            f"{m}_h": {
                "A": float(_at_h(body_a, m).mean()),
                "B": float(_at_h(body_b, m).mean()),
                "difference": paired_scene_bootstrap(_at_h(body_b, m), _at_h(body_a, m), **options).as_dict(),
            }
            for m in ("mae", "regret")
        },
        "observed_updates": {"A": body_a["observed_updates"], "B": body_b["observed_updates"]},
    }


def _updates_check(cells: list[dict]) -> dict[str, Any]:
    """The check that both lanes made as many optimizer updates in every cell."""
    unequal = [c["cell"] for c in cells if c["observed_updates"]["A"] != c["observed_updates"]["B"]]
    return {
        "check": "observed updates equal in every cell",
        "passed": not unequal,
        "detail": f"unequal in {', '.join(unequal)}" if unequal else f"{len(cells)} cells",
    }


def _arm_rows(
    a: dict,
    b: dict,
    cells: list[dict],
    arms: list,
    seeds: list,
    *,
    margin: float,
    seed_variance: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Per arm: the lane effect beside each lane's seed effect (MAE_H, regret_H) and the regret_H TOST."""
    by_cell = {(c["arm"], c["seed"]): c for c in cells}
    arm_rows = []
    for arm in arms:
        at = {m: {s: by_cell[(arm, s)][f"{m}_h"] for s in seeds} for m in ("mae", "regret")}
        effects = {
            m: {
                "lane_effect": float(np.mean([abs(at[m][s]["B"] - at[m][s]["A"]) for s in seeds])),
                **{f"seed_effect_{k}": _seed_effect({s: at[m][s][k] for s in seeds}) for k in ("A", "B")},
            }
            for m in at
        }
        differences = np.stack(
            [_at_h(b["cells"][(arm, s)], "regret") - _at_h(a["cells"][(arm, s)], "regret") for s in seeds]
        )
        arm_rows.append(
            {"arm": arm, **effects, "tost_regret_h": tost_verdict(differences, margin, seed_variance=seed_variance)}
        )
    return arm_rows


def _states_check(drift: list[dict]) -> dict[str, Any]:
    """The check that both lanes' final states hold the same tensors in every cell."""
    missing = [d["cell"] for d in drift if any(g["missing"] for g in d["groups"].values())]
    return {
        "check": "final states hold the same tensors",
        "passed": not missing,
        "detail": f"differ in {', '.join(missing)}" if missing else f"{len(drift)} cells",
    }


def _lane_records(a: dict, b: dict) -> dict[str, dict[str, Any]]:
    """Each lane's identity: directory, profile, study id, its receipts' digests and package versions."""
    return {
        k: {
            "directory": str(lane["directory"]),
            "profile": lane["profile"],
            "study_id": lane["study_id"],
            "freeze_receipt_sha256": sha256_file(lane["freeze"]),
            "report_receipt_sha256": sha256_file(lane["report"]),
            "versions": lane["versions"],
        }
        for k, lane in (("A", a), ("B", b))
    }


def _definitions() -> dict[str, str]:
    """What each number of ``lanes.json`` means (a fresh dict per document)."""
    return {
        "lane_effect": "mean over seeds of |metric_H(B, seed) - metric_H(A, seed)| (scene means)",
        "seed_effect": "on one lane, mean over seed pairs of |metric_H(s_j) - metric_H(s_i)| (|s1 - s0|)",
        "tost": "regret_H, per-scene (B - A) pooled over seeds with the report's seed-aware variance (scene "
        "part + tau^2 / seeds); equivalent iff the 90% interval lies inside [-margin, margin]; not "
        "equivalent iff the 95% interval lies outside it; else inconclusive",
        "drift": "per tensor group (the key's first two non-numeric components: online.encoder, "
        "optim.exp_avg, ...), sqrt(sum ||B - A||^2) / sqrt(sum ||A||^2) over the group's tensors",
    }


def _retention_agreement(a: dict, b: dict) -> dict:
    """Each variant's per-seed reading and the study's decision on both lanes (from report.json)."""
    rows, disagreements = [], []
    b_entries = {e["variant"]: e for e in b["retention"]}
    for entry in a["retention"]:
        other = b_entries.get(entry["variant"], {"per_seed": {}})
        per_seed = {
            s: {
                "A": d["retained"],
                "B": (other["per_seed"].get(s) or {}).get("retained"),
                "reading_A": d["decision"],
                "reading_B": (other["per_seed"].get(s) or {}).get("decision"),
            }
            for s, d in entry["per_seed"].items()
        }
        decision = {k: e.get("decision") for k, e in (("A", entry), ("B", other))}
        rows.append({"variant": entry["variant"], "per_seed": per_seed, "decision": decision})
        disagreements += [
            f"{entry['variant']} seed {s} retained A={v['A']} B={v['B']}"
            for s, v in per_seed.items()
            if v["A"] != v["B"]
        ]
        if decision["A"] != decision["B"]:
            disagreements.append(f"{entry['variant']} decision A={decision['A']} B={decision['B']}")
    return {"variants": rows, "agree": not disagreements, "disagreements": disagreements}


def tensor_group(key: str) -> str:
    """A state-dict key's group: its first two non-numeric components, ensemble members pooled.

    ``online.encoder.blocks.0.qkv.weight`` -> ``online.encoder``; an ensemble's
    ``online.members.1.encoder.blocks.0.qkv.weight`` -> ``online.encoder`` too;
    ``optim.3.exp_avg`` -> ``optim.exp_avg`` (one group per optimizer moment); ``bias`` -> ``bias``.
    """
    parts = [part for part in key.split(".") if not part.isdigit()]
    if len(parts) > 2 and parts[1] == "members":
        parts = parts[:1] + parts[2:]
    return ".".join(parts[:2])


def state_drift(a: Path, b: Path) -> dict[str, dict]:
    """Relative L2 drift of lane B's final state from lane A's, per tensor group.

    Args:
        a, b: the two cells' ``final_state.safetensors`` (authenticated by their cell receipts).

    Returns:
        {group: {"n_tensors", "relative_l2" (None when ||A|| is 0 and B differs),
        "missing" (keys in one state only)}}.
    """
    from safetensors.torch import load_file

    left, right = load_file(str(a)), load_file(str(b))
    groups: dict[str, dict] = {}
    for key in sorted(set(left) | set(right)):
        group = groups.setdefault(tensor_group(key), {"n_tensors": 0, "diff2": 0.0, "norm2": 0.0, "missing": []})
        if key not in left or key not in right or left[key].shape != right[key].shape:
            group["missing"].append(key)
            continue
        x, y = left[key].double(), right[key].double()
        group["n_tensors"] += 1
        group["diff2"] += float(((y - x) ** 2).sum())
        group["norm2"] += float((x**2).sum())
    return {
        name: {
            "n_tensors": g["n_tensors"],
            "missing": g["missing"],
            "relative_l2": (
                math.sqrt(g["diff2"] / g["norm2"]) if g["norm2"] > 0 else (0.0 if g["diff2"] == 0 else None)
            ),
        }
        for name, g in groups.items()
    }


def run_command(args: Any) -> int:
    """``qhlab study compare-lanes A B --output DIR --margin M [--populations ROOT]``: compare and print
    one line per arm. Exit status 0, or 1 when a check failed (the lane report is written either way)."""
    result = compare_lanes(
        args.lane_a,
        args.lane_b,
        args.output,
        margin=args.margin,
        margin_mde_multiple=args.margin_mde_multiple,
        populations=args.populations,
    )
    console = study_console()
    for row in result["arms"]:
        console.print(
            f"{row['arm']}: lane effect regret_H {row['regret']['lane_effect']:.4f} vs seed effect "
            f"{row['regret']['seed_effect_A']:.4f} / {row['regret']['seed_effect_B']:.4f}; "
            f"{row['tost_regret_h']['verdict']} at margin {result['margin']}",
            soft_wrap=True,
        )
    console.print(
        f"[green]lanes[/] {Path(args.output) / LANES_MARKDOWN} (checks "
        f"{'passed' if result['summary']['checks_passed'] else 'FAILED'})",
        soft_wrap=True,
    )
    # As for a failed E0 gate: the report is written and stays, and the status says it failed.
    return 0 if result["summary"]["checks_passed"] else 1
