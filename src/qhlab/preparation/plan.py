"""``qhlab plan``: predict a study's MDEs from its pilot before any of its fits, and weigh its alternatives.

Owns: the plan directory (``config.toml``, ``plan.json``, ``plan.md``, the receipt), reading and
checking the records a plan reads (the study's pilot, and a tuning of its margins), the validation
labelling cost, and the plan's console lines and markdown. Does not own: the predictions
(``qhlab.design.plan_record``), the statistics (``qhlab.statistics``) or binding the plan to a
study (``qhlab.study.preparation``). A plan fits nothing: it runs in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.design import pilot_record, tuning_record
from qhlab.design.pilot_config import study_design
from qhlab.design.plan_config import PLAN_CALL, QhPlanConfig, read_plan_config
from qhlab.design.plan_record import (
    CONFIG_COPY,
    RECEIPT,
    RECORD,
    plan_components,
    plan_digest,
    plan_document,
    publish_record,
    read_record,
)
from qhlab.design.preparation_record import record_path
from qhlab.design.study_config import declared_scenes
from qhlab.design.user_sources import user_source_digests
from qhlab.evidence import differing_keys, input_error, publish_bytes, read_receipt, sha256_file
from qhlab.evidence.layout import GENERATION_RECEIPT, PLAN_MARKDOWN
from qhlab.preparation.declared import declared_population, declared_unit, unit_suffix
from qhlab.preparation.fits import ToolRun, finished_record
from qhlab.report.render import fmt, table
from qhlab.scenes.records import PopulationGenerationReceipt

__all__ = ["plan_markdown", "run_plan"]

_LOCK = ".plan.lock"
# What a plan writes in its directory: another name there is not this plan's, and is refused.
_OWN = (CONFIG_COPY, RECORD, RECEIPT, PLAN_MARKDOWN, _LOCK)


def _pilot(config: QhPlanConfig, study: Any) -> tuple[dict, str]:
    """The pilot record the plan reads, authenticated and recomputed, of the study's design."""
    path = record_path(PLAN_CALL, "pilot", config.pilot, "pilot")
    pilot_record.check_record(path.parent)
    record = pilot_record.read_record(path.parent)
    differing = differing_keys(
        study_design(study, user_source_digests(study, Path(config.study).parent)), record["design"]
    )
    if differing:
        raise input_error(
            PLAN_CALL,
            "pilot",
            config.pilot,
            f"a pilot of the study's design (it differs in {', '.join(differing)})",
            "a plan predicts the study the pilot measured; run `qhlab pilot` for this design",
        )
    return record, sha256_file(path)


def _tuning(config: QhPlanConfig, pilot: dict) -> tuple[dict | None, str | None]:
    """The tuning record whose trials the plan weighs, of the study's margins, or (None, None)."""
    if config.tuning is None:
        return None, None
    path = record_path(PLAN_CALL, "tuning", config.tuning, "tuning")
    tuning_record.check_record(path.parent)
    record = tuning_record.read_record(path.parent)
    design = record.get("design") or {}
    theirs = {k: design.get(k) for k in ("arms", "variants", "regret_fraction", "mae_fraction")}
    ours = {k: pilot["design"][k] for k in ("arms", "variants", "regret_fraction", "mae_fraction")}
    if record["objective"]["metric"] != "mde" or theirs != ours:
        raise input_error(
            PLAN_CALL,
            "tuning",
            config.tuning,
            "a tuning of metric 'mde' of the study's arms, variants and fractions",
            "its trials must have fitted every arm of the study, so that each comparison's noise is measured",
        )
    return record, sha256_file(path)


def _seconds_per_scene(pilot: dict) -> float | None:
    """CPU seconds the pilot's validation population took to label, per scene (None: its receipt is not here)."""
    population = Path(pilot["populations"]["validation"]["path"])
    receipt = population / GENERATION_RECEIPT
    if not receipt.is_file():
        return None
    body = read_receipt(receipt, PopulationGenerationReceipt).body
    scenes = len(pilot["populations"]["validation"]["scene_digests"])
    return float(body.label_seconds) * float(body.processes or 1) / scenes


