"""The power plan: every comparison's and margin's predicted MDE, for the study's design and its alternatives.

Owns: the plan directory's file names, ``plan_components`` (what a plan reads of its records: each
comparison's and margin's pilot components, each tuning trial's one-draw components and each
recipe's measured fit cost), ``plan_document`` (the predictions from those: the study's design,
every alternative of recipe and validation size with its compute cost, and the cheapest that
reaches the target and can decide), the record's layout, publishing and reading it, and
``check_record`` (``qhlab verify`` recomputes every prediction from the record's components).
Torch-free. Does not own: the statistics (``qhlab.statistics``), the pilot or tuning records it
reads, or binding it to a study (``qhlab.study.preparation``).

The model. A design's MDE for one row is ``planned_difference`` of the row's components with the
study's seeds and that design's validation scenes. The study's own recipe carries the pilot's
components whole (seed and TRAIN draw); a tuning trial's recipe carries the seed and scene parts
its own fits measured on one TRAIN draw, and the pilot's TRAIN-draw component of the same row
(the draw effect taken as the recipe's: stated, and checked by the report's planned-against-
achieved table). A design's cost is measured, not assumed: the mean wall seconds of its recipe's
fits of each arm (the pilot's, or the trial's) times the study's seeds, and the labelling seconds
of the pilot's validation population per scene times the design's scenes (a fit's evaluation is
counted at the pilot's size). Fit compute is cells x updates x ensemble members x batch size.

A design of fewer than ``MIN_SCENES_TO_DECIDE`` validation scenes never reaches the target and is
never chosen, whatever its MDE: a study of it is always "undecided" (``qhlab plan`` refuses a config
that would weigh one). Each row of a design names the part of its predicted variance that dominates
it (``qhlab.statistics.variance.variance_components``: the validation scenes', the training seeds'
or the TRAIN draw's), since the levers differ: only the scenes' part shrinks with more scenes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from qhlab.design.preparation_record import (
    Number,
    StudyReference,
    ToolBody,
    ToolRecordFiles,
    close_values,
    opened_record,
)
from qhlab.evidence import DigestMismatchError, canonical_json, sha256_bytes
from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt, register_check
from qhlab.evidence.layout import PLAN_MARKDOWN, PLAN_RECEIPT, PLAN_RECORD, RECORD_CONFIG_COPY

__all__ = [
    "CONFIG_COPY",
    "RECEIPT",
    "RECORD",
    "PlanReceipt",
    "PlanRecord",
    "check_record",
    "plan_components",
    "plan_digest",
    "plan_document",
    "publish_record",
    "read_record",
    "row_key",
]

RECORD = PLAN_RECORD
RECEIPT = PLAN_RECEIPT
CONFIG_COPY = RECORD_CONFIG_COPY
POWER = 0.8


class PlanBody(ToolBody):
    """A plan's receipt body: the plan, its config digest, the records it read and its verdict.

    Attributes:
        name, config_sha256: the plan and its config. pilot_sha256, tuning_sha256: the records'
        digests. designs: how many designs it weighed. chosen: the cheapest that reaches the
        target (its index in the record's ``designs``), or None.
    """

    pilot_sha256: str = Field(pattern=SHA256)
    tuning_sha256: str | None = Field(default=None, pattern=SHA256)
    designs: int
    chosen: int | None


class PlanReceipt(Receipt, kind="plan", version=1):
    """``plan.receipt.json``."""

    body: PlanBody


class PlanSource(Closed):
    """A record a plan read: its name and the digest of its record file."""

    name: str
    record_sha256: str = Field(pattern=SHA256)


class PlanRecipe(Closed):
    """One recipe a plan weighs: the study's own, or a tuning trial's.

    Attributes:
        recipe: "study" or "trial N". params: a trial's parameters (None for the study's).
        updates, members, batch_size: its budget. cell_seconds: mean wall seconds of a fit of each arm.
        noise: each row's components (the pilot's whole, or the trial's one-draw ones), by row key.
        draw_from_pilot: whether each row also carries the pilot's TRAIN-draw component.
    """

    recipe: str
    params: Json | None
    updates: int
    members: int
    batch_size: int
    cell_seconds: dict[str, Number]
    noise: dict[str, Json]
    draw_from_pilot: bool


class PlanDesign(Closed):
    """One design the plan weighs: a recipe and a validation size, its predictions and cost.

    Attributes:
        recipe, validation_scenes: the design. rows: each row's predicted ``mde``, ``se`` and
            ``dof``, and (a record with ``min_scenes_to_decide``) ``variance``: its parts, shares and
            the dominant part (``variance_components``). largest: the largest D_reg and D_mae MDE
            over the variants. reaches_target: both within the target, on enough scenes to decide.
            cost: its seconds and fit compute.
    """

    recipe: str
    validation_scenes: int
    rows: dict[str, Json]
    largest: dict[Literal["D_reg", "D_mae"], Number]
    reaches_target: bool
    cost: Json


class PlanRecord(Closed):
    """``plan.json``: a power plan and every prediction it made.

    Attributes:
        kind: always ``plan_record``. name, config, config_sha256: the plan and its config.
        study: the study planned for. design: its design (the pilot's ``study_design``).
        seeds, validation_scenes, confidence: the study's. target: the MDE to reach. pilot,
        tuning: the records read. rows: every comparison and margin (key, kind, arm, against or
        variant, metric). validation_seconds_per_scene: the pilot's validation labelling cost
        (None: unknown). recipes: each recipe's components and costs. designs: every design's
        predictions. planned: the study's own design (its index in ``designs``). chosen: the
        cheapest design that reaches the target (None: none does). variance_floor: the floor its
        predictions used (``qhlab.statistics.replication.VARIANCE_FLOORS``): "scene", the study's
        own; a record without it predates that rule and recomputes with "half scene".
        min_scenes_to_decide: the fewest validation scenes of a design that may reach the target
        (``MIN_SCENES_TO_DECIDE``); a record without it predates that rule and each row's
        ``variance``, and recomputes without them. levers: what the designs do not weigh, for the
        study's own recipe and validation: ``pilot_draws`` (the same mean squares on more pilot
        draws: more dof for the TRAIN-draw term, at the cost of more pilot fits; empty with a
        one-draw pilot, whose draw term is unmeasured) and ``train_size`` (unmeasured: a pilot
        fits one TRAIN size); a record without it predates them and recomputes without them.
    """

    kind: Literal["plan_record"]
    name: str
    config: Json
    config_sha256: str = Field(pattern=SHA256)
    study: StudyReference
    design: Json
    seeds: int
    validation_scenes: int
    confidence: Number
    target: dict[Literal["d_reg", "d_mae"], Number]
    pilot: PlanSource
    tuning: PlanSource | None
    rows: list[Json]
    validation_seconds_per_scene: Number | None
    recipes: list[PlanRecipe]
    designs: list[PlanDesign]
    planned: int
    chosen: int | None
    variance_floor: Literal["scene", "half scene"] = "half scene"
    min_scenes_to_decide: int | None = None
    levers: Json | None = None


def row_key(row: dict) -> str:
    """A row's key: ``"arm - against (metric)"`` for a comparison, ``"D_reg variant"`` for a margin."""
    if row["kind"] == "comparison":
        return f"{row['arm']} - {row['against']} ({row['metric']})"
    return f"{row['margin']} {row['variant']}"


