"""The pilot record: ``pilot.json`` and the receipt that binds it, and its checks.

Owns: the pilot directory's file names, the record's layout (the config, the study design it
measured, every population's identity, every fit's per-scene metrics at H with its evidence
digests, every comparison's and margin's fit-noise components, which a study's intervals carry one by one),
reading a record back (``read_record``: authenticated) and ``check_record``, which recomputes
every component from the record's per-scene values and, where the fits are present, every value
from its fit's evaluation receipt. Torch-free, so ``qhlab verify`` runs it. Does not own:
running the fits (``run``) or the arithmetic (``variance``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from qhlab.design.preparation_record import (
    FitEvidence,
    Number,
    PopulationIdentity,
    StudyReference,
    ToolBody,
    ToolRecordFiles,
    absent_note,
    close_values,
    opened_record,
    recipe_differences,
    recorded_fit,
)
from qhlab.evidence import DigestMismatchError
from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt, register_check
from qhlab.evidence.layout import PILOT_RECEIPT, PILOT_RECORD, PREPARATION_FITS_DIR, RECORD_CONFIG_COPY

__all__ = [
    "CONFIG_COPY",
    "FITS_DIR",
    "RECEIPT",
    "RECORD",
    "FitNoiseRecord",
    "PilotReceipt",
    "PilotRecord",
    "check_record",
    "components_of",
    "fits_words",
    "publish_record",
    "read_record",
]

RECORD = PILOT_RECORD
RECEIPT = PILOT_RECEIPT
CONFIG_COPY = RECORD_CONFIG_COPY
FITS_DIR = PREPARATION_FITS_DIR


def fits_words(fits: int, seeds: int, draws: int) -> str:
    """A pilot's fits in words, as every place that says them counts them: a fit is one arm trained
    with one seed on one TRAIN draw, so a pilot fits every arm once per seed.

    Args:
        fits: the pilot's fits (its record's ``fits``).
        seeds: its training seeds, over all draws (each seed is fitted on one draw only).
        draws: its TRAIN draws.

    Returns:
        e.g. ``"18 fits (3 arms x 6 seeds, each seed on one of 3 TRAIN draws)"``.
    """
    arms = fits // seeds if seeds else 0
    where = "on one TRAIN draw" if draws == 1 else f"each seed on one of {draws} TRAIN draws"
    return f"{fits} fits ({arms} arm{'s' if arms != 1 else ''} x {seeds} seeds, {where})"


class PilotBody(ToolBody):
    """A pilot's record (its fits and variance components live in ``pilot.json``, which it binds).

    Attributes:
        name: the pilot. config_sha256: its config and the study design. fits: how many.
        draws: the TRAIN draws they were fitted on. components: how many comparisons and margins.
    """

    fits: int
    draws: int
    components: int


class PilotReceipt(Receipt, kind="pilot", version=2):
    """``pilot.receipt.json``."""

    body: PilotBody


class PilotFit(FitEvidence):
    """One pilot fit: its arm, TRAIN draw and seed, and its metrics at H per scene and their means."""

    arm: str
    draw: int
    seed: int
    regret: list[Number]
    mae: list[Number]
    regret_mean: Number
    mae_mean: Number


class FitNoiseRecord(Closed):
    """One comparison's fit noise for one metric (``qhlab.statistics.variance.FitNoise.as_dict``).

    Its ``fits`` counts the comparison's (draw, seed) pairs, one per seed: each pair is one fit of
    every arm the comparison pairs, so it is the seeds the components were measured on, not the
    pilot's fits (``fits_words``).
    """

    fits: int
    draws: int
    n_scenes: int
    ms_within: Number
    dof_within: int
    ms_between: Number | None
    dof_between: int
    n0: Number | None
    residual: Number
    residual_dof: int
    scene_variance: Number
    tau: Number
    omega: Number | None


class NoisePair(Closed):
    """A comparison's fit noise for each metric at H."""

    regret: FitNoiseRecord
    mae: FitNoiseRecord


