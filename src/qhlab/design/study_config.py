"""The study config: a frozen, closed pydantic model of one pre-registered architecture study.

Owns: ``QhArchitectureStudyConfig`` and its parts (population sources, arms, bootstrap
settings), the rule that a cell's recipe is the baseline recipe with only the architecture
changed (``cell_recipe``), and reading a study TOML (``read_study_config``: every invalid
field listed in one error). Does not own: the recipe model (``qhlab.finite_horizon.recipe``),
the scorer arms (``qhlab.finite_horizon.scorer``), presets (``qhlab.scenes``) or what the
study does with the config (the step modules beside this one).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, field_validator, model_validator

from qhlab.design.config_files import (
    FROZEN,
    ConfigName,
    Executor,
    PlainNumber,
    StrictInt,
    TorchThreads,
    Workers,
    read_config,
    read_toml,
)
from qhlab.design.pilot_layout import PilotLayout, pilot_layout_problem
from qhlab.evidence import POPULATION_SEED_LIMIT, QhInputError, distinct_seeds
from qhlab.evidence.layout import STUDY_CALL
from qhlab.evidence.receipts import DEFAULT_POPULATION_ROOT
from qhlab.execution import executor_choice
from qhlab.finite_horizon.architecture import ARMS
from qhlab.finite_horizon.budget import MAX_UPDATES
from qhlab.finite_horizon.recipe import TrainingSeed, validate_recipe
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.presets import PRESET_NAMES, load_preset
from qhlab.training.profiles import PROFILE_NAMES

if TYPE_CHECKING:
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = [
    "EXECUTION_FIELDS",
    "STUDY_PATH_FIELDS",
    "ArmDeclaration",
    "BootstrapConfig",
    "EncoderSizes",
    "PopulationSource",
    "PreparationConfig",
    "ProfileName",
    "QhArchitectureStudyConfig",
    "StudyExperiment",
    "declared_scenes",
    "read_study_config",
]


def _path_text(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{value!r} is not allowed; allowed: a path without NUL characters")
    if isinstance(value, str) and value != value.strip():
        # A trailing space names another directory than the one meant, silently.
        raise ValueError(f"{value!r} is not allowed; allowed: a path without leading or trailing whitespace")
    if value == "":
        # An empty path would resolve to the working directory, not the config's: never meant.
        raise ValueError(
            "'' is not allowed; allowed: a non-empty directory path (a relative one is resolved "
            "against the config's directory)"
        )
    return value


def _known_profile(profile: str) -> str:
    if profile not in PROFILE_NAMES:
        raise ValueError(f"profile={profile!r} is not allowed; allowed: {', '.join(PROFILE_NAMES)}")
    return profile


# An execution profile's name (`qhlab profiles`), checked against the registered lanes.
ProfileName = Annotated[str, AfterValidator(_known_profile)]
_PathText = Annotated[str, BeforeValidator(_path_text)]
# The largest threshold a study takes, in the reward's unit (a few metres bound the puck world's
# returns); a reward on a larger scale is declared in a larger unit.
_MAX_REWARD = 10.0
# Execution, not science: where and how many fits run at once. Results do not depend on them
# (tests compare final-state bytes), so the freeze binds the config without them and they may
# change between steps (a new cluster address, more workers).
EXECUTION_FIELDS = ("workers", "executor", "ray_address")
# A recipe's name, as a recipe file's ``name`` must be (``qhlab.finite_horizon.recipe``).
_RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Fields of the experiment recipe that the study itself owns.
_STUDY_OWNED_RECIPE_FIELDS = {
    "seed": "seeds",
    "updates": "broad_updates / canary_updates",
    "data": "train / validation",
    "accelerator": "profile",
    "devices": "profile",
    "precision": "profile",
}


class PopulationSource(BaseModel):
    """A population named by preset and seed (generated and cached) or by a directory.

    Attributes:
        preset: a built-in preset's name (``qhlab.scenes.PRESET_NAMES``) or a preset file
            (``*.toml``; a relative one is resolved against the study config's directory), with
            ``seed``.
        seed: population seed (with ``preset``).
        path: an existing population directory (instead of preset and seed); relative paths
            are resolved against the study config's directory.
    """

    model_config = FROZEN

    preset: str | None = None
    seed: StrictInt | None = Field(default=None, ge=0, lt=POPULATION_SEED_LIMIT)
    path: Annotated[str, BeforeValidator(_path_text)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PopulationSource:
        if self.path is not None:
            if self.preset is not None or self.seed is not None:
                raise ValueError(
                    "path together with preset/seed is not allowed; allowed: either path, or preset and seed"
                )
            if not self.path:
                raise ValueError("path='' is not allowed; allowed: a population directory")
            return self
        if self.preset is None or self.seed is None:
            raise ValueError(
                f"preset={self.preset!r}, seed={self.seed!r} is not allowed; allowed: both preset "
                "and seed (explicit), or path"
            )
        # The form only: a preset file is read where the population is drawn (the freeze, the
        # preparation tools), since a study's config copy keeps the path as the user wrote it.
        if self.preset not in PRESET_NAMES and not self.preset.endswith(".toml"):
            raise ValueError(
                f"preset={self.preset!r} is not allowed; allowed: a built-in preset ({', '.join(PRESET_NAMES)}) or "
                "a preset file (*.toml)"
            )
        return self


class EncoderSizes(BaseModel):
    """Size overrides of one arm's encoder (structure comes from the registered arm).

    Attributes:
        depth: encoder blocks; None keeps the arm's declared depth, else the baseline's.
        width: embedding width W; None keeps the arm's declared width, else the baseline's.
        heads: attention heads (W must divide by them); None keeps the arm's, else the baseline's.
    """

    model_config = FROZEN

    depth: StrictInt | None = Field(default=None, ge=1, le=16)
    width: StrictInt | None = Field(default=None, ge=8, le=1024)
    heads: StrictInt | None = Field(default=None, ge=1, le=64)


class ArmDeclaration(BaseModel):
    """One non-baseline arm of the comparison family.

    Attributes:
        arm: the arm's name: a built-in arm (``qhlab.finite_horizon.architecture.ARMS``), or any
            other name with ``builder``.
        role: "control" (a structural ablation of the baseline) or "variant" (a candidate
            improvement).
        control: variants only: the structural control the regret margin compares against.
        matched: variants only: the matched control of the calibration (MAE) margin; default
            the baseline.
        builder: a user arm's builder, ``"file.py:function"`` (relative to the config) or
            ``"package.module:function"``; the freeze copies its source into the study.
        options: extra scalars passed to a user arm's builder (``arch.options``).
        encoder: optional size overrides (architecture fields only).
    """

    model_config = FROZEN

    arm: str
    role: Literal["control", "variant"]
    control: str | None = None
    matched: str | None = None
    builder: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    encoder: EncoderSizes = EncoderSizes()


class StudyExperiment(BaseModel):
    """The native-Huber baseline recipe and the arms derived from it.

    Attributes:
        recipe: the baseline recipe's scientific fields (as in a recipe TOML) without
            ``seed``, ``updates``, ``data`` and backend fields, which the study owns. Its
            ``architecture.arm`` is the baseline arm. In the TOML it may instead be the path
            of a recipe file (e.g. a tuning's ``recipe.toml``); the loader reads that file's
            scientific fields into it.
        recipe_file: the recipe file ``recipe`` was read from (set by the loader), else None.
        arms: controls and variants; each alters only architecture fields.
    """

    model_config = FROZEN

    recipe: dict[str, Any]
    recipe_file: str | None = None
    arms: tuple[ArmDeclaration, ...] = Field(min_length=2)

    @field_validator("recipe")
    @classmethod
    def _no_study_fields(cls, recipe: dict[str, Any]) -> dict[str, Any]:
        owned = [f"{k} (set by the study's {v})" for k, v in _STUDY_OWNED_RECIPE_FIELDS.items() if k in recipe]
        if owned:
            raise ValueError(f"recipe field(s) {', '.join(owned)} are not allowed; allowed: the scientific fields only")
        name = recipe.get("name")
        # Read for its label only (each cell's recipe is named study-arm-seed), but never any value.
        if name is not None and (not isinstance(name, str) or not _RECIPE_NAME.fullmatch(name)):
            raise ValueError(
                f"name={name!r} is not allowed; allowed: a recipe name of letters, digits, '_', '.' and '-' "
                "(each cell's recipe is named after the study, its arm and seed)"
            )
        return recipe


class BootstrapConfig(BaseModel):
    """Scene bootstrap settings (declared, so every interval is reproducible).

    Attributes:
        resamples: bootstrap resamples of the scenes per interval.
        seed: seed of the resampling generator.
        confidence: two-sided confidence of every interval (one-sided bounds use the same level).
    """

    model_config = FROZEN

    resamples: StrictInt = Field(default=9999, ge=100, le=1_000_000)
    seed: TrainingSeed = 0
    confidence: PlainNumber = Field(default=0.95, gt=0.5, lt=1.0)

    def interval(self, values: np.ndarray, other: np.ndarray | None = None) -> dict:
        """The scene-bootstrap interval of ``values`` under these settings, as a JSON-able dict.

        Args:
            values: float [n_scenes], one value per scene.
            other: float [n_scenes] on the same scenes: the interval is then of the paired
                mean difference ``values - other``; None: of the mean of ``values``.

        Returns:
            ``BootstrapInterval.as_dict()`` (``qhlab.statistics.bootstrap``).
        """
        # Lazy: keeps importing this module free of scipy.
        from qhlab.statistics.bootstrap import paired_scene_bootstrap, scene_mean_interval

        options = dict(confidence=self.confidence, n_resamples=self.resamples, rng_seed=self.seed)
        if other is None:
            return scene_mean_interval(values, **options).as_dict()
        return paired_scene_bootstrap(values, other, **options).as_dict()


class SeedVarianceConfig(BaseModel):
    """The training-seed variance measured by a pilot before the study, frozen with it.

    Each value is the largest, over the report's comparisons and the variants' margins, seed-effect
    sd tau at H (``replication.seed_effect_sd`` on the pilot's seeds-by-scenes table), in the
    reward's unit. The seed-pooled intervals add tau^2 / S to the scene variance, with Student's t
    on the two terms' Welch-Satterthwaite dof (the pilot's part has ``seeds - 1``;
    ``qhlab.statistics.replication``). One value per metric: one comparison's tau from a few seeds
    can be far too small (one pilot tau of 0.6 mm against study seeds 6.7 mm apart).

    Attributes:
        regret: the largest seed-effect sd of regret_H over the pilot's comparisons (the reward's unit).
        mae: the largest seed-effect sd of MAE_H over the pilot's comparisons (the reward's unit).
        seeds: training seeds the pilot fitted (its tau has ``seeds - 1`` degrees of freedom).
        source: what the pilot ran on (population, seeds, recipe), recorded with the study.
    """

    model_config = FROZEN

    regret: PlainNumber = Field(ge=0.0, le=_MAX_REWARD)
    mae: PlainNumber = Field(ge=0.0, le=_MAX_REWARD)
    seeds: StrictInt = Field(ge=2, le=1000)
    source: str = Field(min_length=1, max_length=500)


class PreparationConfig(BaseModel):
    """The records of how the study was prepared, bound by the freeze.

    Attributes:
        tuning: a ``qhlab tune`` record (``.../tuning.json``): the freeze refuses a recipe
            other than its winner (except in its declared deviations) and a tuning population
            that is this study's validation.
        pilot: a ``qhlab pilot`` record (``.../pilot.json``) of this study's design: each of the
            report's intervals carries its own comparison's seed and TRAIN-draw components (no
            typed ``[seed_variance]`` beside it).
        e0: a ``qhlab e0-check`` record (``.../e0.json``) of this study's E0 gate: its canary
            budget, row margin, tie band and baseline recipe passed on fresh TRAIN draws.
        plan: a ``qhlab plan`` record (``.../plan.json``) made from this study's pilot: the report
            shows each comparison's planned MDE beside the one it achieved (needs ``pilot``).
        pilot_layout: its pilot's TRAIN draws and seeds, declared before it runs (with ``pilot``).
    """

    model_config = FROZEN

    tuning: _PathText | None = None
    pilot: _PathText | None = None
    e0: _PathText | None = None
    plan: _PathText | None = None
    pilot_layout: PilotLayout | None = None


class QhArchitectureStudyConfig(BaseModel):
    """Bind data, optimization and a finite architecture comparison family.

    Attributes:
        name: study name.
        profile: execution profile (lane) of every fit, e.g. "cpu-fp32".
        train: TRAIN-only actor/label population; paths are explicit in the frozen record.
        validation: exposed development validation; no test-stage field exists in this study.
        experiment: native-Huber baseline; derived variants alter only the declared architecture.
        seeds: both declared replication seeds; no seed search.
        canary_updates: fixed final-update budget for each of the two TRAIN canary fits.
        broad_updates: fixed final-update budget for each broad fit.
        tie_band: native Q tolerance for ranking ties and canary optimal-action admission.
        canary_gap_multiple: the canary row's best label must beat the runner-up by more than
            this many tie bands at every horizon (a margin of several times a canary's accuracy).
        curve_points: points of each broad cell's validation learning curve, the final
            evaluation included (evenly spaced in observed updates; drawn by the report, never
            used to select anything).
        regret_fraction: prospective retention threshold relative to the structural control.
        mae_fraction: calibration safety bound relative to the matched control.
        max_allocated_bytes: scorer process GPU allocator ceiling (enforced on CUDA only).
        workers: broad fits run at once (one process each) on the local executor.
        executor: where broad fits and population labelling run: ``"local"`` (process pools on
            this machine) or ``"ray"`` (tasks on a Ray cluster). Not frozen (``EXECUTION_FIELDS``).
        ray_address: ``HOST:PORT`` of the Ray cluster (``executor = "ray"`` only); default
            ``RAY_ADDRESS``, else a Ray started on this machine. Not frozen.
        torch_threads: torch intra-op threads of each fit process. One is the fastest for these
            small scorers (with two threads on a busy 2-core host a forward can be 30x slower)
            and keeps every reduction in one order.
        population_cache: cache directory of generated populations.
        bootstrap: scene bootstrap settings of the report.
        seed_variance: the pilot's seed variance of paired differences (None: the study's own).
        preparation: the tuning record the recipe comes from and the pilot record of the
            seed variance (None: both unrecorded).
    """

    model_config = FROZEN

    name: ConfigName
    profile: ProfileName = "cpu-fp32"
    train: PopulationSource
    validation: PopulationSource
    experiment: StudyExperiment
    seeds: tuple[StrictInt, ...]
    canary_updates: StrictInt = Field(ge=1, le=MAX_UPDATES)
    broad_updates: StrictInt = Field(ge=1, le=MAX_UPDATES)
    tie_band: PlainNumber = Field(ge=0.0, le=_MAX_REWARD)
    canary_gap_multiple: PlainNumber = Field(default=10.0, ge=1.0, le=1000.0)
    curve_points: StrictInt = Field(default=4, ge=1, le=64)
    regret_fraction: PlainNumber = Field(gt=0.0, le=100.0)
    mae_fraction: PlainNumber = Field(gt=0.0, le=100.0)
    max_allocated_bytes: StrictInt | None = Field(default=None, gt=0, le=2**50)
    workers: Workers = 1
    executor: Executor = "local"
    ray_address: str | None = None
    torch_threads: TorchThreads = 1
    population_cache: _PathText = DEFAULT_POPULATION_ROOT
    bootstrap: BootstrapConfig = BootstrapConfig()
    seed_variance: SeedVarianceConfig | None = None
    preparation: PreparationConfig | None = None

    @model_validator(mode="after")
    def _executor(self) -> QhArchitectureStudyConfig:
        try:
            executor_choice(
                self.executor, self.ray_address, call="study config", field="executor", address_field="ray_address"
            )
        except QhInputError as exc:
            raise ValueError(str(exc).removeprefix("study config: ")) from None
        return self

    def decision_record(self) -> dict[str, Any]:
        """The config as the freeze binds it: every field except ``EXECUTION_FIELDS``."""
        return self.model_dump(mode="json", exclude=set(EXECUTION_FIELDS))

    def executor_choice(
        self, kind: str | None = None, ray_address: str | None = None, *, call: str = "qhlab study run"
    ) -> Any:
        """The ``qhlab.execution.ExecutorChoice`` of this config, or of the CLI's overrides.

        Args:
            kind: ``--executor`` (None: the config's ``executor``; ``"ray"`` if only
                ``ray_address`` is given).
            ray_address: ``--ray-address`` (None: the config's ``ray_address`` whenever the
                executor is Ray).
            call: the command named in a refusal.
        """
        if kind is None:
            kind = "ray" if ray_address is not None else self.executor
        if kind == "ray" and ray_address is None:
            ray_address = self.ray_address
        return executor_choice(kind, ray_address, call=call)

    @field_validator("seeds")
    @classmethod
    def _two_seeds(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        if len(seeds) != 2 or len(set(seeds)) != 2:
            raise ValueError(
                f"seeds={list(seeds)!r} is not allowed; allowed: exactly two distinct training seeds "
                "(both replication seeds are declared up front; no seed search)"
            )
        return distinct_seeds("seeds", seeds)

    @model_validator(mode="after")
    def _pilot_declared(self) -> QhArchitectureStudyConfig:
        problem = pilot_layout_problem(self.preparation, self.seeds)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def curve_updates(self) -> tuple[int, ...]:
        """The observed updates of each broad cell's learning curve before its final update."""
        n, budget = self.curve_points, self.broad_updates
        return tuple(sorted({round(budget * i / n) for i in range(1, n)} - {0, budget}))

    def variant_margins(self) -> list[dict[str, str]]:
        """Each variant's retention margins as records name them: ``{"arm", "control" (its
        structural control, D_reg), "matched" (its matched control, D_mae; the baseline when
        none is declared)}``, in declaration order."""
        return [
            {"arm": a.arm, "control": a.control, "matched": a.matched or self.baseline_arm}
            for a in self.experiment.arms
            if a.role == "variant"
        ]

    def comparisons(self) -> list[tuple[str, str, str]]:
        """(arm, against, relation) of every paired comparison of the report, in report order."""
        baseline, arms = self.baseline_arm, self.experiment.arms
        pairs = [(baseline, a.arm, "baseline minus control") for a in arms if a.role == "control"]
        for a in (a for a in arms if a.role == "variant"):
            pairs += [
                (a.arm, a.control, "variant minus structural control"),
                (a.arm, a.matched or baseline, "variant minus matched control"),
            ]
        return pairs

    @model_validator(mode="after")
    def _family(self) -> QhArchitectureStudyConfig:
        problems = []
        baseline = self.baseline_arm
        names = [a.arm for a in self.experiment.arms]
        if len(set(names)) != len(names):
            problems.append(f"experiment.arms={names!r}: each arm may appear once")
        if baseline in names:
            problems.append(f"experiment.arms: {baseline!r} is the baseline (experiment.recipe.architecture.arm)")
        controls = {a.arm for a in self.experiment.arms if a.role == "control"}
        variants = [a for a in self.experiment.arms if a.role == "variant"]
        if not controls or not variants:
            problems.append("experiment.arms needs at least one control and one variant")
        for a in self.experiment.arms:
            if a.role == "control" and (a.control is not None or a.matched is not None):
                problems.append(f"experiment.arms[{a.arm}]: a control names no control/matched")
            if a.role == "variant":
                if a.control not in controls:
                    problems.append(
                        f"experiment.arms[{a.arm}].control={a.control!r} is not allowed; allowed: "
                        f"a declared control ({', '.join(sorted(controls)) or 'none'})"
                    )
                if a.matched is not None and a.matched not in controls | {baseline}:
                    problems.append(
                        f"experiment.arms[{a.arm}].matched={a.matched!r} is not allowed; allowed: "
                        f"the baseline {baseline!r} or a declared control"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        # Every cell's recipe must validate now, not at fit time.
        for arm in [baseline, *names]:
            self.cell_recipe(arm, self.seeds[0], self.broad_updates)
        return self

    @property
    def baseline_arm(self) -> str:
        """The baseline arm (the experiment recipe's ``architecture.arm``)."""
        architecture = self.experiment.recipe.get("architecture", {})
        arm = architecture.get("arm") if isinstance(architecture, dict) else None
        if not isinstance(arm, str):
            raise ValueError(
                "experiment.recipe.architecture.arm is missing; allowed: a built-in arm, or a name with a builder"
            )
        return arm

    def builder(self, arm: str) -> str | None:
        """The builder string of a user arm as the config wrote it (None for a built-in arm)."""
        if arm == self.baseline_arm:
            architecture = self.experiment.recipe.get("architecture", {})
            return architecture.get("builder") if isinstance(architecture, dict) else None
        declaration = self.declaration(arm)
        return None if declaration is None else declaration.builder

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm in declaration order, baseline first."""
        return (self.baseline_arm, *(a.arm for a in self.experiment.arms))

    @property
    def cells(self) -> tuple[tuple[str, int], ...]:
        """Every declared (arm, seed) cell, arm-major."""
        return tuple((arm, seed) for arm in self.arms for seed in self.seeds)

    def declaration(self, arm: str) -> ArmDeclaration | None:
        """The declaration of a non-baseline arm (None for the baseline)."""
        return next((a for a in self.experiment.arms if a.arm == arm), None)

    def cell_recipe(self, arm: str, seed: int, updates: int, *, sources: dict[str, str] | None = None) -> QhRecipe:
        """The recipe of one cell: the baseline recipe with only the architecture changed.

        An arm's sizes (encoder width, depth, heads) follow the baseline's, except those its
        registration declares (``register_arm(..., depth=2)``) and those its entry overrides.

        Args:
            arm: a declared arm.
            seed: the fit seed.
            updates: the final update budget.
            sources: ``{arm: source sha256}`` of the user arms' frozen sources (the freeze's
                ``family`` record), bound into their architectures; None before the freeze.

        Returns:
            A validated ``QhRecipe`` (data fields empty; backend fields from no profile yet).
        """

        raw = dict(self.experiment.recipe)
        base_arch = _table(raw, "architecture", "experiment.recipe")
        base_encoder = _table(base_arch, "encoder", "experiment.recipe.architecture")
        evaluation = _table(raw, "evaluation", "experiment.recipe")
        if "tie_band" in evaluation and float(evaluation["tie_band"]) != self.tie_band:
            raise ValueError(
                f"experiment.recipe.evaluation.tie_band={evaluation['tie_band']!r} is not allowed; "
                f"allowed: omit it or use the study tie_band {self.tie_band!r}"
            )
        evaluation["tie_band"] = self.tie_band
        if arm == self.baseline_arm:
            architecture = base_arch
        else:
            declaration = self.declaration(arm)
            if declaration is None:
                raise ValueError(f"arm={arm!r} is not declared")
            own = ARMS[arm].defaults if declaration.builder is None and arm in ARMS else {}
            encoder = {
                k: base_encoder[k]
                for k in ("width", "heads", "depth")
                if k in base_encoder and f"encoder.{k}" not in own
            }
            encoder.update(declaration.encoder.model_dump(exclude_none=True))
            architecture = {"arm": arm, "encoder": encoder}
            if declaration.builder is not None:
                architecture["builder"] = declaration.builder
            if declaration.options:
                architecture["options"] = dict(declaration.options)
        if sources is not None and arm in sources:
            architecture = {**architecture, "source_sha256": sources[arm]}
        raw.update(
            name=f"{self.name}-{arm}-s{seed}"[:128],
            seed=seed,
            updates=updates,
            architecture=architecture,
            evaluation=evaluation,
        )
        try:
            return validate_recipe(raw, source=f"study {self.name!r} arm {arm!r}")
        except QhInputError as exc:  # the recipe's field lines, nested under the study's, without its HINT
            raise ValueError(str(exc).rsplit("\nHINT: ", 1)[0].replace("\n", "\n  ")) from None


# The study TOML's path fields: a relative one is resolved against the config file's directory.
# Its name-or-file fields: a value ending in .toml is a path, resolved the same way.
STUDY_PRESET_FIELDS = (("train", "preset"), ("validation", "preset"))
STUDY_PATH_FIELDS = (
    ("train", "path"),
    ("validation", "path"),
    ("population_cache",),
    ("experiment", "recipe"),
    ("preparation", "tuning"),
    ("preparation", "pilot"),
    ("preparation", "e0"),
    ("preparation", "plan"),
)


def _table(mapping: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``mapping[key]`` as a dict (empty when absent); a value that is not a table is refused, naming it."""
    value = mapping.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}.{key}={value!r} is not allowed; allowed: a table (e.g. {key} = {{ ... }})")
    return dict(value)


