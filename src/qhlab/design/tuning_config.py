"""The tuning config: what ``qhlab tune`` searches, on which population, and by which rule.

Owns: ``QhTuningConfig`` and its parts (the search space, the objective and its winner rule's
settings), reading a tuning TOML (``read_tuning_config``: every invalid field listed in one
error, before anything is written), and applying a trial's parameters to the base recipe
(``trial_recipe``). Does not own: the recipe model (``qhlab.finite_horizon.recipe``), the
population sources (the study config's ``PopulationSource``), the winner rule's arithmetic
(``rule``) or running trials (``run``).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from qhlab.design.config_files import (
    FROZEN,
    ConfigForm,
    ConfigName,
    PlainNumber,
    PlainNumeric,
    StrictInt,
    ToolExecution,
    TorchThreads,
    read_toml,
)
from qhlab.design.study_config import (
    STUDY_PRESET_FIELDS,
    PopulationSource,
    ProfileName,
    declared_scenes,
    read_study_config,
)
from qhlab.evidence import QhInputError, distinct_seeds, invalid_fields
from qhlab.finite_horizon.recipe import TrainingSeed, validate_recipe
from qhlab.training.console import console_verbose

__all__ = [
    "SAMPLERS",
    "Domain",
    "Objective",
    "Pruner",
    "QhTuningConfig",
    "arm_recipe",
    "optuna_distributions",
    "power_design",
    "quiet_optuna",
    "read_tuning_config",
    "trial_recipe",
    "tuning_document",
]

TUNE_CALL = "qhlab tune"
# Samplers that are reproducible from a seed and the completed trials alone: Optuna's TPE and random
# samplers (each trial's suggestion is drawn by a sampler made for that trial: see ``run``), and
# "grid", every combination of the choices once, trial n taking the n-th in a fixed order.
SAMPLERS = ("tpe", "random", "grid")
# Recipe fields a search may never vary, and why (a refusal says the reason).
_FIXED_FIELDS = {
    "seed": "the objective's fit seeds are the seeds; a seed search is not tuning",
    "name": "a label, not a setting",
    "horizon": "the population's H decides it",
    "data": "the tuning population is [train] and [validation]",
    "accelerator": "a backend field: the execution profile sets it",
    "devices": "a backend field: the execution profile sets it",
    "precision": "a backend field: the execution profile sets it",
    "evaluation.tie_band": "it defines the metric, which must not move between trials",
    "architecture.arm": "comparing arms is a study's question, not a recipe's",
    "architecture.builder": "comparing arms is a study's question, not a recipe's",
    "architecture.source_sha256": "bound from the arm's source, never chosen",
}
_DOMAIN_KEYS = {"choices", "low", "high", "log", "step"}


class Domain(BaseModel):
    """One recipe field's domain: a list of choices, or an int or float range.

    A range is of integers when ``low`` and ``high`` are both TOML integers (and ``step``, if
    given), else of floats. ``log`` samples a range on a log scale (``low > 0``).

    Attributes:
        choices: the allowed values (at least two distinct).
        low: the range's lowest value (inclusive).
        high: the range's highest value (inclusive), above ``low``.
        log: sample the range log-uniformly.
        step: the range's grid spacing (no ``log`` with it).
    """

    model_config = FROZEN

    choices: tuple[Any, ...] | None = None
    low: PlainNumeric | None = None
    high: PlainNumeric | None = None
    log: bool = False
    step: PlainNumeric | None = None

    @model_validator(mode="after")
    def _shape(self) -> Domain:
        if self.choices is not None:
            if any(v is not None for v in (self.low, self.high, self.step)) or self.log:
                raise ValueError(
                    "choices together with low/high/log/step is not allowed; allowed: either choices, "
                    "or a range (low, high, optional log or step)"
                )
            if len(self.choices) < 2 or len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError(
                    f"choices={list(self.choices)!r} is not allowed; allowed: at least two distinct values"
                )
            return self
        if self.low is None or self.high is None:
            raise ValueError("a domain needs choices, or both low and high")
        for name in ("low", "high", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or (value is not None and not math.isfinite(value)):
                raise ValueError(f"{name}={value!r} is not allowed; allowed: a finite number")
        if not self.low < self.high:
            raise ValueError(
                f"low={self.low!r}, high={self.high!r} is not allowed; allowed: low < high (the range "
                "is empty or inverted)"
            )
        if self.log and self.low <= 0:
            raise ValueError(f"log with low={self.low!r} is not allowed; allowed: low > 0 on a log scale")
        if self.step is not None and (self.log or self.step <= 0 or self.step > self.high - self.low):
            raise ValueError(f"step={self.step!r} is not allowed; allowed: 0 < step <= high - low, without log")
        return self

    @property
    def kind(self) -> Literal["categorical", "int", "float"]:
        """How Optuna suggests it: ``suggest_categorical``, ``suggest_int`` or ``suggest_float``."""
        if self.choices is not None:
            return "categorical"
        ints = all(isinstance(v, int) for v in (self.low, self.high, *([self.step] if self.step is not None else [])))
        return "int" if ints else "float"

    def corners(self) -> list[Any]:
        """The values that must each make a valid recipe: every choice, or both ends of the range."""
        if self.choices is not None:
            return list(self.choices)
        return [self.low, self.high] if self.kind == "int" else [float(self.low), float(self.high)]

    def values(self) -> list[Any]:
        """Every value a trial can take where that is a finite set (the choices, every integer of an
        integer range on its step), else the range's ends: what is checked before any fit."""
        if self.choices is None and self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return self.corners()


