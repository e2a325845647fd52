"""The tuning record: ``tuning.json``, ``recipe.toml`` and the receipt that binds them, and its checks.

Owns: the tuning directory's file names, the record's layout (the config, every trial's
parameters, state, metrics and fit evidence digests, the rule, the winner and every
population's identity), emitting the winning recipe as a recipe file, reading a record back
(``read_record``: authenticated), and ``check_record``, which recomputes every trial's score
and the winner from the record and, where the trials' fits are present, every metric from its
fit's evaluation receipt. Everything here but ``publish_record`` is torch-free, so
``qhlab verify`` runs it. Does not own: running trials (``run``) or the rule's arithmetic
(``rule``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from qhlab.design.preparation_record import (
    BACKEND_FIELDS,
    FitEvidence,
    Number,
    PopulationIdentity,
    ToolBody,
    absent_note,
    check_config_copy,
    close_values,
    read_record_file,
    recipe_differences,
    recorded_fit,
)
from qhlab.design.tuning_rule import pick_winner, planned_mde, prune_at, running_means, trial_score
from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    input_error,
    publish_bytes,
    publish_json,
    sha256_file,
    write_receipt,
)
from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt, register_check
from qhlab.evidence.layout import (
    PREPARATION_FITS_DIR,
    RECORD_CONFIG_COPY,
    TUNING_RECEIPT,
    TUNING_RECIPE,
    TUNING_RECORD,
    TUNING_TRIALS_DB,
)
from qhlab.scenes.manifest import generator_identity, read_manifest
from qhlab.scenes.seals import seals_of
from qhlab.training.console import console_verbose

__all__ = [
    "CONFIG_COPY",
    "FITS_DIR",
    "RECEIPT",
    "RECIPE",
    "RECORD",
    "TRIALS_DB",
    "TuningReceipt",
    "TuningRecord",
    "check_record",
    "population_record",
    "publish_record",
    "read_record",
    "refuse_sealed_validation",
]

RECORD = TUNING_RECORD
RECEIPT = TUNING_RECEIPT
RECIPE = TUNING_RECIPE
CONFIG_COPY = RECORD_CONFIG_COPY
TRIALS_DB = TUNING_TRIALS_DB
FITS_DIR = PREPARATION_FITS_DIR
RULE_TEXT = (
    "admissible: complete trials (run within max_cost) whose seed sd is within max_seed_sd; the best is "
    "the lowest mean metric over the fit seeds (for metric mde: the lowest of each trial's largest planned "
    "MDE over the study's retention margins); trials within band of it are tied and the tie goes to "
    "the lowest cost (updates x ensemble members), then the lowest score, then the lowest trial number"
)


class TuningBody(ToolBody):
    """A tuning's record (the trials and the rule live in ``tuning.json``, which it binds).

    Attributes:
        name: the tuning. config_sha256: its config. trials: how many. winner: the winning
        trial's number (None when no trial is admissible).
    """

    trials: int
    winner: int | None


class TuningReceipt(Receipt, kind="tuning", version=1):
    """``tuning.receipt.json``."""

    body: TuningBody


Scalar = bool | int | float | str


class TuningFit(FitEvidence):
    """One fit of a trial: its seed and its metrics at H on the tuning validation population; for an
    "mde" objective also its arm and its per-scene values at H (``{"regret": [...], "mae": [...]}``)."""

    seed: int
    regret: Number
    mae: Number
    arm: str | None = None
    scenes: dict[Literal["regret", "mae"], list[Number]] | None = None


class TuningTrial(Closed):
    """One trial as the record holds it.

    Attributes:
        number: its number (from 0). batch: the batch it ran in. params: its parameters by
        dotted recipe field. cost: updates x ensemble members. state: ``complete`` or ``pruned``.
        reason: why it was pruned (None for a complete one). fits: its fits, in seed order.
        mean, seed_sd: its score (None for a pruned one; for an "mde" objective ``mean`` is its
        largest planned MDE). intermediate: the running means at the pruner's rungs (only with a
        pruner). margins: an "mde" trial's planned MDE of each retention margin.
    """

    number: int
    batch: int
    params: dict[str, Scalar]
    cost: int
    state: Literal["complete", "pruned"]
    reason: str | None
    fits: list[TuningFit]
    mean: Number | None
    seed_sd: Number | None
    intermediate: dict[str, Number] | None = None
    margins: list[Json] | None = None


class TuningWinner(Closed):
    """The rule's winner: its number (None when no trial is admissible), the admissible and tied
    trials, its margin over the rest, and its parameters, mean and recipe."""

    number: int | None
    admissible: list[int]
    tied: list[int]
    margin: Number | None
    params: dict[str, Scalar] | None
    mean: Number | None
    recipe: Json | None


class TuningOptuna(Closed):
    """How Optuna suggested the trials: its version, sampler and seed, batch and storage."""

    version: str
    sampler: str
    sampler_seed: int
    batch: int
    storage: str
    suggestion: str


class TuningRecord(Closed):
    """``tuning.json``: a tuning's config, every trial, the rule and its winner.

    Attributes:
        kind: always ``tuning_record``. name: the tuning. config: its config as validated.
        config_sha256: its digest. base_recipe: the recipe the space varies. populations: the
        tuning TRAIN and validation, by identity. objective: the metric, seeds and rule settings.
        rule: the winner rule in words. deviations: the recipe fields a study may set otherwise.
        optuna: how trials were suggested. trials: every trial, in number order. winner: the rule's.
        design: for an "mde" objective, the study design its MDEs are planned for
        (``tuning_config.power_design``).
    """

    kind: Literal["tuning_record"]
    name: str
    config: Json
    config_sha256: str = Field(pattern=SHA256)
    base_recipe: Json
    populations: dict[str, PopulationIdentity]
    objective: Json
    rule: str
    deviations: list[str]
    optuna: TuningOptuna
    trials: list[TuningTrial]
    winner: TuningWinner
    design: Json | None = None


def population_record(path: Path) -> dict:
    """A population's identity as the record holds it: path, manifest digest, declared generator
    and its identity (``generator_identity``: what a study compares its own populations with), and
    the content digest of every scene (a study compares them with its own validation's)."""
    # Lazy: keeps importing this module free of pyarrow and numpy.
    from qhlab.scenes.population import scene_content_digests

    manifest = read_manifest(path)
    generator = manifest.get("generator") or {}
    return {
        "path": str(path),
        "manifest_sha256": sha256_file(path / "manifest.json"),
        "preset": generator.get("preset"),
        "split": generator.get("split"),
        "seed": generator.get("seed"),
        "generator_sha256": generator_identity(generator),
        "scene_digests": sorted(set(scene_content_digests(path).values())),
    }


def refuse_sealed_validation(call: str, population: Path, cache: str | os.PathLike) -> None:
    """Refuse a tuning validation population that a study has sealed as its validation."""
    seals = seals_of(population, (cache,))
    if seals:
        studies = ", ".join(sorted({str(s["study"]) for s in seals}))
        raise input_error(
            call,
            "validation",
            str(population),
            "a population no study has sealed as its validation",
            f"study {studies} holds it out (its seal is in the population cache's .sealed-validations/);"
            " tune on another validation seed of the preset",
        )


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    return value


def _recipe_file(recipe: dict, number: int) -> bytes:
    import tomli_w

    header = (
        f"# Emitted by qhlab tune: the winning recipe of trial {number + 1} ({RECORD}). Not edited by hand:\n"
        "# a study that names this tuning's record is frozen only with this recipe (or its declared\n"
        "# deviations).\n"
    )
    return (header + tomli_w.dumps(recipe)).encode("utf-8")


def publish_record(
    directory: Path,
    *,
    config: Any,
    config_sha256: str,
    base: dict,
    entries: list[dict],
    populations: dict,
    recipe_of: Callable[[dict], Any],
    design: dict | None = None,
) -> dict:
    """Publish ``tuning.json``, ``recipe.toml`` (when a trial is admissible) and the receipt binding them.

    A run killed between these files is completed by the next run: a file already published
    must hold exactly the bytes this run would write (it is rebuilt from the same trials), else
    the run refuses.
    """
    import optuna

    objective = config.objective
    winner = pick_winner(entries, band=objective.band, max_seed_sd=objective.max_seed_sd)
    recipe = None
    if winner["number"] is not None:
        applied = recipe_of(entries[winner["number"]]["params"])
        recipe = _strip_none({k: v for k, v in applied.model_dump(mode="json").items() if k not in BACKEND_FIELDS})
    record = {
        "kind": "tuning_record",
        "name": config.name,
        "config": config.record(),
        "config_sha256": config_sha256,
        "base_recipe": base,
        "populations": populations,
        "objective": objective.model_dump(mode="json"),
        "rule": RULE_TEXT,
        "deviations": list(config.deviations),
        "optuna": {
            "version": optuna.__version__,
            "sampler": config.sampler,
            "sampler_seed": config.sampler_seed,
            "batch": config.batch,
            "storage": TRIALS_DB,
            "suggestion": (
                "trial n takes the n-th combination of the choices (fields sorted, the last varying fastest)"
                if config.sampler == "grid"
                else "each trial by a sampler seeded with sha256(sampler_seed:number), from the "
                "finished trials of earlier batches"
            ),
        },
        "trials": entries,
        "winner": {
            **winner,
            "params": None if recipe is None else entries[winner["number"]]["params"],
            "mean": None if recipe is None else entries[winner["number"]]["mean"],
            "recipe": recipe,
        },
        **({} if design is None else {"design": design}),
    }
    outputs = {"record": directory / RECORD}
    _publish_same(directory / RECORD, lambda p: publish_json(p, record))
    if recipe is not None:
        data = _recipe_file(recipe, winner["number"])
        _publish_same(directory / RECIPE, lambda p: publish_bytes(p, data))
        outputs["recipe"] = directory / RECIPE
    write_receipt(
        directory / RECEIPT,
        TuningReceipt,
        body={"name": config.name, "config_sha256": config_sha256, **_summary(record)},
        inputs={"config": directory / CONFIG_COPY},
        outputs=outputs,
    )
    return record


def _publish_same(path: Path, publish: Callable[[Path], Any]) -> None:
    """Publish ``path``, or accept it in place when an interrupted run published the same bytes."""
    if not path.exists():
        publish(path)
        return
    staged = path.parent / f".{path.name}.check"
    staged.unlink(missing_ok=True)
    try:
        publish(staged)
        if sha256_file(staged) != sha256_file(path):
            raise EvidenceError(
                f"qhlab tune: {path} exists with other bytes than this tuning's record; it was not "
                "overwritten. HINT: a record is write-once; use another --output."
            )
    finally:
        staged.unlink(missing_ok=True)


def read_record(directory: str | os.PathLike) -> dict:
    """The record of a tuning directory, authenticated by its receipt (and the files it binds).

    Raises:
        MissingEvidenceError: no ``tuning.receipt.json``.
        EvidenceError: the receipt or a bound file fails.
        SchemaMismatchError: ``tuning.json`` is not in ``TuningRecord``'s layout.
        DigestMismatchError: the receipt's body summarises another record.
    """
    return read_record_file(directory, RECORD, RECEIPT, TuningReceipt, TuningRecord, summary=_summary)[0]


def _summary(record: dict) -> dict:
    """What a tuning receipt's body says of its record: its count of trials and the winner's number."""
    return {"trials": len(record["trials"]), "winner": record["winner"]["number"]}


def _at(mapping: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return _MISSING
        mapping = mapping[part]
    return mapping


_MISSING = object()


def check_record(directory: str | os.PathLike) -> dict:
    """Recompute a tuning record from its evidence; raise at the first disagreement.

    Checks, in order: the receipt and the files it binds; every complete trial's mean and seed sd
    from its fits' values (``rule.trial_score``); every trial pruned before it ran, its cost against
    ``max_cost``; with a pruner, every trial's intermediate values (``rule.running_means``) and the
    pruner's decision at each rung it reached (``rule.prune_at``, from the complete trials of
    earlier batches); the winner from the rule (``rule.pick_winner``); ``recipe.toml`` against the
    record's winning recipe and parameters; and, for each fit whose directory is present below the
    tuning directory, its metric values and receipt digests against its evaluation and fit receipts.

    Returns:
        ``{"trials", "winner", "fits_recomputed", "fits_absent"}``.

    Raises:
        DigestMismatchError: a recomputed value differs from the recorded one.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of Optuna.
    from qhlab.design.tuning_config import QhTuningConfig, tuning_document

    directory = Path(directory)
    record = read_record(directory)
    where = f"qhlab verify: {directory / RECORD}"
    check_config_copy(directory, record["config"], QhTuningConfig, where, prepare=tuning_document)
    if record["objective"] != record["config"].get("objective"):
        raise DigestMismatchError(f"{where}: its objective is not its config's objective.")
    objective, trials = record["objective"], record["trials"]
    pruner = record["config"].get("pruner")
    recomputed = absent = 0
    for position, trial in enumerate(trials):
        if trial["number"] != position:
            raise DigestMismatchError(f"{where}: trial {position + 1} is numbered {trial['number'] + 1}.")
        max_cost = objective.get("max_cost")
        if trial["state"] == "pruned" and not trial["fits"]:
            if max_cost is None or trial["cost"] <= max_cost:
                raise DigestMismatchError(
                    f"{where}: trial {position + 1} is pruned at cost {trial['cost']} within max_cost {max_cost}."
                )
            continue
        design = record.get("design")
        arms = [None] if design is None else design["arms"]
        made = len(trial["fits"]) if trial["state"] == "pruned" else len(objective["seeds"]) * len(arms)
        wanted = [(a, s) for s in objective["seeds"] for a in arms][:made]
        if [(f.get("arm"), f["seed"]) for f in trial["fits"]] != wanted:
            raise DigestMismatchError(
                f"{where}: trial {position + 1} fits {[(f.get('arm'), f['seed']) for f in trial['fits']]}, "
                f"not the objective's {wanted}."
            )
        if design is not None:
            if trial["state"] == "complete":
                _check_planned(where, trial, design)
            for fit in trial["fits"]:
                if _check_fit(directory, where, position, fit, _trial_recipe(record, trial, fit["seed"], fit["arm"])):
                    recomputed += 1
                else:
                    absent += 1
            continue
        values = [f[objective["metric"]] for f in trial["fits"]]
        if trial["state"] == "complete":
            score = trial_score(values)
            if score != {"mean": trial["mean"], "seed_sd": trial["seed_sd"]}:
                raise DigestMismatchError(
                    f"{where}: trial {position + 1} records mean {trial['mean']!r}, seed sd "
                    f"{trial['seed_sd']!r}; its fits give {score['mean']!r}, "
                    f"{score['seed_sd']!r}."
                )
        _check_pruning(where, trial, trials, values, pruner)
        for fit in trial["fits"]:
            if _check_fit(directory, where, position, fit, _trial_recipe(record, trial, fit["seed"])):
                recomputed += 1
            else:
                absent += 1
    winner = pick_winner(trials, band=objective["band"], max_seed_sd=objective.get("max_seed_sd"))
    recorded = {k: record["winner"].get(k) for k in winner}
    if recorded != winner:
        raise DigestMismatchError(f"{where}: the recorded winner {recorded} is not the rule's {winner}.")
    _check_recipe(directory, where, record)
    return {"trials": len(trials), "winner": winner["number"], "fits_recomputed": recomputed, "fits_absent": absent}


def _check_planned(where: str, trial: dict, design: dict) -> None:
    """An "mde" trial's margins and score, recomputed from its fits' per-scene values."""
    try:
        score = planned_mde(trial["fits"], design)
    except (ValueError, KeyError, TypeError) as exc:
        raise DigestMismatchError(
            f"{where}: trial {trial['number'] + 1}'s fits do not make the design's margins ({exc})."
        ) from None
    recorded = {k: trial.get(k) for k in ("mean", "seed_sd", "margins")}
    if not close_values(recorded, score):
        raise DigestMismatchError(
            f"{where}: trial {trial['number'] + 1}'s recorded margins and planned MDE ({trial['mean']!r}) are not what "
            f"its fits give (largest planned MDE {score['mean']!r}, margins {score['margins']!r})."
        )


def _check_pruning(where: str, trial: dict, trials: list[dict], values: list[float], pruner: dict | None) -> None:
    """Recompute a trial's intermediate values and the pruner's decision at each rung it reached:
    a pruned trial was stopped at its last rung and not before, a complete one never."""
    number = trial["number"]
    if pruner is None:
        if trial["state"] == "pruned":
            raise DigestMismatchError(
                f"{where}: trial {number + 1} is pruned after {len(values)} fits, but the config declares no pruner."
            )
        return
    # Lazy: keeps importing this module (and so `qhlab verify`) free of optuna until a pruner is checked.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if console_verbose() else optuna.logging.WARNING)
    running = running_means(values, pruner["rungs"])
    if trial.get("intermediate") != running:
        raise DigestMismatchError(
            f"{where}: trial {number + 1} records intermediate values "
            f"{trial.get('intermediate')!r}; its fits give {running!r}."
        )
    earlier = [t for t in trials if t["batch"] < trial["batch"] and t["state"] == "complete"]
    stopped = len(values) if trial["state"] == "pruned" else None
    for rung in (r for r in pruner["rungs"] if r <= len(values)):
        if prune_at(pruner, earlier, running, rung) != (rung == stopped):
            raise DigestMismatchError(
                f"{where}: trial {number + 1} is {'pruned' if stopped else 'complete'} after {len(values)} fits, but "
                f"the {pruner['kind']} pruner {'stops' if rung != stopped else 'does not stop'} it after {rung} "
                "(from the complete trials of earlier batches)."
            )
    if stopped is not None and stopped not in pruner["rungs"]:
        raise DigestMismatchError(
            f"{where}: trial {number + 1} is pruned after {stopped} fits, not at a rung {pruner['rungs']}."
        )


def _trial_recipe(record: dict, trial: dict, seed: int, arm: str | None = None) -> dict:
    """The recipe a trial's fit of ``seed`` (and, for an "mde" objective, ``arm``) must have run: the
    record's base recipe with the trial's parameters set (``tuning_config.trial_recipe``, or
    ``arm_recipe`` with the design's architecture of the arm, from what the record binds)."""
    # Lazy: keeps importing this module (and so `qhlab verify`) free of the recipe's validators.
    from qhlab.design.tuning_config import QhTuningConfig, arm_recipe, trial_recipe

    config = QhTuningConfig.model_validate(record["config"])
    if arm is None:
        return trial_recipe(config, trial["params"], seed=seed, base=record["base_recipe"]).model_dump(mode="json")
    architecture = record["design"]["architectures"][arm]
    return arm_recipe(
        config, trial["params"], seed=seed, base=record["base_recipe"], architecture=architecture
    ).model_dump(mode="json")


def _check_fit(directory: Path, where: str, number: int, fit: dict, recipe: dict) -> bool:
    """Compare one fit's recorded values and recipe with its receipts; False when its directory is
    absent. ``recipe``: the trial's recipe for the fit's seed (its parameters applied)."""
    attempt = directory / fit["directory"]
    if not attempt.is_dir():
        return False
    fitted, body = (r.body for r in recorded_fit(where, attempt, fit, f"trial {number + 1} fit {fit['directory']}"))
    differing = recipe_differences(recipe, fitted)
    if differing or fitted.seed != fit["seed"]:
        raise DigestMismatchError(
            f"{where}: trial {number + 1} fit {fit['directory']} did not run the trial's parameters: its fit "
            f"receipt's recipe differs in {differing or ['seed']}."
        )
    for metric, field in (("regret", "regret_primary"), ("mae", "mae_primary")):
        if getattr(body, field) != fit[metric]:
            raise DigestMismatchError(
                f"{where}: trial {number + 1} fit {fit['directory']} records {metric} "
                f"{fit[metric]!r}; its evaluation receipt says {getattr(body, field)!r}."
            )
        if fit.get("scenes") is not None and [row[-1] for row in body.per_scene[metric]] != fit["scenes"][metric]:
            raise DigestMismatchError(
                f"{where}: trial {number + 1} fit {fit['directory']} records other per-scene {metric} values than "
                "its evaluation receipt."
            )
    return True


def _check_recipe(directory: Path, where: str, record: dict) -> None:
    winner = record["winner"]
    path = directory / RECIPE
    if winner["number"] is None:
        if path.exists():
            raise DigestMismatchError(f"{where}: no trial is admissible, yet {path} exists.")
        return
    try:
        emitted = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EvidenceError(f"{where}: {path} is not a readable recipe ({exc}).") from None
    if emitted != winner["recipe"]:
        raise DigestMismatchError(f"{where}: {path} is not the winning recipe the record holds.")
    params = record["trials"][winner["number"]]["params"]
    if winner["params"] != params or any(_at(emitted, k) != v for k, v in params.items()):
        raise DigestMismatchError(
            f"{where}: the winning recipe does not carry trial {winner['number'] + 1}'s parameters."
        )


def _describe(directory: Path, entry: dict) -> str:
    """``qhlab verify``'s line for a recomputed tuning record."""
    winner = "none" if entry["winner"] is None else entry["winner"] + 1
    absent = absent_note(entry["fits_absent"], "fits")
    return (
        f"tuning: {directory}: {entry['trials']} trials' scores and the winner (trial {winner}) recomputed by the "
        f"rule; {entry['fits_recomputed']} fits' metrics recomputed from their evaluation receipts{absent}"
    )


register_check(TuningReceipt, file=RECEIPT, check=check_record, describe=_describe)