def declared_scenes(source: PopulationSource, *, call: str) -> int:
    """How many scenes a declared population has, without drawing it: its preset's ``scenes``, or
    the count its manifest records (a population named by path)."""
    if source.preset is not None:
        return int(load_preset(source.preset, call=call).scenes)
    return int(read_manifest(source.path)["counts"]["scenes"])


def read_study_config(
    config_path: str | os.PathLike, *, recipe: dict[str, Any] | None = None
) -> tuple[QhArchitectureStudyConfig, bytes, Path]:
    """Read and fully validate a study TOML before anything is written.

    Relative ``train.path``, ``validation.path`` and ``population_cache`` are resolved against
    the config file's directory.

    Args:
        config_path: the study TOML (e.g. ``examples/default-study.toml``).
        recipe: a recipe mapping to read the study with instead of its ``experiment.recipe`` (its
            ``updates`` the study's ``broad_updates``): the design a tuning scores its trials by,
            before the recipe the study will name exists.

    Returns:
        (the validated config, the file's exact bytes (a freeze binds their digest), the
        resolved path of the file).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, or every invalid field at once.
    """

    return read_config(
        config_path,
        QhArchitectureStudyConfig,
        call=STUDY_CALL,
        what="study config",
        example="examples/default-study.toml",
        relative=STUDY_PATH_FIELDS,
        toml_files=STUDY_PRESET_FIELDS,
        prepare=_recipe_from_file if recipe is None else lambda raw: _with_recipe(raw, recipe),
    )