class Objective(BaseModel):
    """The metric and the winner rule, written before any trial.

    With metric "regret" or "mae", a trial fits the candidate recipe once per seed in ``seeds``
    and scores the mean of the metric at H over those fits, on the tuning validation population.
    With metric "mde", a trial fits every arm of ``study`` with the candidate recipe once per seed
    and scores the largest planned MDE of the study's retention margins: what the study, with its
    own seeds and validation scenes, could detect under that recipe, from the paired seed effect
    the trial measured (``rule.planned_mde``). The winner is the best admissible trial, except that
    a cheaper trial within ``band`` of the best wins (``rule.pick_winner``).

    Attributes:
        metric: "regret" (regret_H), "mae" (MAE_H) or "mde" (the study's largest planned MDE), in the reward's unit.
        seeds: the fit seeds of every trial (distinct, at least one; at least three for "mde").
        study: the study config whose arms, retention margins, seeds and validation size "mde"
            plans for (relative to this config); its recipe is the trial's, so it may name the
            tuning's own output. Only with "mde".
        max_seed_sd: a trial whose metric's sample standard deviation over the seeds exceeds
            it is not admissible (None: no limit; needs two seeds or more).
        max_cost: a trial whose cost (updates x ensemble members) exceeds it is not run
            (None: no limit).
        band: in the reward's unit: trials within it of the best count as tied, and the cheapest wins.
    """

    model_config = FROZEN

    metric: Literal["regret", "mae", "mde"] = "regret"
    seeds: tuple[StrictInt, ...] = Field(min_length=1, max_length=64)
    max_seed_sd: PlainNumber | None = Field(default=None, gt=0.0, le=10.0)
    max_cost: StrictInt | None = Field(default=None, ge=1)
    band: PlainNumber = Field(default=0.0, ge=0.0, le=10.0)
    study: str | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        return distinct_seeds("seeds", seeds)

    @model_validator(mode="after")
    def _spread_needs_seeds(self) -> Objective:
        if self.max_seed_sd is not None and len(self.seeds) < 2:
            raise ValueError(
                "max_seed_sd with one seed is not allowed; allowed: two seeds or more (a spread needs them)"
            )
        if (self.metric == "mde") != (self.study is not None):
            raise ValueError(
                f"study={self.study!r} with metric={self.metric!r} is not allowed; allowed: a study config with "
                "metric 'mde' only (the MDE is planned for a study's margins)"
            )
        if self.metric == "mde" and len(self.seeds) < 3:
            raise ValueError(
                f"seeds={list(self.seeds)!r} with metric 'mde' is not allowed; allowed: three seeds or more (a "
                "paired seed effect needs them)"
            )
        if self.metric == "mde" and self.max_seed_sd is not None:
            raise ValueError(
                "max_seed_sd with metric 'mde' is not allowed; allowed: none (the planned MDE carries the seed effect)"
            )
        return self