def run_plan(run: ToolRun) -> dict:
    """Make (or re-read) a plan (``run``) and publish its record.

    Returns:
        The record (``plan.json``'s document).

    Raises:
        QhInputError: an invalid config, a pilot or tuning field naming no such record, records of
            another design, or an output that is not new, empty or this plan's own; nothing written.
        EvidenceError: a record does not authenticate or recompute.
    """
    config, data, study = read_plan_config(run.config_path)
    pilot, pilot_sha = _pilot(config, study)
    tuning, tuning_sha = _tuning(config, pilot)
    digest = plan_digest(config, pilot["design"], pilot_sha, tuning_sha)
    directory = run.directory
    record = finished_record(directory, RECEIPT, read_record, digest, call=PLAN_CALL, what="plan", data=data, own=_OWN)
    if record is not None:
        run.say(f"plan {config.name}: already made; {directory / 'plan.json'}")
        return record
    components = plan_components(pilot, tuning)
    seconds = _seconds_per_scene(pilot)
    scenes = declared_scenes(study.validation, call=PLAN_CALL)
    document = plan_document(
        rows=components["rows"],
        recipes=components["recipes"],
        pilot_noise=components["recipes"][0]["noise"],
        seeds=len(study.seeds),
        validation_scenes=scenes,
        sizes=list(config.validation_scenes),
        confidence=study.bootstrap.confidence,
        target=config.target.model_dump(mode="json"),
        validation_seconds_per_scene=seconds,
    )
    record = {
        "kind": "plan_record",
        "name": config.name,
        "config": config.record(),
        "config_sha256": digest,
        "study": {"name": study.name, "path": str(Path(config.study).resolve())},
        "design": pilot["design"],
        "seeds": len(study.seeds),
        "validation_scenes": scenes,
        "confidence": study.bootstrap.confidence,
        "target": config.target.model_dump(mode="json"),
        "pilot": {"name": pilot["name"], "record_sha256": pilot_sha},
        "tuning": None if tuning is None else {"name": tuning["name"], "record_sha256": tuning_sha},
        "rows": components["rows"],
        "validation_seconds_per_scene": seconds,
        "recipes": components["recipes"],
        **document,
    }
    # The study's reward unit: every MDE, standard error and target is in it.
    unit = declared_unit(declared_population(study.train, "train", field="study train", call=PLAN_CALL, required=False))
    with run.writing(PLAN_CALL, _LOCK, data):
        publish_bytes(directory / PLAN_MARKDOWN, plan_markdown(record, unit=unit).encode("utf-8"))
        publish_record(directory, record)
    for line in _summary(record, unit_suffix(unit)):
        run.say(line)
    return record


def _summary(record: dict, u: str) -> list[str]:
    """The plan's console lines: the study's design, and the cheapest design that reaches the target;
    ``u`` follows every MDE and target (" m", or "" where the reward names no unit)."""
    planned = record["designs"][record["planned"]]
    target = record["target"]
    lines = [
        f"plan {record['name']}: the study's design ({planned['recipe']} recipe, {planned['validation_scenes']} "
        f"validation scenes, {record['seeds']} seeds) predicts MDE D_reg {fmt(planned['largest']['D_reg'])}{u}, "
        f"D_mae {fmt(planned['largest']['D_mae'])}{u} (target {fmt(target['d_reg'])}{u}, {fmt(target['d_mae'])}{u})"
    ]
    if record["chosen"] is None:
        best = min(
            record["designs"],
            key=lambda d: max(d["largest"]["D_reg"] / target["d_reg"], d["largest"]["D_mae"] / target["d_mae"]),
        )
        lines.append(
            f"  no design weighed reaches the target; the closest: {best['recipe']} recipe, "
            f"{best['validation_scenes']} scenes (D_reg {fmt(best['largest']['D_reg'])}{u}, D_mae "
            f"{fmt(best['largest']['D_mae'])}{u})"
        )
    else:
        chosen = record["designs"][record["chosen"]]
        lines.append(
            f"  the cheapest design that reaches it: {chosen['recipe']} recipe, {chosen['validation_scenes']} scenes "
            f"({chosen['cost']['seconds']:.0f} CPU s; D_reg {fmt(chosen['largest']['D_reg'])}{u}, D_mae "
            f"{fmt(chosen['largest']['D_mae'])}{u})"
        )
    return lines