def _with_recipe(raw: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    """The study's mapping with ``experiment.recipe`` replaced by ``recipe``'s scientific fields."""
    fields = {k: v for k, v in recipe.items() if k not in _FILE_FIELDS_THE_STUDY_OWNS}
    updates = fields.pop("updates", None)
    if isinstance(raw.get("experiment"), dict):
        raw["experiment"] = {**raw["experiment"], "recipe": fields}
    if updates is not None:
        raw["broad_updates"] = updates
    return raw


def _recipe_from_file(raw: dict[str, Any]) -> dict[str, Any]:
    """An ``experiment.recipe`` that names a recipe file becomes that file's scientific fields."""
    experiment = raw.get("experiment")
    if isinstance(experiment, dict) and isinstance(experiment.get("recipe"), str):
        experiment["recipe_file"] = experiment["recipe"]
        experiment["recipe"] = _recipe_file_fields(experiment["recipe"], raw.get("broad_updates"))
    return raw


# A recipe file's fields that the study owns, dropped when a study reads its recipe from a file.
_FILE_FIELDS_THE_STUDY_OWNS = ("name", "seed", "data", "accelerator", "devices", "precision")


def _recipe_file_fields(path: str, broad_updates: Any) -> dict[str, Any]:
    """The scientific fields of the recipe file at ``path``, as ``experiment.recipe`` holds them.

    ``name``, ``seed``, ``data`` and the backend fields are the study's; ``updates`` must be the
    study's ``broad_updates`` (a recipe tuned at another budget is another recipe).
    """

    raw, _, _ = read_toml(path, call=STUDY_CALL, field="experiment.recipe", example="examples/tiny-recipe.toml")
    updates = raw.pop("updates", None)
    if updates is not None and updates != broad_updates:
        raise QhInputError(
            f"{STUDY_CALL}: experiment.recipe={path!r} sets updates={updates!r}, which is not allowed; "
            f"allowed: the study's broad_updates ({broad_updates!r}). HINT: a recipe tuned at another "
            "budget is another recipe; set broad_updates to it, or tune at the study's budget."
        )
    return {k: v for k, v in raw.items() if k not in _FILE_FIELDS_THE_STUDY_OWNS}