class Pruner(BaseModel):
    """Stopping a poor trial between its fits, by an Optuna pruner, on the tuning validation population.

    A trial fits its seeds in the objective's order. After the first ``r`` fits, for each ``r``
    in ``rungs``, its running mean of the metric (each fit scored at its full budget of observed
    updates) is reported to Optuna at step ``r``; the pruner compares it with the running means at
    step ``r`` of the complete trials of earlier batches, and a pruned trial fits no more seeds.
    A fit is never stopped part-way: each is a whole fit with its receipts. Decisions use only
    earlier batches, so they do not depend on the worker count, the executor or an interruption,
    and ``qhlab verify`` recomputes every one from the record.

    Attributes:
        kind: "median" (Optuna's ``MedianPruner``: pruned when worse than the median) or
            "percentile" (``PercentilePruner``: worse than ``percentile``; 25 keeps only trials
            in the best quarter).
        percentile: for "percentile" only, in (0, 100).
        rungs: the fit counts after which a trial may be pruned: increasing, each at least 1 and
            fewer than the objective's seeds.
        startup_trials: complete trials needed before any trial is pruned.
    """

    model_config = FROZEN

    kind: Literal["median", "percentile"]
    percentile: PlainNumber | None = Field(default=None, gt=0.0, lt=100.0)
    rungs: tuple[StrictInt, ...] = Field(min_length=1, max_length=64)
    startup_trials: StrictInt = Field(default=2, ge=1, le=10_000)

    @model_validator(mode="after")
    def _consistent(self) -> Pruner:
        if (self.kind == "percentile") != (self.percentile is not None):
            raise ValueError(
                f"percentile={self.percentile!r} with kind={self.kind!r} is not allowed; allowed: a "
                "percentile in (0, 100) with kind 'percentile' only"
            )
        if list(self.rungs) != sorted(set(self.rungs)) or self.rungs[0] < 1:
            raise ValueError(f"rungs={list(self.rungs)!r} is not allowed; allowed: increasing fit counts >= 1")
        return self