class PilotComparison(Closed):
    """One paired comparison's fit-noise components (seed and, with draws, TRAIN draw)."""

    arm: str
    against: str
    relation: str
    noise: NoisePair


class PilotMargin(Closed):
    """One variant's retention margins' components (``regret``: D_reg's, ``mae``: D_mae's)."""

    variant: str
    noise: NoisePair


class PilotDraw(Closed):
    """One TRAIN draw of the pilot and the seeds fitted on it (each seed on one draw only)."""

    draw: int
    seeds: list[int]


class PilotVariant(Closed):
    """A variant of the design with its structural and matched controls."""

    arm: str
    control: str
    matched: str


class PilotDesign(Closed):
    """The study design a pilot measured: arms, comparisons, variants, thresholds, lane and recipes."""

    arms: list[str]
    broad_updates: int
    comparisons: list[list[str]]
    variants: list[PilotVariant]
    regret_fraction: Number
    mae_fraction: Number
    profile: str
    recipes: dict[str, Json]


class PilotRecord(Closed):
    """``pilot.json``: a pilot's config, the design it measured, its fits and their components.

    Attributes:
        kind: always ``pilot_record``. name, config, config_sha256: the pilot and its config.
        study: the study it serves. design: that study's design. horizon: H. populations: every
        population it fitted on or scored, by identity. layout: the TRAIN draws and the seeds
        fitted on each. fits: every fit. comparisons, margins: their fit-noise components.
        estimators: how each was estimated.
    """

    kind: Literal["pilot_record"]
    name: str
    config: Json
    config_sha256: str = Field(pattern=SHA256)
    study: StudyReference
    design: PilotDesign
    horizon: int
    populations: dict[str, PopulationIdentity]
    layout: list[PilotDraw]
    fits: list[PilotFit]
    comparisons: list[PilotComparison]
    margins: list[PilotMargin]
    estimators: dict[str, str]


def components_of(design: dict, fits: list[dict], *, layout: list[tuple[int, list[int]]]) -> dict:
    """``variance.pilot_components`` of a record's fits under the study design they were made for.

    Args:
        design: the study design the fits were made for.
        fits: the record's fits (arm, draw, seed and per-scene values).
        layout: every (draw, seeds) of the pilot.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    from qhlab.statistics.variance import pilot_components

    values = {(f["arm"], f["draw"], f["seed"]): {"regret": f["regret"], "mae": f["mae"]} for f in fits}
    return pilot_components(
        values,
        arms=design["arms"],
        comparisons=[tuple(c) for c in design["comparisons"]],
        variants=design["variants"],
        regret_fraction=design["regret_fraction"],
        mae_fraction=design["mae_fraction"],
        fits=[(draw, seed) for draw, seeds in layout for seed in seeds],
    )


def _counts(record: dict) -> dict:
    """What a pilot receipt's body says of its record: its counts."""
    components = len(record["comparisons"]) + len(record["margins"])
    return {"fits": len(record["fits"]), "draws": len(record["layout"]), "components": components}


_FILES = ToolRecordFiles(RECORD, RECEIPT, PilotReceipt, PilotRecord, _counts)

# This record's ``publish_record(directory, record)`` and ``read_record(directory)``.
publish_record = _FILES.publish
read_record = _FILES.read_record


