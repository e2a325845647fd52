"""``qhlab plan``: predict a study's MDEs from its pilot before any of its fits, and weigh its alternatives.

Owns: the plan directory (``config.toml``, ``plan.json``, ``plan.md``, the receipt), reading and
checking the records a plan reads (the study's pilot, and a tuning of its margins), the validation
labelling cost, and the plan's console lines and markdown (with each row's dominant variance part
and what moves it). Does not own: the predictions
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
    row_key,
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
from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE

__all__ = ["plan_markdown", "run_plan"]

_LOCK = ".plan.lock"
# What a plan writes in its directory: another name there is not this plan's, and is refused.
_OWN = (CONFIG_COPY, RECORD, RECEIPT, PLAN_MARKDOWN, _LOCK)
# A row's variance parts (``qhlab.statistics.variance.variance_components``) in words, and what moves
# each: the levers differ, so naming the dominant part says which alternative can help.
_PARTS = {"scene": "validation scenes", "seed": "training seeds", "draw": "TRAIN draw"}
_LEVERS = {
    "scene": "more validation scenes shrink it",
    "seed": "more seeds shrink it",
    "draw": "more validation scenes or seeds do not shrink it (a study fits one TRAIN draw; TRAIN size is "
    "unmeasured; more pilot draws give it more dof)",
}


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
        min_scenes_to_decide=MIN_SCENES_TO_DECIDE,
        levers=True,
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
    worst = _worst_margin(record)
    if worst is not None:
        key, row = worst
        part = row["variance"]["parts"][row["variance"]["dominant"]]
        lines.append(
            f"  worst margin {key}: MDE {fmt(row['mde'])}{u}, {part['share']:.0%} "
            f"{_PARTS[row['variance']['dominant']]} ({part['dof']:.1f} dof); {_LEVERS[row['variance']['dominant']]}"
        )
    if record["chosen"] is None:
        # The closest design that can decide: one of fewer scenes is no alternative, whatever its MDE.
        deciding = [d for d in record["designs"] if _decides(record, d)] or record["designs"]
        best = min(
            deciding,
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


def _decides(record: dict, design: dict) -> bool:
    """Whether a design has the scenes to decide (a record before the rule names no minimum)."""
    least = record.get("min_scenes_to_decide")
    return least is None or design["validation_scenes"] >= least


def _worst_margin(record: dict) -> tuple[str, dict] | None:
    """The study's design's margin whose MDE is the largest multiple of its target, as (row key, its
    prediction); None where the rows name no variance parts (a record before them)."""
    planned = record["designs"][record["planned"]]
    targets = {"D_reg": record["target"]["d_reg"], "D_mae": record["target"]["d_mae"]}
    margins = [
        (row_key(r), planned["rows"][row_key(r)], targets[r["margin"]]) for r in record["rows"] if r["kind"] == "margin"
    ]
    if not margins or any("variance" not in p for _, p, _ in margins):
        return None
    key, row, _ = max(margins, key=lambda m: m[1]["mde"] / m[2])
    return key, row


def _variance_cells(row: dict) -> list[str]:
    """A row's variance cells: each part's share (scenes / seeds / draw; "-": not measured) and the dominant part."""
    parts, dominant = row["variance"]["parts"], row["variance"]["dominant"]
    shares = " / ".join("-" if parts[n] is None else f"{parts[n]['share']:.0%}" for n in _PARTS)
    return [shares, f"{_PARTS[dominant]} ({parts[dominant]['dof']:.1f})"]


def _variance_lines(record: dict, u: str) -> list[str]:
    """What the variance columns mean, and the worst margin's dominant part and its levers (none: a record
    whose rows name no parts)."""
    worst = _worst_margin(record)
    if worst is None:
        return []
    key, row = worst
    dominant = row["variance"]["dominant"]
    part = row["variance"]["parts"][dominant]
    return [
        "",
        "Each row's predicted variance has three parts: the validation scenes' (`(sigma_v^2 + r/S)/n`: more scenes "
        "shrink it), the training seeds' (`tau^2/S`: more seeds shrink it) and the TRAIN draw's (`omega^2`: a study "
        "fits one TRAIN draw, so neither more validation scenes nor more seeds shrink it; the pilot measured it at one "
        "TRAIN size, so what a larger TRAIN would do is unmeasured; more pilot draws give it more dof). Shares are of "
        "the parts estimated at or above zero: a part estimated below zero counts as 0, since it never narrows a "
        'prediction (no predicted variance is below its scenes\' part); "-": no TRAIN draw measured (a one-draw '
        "pilot predicts the study's own draw). The dominant part's dof: the study's scenes less one for the scenes' "
        "part, Satterthwaite's over the mean squares that estimate it for the others.",
        "",
        f"The worst margin, {key} (MDE {fmt(row['mde'], 5)}{u}), owes {part['share']:.0%} of its predicted variance "
        f"to the {_PARTS[dominant]} ({part['dof']:.1f} dof): {_LEVERS[dominant]}.",
    ]


def _lever_lines(record: dict, column: str) -> list[str]:
    """The levers the designs do not weigh: more pilot draws (a table), TRAIN size, and which of
    ensemble members and updates the tuning's trials weighed (none: a record before the levers)."""
    levers = record.get("levers")
    if levers is None:
        return []
    weighed = sorted({k for r in record["recipes"] if r["params"] for k in r["params"]})
    lines = [
        "",
        "## Levers the designs do not weigh",
        "",
        "- Ensemble members and updates: "
        + (
            f"weighed above, through the tuning's trials (their parameters: {', '.join(weighed)})."
            if weighed
            else "not weighed (no tuning record of metric `mde` is read): a tuning of them would be."
        ),
        f"- TRAIN size: unmeasured: {levers['train_size']['why']}.",
    ]
    options = levers["pilot_draws"]
    if not options:
        return [*lines, "- Pilot draws: the pilot fitted one TRAIN draw, so its TRAIN-draw term is unmeasured."]
    lines += [
        "- Pilot draws: the study's design, its pilot's draws multiplied, each with as many seeds: the same mean "
        "squares on more degrees of freedom (the TRAIN-draw term is estimated, not shrunk), so only the t quantile "
        "moves. The cost is the extra pilot fits' CPU seconds, at the pilot's mean wall time per fit.",
        "",
        *table(
            ["pilot draws", "extra pilot fits", "CPU s", f"MDE D_reg{column}", f"MDE D_mae{column}", "reaches"],
            [
                [
                    o["draws"],
                    o["extra_fits"],
                    f"{o['seconds']:.0f}",
                    fmt(o["largest"]["D_reg"], 5),
                    fmt(o["largest"]["D_mae"], 5),
                    "yes" if o["reaches_target"] else "no",
                ]
                for o in options
            ],
        ),
    ]
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
    parts = all("variance" in p for p in planned["rows"].values())
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
            ["comparison or margin", f"predicted se{column}", "dof", f"predicted MDE{column}"]
            + (["variance shares (scenes / seeds / TRAIN draw)", "dominant part (its dof)"] if parts else []),
            [
                [key, fmt(p["se"], 5), f"{p['dof']:.1f}", fmt(p["mde"], 5)] + (_variance_cells(p) if parts else [])
                for key, p in planned["rows"].items()
            ],
        ),
        *_variance_lines(record, u),
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
                "yes" if d["reaches_target"] else "no" if _decides(record, d) else "no: cannot decide",
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
        "scene; fit compute is cells x updates x ensemble members x batch size."
        + (
            ""
            if record.get("min_scenes_to_decide") is None
            else f" A design of fewer than {record['min_scenes_to_decide']} validation scenes never reaches the "
            "target: a study of it is always undecided."
        ),
        "",
        "No design weighed reaches the target."
        if chosen is None
        else f"The cheapest design that reaches the target: design {chosen + 1}.",
        *_lever_lines(record, column),
        "",
    ]
    return "\n".join(lines)