def plan_markdown(record: dict, *, unit: str = "") -> str:
    """``plan.md``: the study's predicted MDEs, every design weighed, and the choice.

    Args:
        record: the plan's record.
        unit: the study's reward unit (``"m"``; "": it names none): after every MDE and target, and
            in the header of every column of them.
    """
    u = unit_suffix(unit)
    column = f" ({unit})" if unit else ""
    planned = record["designs"][record["planned"]]
    level = f"{record['confidence']:.0%}"
    lines = [
        f"# Power plan `{record['name']}` for study `{record['study']['name']}`",
        "",
        f"Predicted before any of the study's fits, from pilot `{record['pilot']['name']}` (record sha256 "
        f"`{record['pilot']['record_sha256'][:16]}`)"
        + (
            ""
            if record["tuning"] is None
            else f" and the trials of tuning `{record['tuning']['name']}` (sha256 "
            f"`{record['tuning']['record_sha256'][:16]}`)"
        )
        + f". Every MDE: the smallest true difference detected with 80% power by a two-sided {level} interval, "
        f"with the study's {record['seeds']} seeds. A tuning trial's recipe carries its own seed and scene "
        "components and the pilot's TRAIN-draw component.",
        "",
        f"## The study's design ({planned['recipe']} recipe, {planned['validation_scenes']} validation scenes)",
        "",
        *table(
            ["comparison or margin", f"predicted se{column}", "dof", f"predicted MDE{column}"],
            [[key, fmt(p["se"], 5), f"{p['dof']:.1f}", fmt(p["mde"], 5)] for key, p in planned["rows"].items()],
        ),
        "",
        f"## Designs weighed (target: largest MDE D_reg <= {fmt(record['target']['d_reg'])}{u}, D_mae <= "
        f"{fmt(record['target']['d_mae'])}{u}" + ("" if unit else ", in the reward's own unit, which names none") + ")",
        "",
    ]
    rows = []
    for i, d in enumerate(record["designs"]):
        cost = d["cost"]
        rows.append(
            [
                i + 1,
                d["recipe"],
                d["validation_scenes"],
                fmt(d["largest"]["D_reg"], 5),
                fmt(d["largest"]["D_mae"], 5),
                "yes" if d["reaches_target"] else "no",
                f"{cost['cell_seconds']:.0f}",
                "-" if cost["validation_seconds"] is None else f"{cost['validation_seconds']:.0f}",
                f"{cost['fit_compute']:,}",
            ]
        )
    lines += table(
        [
            "design",
            "recipe",
            "scenes",
            f"MDE D_reg{column}",
            f"MDE D_mae{column}",
            "reaches",
            "cells CPU s",
            "labelling CPU s",
            "fit compute",
        ],
        rows,
    )
    recipes = [r for r in record["recipes"] if r["params"] is not None]
    if recipes:
        lines += ["", *(f"- {r['recipe']}: `{r['params']}`" for r in recipes)]
    chosen = record["chosen"]
    lines += [
        "",
        "Cost: the cells' CPU seconds are the mean wall time of the recipe's fits of each arm (the pilot's, or the "
        "trial's) times the study's seeds; the labelling seconds those of the pilot's validation population per "
        "scene; fit compute is cells x updates x ensemble members x batch size.",
        "",
        "No design weighed reaches the target."
        if chosen is None
        else f"The cheapest design that reaches the target: design {chosen + 1}.",
        "",
    ]
    return "\n".join(lines)