def check_record(directory: str | os.PathLike) -> dict:
    """Recompute a pilot record from its evidence; raise at the first disagreement.

    Checks: the receipt and the files it binds; the config (validated again) and the record's
    digest of it and of the design; that the fits are exactly the ones the config asks for
    (every arm on every draw and seed, once); every comparison's and margin's fit-noise
    components from the fits' per-scene values (``variance.pilot_components``);
    and, for each fit whose directory is present below the pilot directory, its receipts'
    digests, its per-scene values, and that it fitted the design's recipe for its arm with its
    seed and profile on the record's populations.

    Returns:
        ``{"fits", "comparisons", "fits_recomputed", "fits_absent"}``.

    Raises:
        DigestMismatchError: a variance component or maximum recomputed from the fits, or a fit's values,
            recipe, seed, lane or populations, differs from the record's.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    from qhlab.design.pilot_config import QhPilotConfig, pilot_digest

    directory = Path(directory)
    record, receipt, where, config = opened_record(
        directory, read_record, (PilotReceipt, RECEIPT), RECORD, QhPilotConfig, pilot_digest
    )
    design = record["design"]
    main = config.train.seed
    layout = [(draw, list(seeds)) for draw, seeds in config.layout]
    if [(d["draw"], d["seeds"]) for d in record["layout"]] != layout:
        raise DigestMismatchError(f"{where}: records draws and seeds {record['layout']}, not its config's {layout}.")
    wanted = sorted((a, d, s) for a in design["arms"] for d, ss in layout for s in ss)
    found = sorted((f["arm"], f["draw"], f["seed"]) for f in record["fits"])
    if found != wanted or receipt.fits != len(found):
        raise DigestMismatchError(
            f"{where}: holds {len(found)} fits {found[:3]}..., not the design's {len(wanted)} "
            "(every arm on every draw and seed, once)."
        )
    try:
        recomputed = components_of(design, record["fits"], layout=layout)
    except (ValueError, KeyError, TypeError) as exc:
        raise DigestMismatchError(f"{where}: its fits' values do not make a variance table ({exc}).") from None
    for key in ("comparisons", "margins"):
        if not close_values(recomputed[key], record[key]):
            raise DigestMismatchError(f"{where}: the recorded {key} is not what its fits give ({recomputed[key]!r}).")
    present = absent = 0
    for fit in record["fits"]:
        attempt = directory / fit["directory"]
        if not attempt.is_dir():
            absent += 1
            continue
        _check_fit(where, attempt, fit, record, main)
        present += 1
    return {
        "fits": len(record["fits"]),
        "comparisons": len(record["comparisons"]) + len(record["margins"]),
        "fits_recomputed": present,
        "fits_absent": absent,
    }


def _check_fit(where: str, attempt: Path, fit: dict, record: dict, main_draw: int) -> None:
    """One present fit against the record: its receipts, values, recipe, seed, lane and populations."""
    fitted, evaluation = recorded_fit(where, attempt, fit, f"fit {fit['directory']}")
    evaluation, body = evaluation.body, fitted.body
    for metric in ("regret", "mae"):
        if [row[-1] for row in evaluation.per_scene[metric]] != fit[metric]:
            raise DigestMismatchError(
                f"{where}: fit {fit['directory']} records other per-scene {metric} values than its evaluation receipt."
            )
    design = record["design"]
    differing = recipe_differences(design["recipes"][fit["arm"]], body)
    role = "train" if fit["draw"] == main_draw else f"draw {fit['draw']}"
    problems = [f"recipe fields {differing}"] if differing else []
    if body.seed != fit["seed"]:
        problems.append(f"seed {body.seed}")
    if body.profile != design["profile"]:
        problems.append(f"profile {body.profile}")
    for name, population in (("train_manifest", role), ("validation_manifest", "validation")):
        bound = fitted.inputs.get(name)
        if bound is None or bound.sha256 != record["populations"][population]["manifest_sha256"]:
            problems.append(f"{name} (not the {population} population's)")
    if problems:
        raise DigestMismatchError(
            f"{where}: fit {fit['directory']} is not the design's {fit['arm']} fit of seed "
            f"{fit['seed']} on draw {fit['draw']}: its receipt has {', '.join(problems)}."
        )


def _describe(directory: Path, entry: dict) -> str:
    """``qhlab verify``'s line for a recomputed pilot record."""
    absent = absent_note(entry["fits_absent"], "fits")
    return (
        f"pilot: {directory}: {entry['comparisons']} comparisons' and margins' fit-noise components "
        f"recomputed from {entry['fits']} fits' per-scene values; {entry['fits_recomputed']} fits' values "
        f"recomputed from their evaluation receipts{absent}"
    )


register_check(PilotReceipt, file=RECEIPT, check=check_record, describe=_describe)