def _rows(pilot: dict) -> list[dict]:
    rows = [
        {"kind": "comparison", "arm": c["arm"], "against": c["against"], "metric": m}
        for c in pilot["comparisons"]
        for m in ("regret", "mae")
    ]
    rows += [
        {"kind": "margin", "variant": v["variant"], "margin": name, "metric": metric}
        for v in pilot["margins"]
        for name, metric in (("D_reg", "regret"), ("D_mae", "mae"))
    ]
    return rows


def _mean_seconds(fits: list[dict], arm: str) -> float:
    walls = [float(f["wall_seconds"]) for f in fits if f["arm"] == arm]
    return sum(walls) / len(walls)


def plan_components(pilot: dict, tuning: dict | None) -> dict:
    """What a plan reads of its records: rows, each recipe's components and fit costs.

    Args:
        pilot: the pilot record (``pilot.json``).
        tuning: a tuning record of metric "mde" (its trials fitted every arm), or None.

    Returns:
        ``{"rows": [...], "recipes": [PlanRecipe as dicts]}``: the study's recipe first (the pilot's
        components and its fits' costs, the main draw's), then each complete tuning trial's.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    import numpy as np

    # Lazy: as numpy, the statistics that compute with it.
    from qhlab.statistics.variance import fit_noise

    rows = _rows(pilot)
    pilot_noise = {}
    for row in rows:
        if row["kind"] == "comparison":
            entry = next(c for c in pilot["comparisons"] if (c["arm"], c["against"]) == (row["arm"], row["against"]))
        else:
            entry = next(m for m in pilot["margins"] if m["variant"] == row["variant"])
        pilot_noise[row_key(row)] = entry["noise"][row["metric"]]
    baseline = pilot["design"]["recipes"][pilot["design"]["arms"][0]]
    main = pilot["layout"][0]["draw"]
    main_fits = [f for f in pilot["fits"] if f["draw"] == main]
    recipes = [
        {
            "recipe": "study",
            "params": None,
            "updates": int(baseline["updates"]),
            "members": int(baseline["ensemble_members"]),
            "batch_size": int(baseline["batch_size"]),
            "cell_seconds": {arm: _mean_seconds(main_fits, arm) for arm in pilot["design"]["arms"]},
            "noise": pilot_noise,
            "draw_from_pilot": False,
        }
    ]
    design = pilot["design"]
    for trial in (tuning or {}).get("trials", []):
        if trial["state"] != "complete":
            continue
        seeds = sorted({int(f["seed"]) for f in trial["fits"]})
        values = {(f["arm"], int(f["seed"])): f["scenes"] for f in trial["fits"]}

        def table(arm: str, metric: str, values=values, seeds=seeds) -> np.ndarray:
            return np.stack([np.asarray(values[(arm, s)][metric], dtype=np.float64) for s in seeds])

        noise = {}
        for row in rows:
            metric = row["metric"]
            if row["kind"] == "comparison":
                x = table(row["arm"], metric) - table(row["against"], metric)
            else:
                variant = next(v for v in design["variants"] if v["arm"] == row["variant"])
                against = variant["control"] if row["margin"] == "D_reg" else variant["matched"]
                fraction = design["regret_fraction"] if row["margin"] == "D_reg" else design["mae_fraction"]
                x = table(row["variant"], metric) - fraction * table(against, metric)
            noise[row_key(row)] = fit_noise(x, [0] * len(seeds)).as_dict()
        recipe = tuning["base_recipe"] | {}
        params = dict(trial["params"])
        recipes.append(
            {
                "recipe": f"trial {trial['number'] + 1}",
                "params": params,
                "updates": int(params.get("updates", recipe.get("updates", baseline["updates"]))),
                "members": int(params.get("ensemble_members", recipe.get("ensemble_members", 1))),
                "batch_size": int(params.get("batch_size", recipe.get("batch_size", baseline["batch_size"]))),
                "cell_seconds": {arm: _mean_seconds(trial["fits"], arm) for arm in design["arms"]},
                "noise": noise,
                "draw_from_pilot": True,
            }
        )
    return {"rows": rows, "recipes": recipes}


def plan_document(
    *,
    rows: list[dict],
    recipes: list[dict],
    pilot_noise: dict[str, dict],
    seeds: int,
    validation_scenes: int,
    sizes: list[int],
    confidence: float,
    target: dict[str, float],
    validation_seconds_per_scene: float | None,
    min_scenes_to_decide: int | None,
    variance_floor: str = "scene",
    levers: bool = False,
) -> dict:
    """Every design's predictions and cost, the study's own design and the cheapest that reaches the target.

    Args:
        rows: the rows (``plan_components``). recipes: each recipe's components and costs.
        pilot_noise: the pilot's components by row key (a trial's recipe takes their TRAIN-draw part).
        seeds, validation_scenes, confidence: the study's.
        sizes: the validation sizes weighed beside the study's.
        target: ``{"d_reg", "d_mae"}``, the MDE to reach.
        validation_seconds_per_scene: the labelling cost of a validation scene (None: unknown).
        min_scenes_to_decide: ``MIN_SCENES_TO_DECIDE``: a design of fewer scenes never reaches the
            target, so is never chosen, and every row names its variance parts; None: a plan
            recorded before that rule, recomputed without it and without the parts.
        variance_floor: ``planned_difference``'s (a recorded plan's own, to recompute it).
        levers: also weigh ``_pilot_draw_levers`` (False: a plan recorded before them).

    Returns:
        ``{"designs": [...], "planned": index of the study's design, "chosen": index or None,
        "variance_floor", "min_scenes_to_decide"}`` and, with ``levers``, ``"levers"``; a design's
        rows ``{key: {"mde", "se", "dof", "variance"}}`` (``variance``: ``variance_components``' dict,
        where the rule applies).
    """
    designs = []
    for recipe in recipes:
        cells = sum(recipe["cell_seconds"].values()) * seeds
        compute = len(recipe["cell_seconds"]) * seeds * recipe["updates"] * recipe["members"] * recipe["batch_size"]
        for n in sorted({validation_scenes, *sizes}):
            predicted = {
                row_key(row): _predicted_row(
                    recipe,
                    pilot_noise[row_key(row)],
                    row_key(row),
                    seeds=seeds,
                    n_scenes=n,
                    confidence=confidence,
                    variance_floor=variance_floor,
                    parts=min_scenes_to_decide is not None,
                )
                for row in rows
            }
            largest = {
                name: max(p["mde"] for r, p in zip(rows, predicted.values()) if r.get("margin") == name)
                for name in ("D_reg", "D_mae")
            }
            labelling = None if validation_seconds_per_scene is None else validation_seconds_per_scene * n
            # A study of fewer scenes is always "undecided": its MDE is no target it can reach.
            decides = min_scenes_to_decide is None or n >= min_scenes_to_decide
            designs.append(
                {
                    "recipe": recipe["recipe"],
                    "validation_scenes": n,
                    "rows": predicted,
                    "largest": largest,
                    "reaches_target": decides
                    and largest["D_reg"] <= target["d_reg"]
                    and largest["D_mae"] <= target["d_mae"],
                    "cost": {
                        "fit_compute": compute,
                        "cell_seconds": cells,
                        "validation_seconds": labelling,
                        "seconds": cells + (labelling or 0.0),
                    },
                }
            )
    planned = next(
        i for i, d in enumerate(designs) if d["recipe"] == "study" and d["validation_scenes"] == validation_scenes
    )
    reaching = [i for i, d in enumerate(designs) if d["reaches_target"]]
    chosen = min(reaching, key=lambda i: (designs[i]["cost"]["seconds"], i)) if reaching else None
    document = {
        "designs": designs,
        "planned": planned,
        "chosen": chosen,
        "variance_floor": variance_floor,
        "min_scenes_to_decide": min_scenes_to_decide,
    }
    if levers:
        decides = min_scenes_to_decide is None or validation_scenes >= min_scenes_to_decide
        draws = _pilot_draw_levers(
            rows, recipes[0], seeds, validation_scenes, confidence, target, decides, variance_floor
        )
        document["levers"] = {"pilot_draws": draws, "train_size": _TRAIN_SIZE}
    return document


def _predicted_row(
    recipe: dict,
    pilot_noise: dict,
    key: str,
    *,
    seeds: int,
    n_scenes: int,
    confidence: float,
    variance_floor: str,
    parts: bool,
) -> dict:
    """One row's prediction under one recipe and validation size: ``{"mde", "se", "dof"}`` and, with
    ``parts``, ``"variance"`` (``variance_components``). A tuning trial's recipe carries the pilot's
    TRAIN-draw terms (``pilot_noise``) beside its own one-draw components."""
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy and scipy.
    from qhlab.statistics.replication import planned_difference
    from qhlab.statistics.variance import FitNoise, draw_variance_terms, variance_components

    pilot = FitNoise.from_dict(pilot_noise) if recipe["draw_from_pilot"] else None
    noise = FitNoise.from_dict(recipe["noise"][key])
    planned = planned_difference(
        noise,
        n_seeds=seeds,
        n_scenes=n_scenes,
        confidence=confidence,
        power=POWER,
        extra=[] if pilot is None else draw_variance_terms(pilot),
        variance_floor=variance_floor,
    )
    predicted = {k: planned[k] for k in ("mde", "se", "dof")}
    if parts:
        predicted["variance"] = variance_components(noise, n_seeds=seeds, n_scenes=n_scenes, draw=pilot)
    return predicted


# A pilot fits every draw at one TRAIN size: how the TRAIN-draw term moves with it is unmeasured.
_TRAIN_SIZE = {
    "measured": False,
    "why": "the pilot fitted every draw at the study's TRAIN size; a pilot at a second TRAIN size would "
    "measure how the TRAIN-draw term moves with it",
}
# More pilot draws, as multiples of the pilot's own: what each would cost and predict.
_DRAW_MULTIPLES = (2, 4)


def _pilot_draw_levers(
    rows: list[dict],
    study: dict,
    seeds: int,
    n_scenes: int,
    confidence: float,
    target: dict[str, float],
    decides: bool,
    variance_floor: str,
) -> list[dict]:
    """The study's own design with its pilot's TRAIN draws multiplied: the same mean squares on more dof.

    A TRAIN-draw term estimated on a pilot's few draws has few degrees of freedom, and the MDE's t
    quantile pays for them. A pilot with ``m`` times the draws (each of the same seeds per draw)
    would estimate the same expected mean squares on ``m D - 1`` between-draw dof, ``m (F - D)``
    within and ``m`` times the residual's. The prediction keeps today's estimates, so it moves only
    the quantile: what more draws buy is precision, not a smaller component.

    Args:
        rows: the plan's rows. study: the study's recipe entry (``plan_components``' first).
        seeds, n_scenes, confidence: the study's. target: the MDE to reach. decides: whether the
            study's validation has the scenes to decide. variance_floor: ``planned_difference``'s.

    Returns:
        ``[{"draws", "extra_fits", "seconds", "rows": {key: mde}, "largest", "reaches_target"}]``, one
        per multiple; empty where the pilot fitted one draw (its draw term is unmeasured, not imprecise).
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy and scipy.
    from qhlab.statistics.replication import planned_difference
    from qhlab.statistics.variance import FitNoise

    noises = {row_key(r): FitNoise.from_dict(study["noise"][row_key(r)]) for r in rows}
    first = next(iter(noises.values()))
    if first.draws < 2:
        return []
    options = []
    for multiple in _DRAW_MULTIPLES:
        predicted = {}
        for key, noise in noises.items():
            more = replace(
                noise,
                fits=noise.fits * multiple,
                draws=noise.draws * multiple,
                dof_within=noise.dof_within * multiple,
                dof_between=noise.draws * multiple - 1,
                residual_dof=noise.residual_dof * multiple,
            )
            planned = planned_difference(
                more,
                n_seeds=seeds,
                n_scenes=n_scenes,
                confidence=confidence,
                power=POWER,
                variance_floor=variance_floor,
            )
            predicted[key] = planned["mde"]
        largest = {
            name: max(predicted[row_key(r)] for r in rows if r.get("margin") == name) for name in ("D_reg", "D_mae")
        }
        # Each extra pilot seed is one fit of every arm.
        extra_fits = first.fits * (multiple - 1)
        options.append(
            {
                "draws": first.draws * multiple,
                "extra_fits": extra_fits * len(study["cell_seconds"]),
                "seconds": extra_fits * sum(study["cell_seconds"].values()),
                "rows": predicted,
                "largest": largest,
                "reaches_target": decides
                and largest["D_reg"] <= target["d_reg"]
                and largest["D_mae"] <= target["d_mae"],
            }
        )
    return options


def plan_digest(config: Any, design: dict, pilot_sha256: str, tuning_sha256: str | None) -> str:
    """The digest a plan record carries: its config's identity, the study design and the records it read."""
    return sha256_bytes(
        canonical_json({"config": config.identity(), "design": design, "pilot": pilot_sha256, "tuning": tuning_sha256})
    )


def _named(record: dict) -> dict:
    """What a plan receipt's body says of its record: the records it read, its designs and its choice."""
    tuning = None if record["tuning"] is None else record["tuning"]["record_sha256"]
    return {
        "pilot_sha256": record["pilot"]["record_sha256"],
        "tuning_sha256": tuning,
        "designs": len(record["designs"]),
        "chosen": record["chosen"],
    }


_FILES = ToolRecordFiles(RECORD, RECEIPT, PlanReceipt, PlanRecord, _named, also=(("markdown", PLAN_MARKDOWN),))

# This record's ``publish_record(directory, record)`` and ``read_record(directory)``.
publish_record = _FILES.publish
read_record = _FILES.read_record


def recomputed(record: dict) -> dict:
    """``plan_document`` of a record's own components and settings."""
    return plan_document(
        rows=record["rows"],
        recipes=record["recipes"],
        pilot_noise=record["recipes"][0]["noise"],
        seeds=record["seeds"],
        validation_scenes=record["validation_scenes"],
        sizes=list(record["config"]["validation_scenes"]),
        confidence=record["confidence"],
        target=record["target"],
        validation_seconds_per_scene=record["validation_seconds_per_scene"],
        # A plan recorded before the scene-only floor names none, and recomputes with its own rule.
        variance_floor=record.get("variance_floor", "half scene"),
        # A plan recorded before the undecidable-design rule names no minimum, nor its rows' variance parts.
        min_scenes_to_decide=record.get("min_scenes_to_decide"),
        # A plan recorded before the levers weighs none.
        levers=record.get("levers") is not None,
    )


def check_record(directory: str | os.PathLike) -> dict:
    """Recompute a plan record's predictions from its components; raise at the first disagreement.

    Checks: the receipt and the files it binds; the config (validated again) and the record's
    digest of it, the design and the records it read; every design's predictions, its cost and
    the cheapest design that reaches the target, from the recorded components and costs. The
    components themselves are compared with the pilot and tuning records where a study binds the
    plan (``qhlab.study.preparation``).

    Returns:
        ``{"designs", "chosen"}``.

    Raises:
        DigestMismatchError: a recomputed value differs from the recorded one.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy (the study config's readers).
    from qhlab.design.plan_config import QhPlanConfig

    first = read_record(directory)
    sources = (first["pilot"]["record_sha256"], None if first["tuning"] is None else first["tuning"]["record_sha256"])
    record, _, where, _ = opened_record(
        directory,
        read_record,
        (PlanReceipt, RECEIPT),
        RECORD,
        QhPlanConfig,
        lambda config, design: plan_digest(config, design, *sources),
    )
    if record["target"] != record["config"]["target"]:
        raise DigestMismatchError(f"{where}: its target is not its config's.")
    # Lazy: as the statistics below. Recomputed with another minimum, a forged choice of a design
    # that cannot decide would agree with itself.
    from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE

    if record.get("min_scenes_to_decide") not in (None, MIN_SCENES_TO_DECIDE):
        raise DigestMismatchError(
            f"{where}: its min_scenes_to_decide={record['min_scenes_to_decide']!r} is not MIN_SCENES_TO_DECIDE="
            f"{MIN_SCENES_TO_DECIDE}."
        )
    try:
        again = recomputed(record)
    except (ValueError, KeyError, TypeError, StopIteration) as exc:
        raise DigestMismatchError(f"{where}: its components do not make a plan ({exc}).") from None
    for key in ("designs", "planned", "chosen", *(("levers",) if "levers" in again else ())):
        if not close_values(again[key], record[key]):
            raise DigestMismatchError(f"{where}: the recorded {key} is not what its components give.")
    return {"designs": len(record["designs"]), "chosen": record["chosen"]}


def _describe(directory: Path, entry: dict) -> str:
    """``qhlab verify``'s line for a recomputed plan record."""
    chosen = "none reaches the target" if entry["chosen"] is None else f"design {entry['chosen'] + 1} chosen"
    return f"plan: {directory}: {entry['designs']} designs' predicted MDEs and costs recomputed ({chosen})"


register_check(PlanReceipt, file=RECEIPT, check=check_record, describe=_describe)