class QhTuningConfig(ToolExecution):
    """One tuning: a base recipe, a search space, an objective, on one tuning population.

    Attributes:
        name: the tuning's name (W&B group of its trials' runs).
        profile: execution profile (lane) of every fit, e.g. "cpu-fp32".
        train: the TRAIN population the trials fit on (it may be a study's TRAIN).
        validation: the tuning validation population the trials are scored on; never a
            population a study has sealed as its validation.
        recipe: the base recipe: a recipe file's path (relative to this config), or its fields
            inline (without ``seed`` and ``data``, which the tuning owns).
        space: ``{dotted recipe field: Domain}``, e.g. ``"optimizer.lr" = {low = 1e-3, high = 1e-2, log = true}``.
        objective: the metric and the winner rule.
        trials: trials in all.
        batch: trials asked together; each batch is suggested from the trials of earlier
            batches only, so the trials do not depend on how many fits run at once.
        sampler: one of ``SAMPLERS``: "tpe" or "random" (Optuna's), or "grid" (every
            combination of the choices once, in the order of ``grid_points``; choices only, and
            ``trials`` equal to the number of combinations).
        sampler_seed: the sampler's seed.
        deviations: recipe fields a study using the winner may set otherwise (e.g. ``updates``).
        pruner: stop a poor trial between its fits (``Pruner``); None: every trial fits every seed.
        workers: fits at once on the local executor. Not part of the record (execution only).
        executor: "local" or "ray" (a Ray on this machine or a cluster sharing its file system).
            Not part of the record.
        torch_threads: torch intra-op threads of each fit process.
        population_cache: cache directory of generated populations.
    """

    name: ConfigName
    profile: ProfileName = "cpu-fp32"
    train: PopulationSource
    validation: PopulationSource
    recipe: str | dict[str, Any]
    space: dict[str, Domain] = Field(min_length=1)
    objective: Objective
    trials: StrictInt = Field(ge=1, le=10_000)
    batch: StrictInt = Field(default=1, ge=1, le=256)
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    sampler_seed: TrainingSeed = 0
    deviations: tuple[str, ...] = ()
    pruner: Pruner | None = None
    torch_threads: TorchThreads = 1

    @field_validator("space")
    @classmethod
    def _fields(cls, space: dict[str, Domain]) -> dict[str, Domain]:
        for field in space:
            for fixed, why in _FIXED_FIELDS.items():
                if field == fixed or field.startswith(fixed + "."):
                    raise ValueError(
                        f"{field!r} is not allowed; allowed: a scientific recipe field other than "
                        f"{', '.join(sorted(_FIXED_FIELDS))} ({why})"
                    )
        return space

    @model_validator(mode="after")
    def _power(self) -> QhTuningConfig:
        if self.objective.metric != "mde":
            return self
        if self.pruner is not None:
            raise ValueError(
                "pruner with objective.metric 'mde' is not allowed; allowed: none (a trial's MDE needs every fit)"
            )
        shaped = sorted(f for f in self.space if f == "architecture" or f.startswith("architecture."))
        if shaped:
            raise ValueError(
                f"space fields {shaped} with objective.metric 'mde' are not allowed; allowed: recipe fields other "
                "than the architecture (each arm's architecture is the study's)"
            )
        return self

    @model_validator(mode="after")
    def _rungs(self) -> QhTuningConfig:
        if self.pruner is not None and self.pruner.rungs[-1] >= len(self.objective.seeds):
            raise ValueError(
                f"pruner.rungs={list(self.pruner.rungs)!r} is not allowed; allowed: fit counts below "
                f"the objective's {len(self.objective.seeds)} seeds (a trial that fitted every seed "
                "is complete)"
            )
        return self

    @model_validator(mode="after")
    def _grid(self) -> QhTuningConfig:
        if self.sampler != "grid":
            return self
        ranges = sorted(name for name, domain in self.space.items() if domain.choices is None)
        if ranges:
            raise ValueError(
                f"sampler='grid' with ranges in space ({', '.join(ranges)}) is not allowed; allowed: "
                "choices only (a grid enumerates them)"
            )
        if self.trials != len(self.grid_points()):
            raise ValueError(
                f"trials={self.trials} with sampler='grid' is not allowed; allowed: "
                f"{len(self.grid_points())}, the number of combinations of the choices"
            )
        return self

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the space's choices: fields in sorted order, choices as declared.

        Returns:
            ``[{field: value}]``, the last field varying fastest (the grid sampler's trial order).
        """
        names = sorted(self.space)
        return [dict(zip(names, values)) for values in itertools.product(*(self.space[n].choices for n in names))]

    def record(self) -> dict[str, Any]:
        """The config as the tuning record binds it: every field except the execution ones (and
        ``pruner`` when there is none, so a tuning without one keeps its digest)."""
        recorded = super().record()
        if self.pruner is None:
            del recorded["pruner"]
        return recorded


def tuning_document(raw: dict[str, Any]) -> dict[str, Any]:
    """A tuning TOML document as its model reads it: ``[space]``'s nested tables flattened to dotted
    fields (TOML nests ``"optimizer.lr" = {...}`` written unquoted as tables)."""
    return {**raw, "space": _flatten_space(raw["space"])} if "space" in raw else raw


def _flatten_space(raw: Any, prefix: str = "") -> Any:
    """``[space]`` as ``{dotted field: domain table}``: TOML nests ``optimizer.lr = {...}`` as tables."""
    if not isinstance(raw, dict):
        return raw
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and not set(value) <= _DOMAIN_KEYS:
            flat.update(_flatten_space(value, name + "."))
        else:
            flat[name] = value
    return flat


def _base_recipe_raw(config: QhTuningConfig) -> dict[str, Any]:
    """The base recipe's fields as a mapping (a file's, or the inline table)."""
    if isinstance(config.recipe, dict):
        owned = sorted(k for k in ("seed", "data") if k in config.recipe)
        if owned:
            raise ValueError(
                f"recipe field(s) {', '.join(owned)} are not allowed inline; allowed: the scientific "
                "fields (the objective's seeds and [train]/[validation] set them)"
            )
        return {"seed": config.objective.seeds[0], **copy.deepcopy(config.recipe)}

    raw, _, _ = read_toml(config.recipe, call=TUNE_CALL, field="recipe", example="examples/tiny-recipe.toml")
    raw.pop("data", None)
    return raw


def _set(raw: dict[str, Any], field: str, value: Any) -> None:
    *parents, key = field.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"space field {field!r}: {part!r} is not a table of the recipe")
    node[key] = value


def trial_recipe(config: QhTuningConfig, params: dict[str, Any], *, seed: int, base: dict[str, Any] | None = None):
    """The base recipe with a trial's parameters set, for one fit seed.

    Args:
        config: the tuning config.
        params: ``{space field: value}`` (every field of ``config.space``).
        seed: the fit seed.
        base: the base recipe mapping (``_base_recipe_raw``; read again when None).

    Returns:
        A validated ``QhRecipe`` named ``<config.name>``, data fields empty.

    Raises:
        QhInputError: the parameters make an invalid recipe (every field listed).
    """

    raw = copy.deepcopy(base if base is not None else _base_recipe_raw(config))
    for field, value in params.items():
        _set(raw, field, value)
    raw.update(name=config.name, seed=seed)
    return validate_recipe(raw, source=f"tuning {config.name!r} trial recipe")


def arm_recipe(
    config: QhTuningConfig, params: dict[str, Any], *, seed: int, base: dict[str, Any], architecture: dict[str, Any]
):
    """A trial's recipe for one arm of an "mde" objective: ``trial_recipe`` with the arm's architecture.

    Args:
        config, params, seed, base: as ``trial_recipe``'s.
        architecture: the arm's architecture (``power_design``'s ``architectures[arm]``).
    """
    raw = copy.deepcopy(base)
    for field, value in params.items():
        _set(raw, field, value)
    raw.update(name=config.name, seed=seed, architecture=copy.deepcopy(architecture))
    return validate_recipe(raw, source=f"tuning {config.name!r} trial recipe of arm {architecture.get('arm')!r}")


def power_design(config: QhTuningConfig, base: dict[str, Any]) -> dict[str, Any] | None:
    """What an "mde" objective plans for: the study's arms and their architectures on the base
    recipe, its variants and fractions, its seeds, tie band and validation scenes. None for
    another metric.

    Raises:
        QhInputError: the study cannot be read with the base recipe, names a user arm, or its tie
            band or baseline is not the base recipe's.
    """
    if config.objective.metric != "mde":
        return None
    study = read_study_config(config.objective.study, recipe=base)[0]
    problems = []
    users = sorted(a.arm for a in study.experiment.arms if a.builder is not None)
    if users:
        problems.append(f"objective.study: user arms {users} are not allowed; allowed: built-in arms")
    if (base.get("architecture") or {}).get("arm", "baseline") != study.baseline_arm:
        problems.append(
            f"recipe.architecture.arm={base['architecture'].get('arm')!r} is not allowed; allowed: the study's "
            f"baseline {study.baseline_arm!r}"
        )
    tie_band = (base.get("evaluation") or {}).get("tie_band")
    if tie_band is not None and float(tie_band) != study.tie_band:
        problems.append(
            f"recipe.evaluation.tie_band={tie_band!r} is not allowed; allowed: the study's {study.tie_band}"
        )
    if problems:
        raise invalid_fields(f"tuning config {config.name!r}", problems, "an 'mde' objective plans for its study.")
    scenes = declared_scenes(study.validation, call=TUNE_CALL)
    updates = int(base.get("updates", study.broad_updates))
    return {
        "study": study.name,
        "arms": list(study.arms),
        "architectures": {
            arm: study.cell_recipe(arm, 0, updates).architecture.model_dump(mode="json", exclude_none=True)
            for arm in study.arms
        },
        "variants": study.variant_margins(),
        "regret_fraction": study.regret_fraction,
        "mae_fraction": study.mae_fraction,
        "study_seeds": len(study.seeds),
        "validation_scenes": int(scenes),
        "confidence": study.bootstrap.confidence,
    }


def _known_field(recipe_dump: dict[str, Any], field: str) -> bool:
    node: Any = recipe_dump
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not isinstance(node, dict)


# The most combinations of a space's values checked one by one before any fit; a larger space has
# each field's values checked with the others at their ends.
_MAX_CHECKED_COMBINATIONS = 4096


def _detail(exc: QhInputError) -> str:
    return str(exc).split("\n")[1].strip(" -") if "\n" in str(exc) else str(exc)


def _check_interior(config: QhTuningConfig, base: dict[str, Any]) -> list[str]:
    """A trial the sampler may suggest inside the space must make a valid recipe too (heads 3 at
    width 32 is invalid although heads 1 and 4 are not): every combination of the fields' values
    (``Domain.values``), or, for a larger space, every value of each field against the ends of
    the others. Returns the first invalid combination, as one problem."""
    fields = sorted(config.space)
    values = {f: config.space[f].values() for f in fields}
    if math.prod(len(v) for v in values.values()) <= _MAX_CHECKED_COMBINATIONS:
        combinations = itertools.product(*(values[f] for f in fields))
    else:
        ends = {f: config.space[f].corners() for f in fields}
        combinations = (
            tuple(value if g == f else end for g, end in zip(fields, others, strict=True))
            for f in fields
            for value in values[f]
            for others in itertools.product(*(ends[g] for g in fields))
        )
    for combination in combinations:
        params = dict(zip(fields, combination, strict=True))
        try:
            trial_recipe(config, params, seed=config.objective.seeds[0], base=base)
        except QhInputError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            return [
                f"space: the trial {shown} is not allowed; allowed: a space whose every trial is a valid recipe "
                f"({_detail(exc)})"
            ]
    return []


def _check_space(config: QhTuningConfig, base: dict[str, Any]) -> list[str]:
    """Every problem of the space against the base recipe: unknown fields, invalid corners."""
    problems = []
    try:
        base_recipe = trial_recipe(config, {}, seed=config.objective.seeds[0], base=base)
    except QhInputError as exc:
        return [f"recipe: the base recipe is invalid: {exc}"]
    dump = base_recipe.model_dump(mode="json")
    for field, domain in config.space.items():
        if not _known_field(dump, field):
            problems.append(
                f"space.{field} is not allowed; allowed: a scalar field of the base recipe "
                f"(e.g. optimizer.lr, batch_size, updates, architecture.encoder.width)"
            )
            continue
        for value in domain.corners():
            try:
                trial_recipe(config, {field: value}, seed=config.objective.seeds[0], base=base)
            except QhInputError as exc:
                problems.append(
                    f"space.{field}={value!r} is not allowed; allowed: values that make a valid recipe ({_detail(exc)})"
                )
    if not problems:
        problems += _check_interior(config, base)
    for field in config.deviations:
        if not _known_field(dump, field):
            problems.append(f"deviations: {field!r} is not allowed; allowed: a scalar field of the base recipe")
    return problems


_FORM = ConfigForm(
    QhTuningConfig,
    call=TUNE_CALL,
    what="tuning config",
    example="examples/tiny-tune.toml",
    relative=(("recipe",), ("train", "path"), ("validation", "path"), ("population_cache",), ("objective", "study")),
    toml_files=STUDY_PRESET_FIELDS,
    prepare=tuning_document,
)


def read_tuning_config(config_path: str | os.PathLike) -> tuple[QhTuningConfig, bytes, Path, dict[str, Any]]:
    """Read and fully validate a tuning TOML before anything is written.

    Relative ``recipe``, ``train.path``, ``validation.path`` and ``population_cache`` are
    resolved against the config file's directory.

    Returns:
        (the validated config, the file's exact bytes, the resolved path, the base recipe mapping).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, or every invalid field at once.
    """

    config, data, path = _FORM.read(config_path)
    try:
        base = _base_recipe_raw(config)
    except ValueError as exc:
        raise _FORM.invalid(config_path, [f"recipe: {exc}"], "compare with examples/tiny-tune.toml.") from None
    _FORM.refuse(
        config_path,
        _check_space(config, base),
        "the space names recipe fields (dotted) and domains that make valid recipes.",
    )
    return config, data, path, base


def quiet_optuna() -> None:
    """Optuna logs every study it creates (a tuning makes one per suggestion, a report's figures
    one each): quiet unless --verbose."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if console_verbose() else optuna.logging.WARNING)


def optuna_distributions(space: dict[str, Domain]) -> dict:
    """Optuna's distribution of each field of a search space, by field name (sorted)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for name in sorted(space):
        domain = space[name]
        if domain.kind == "categorical":
            out[name] = CategoricalDistribution(list(domain.choices))
        elif domain.kind == "int":
            out[name] = IntDistribution(int(domain.low), int(domain.high), log=domain.log, step=int(domain.step or 1))
        else:
            out[name] = FloatDistribution(
                float(domain.low),
                float(domain.high),
                log=domain.log,
                step=None if domain.step is None else float(domain.step),
            )
    return out
