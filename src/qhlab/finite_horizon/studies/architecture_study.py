"""Seed 002: a frozen, pre-registered, paired architecture study over charged final fits.

Owns: the study config (``QhArchitectureStudyConfig``), the order of its operations and
their receipts: ``freeze_study`` -> ``admit_canaries`` (E0 gate) -> ``prepare_development``
-> ``run_fit`` for every declared cell -> ``benchmark_scorer`` -> ``report_study``; and the
command line (``main``; ``qhlab study ...`` calls :func:`_main`).

Does not own: fitting (``qhlab.finite_horizon.fit.fit_recipe`` is the only optimizer loop),
evaluation arithmetic (``qhlab.finite_horizon.evaluation``), statistics
(``qhlab.finite_horizon.studies.statistics``), population generation (``qhlab.scenes``) or
reading (``qhlab.finite_horizon.data``), and receipts/write-once files (``qhlab.evidence``).

Scientific guard rails, each enforced here:
* the statistical unit is the scene (evaluation and bootstrap work on per-scene values);
* TRAIN is digested at freeze and re-authenticated by every later step; validation is not
  opened before ``prepare_development`` and only after a passed E0 gate; no test data exists;
* exactly the declared cells (arm x seed) run, each once to its final budget; only a
  crashed cell (no final receipt) is attempted again, as a new recorded attempt;
* the report uses final states only, never an intermediate checkpoint;
* the qhlab source package may not change after freeze (``source_package_digest``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics as pystats
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qhlab.evidence.publish import TEMP_MARKER
from qhlab.evidence import (
    EvidenceError,
    OrderError,
    PublishConflictError,
    QhError,
    QhInputError,
    canonical_json,
    exclusive_lock,
    publish_bytes,
    publish_json,
    read_receipt,
    safe_component,
    sha256_bytes,
    sha256_file,
    source_package_digest,
    write_receipt,
)

__all__ = [
    "QhArchitectureStudyConfig",
    "admit_canaries",
    "benchmark_scorer",
    "freeze_study",
    "main",
    "prepare_development",
    "reference_comparisons",
    "report_study",
    "run_fit",
]

SCHEMA_VERSION = 1
CONFIG_COPY = "study-config.toml"
FREEZE_RECEIPT = "freeze.receipt.json"
CANARY_DIR = "canaries"
SELECTION_FILE = "selection.json"
E0_RECEIPT = "e0.receipt.json"
DEVELOPMENT_RECEIPT = "development.receipt.json"
CELLS_DIR = "cells"
CELL_RECEIPT = "cell.receipt.json"
BENCHMARK_DIR = "benchmarks"
REPORT_DIR = "report"
REPORT_RECEIPT = "report.receipt.json"
CANARY_ROLES = ("e0",)
WARMUP_FORWARDS = 10
TIMED_FORWARDS = 20
_CALL = "architecture_study"
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
# Fields of the experiment recipe that the study itself owns.
_STUDY_OWNED_RECIPE_FIELDS = {
    "seed": "seeds",
    "updates": "broad_updates / canary_updates",
    "data": "train / validation",
    "accelerator": "profile",
    "devices": "profile",
    "precision": "profile",
}


def _fail(field: str, value: Any, allowed: str, hint: str, *, call: str = _CALL) -> QhInputError:
    return QhInputError(f"{call}: {field}={value!r} is not allowed; allowed: {allowed}. HINT: {hint}")


# ============================================================================ configuration


class PopulationSource(BaseModel):
    """A population named by preset and seed (generated and cached) or by a directory.

    Attributes:
        preset: registered ``qhlab.scenes`` preset (with ``seed``).
        seed: population seed (with ``preset``).
        path: an existing population directory (instead of preset and seed); relative paths
            are resolved against the study config's directory.
    """

    model_config = _FROZEN

    preset: str | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    path: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PopulationSource:
        if self.path is not None:
            if self.preset is not None or self.seed is not None:
                raise ValueError(
                    "path together with preset/seed is not allowed; allowed: either path, or "
                    "preset and seed"
                )
            if not self.path:
                raise ValueError("path='' is not allowed; allowed: a population directory")
            return self
        if self.preset is None or self.seed is None:
            raise ValueError(
                f"preset={self.preset!r}, seed={self.seed!r} is not allowed; allowed: both preset "
                "and seed (explicit), or path"
            )
        from qhlab.scenes import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(
                f"preset={self.preset!r} is not allowed; allowed: {', '.join(sorted(PRESETS))}"
            )
        return self


class EncoderSizes(BaseModel):
    """Size overrides of one arm's encoder (structure comes from the registered arm)."""

    model_config = _FROZEN

    depth: int | None = Field(default=None, ge=1, le=16)
    width: int | None = Field(default=None, ge=8, le=1024)
    heads: int | None = Field(default=None, ge=1, le=64)


class ArmDeclaration(BaseModel):
    """One non-baseline arm of the comparison family.

    Attributes:
        arm: a registered scorer arm (``qhlab.finite_horizon.scorer.ARMS``).
        role: "control" (a structural ablation of the baseline) or "variant" (a candidate
            improvement).
        control: variants only: the structural control the regret margin compares against.
        matched: variants only: the matched control of the calibration (MAE) margin; default
            the baseline.
        encoder: optional size overrides (architecture fields only).
    """

    model_config = _FROZEN

    arm: str
    role: Literal["control", "variant"]
    control: str | None = None
    matched: str | None = None
    encoder: EncoderSizes = EncoderSizes()

    @field_validator("arm")
    @classmethod
    def _registered(cls, arm: str) -> str:
        from qhlab.finite_horizon.scorer import ARMS

        if arm not in ARMS:
            raise ValueError(f"arm={arm!r} is not allowed; allowed: {', '.join(sorted(ARMS))}")
        return arm


class StudyExperiment(BaseModel):
    """The native-Huber baseline recipe and the arms derived from it.

    Attributes:
        recipe: the baseline recipe's scientific fields (as in a recipe TOML) without
            ``seed``, ``updates``, ``data`` and backend fields, which the study owns. Its
            ``architecture.arm`` is the baseline arm.
        arms: controls and variants; each alters only architecture fields.
    """

    model_config = _FROZEN

    recipe: dict[str, Any]
    arms: tuple[ArmDeclaration, ...] = Field(min_length=2)

    @field_validator("recipe")
    @classmethod
    def _no_study_fields(cls, recipe: dict[str, Any]) -> dict[str, Any]:
        owned = [f"{k} (set by the study's {v})" for k, v in _STUDY_OWNED_RECIPE_FIELDS.items() if k in recipe]
        if owned:
            raise ValueError(f"recipe field(s) {', '.join(owned)} are not allowed; allowed: the "
                             "scientific fields only")
        return recipe


class BootstrapConfig(BaseModel):
    """Scene bootstrap settings (declared, so every interval is reproducible)."""

    model_config = _FROZEN

    resamples: int = Field(default=9999, ge=100, le=1_000_000)
    seed: int = Field(default=0, ge=0, lt=2**32)
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)


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
        regret_fraction: prospective retention threshold relative to the structural control.
        mae_fraction: calibration safety bound relative to the matched control.
        max_allocated_bytes: scorer process GPU allocator ceiling (enforced on CUDA only).
        workers: broad fits run at once (one process each).
        torch_threads: torch intra-op threads of each fit process. One is the fastest for these
            small scorers (with two threads on a busy 2-core host a forward can be 30x slower)
            and keeps every reduction in one order.
        population_cache: cache directory of generated populations.
        bootstrap: scene bootstrap settings of the report.
    """

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    profile: str = "cpu-fp32"
    train: PopulationSource
    validation: PopulationSource
    experiment: StudyExperiment
    seeds: tuple[int, ...]
    canary_updates: int = Field(ge=1, le=10_000_000)
    broad_updates: int = Field(ge=1, le=10_000_000)
    tie_band: float = Field(ge=0.0)
    regret_fraction: float = Field(gt=0.0)
    mae_fraction: float = Field(gt=0.0)
    max_allocated_bytes: int | None = Field(default=None, gt=0)
    workers: int = Field(default=1, ge=1, le=64)
    torch_threads: int = Field(default=1, ge=1, le=256)
    population_cache: str = "~/.cache/qhlab/populations"
    bootstrap: BootstrapConfig = BootstrapConfig()

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, profile: str) -> str:
        from qhlab.training.execution_profile import PROFILE_NAMES

        if profile not in PROFILE_NAMES:
            raise ValueError(f"profile={profile!r} is not allowed; allowed: {', '.join(PROFILE_NAMES)}")
        return profile

    @field_validator("seeds")
    @classmethod
    def _two_seeds(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        if len(seeds) != 2 or len(set(seeds)) != 2 or any(s < 0 or s >= 2**63 for s in seeds):
            raise ValueError(
                f"seeds={list(seeds)!r} is not allowed; allowed: exactly two distinct integers >= 0 "
                "(both replication seeds are declared up front; no seed search)"
            )
        return seeds

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
            raise ValueError("experiment.recipe.architecture.arm is missing; allowed: a registered arm")
        return arm

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

    def cell_recipe(self, arm: str, seed: int, updates: int):
        """The recipe of one cell: the baseline recipe with only the architecture changed.

        Args:
            arm: a declared arm.
            seed: the fit seed.
            updates: the final update budget.

        Returns:
            A validated ``QhRecipe`` (data fields empty; backend fields from no profile yet).
        """
        from qhlab.finite_horizon.recipe import validate_recipe

        raw = dict(self.experiment.recipe)
        base_arch = dict(raw.get("architecture", {}))
        base_encoder = dict(base_arch.get("encoder", {}))
        evaluation = dict(raw.get("evaluation", {}))
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
            # Shared sizes follow the baseline; the depth is the arm's own (its default or an
            # explicit override), because depth is what e.g. variant_deep changes.
            encoder = {k: base_encoder[k] for k in ("width", "heads") if k in base_encoder}
            encoder.update(declaration.encoder.model_dump(exclude_none=True))
            architecture = {"arm": arm, "encoder": encoder}
        raw.update(
            name=f"{self.name}-{arm}-s{seed}"[:128],
            seed=seed,
            updates=updates,
            architecture=architecture,
            evaluation=evaluation,
        )
        try:
            return validate_recipe(raw, source=f"study {self.name!r} arm {arm!r}")
        except QhInputError as exc:
            raise ValueError(str(exc)) from None


def _config_error(exc: ValidationError, source: str) -> QhInputError:
    lines = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(p) for p in error["loc"]) or "<config>"
        if error["type"] == "missing":
            lines.append(f"  - {path} is missing; allowed: a value (this field is required)")
        elif error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            lines.append(f"  - {path} is not allowed; allowed: only the fields "
                         f"{', '.join(QhArchitectureStudyConfig.model_fields)} (a study has no test stage)")
        elif error["type"] in ("value_error", "assertion_error"):
            lines.append(f"  - {path}: {str(error['msg']).removeprefix('Value error, ')}")
        else:
            value = error.get("input")
            shown = "{...}" if isinstance(value, dict) else repr(value)
            lines.append(f"  - {path}={shown} is not allowed; allowed: {error['msg']}")
    return QhInputError(
        f"{source}: {len(lines)} invalid field(s):\n" + "\n".join(lines)
        + "\nHINT: compare with examples/default-study.toml."
    )


def _read_config(config_path: str | os.PathLike) -> tuple[QhArchitectureStudyConfig, bytes, Path]:
    """Read and fully validate a study config; returns (config, file bytes, resolved path)."""
    path = Path(config_path).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _fail("config_path", str(path), "an existing study TOML file",
                    "see examples/default-study.toml") from None
    except OSError as exc:
        raise _fail("config_path", str(path), f"a readable file ({exc})", "check permissions") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _fail("config_path", str(path), f"a UTF-8 TOML file ({exc})",
                    "compare with examples/default-study.toml") from None
    base = path.resolve().parent
    for section in ("train", "validation"):
        entry = raw.get(section)
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and entry["path"]:
            p = Path(entry["path"]).expanduser()
            raw[section] = {**entry, "path": str(p if p.is_absolute() else (base / p).resolve())}
    cache = raw.get("population_cache")
    if isinstance(cache, str) and cache:
        p = Path(cache).expanduser()
        raw["population_cache"] = str(p if p.is_absolute() else (base / p).resolve())
    try:
        config = QhArchitectureStudyConfig.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc, f"study config {str(path)!r}") from None
    return config, data, path.resolve()


# ============================================================================ shared helpers


def _cell_name(arm: str, seed: int, canary_role: str | None = None) -> str:
    name = f"{arm}-s{seed}" if canary_role is None else f"{canary_role}-{arm}-s{seed}"
    return safe_component(name, field="cell", call=_CALL)


def _population_files(path: Path) -> dict[str, Path]:
    from qhlab.scenes.population import MANIFEST, POPULATION_FILES

    return {name: path / name for name in (MANIFEST, *POPULATION_FILES)}


def _resolve_population(source: PopulationSource, split: str, cache: str, *, progress: bool) -> Path:
    """Generate (or reuse from the cache) a preset population, or return the named path."""
    if source.path is not None:
        return Path(source.path)
    from qhlab.scenes import cached_population

    reporter = None
    if progress:
        reporter = _generation_progress(f"{split} population ({source.preset}, seed {source.seed})")
    try:
        return cached_population(source.preset, split, source.seed, Path(cache).expanduser(),
                                 progress=reporter)
    finally:
        if reporter is not None:
            reporter.close()


class _generation_progress:
    """A rich progress bar fed by ``cached_population``'s ``progress(done, planned)``."""

    def __init__(self, label: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                  TextColumn("{task.completed}/{task.total} simulations"),
                                  TimeElapsedColumn(), transient=False)
        self._task = None
        self._label = label

    def __call__(self, done: int, planned: int) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=planned)
        self._progress.update(self._task, completed=done, total=planned)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()


def _population_support(population: Any) -> dict[str, int]:
    is_chain = population.is_chain.numpy().astype(bool)
    mask = population.candidate_mask.numpy()
    return {
        "scenes": int(np.unique(population.scene_id.numpy()[is_chain]).size),
        "chain_states": int(is_chain.sum()),
        "successor_states": int((~is_chain).sum()),
        "candidates": int(mask[is_chain].sum()),
        "K": int(population.num_candidates),
        "H": int(population.horizon),
    }


def _canonical_first_chain(population: Any) -> dict[str, Any]:
    """Rows of the chain with the smallest (scene_id, chain_id), in step order."""
    is_chain = population.is_chain.numpy().astype(bool)
    rows = np.flatnonzero(is_chain)
    scene = population.scene_id.numpy()[rows]
    chain = population.chain_id.numpy()[rows]
    key = min(zip(scene.tolist(), chain.tolist()))
    selected = rows[(scene == key[0]) & (chain == key[1])]
    steps = population.step.numpy()[selected]
    ordered = selected[np.argsort(steps, kind="stable")]
    return {"scene_id": int(key[0]), "chain_id": int(key[1]), "rows": [int(r) for r in ordered]}


def _load(path: Path, split: str, horizon: int):
    from qhlab.finite_horizon.data import load_population

    return load_population(path, split=split, horizon=horizon)


def _require(path: Path, what: str, step: str, hint: str) -> None:
    if not path.is_file():
        raise OrderError(
            f"{step}: {what} is missing ({path} does not exist); the study steps run in order "
            f"freeze -> admit-canaries -> prepare-development -> run-fit -> report. HINT: {hint}"
        )


class _Frozen:
    """The authenticated freeze record plus the config it was made from."""

    def __init__(self, config: QhArchitectureStudyConfig, receipt: dict, output: Path, config_path: Path):
        self.config = config
        self.receipt = receipt
        self.body = receipt["body"]
        self.output = output
        self.config_path = config_path
        self.receipt_path = output / FREEZE_RECEIPT
        self.train_path = Path(self.body["train"]["path"])

    @property
    def horizon(self) -> int:
        return int(self.body["train"]["support"]["H"])

    def recipe(self, arm: str, seed: int, updates: int):
        recipe = self.config.cell_recipe(arm, seed, updates)
        from qhlab.finite_horizon.recipe import recipe_digest

        frozen = self.body["recipes"][arm][str(seed)][str(updates)]
        if recipe_digest(recipe) != frozen:
            raise EvidenceError(
                f"{_CALL}: the recipe of cell {arm}-s{seed} has digest {recipe_digest(recipe)}; the "
                f"freeze receipt {self.receipt_path} binds {frozen}. HINT: the study is frozen."
            )
        return recipe


def _authenticate_freeze(config_path: str | os.PathLike, output: str | os.PathLike, step: str) -> _Frozen:
    """Re-read the config and authenticate the freeze receipt, TRAIN bytes and source code."""
    config, data, resolved = _read_config(config_path)
    output = Path(output)
    _require(output / FREEZE_RECEIPT, "the freeze receipt", step,
             f"run `qhlab study freeze {config_path} --output {output}` first")
    receipt = read_receipt(output / FREEZE_RECEIPT, kind="study_freeze", schema_version=SCHEMA_VERSION)
    body = receipt["body"]
    if body["config"]["sha256"] != sha256_bytes(data):
        raise EvidenceError(
            f"{step}: config {str(resolved)!r} has sha256 {sha256_bytes(data)}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body['config']['sha256']}. HINT: a frozen study's config "
            "cannot change; freeze a new study into a new output directory."
        )
    source = source_package_digest()
    if source["sha256"] != body["source_package"]["sha256"]:
        raise EvidenceError(
            f"{step}: the qhlab source package has sha256 {source['sha256']}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body['source_package']['sha256']}. HINT: the package "
            "code changed after freeze; a study runs on the code it was frozen with."
        )
    return _Frozen(config, receipt, output, resolved)


def _authenticate_e0(frozen: _Frozen, step: str) -> dict:
    path = frozen.output / CANARY_DIR / E0_RECEIPT
    _require(path, "the E0 gate receipt", step,
             f"run `qhlab study admit-canaries {frozen.config_path} --output {frozen.output}`")
    receipt = read_receipt(path, kind="study_e0", schema_version=SCHEMA_VERSION)
    _check_bound(receipt, "freeze", frozen.receipt_path, path)
    return receipt


def _authenticate_development(frozen: _Frozen, step: str) -> dict:
    path = frozen.output / DEVELOPMENT_RECEIPT
    _require(path, "the development receipt (validation not sealed)", step,
             f"run `qhlab study prepare-development {frozen.config_path} --output {frozen.output}`")
    receipt = read_receipt(path, kind="study_development", schema_version=SCHEMA_VERSION)
    _check_bound(receipt, "freeze", frozen.receipt_path, path)
    e0 = _authenticate_e0(frozen, step)
    _check_bound(receipt, "e0", frozen.output / CANARY_DIR / E0_RECEIPT, path)
    if not e0["body"]["passed"]:
        raise EvidenceError(f"{step}: {path} binds an E0 gate that did not pass.")
    return receipt


def _check_bound(receipt: dict, name: str, expected: Path, where: Path) -> None:
    entry = receipt["inputs"].get(name)
    if entry is None or entry["sha256"] != sha256_file(expected):
        raise EvidenceError(
            f"{_CALL}: {where} does not bind the current {name} receipt {expected}. HINT: receipts "
            "of one study chain each other; a replaced receipt breaks the chain."
        )


# ============================================================================ 1. freeze


def freeze_study(config_path, output):
    """Bind TRAIN support, source and controls without constructing held-out data.

    Validates the config completely, resolves the TRAIN population (generated or reused from
    the cache when named by preset) and digests its files, records TRAIN support, the
    canonical first TRAIN chain, the arms with their resolved architectures and recipe
    digests, both seeds, budgets, thresholds and the source-package digest. The validation
    population is only declared: it is neither generated nor opened here.

    Args:
        config_path: the study TOML.
        output: the study directory (must not exist, or be empty).

    Returns:
        The freeze receipt body (dict).

    Raises:
        QhInputError: bad config or TRAIN data (nothing written).
        PublishConflictError: the study is already frozen at ``output``.
    """
    from qhlab.finite_horizon.recipe import recipe_digest

    config, data, resolved = _read_config(config_path)
    output = Path(output)
    if (output / FREEZE_RECEIPT).exists():
        raise PublishConflictError(
            f"freeze_study: {output / FREEZE_RECEIPT} already exists; a study is frozen once. "
            "HINT: `qhlab study run` skips steps that already authenticate; use a new --output for a new study."
        )
    # A freeze killed after publishing its config copy leaves only that copy (and perhaps a
    # temporary file): the same config bytes may complete the freeze there.
    leftovers = sorted(p.name for p in output.iterdir() if TEMP_MARKER not in p.name) if output.is_dir() else []
    resumable = leftovers == [CONFIG_COPY] and (output / CONFIG_COPY).read_bytes() == data
    if output.exists() and (not output.is_dir() or (leftovers and not resumable)):
        raise _fail("output", str(output), "a new or empty directory",
                    "each study publishes into its own directory", call="freeze_study")
    train_path = _resolve_population(config.train, "train", config.population_cache, progress=True)
    first = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates)
    population = _load(train_path, "train", first.horizon)
    support = _population_support(population)
    chain = _canonical_first_chain(population)
    recipes = {
        arm: {
            str(seed): {str(u): recipe_digest(config.cell_recipe(arm, seed, u))
                        for u in (config.broad_updates, config.canary_updates)}
            for seed in config.seeds
        }
        for arm in config.arms
    }
    arms = []
    for arm in config.arms:
        declaration = config.declaration(arm)
        recipe = config.cell_recipe(arm, config.seeds[0], config.broad_updates)
        arms.append({
            "arm": arm,
            "role": "baseline" if declaration is None else declaration.role,
            "control": None if declaration is None else declaration.control,
            "matched": None if declaration is None or declaration.role != "variant"
            else (declaration.matched or config.baseline_arm),
            "architecture": recipe.architecture.model_dump(mode="json"),
        })
    body = {
        "study": config.name,
        "config": {"sha256": sha256_bytes(data), "source_path": str(resolved),
                   "resolved": config.model_dump(mode="json")},
        "profile": config.profile,
        "source_package": source_package_digest(),
        "train": {
            "path": str(train_path.resolve()),
            "declared": config.train.model_dump(mode="json"),
            "manifest_sha256": population.digest,
            "support": support,
            "canonical_first_chain": chain,
        },
        "validation": {"declared": config.validation.model_dump(mode="json"), "opened": False},
        "arms": arms,
        "recipes": recipes,
        "only_architecture_differs": _only_architecture_differs(config),
        "seeds": list(config.seeds),
        "cells": [_cell_name(a, s) for a, s in config.cells],
        "budgets": {"canary_updates": config.canary_updates, "broad_updates": config.broad_updates},
        "thresholds": {"tie_band": config.tie_band, "regret_fraction": config.regret_fraction,
                       "mae_fraction": config.mae_fraction},
        "max_allocated_bytes": config.max_allocated_bytes,
        "test_data": "none: this study has no test stage",
    }
    output.mkdir(parents=True, exist_ok=True)
    if not resumable:
        publish_bytes(output / CONFIG_COPY, data)
    inputs = {f"train/{k}": v for k, v in _population_files(train_path).items()}
    write_receipt(output / FREEZE_RECEIPT, kind="study_freeze", schema_version=SCHEMA_VERSION,
                  body=body, inputs=inputs, outputs={"config": output / CONFIG_COPY})
    return body


def _only_architecture_differs(config: QhArchitectureStudyConfig) -> bool:
    base = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
    for arm in config.arms[1:]:
        other = config.cell_recipe(arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
        changed = {k for k in base if base[k] != other[k]} - {"architecture", "name"}
        if changed:
            raise _fail(f"experiment.arms[{arm}]", sorted(changed), "architecture fields only",
                        "a variant alters only the declared architecture", call="freeze_study")
    return True


# ============================================================================ 2. canaries


def _select_canary_row(population: Any, chain: dict, tie_band: float) -> dict | None:
    """The first state of the canonical first chain whose best label beats the runner-up
    by more than ``tie_band`` at every horizon (rule fixed before looking at any fit)."""
    q = population.q.numpy()
    mask = population.candidate_mask.numpy()
    horizon = int(population.horizon)
    for row in chain["rows"]:
        labels = q[row][mask[row]][:, :horizon]  # [K_valid, H]
        if labels.shape[0] < 2:
            continue
        ordered = np.sort(labels, axis=0)[::-1]
        gaps = ordered[0] - ordered[1]
        if bool((gaps > tie_band).all()):
            valid = np.flatnonzero(mask[row])
            return {
                "row": int(row),
                "state_id": int(population.state_id[row]),
                "scene_id": int(population.scene_id[row]),
                "chain_id": int(population.chain_id[row]),
                "step": int(population.step[row]),
                "best_action": [int(valid[int(np.argmax(labels[:, h]))]) for h in range(horizon)],
                "gaps": [float(g) for g in gaps],
                "labels": q[row][:, :horizon].tolist(),
                "candidate_mask": [bool(m) for m in mask[row]],
            }
    return None


def _recovers(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray, tie_band: float) -> list[dict]:
    """Per horizon: the predicted tie set (within ``tie_band`` of the predicted max) must hold
    only actions whose original label is within ``tie_band`` of the best label.

    Args:
        pred: [K, H] predictions of the row. labels: [K, H] original labels. mask: [K] bool.
    """
    out = []
    for h in range(labels.shape[1]):
        p = np.where(mask, pred[:, h], -np.inf)
        chosen = np.flatnonzero(mask & (p >= p.max() - tie_band))
        best = labels[mask, h].max()
        ok = bool((labels[chosen, h] >= best - tie_band).all())
        out.append({"horizon": h + 1, "chosen": [int(c) for c in chosen], "recovered": ok,
                    "predicted": [float(v) for v in pred[:, h]]})
    return out


_CANARY_SUCCESSOR_WHY = (
    "a canary trains one TRAIN row; its Q_h targets (h >= 2) bootstrap through the target "
    "scorer's Q_{h-1} on the row's successor states, which no TD row of a one-row fit trains "
    "(successor states carry no successors of their own), so without an anchor those values "
    "stay at their initialization and the canary could fail (or pass) whatever the learning "
    "rule does; the canary therefore also fits the successors' Q_1..Q_{H-1} heads to their "
    "exact stored TRAIN labels, and its batch is its one row repeated, so one anchored row "
    "covers every successor"
)


def _canary_recipe(recipe) -> tuple[Any, dict]:
    """The recipe a canary fits: the frozen baseline recipe with its successors anchored.

    ``successor_label_rows`` becomes 1 (see ``_CANARY_SUCCESSOR_WHY``); every other field is
    the frozen recipe's. The change is a fixed rule of this (frozen) source package applied to
    the authenticated frozen recipe, so the freeze still determines exactly what a canary runs.

    Args:
        recipe: the authenticated baseline ``QhRecipe`` at ``canary_updates``.

    Returns:
        (the canary ``QhRecipe``, a JSON-able record of the change and why for the cell
        receipt).
    """
    from qhlab.finite_horizon.recipe import recipe_digest

    canary = type(recipe).model_validate({**recipe.model_dump(), "successor_label_rows": 1})
    record = {
        "successor_label_rows": 1,
        "study_successor_label_rows": int(recipe.successor_label_rows),
        "successor_reward_rows": int(recipe.successor_reward_rows),
        "frozen_recipe_digest": recipe_digest(recipe),
        "canary_recipe_digest": recipe_digest(canary),
        "why": _CANARY_SUCCESSOR_WHY,
    }
    return canary, record


def _canary_failures(canaries: list[dict], selected: dict) -> list[dict]:
    """One record per failing (canary, horizon): the chosen candidates and the optimal one,
    each with predicted and true (original label) values. ``selected["labels"]`` is [K][H]."""
    labels = selected["labels"]
    failures = []
    for c in canaries:
        for h in c["canary"]["per_horizon"]:
            if h["recovered"]:
                continue
            i = h["horizon"] - 1
            best = selected["best_action"][i]
            failures.append({
                "cell": c["cell"], "seed": c["seed"], "horizon": h["horizon"],
                "chosen": h["chosen"],
                "chosen_predicted": [h["predicted"][a] for a in h["chosen"]],
                "chosen_true": [labels[a][i] for a in h["chosen"]],
                "optimal": best, "optimal_predicted": h["predicted"][best],
                "optimal_true": labels[best][i],
            })
    return failures


def _failure_text(f: dict) -> str:
    def values(xs: list[float]) -> str:
        return ", ".join(f"{x:.4f}" for x in xs)

    return (f"{f['cell']} (seed {f['seed']}) at H={f['horizon']} chose candidate(s) "
            f"{', '.join(map(str, f['chosen']))} (predicted {values(f['chosen_predicted'])}; "
            f"true {values(f['chosen_true'])}); the optimal candidate is {f['optimal']} "
            f"(predicted {f['optimal_predicted']:.4f}; true {f['optimal_true']:.4f})")


def admit_canaries(config_path, output):
    """Gate broad fits using the original labels of one prospectively selected TRAIN row.

    Selects the row by the fixed rule (first state of the canonical first TRAIN chain whose
    best label beats the runner-up by more than ``tie_band`` at every horizon), runs the two
    canary fits (baseline, each seed, ``canary_updates``, that TRAIN row only, via
    ``run_fit(..., canary_role="e0")``) and admits when each recovers the optimal action
    within ``tie_band`` on the row's original labels. Writes the E0 receipt either way.

    Each canary fits the frozen baseline recipe with ``successor_label_rows = 1``, so every
    value its H >= 2 targets bootstrap through (Q_1..Q_{H-1} on the row's successors) is fitted
    to the exact TRAIN labels (recorded in the canary cell receipt, ``canary.successor_training``).

    Returns:
        The E0 receipt body; ``body["passed"]`` says whether broad fits may run. On failure
        ``body["reason"]`` names, per failing canary and horizon, the chosen candidates and
        the optimal one with their predicted and true values, and ``body["failures"]`` holds
        the same as records.
    """
    frozen = _authenticate_freeze(config_path, output, "admit_canaries")
    directory = frozen.output / CANARY_DIR
    if (directory / E0_RECEIPT).exists():
        raise PublishConflictError(
            f"admit_canaries: {directory / E0_RECEIPT} already exists; the E0 gate is decided once."
        )
    config = frozen.config
    selection_path = directory / SELECTION_FILE
    if not selection_path.exists():
        population = _load(frozen.train_path, "train", frozen.horizon)
        selected = _select_canary_row(population, frozen.body["train"]["canonical_first_chain"],
                                      config.tie_band)
        directory.mkdir(exist_ok=True)
        publish_json(selection_path, {
            "schema_version": SCHEMA_VERSION,
            "rule": "first state of the canonical first TRAIN chain whose best label beats the "
                    "runner-up by more than tie_band at every horizon",
            "tie_band": config.tie_band,
            "canonical_first_chain": frozen.body["train"]["canonical_first_chain"],
            "freeze_receipt_sha256": sha256_file(frozen.receipt_path),
            "selected": selected,
        })
    selection = _read_selection(frozen)
    canaries = []
    if selection["selected"] is not None:
        for seed in config.seeds:
            cell = _cell_name(config.baseline_arm, seed, "e0")
            receipt_path = directory / cell / CELL_RECEIPT
            if not receipt_path.exists():
                run_fit(config_path, output, variant=config.baseline_arm, seed=seed, canary_role="e0")
            document = read_receipt(receipt_path, kind="study_cell", schema_version=SCHEMA_VERSION)
            canaries.append({"cell": cell, "seed": seed, "receipt": receipt_path,
                             "canary": document["body"]["canary"]})
    passed = bool(canaries) and all(c["canary"]["recovered"] for c in canaries)
    failures = _canary_failures(canaries, selection["selected"]) if canaries else []
    if selection["selected"] is None:
        reason = "no state of the canonical first chain has a unique best action at every horizon"
    elif passed:
        reason = "every canary recovered the optimal action"
    else:
        # Name what each failing canary chose, so a failed gate can be diagnosed from the
        # receipt (and the CLI line) without reopening the fits.
        reason = (f"a canary did not recover the optimal action within tie_band={config.tie_band}: "
                  + "; ".join(_failure_text(f) for f in failures))
    body = {
        "study": config.name,
        "passed": passed,
        "reason": reason,
        "failures": failures,
        "selection": selection,
        "canaries": [{k: v for k, v in c.items() if k != "receipt"} for c in canaries],
        "canary_updates": config.canary_updates,
    }
    inputs = {"freeze": frozen.receipt_path, "selection": selection_path}
    inputs.update({f"canary/{c['cell']}": c["receipt"] for c in canaries})
    write_receipt(directory / E0_RECEIPT, kind="study_e0", schema_version=SCHEMA_VERSION,
                  body=body, inputs=inputs)
    return body


def _read_selection(frozen: _Frozen) -> dict:
    import json

    path = frozen.output / CANARY_DIR / SELECTION_FILE
    raw = path.read_bytes()
    selection = json.loads(raw)
    if canonical_json(selection) != raw or selection.get("freeze_receipt_sha256") != sha256_file(frozen.receipt_path):
        raise EvidenceError(f"{_CALL}: {path} was edited or belongs to another freeze receipt.")
    return selection


# ============================================================================ 3. development


def prepare_development(config_path, output):
    """Seal exposed validation and TRAIN-only constant after the E0 gate passes.

    Resolves (generates or reuses) and authenticates the validation population, checks that it
    matches TRAIN's horizon, candidates and features and shares no scene with it, computes
    the TRAIN-only constant predictor and its validation metrics, the heuristic references
    (TRAIN-chosen best fixed index, straight strike, myopic oracle; body ``references``), and
    writes the development receipt binding the validation files.

    Returns:
        The development receipt body.
    """
    from qhlab.finite_horizon.evaluation import (
        constant_predictions,
        evaluate_population,
        population_heuristic_references,
        population_train_constant,
    )

    frozen = _authenticate_freeze(config_path, output, "prepare_development")
    e0 = _authenticate_e0(frozen, "prepare_development")
    if not e0["body"]["passed"]:
        raise OrderError(
            f"prepare_development: the E0 gate did not pass ({e0['body']['reason']}); validation "
            "stays closed. HINT: a study whose canaries fail is stopped; fix the recipe and freeze a new study."
        )
    path = frozen.output / DEVELOPMENT_RECEIPT
    if path.exists():
        raise PublishConflictError(f"prepare_development: {path} already exists; development is sealed once.")
    config = frozen.config
    source = config.validation
    if source.path is not None and not Path(source.path).is_dir():
        raise _fail("validation.path", source.path, "an existing population directory",
                    "generate it with `qhlab scenes generate --split validation` or name a preset",
                    call="prepare_development")
    validation_path = _resolve_population(source, "validation", config.population_cache, progress=True)
    validation = _load(validation_path, "validation", frozen.horizon)
    train = _load(frozen.train_path, "train", frozen.horizon)
    if train.manifest.get("features") != validation.manifest.get("features") or train.num_candidates != validation.num_candidates:
        raise _fail("validation", str(validation_path), "a population with TRAIN's features and K",
                    "use the same preset family for both splits", call="prepare_development")
    shared = set(train.scene_id.tolist()) & set(validation.scene_id.tolist())
    if shared:
        raise _fail("validation", f"{len(shared)} scene(s) shared with TRAIN", "disjoint scenes",
                    "generate validation with split='validation'", call="prepare_development")
    constant = population_train_constant(train)
    summary = evaluate_population(constant_predictions(constant, validation.candidate_mask.numpy()),
                                  validation, tie_band=config.tie_band)
    # Cheap policies next to the constant: the fixed index is chosen on TRAIN chain rows only;
    # every reference is evaluated on validation chain rows in the cells' scene order.
    references = population_heuristic_references(train, validation, tie_band=config.tie_band)
    body = {
        "study": config.name,
        "validation": {"path": str(validation_path.resolve()), "manifest_sha256": validation.digest,
                       "support": _population_support(validation),
                       "declared": source.model_dump(mode="json")},
        "train_constant": [float(v) for v in constant],
        "constant_on_validation": summary,
        "references": references,
    }
    inputs = {"freeze": frozen.receipt_path, "e0": frozen.output / CANARY_DIR / E0_RECEIPT}
    inputs.update({f"validation/{k}": v for k, v in _population_files(validation_path).items()})
    write_receipt(path, kind="study_development", schema_version=SCHEMA_VERSION, body=body, inputs=inputs)
    return body


# ============================================================================ 4. fits


def _attempt_directories(cell_dir: Path) -> list[Path]:
    if not cell_dir.is_dir():
        return []
    return sorted(p for p in cell_dir.iterdir() if p.is_dir())


def run_fit(config_path, output, *, variant, seed, canary_role=None):
    """Fit one charged cell using canonical diagnostic admission and receipts.

    A broad cell (``canary_role=None``) runs the frozen recipe of ``variant`` with ``seed`` to
    ``broad_updates`` on TRAIN and is evaluated on the sealed validation population; a canary
    (``canary_role="e0"``, baseline only) runs ``canary_updates`` on the selected TRAIN row only
    and is scored on that row's original labels. A finished cell (its cell receipt exists) is
    never rerun; a crashed attempt (no final receipt) is kept and a new attempt is recorded.

    Returns:
        The cell receipt body.
    """
    step = "run_fit" if canary_role is None else "run_fit(canary)"
    frozen = _authenticate_freeze(config_path, output, step)
    config = frozen.config
    if variant not in config.arms:
        raise _fail("variant", variant, f"a declared arm ({', '.join(config.arms)})",
                    "exactly the frozen cells may be run", call=step)
    if isinstance(seed, bool) or seed not in config.seeds:
        raise _fail("seed", seed, f"a declared seed ({', '.join(map(str, config.seeds))})",
                    "exactly the frozen cells may be run; there is no seed search", call=step)
    if canary_role is not None:
        if canary_role not in CANARY_ROLES:
            raise _fail("canary_role", canary_role, f"None or {', '.join(CANARY_ROLES)}",
                        "canaries are the E0 gate's fits", call=step)
        if variant != config.baseline_arm:
            raise _fail("variant", variant, f"the baseline {config.baseline_arm!r} for a canary",
                        "canaries fit the baseline only", call=step)
        if not (frozen.output / CANARY_DIR / SELECTION_FILE).exists():
            raise OrderError(
                f"{step}: the canary row is not selected yet ({frozen.output / CANARY_DIR / SELECTION_FILE} "
                "is missing). HINT: canaries run through `qhlab study admit-canaries`."
            )
        if (frozen.output / CANARY_DIR / E0_RECEIPT).exists():
            raise OrderError(f"{step}: the E0 gate is already decided; canaries do not run again.")
        parent = frozen.output / CANARY_DIR
        development = None
    else:
        development = _authenticate_development(frozen, step)
        parent = frozen.output / CELLS_DIR
    cell = _cell_name(variant, seed, canary_role)
    cell_dir = parent / cell
    parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(parent / f".{cell}.lock"):
        if (cell_dir / CELL_RECEIPT).exists():
            raise PublishConflictError(
                f"{step}: cell {cell} is finished ({cell_dir / CELL_RECEIPT} exists); a charged cell "
                "runs once and is reported whatever its result. HINT: nothing to do."
            )
        if canary_role is None:
            return _run_broad_cell(frozen, development, variant, seed, cell, cell_dir)
        return _run_canary_cell(frozen, variant, seed, cell, cell_dir)


def _fit(frozen: _Frozen, recipe, *, parent: Path, cell: str, validation: Path | None, rows=None):
    import torch

    from qhlab.finite_horizon.fit import fit_recipe

    torch.set_num_threads(frozen.config.torch_threads)
    kwargs: dict[str, Any] = {}
    if rows is not None:
        kwargs["train_rows"] = rows
    progress = os.environ.get("QHLAB_FIT_PROGRESS", "1") == "1"
    return fit_recipe(recipe, profile=frozen.config.profile, output=parent, train=frozen.train_path,
                      validation=validation, cell=cell, evaluate=validation is not None,
                      max_allocated_bytes=frozen.config.max_allocated_bytes, progress=progress,
                      **kwargs)


def _adoptable_attempt(cell_dir: Path, budget: int, evaluate: bool) -> Path | None:
    """An attempt whose fit finished (authenticated fit receipt at the budget) but whose cell
    receipt was never written: adopted rather than rerun, since a finished fit is never rerun."""
    for attempt in _attempt_directories(cell_dir):
        fit_receipt = attempt / "fit.receipt.json"
        if not fit_receipt.is_file() or (evaluate and not (attempt / "evaluation.receipt.json").is_file()):
            continue
        document = read_receipt(fit_receipt, kind="fit", schema_version=None)
        if document["body"].get("observed_updates") == budget:
            return attempt
    return None


def _cell_body_common(frozen: _Frozen, variant: str, seed: int, cell: str, recipe, attempt: Path,
                      previous: list[str], updates: int) -> tuple[dict, dict]:
    from qhlab.finite_horizon.recipe import recipe_digest

    fit_doc = read_receipt(attempt / "fit.receipt.json", kind="fit", schema_version=None)
    observed = fit_doc["body"].get("observed_updates")
    if observed != updates:
        raise QhError(
            f"run_fit: cell {cell} observed {observed!r} optimizer updates; the frozen budget is {updates}."
        )
    final_state = attempt / "final_state.safetensors"
    body = {
        "study": frozen.config.name,
        "cell": cell,
        "arm": variant,
        "seed": seed,
        "attempt": attempt.name,
        "previous_attempts": previous,
        "recipe_digest": recipe_digest(recipe),
        "fit_recipe_digest": fit_doc["body"].get("recipe_digest"),
        "observed_updates": observed,
        "update_budget": updates,
        "final_state_sha256": sha256_file(final_state),
        "profile": fit_doc["body"].get("profile"),
        "wall_seconds": fit_doc["body"].get("wall_seconds"),
    }
    inputs = {
        "freeze": frozen.receipt_path,
        "fit": attempt / "fit.receipt.json",
        "final_state": final_state,
        "final_state_structure": final_state.with_suffix(".json"),
    }
    return body, inputs


def _run_broad_cell(frozen: _Frozen, development: dict, variant: str, seed: int, cell: str, cell_dir: Path) -> dict:
    config = frozen.config
    recipe = frozen.recipe(variant, seed, config.broad_updates)
    validation_path = Path(development["body"]["validation"]["path"])
    previous = [p.name for p in _attempt_directories(cell_dir)]
    attempt = _adoptable_attempt(cell_dir, config.broad_updates, evaluate=True)
    if attempt is None:
        result = _fit(frozen, recipe, parent=cell_dir.parent, cell=cell, validation=validation_path)
        attempt = Path(result.output_directory)
    else:
        previous.remove(attempt.name)
    body, inputs = _cell_body_common(frozen, variant, seed, cell, recipe, attempt, previous, config.broad_updates)
    evaluation = read_receipt(attempt / "evaluation.receipt.json", kind="evaluation", schema_version=None)
    ev = evaluation["body"]
    population_digest = (ev.get("population") or {}).get("digest")
    if population_digest != development["body"]["validation"]["manifest_sha256"]:
        raise EvidenceError(
            f"run_fit: {attempt / 'evaluation.receipt.json'} evaluates population {population_digest}; "
            f"the sealed validation is {development['body']['validation']['manifest_sha256']}."
        )
    if ev.get("final_state_sha256") != body["final_state_sha256"]:
        raise EvidenceError(f"run_fit: {attempt / 'evaluation.receipt.json'} evaluates another final state.")
    # Per-scene arrays are [n_scenes][H] in ascending scene order of the sealed validation.
    body["evaluation"] = {
        "horizon": ev["horizon"], "mae": ev["mae"], "regret": ev["regret"],
        "scene_ids": ev["per_scene"]["scene_id"], "scene_mae": ev["per_scene"]["mae"],
        "scene_regret": ev["per_scene"]["regret"],
    }
    inputs.update(development=frozen.output / DEVELOPMENT_RECEIPT, evaluation=attempt / "evaluation.receipt.json")
    write_receipt(cell_dir / CELL_RECEIPT, kind="study_cell", schema_version=SCHEMA_VERSION, body=body, inputs=inputs)
    return body


def _load_online(recipe, population, final_state: Path, expected_sha256: str | None = None):
    """The module (online + target) of a fit's final state, loaded strictly, on the CPU."""
    from qhlab.finite_horizon.q_learning import QhTDModule, population_dims
    from qhlab.training.tensor_state import load_tensor_state

    module = QhTDModule(recipe, population_dims(population))
    tensors, _ = load_tensor_state(final_state, expected_sha256=expected_sha256)
    for prefix, target in (("online.", module.online), ("target.", module.target)):
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        target.load_state_dict(state, strict=True)
    return module


def _run_canary_cell(frozen: _Frozen, variant: str, seed: int, cell: str, cell_dir: Path) -> dict:
    import torch

    from qhlab.finite_horizon.predict import predict_q

    config = frozen.config
    selection = _read_selection(frozen)["selected"]
    if selection is None:
        raise OrderError("run_fit(canary): no canary row was selected; the E0 gate fails without fits.")
    # Authenticated against the freeze, then the canary rule (successor Q_1 trained) applied.
    recipe, successor_training = _canary_recipe(frozen.recipe(variant, seed, config.canary_updates))
    previous = [p.name for p in _attempt_directories(cell_dir)]
    attempt = _adoptable_attempt(cell_dir, config.canary_updates, evaluate=False)
    if attempt is None:
        result = _fit(frozen, recipe, parent=cell_dir.parent, cell=cell, validation=None,
                      rows=[selection["row"]])
        attempt = Path(result.output_directory)
    else:
        previous.remove(attempt.name)
    body, inputs = _cell_body_common(frozen, variant, seed, cell, recipe, attempt, previous, config.canary_updates)
    population = _load(frozen.train_path, "train", frozen.horizon)
    module = _load_online(recipe, population, attempt / "final_state.safetensors", body["final_state_sha256"])
    pred = predict_q(module.online, population, rows=torch.tensor([selection["row"]])).numpy()[0]
    labels = np.asarray(selection["labels"], dtype=np.float64)
    mask = np.asarray(selection["candidate_mask"], dtype=bool)
    per_horizon = _recovers(pred, labels, mask, config.tie_band)
    body["canary"] = {"role": "e0", "row": selection["row"], "state_id": selection["state_id"],
                      "per_horizon": per_horizon,
                      "recovered": all(h["recovered"] for h in per_horizon),
                      "successor_training": successor_training}
    inputs["selection"] = frozen.output / CANARY_DIR / SELECTION_FILE
    write_receipt(cell_dir / CELL_RECEIPT, kind="study_cell", schema_version=SCHEMA_VERSION, body=body, inputs=inputs)
    return body


def _authenticate_cells(frozen: _Frozen, step: str) -> dict[tuple[str, int], dict]:
    missing, cells = [], {}
    for arm, seed in frozen.config.cells:
        path = frozen.output / CELLS_DIR / _cell_name(arm, seed) / CELL_RECEIPT
        if not path.is_file():
            missing.append(_cell_name(arm, seed))
            continue
        document = read_receipt(path, kind="study_cell", schema_version=SCHEMA_VERSION)
        _check_bound(document, "freeze", frozen.receipt_path, path)
        _check_bound(document, "development", frozen.output / DEVELOPMENT_RECEIPT, path)
        cells[(arm, seed)] = {"path": path, "document": document}
    if missing:
        raise OrderError(
            f"{step}: {len(missing)} of {len(frozen.config.cells)} charged cells have no final receipt: "
            f"{', '.join(missing)}. HINT: run `qhlab study run-fit CONFIG --output DIR --variant ARM "
            "--seed S` for each (or `qhlab study run`); the report compares all cells."
        )
    return cells


# ============================================================================ 5. benchmark


def _sync(device_type: str) -> None:
    import torch

    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


def benchmark_scorer(fit, train):
    """Measure a verified scorer on the canonical first TRAIN chain without updates.

    Ten warm-up and twenty synchronized, uninstrumented forwards under the lane's autocast;
    one native H1 Huber backward identifies the parameter tensors receiving gradients (no
    optimizer is built; no parameter changes, which is checked); a separate hooked pass times
    ``encoder`` and inclusive local ``readout`` (hook overhead; not additive). Fusion is not
    timed independently and is reported unavailable. Memory evidence describes this
    process's loaded module (online and target scorer).

    Args:
        fit: a fit attempt directory or its ``fit.receipt.json`` (authenticated here), or a
            ``FitResult``.
        train: the TRAIN population directory or a loaded ``Population`` (split "train").

    Returns:
        JSON-able dict: ``warmup_forwards``, ``timed_forwards``, ``median_forward_seconds``,
        ``forward_seconds`` [20], ``rows``, ``parameters_receiving_gradients``,
        ``parameters_without_gradients``, ``module_timings`` (``encoder_seconds``,
        ``readout_seconds``, ``fusion_seconds`` None, ``fusion``, ``additive`` False),
        ``memory``, ``profile``, ``device_type``, ``final_state_sha256``, ``updates_applied`` 0.
    """
    import torch

    from qhlab.finite_horizon.q_learning import QhPopulationDataModule, native_huber_loss
    from qhlab.finite_horizon.recipe import validate_recipe
    from qhlab.training.execution_profile import execution_profile

    directory = Path(getattr(fit, "output_directory", fit))
    receipt_path = directory if directory.name == "fit.receipt.json" else directory / "fit.receipt.json"
    document = read_receipt(receipt_path, kind="fit", schema_version=None)
    body = document["body"]
    recipe = validate_recipe(body["recipe"], source=f"fit receipt {receipt_path}")
    profile = execution_profile(body["profile"])
    profile.admit_runtime()
    population = _load(Path(train), "train", recipe.horizon) if isinstance(train, (str, os.PathLike)) else train
    if getattr(population, "split", None) != "train":
        raise _fail("train.split", getattr(population, "split", None), "'train'",
                    "the benchmark runs on the canonical first TRAIN chain", call="benchmark_scorer")
    final_state = receipt_path.parent / "final_state.safetensors"
    digest = sha256_file(final_state)
    bound = {e["sha256"] for e in document["outputs"].values()}
    if digest not in bound:
        raise EvidenceError(f"benchmark_scorer: {final_state} is not a final state bound by {receipt_path}.")
    memory_setup = profile.prepare_memory_accounting(None)
    module = _load_online(recipe, population, final_state, digest)
    device = torch.device(profile.device_type)
    module.to(device)
    chain = _canonical_first_chain(population)
    rows = torch.tensor(chain["rows"], dtype=torch.int64)
    data = QhPopulationDataModule(population, batch_size=len(chain["rows"]), seed=0, rows=rows)
    batch = {k: v.to(device) for k, v in data.gather(rows).items()}
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    online = module.online
    online.eval()
    inputs = [batch[k] for k in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")]
    times = []
    with torch.no_grad():
        for _ in range(WARMUP_FORWARDS):
            with profile.autocast_context():
                online(*inputs)
        _sync(profile.device_type)
        for _ in range(TIMED_FORWARDS):
            start = time.perf_counter()
            with profile.autocast_context():
                online(*inputs)
            _sync(profile.device_type)
            times.append(time.perf_counter() - start)
    # One H1 backward: y_1 = r, native Huber; lists which tensors the loss reaches.
    online.zero_grad(set_to_none=True)
    with profile.autocast_context():
        q = online(*inputs)
    loss = native_huber_loss(q[..., :1].float(), batch["reward"].unsqueeze(-1).float(),
                             batch["candidate_mask"], recipe.huber_delta)
    loss.backward()
    receiving = sorted(n for n, p in online.named_parameters() if p.grad is not None)
    without = sorted(n for n, p in online.named_parameters() if p.grad is None)
    online.zero_grad(set_to_none=True)
    # Hooked pass: inclusive wall time of encoder and readout (hooks add overhead).
    marks: dict[str, float] = {}
    spans: dict[str, float] = {}

    def _pre(name):
        def hook(_module, _inputs):
            _sync(profile.device_type)
            marks[name] = time.perf_counter()
        return hook

    def _post(name):
        def hook(_module, _inputs, _output):
            _sync(profile.device_type)
            spans[name] = time.perf_counter() - marks[name]
        return hook

    handles = []
    for name in ("encoder", "readout"):
        sub = getattr(online, name)
        handles += [sub.register_forward_pre_hook(_pre(name)), sub.register_forward_hook(_post(name))]
    try:
        with torch.no_grad(), profile.autocast_context():
            online(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    after = module.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise QhError("benchmark_scorer: a parameter or buffer changed; the benchmark must not update.")
    return {
        "warmup_forwards": WARMUP_FORWARDS,
        "timed_forwards": TIMED_FORWARDS,
        "median_forward_seconds": float(pystats.median(times)),
        "forward_seconds": [float(t) for t in times],
        "rows": len(chain["rows"]),
        "canonical_first_chain": chain,
        "parameters_receiving_gradients": receiving,
        "parameters_without_gradients": without,
        "h1_huber_loss": float(loss.detach()),
        "module_timings": {
            "encoder_seconds": float(spans["encoder"]),
            "readout_seconds": float(spans["readout"]),
            "fusion_seconds": None,
            "fusion": "unavailable: fusion is not independently hookable in this measurement",
            "additive": False,
            "note": "hooked pass with synchronizing hooks; timings include hook overhead",
        },
        "memory": profile.memory_evidence(),
        "memory_accounting": memory_setup,
        "profile": profile.name,
        "device_type": profile.device_type,
        "precision": profile.precision,
        "final_state_sha256": digest,
        "torch_threads": torch.get_num_threads(),
        "updates_applied": 0,
    }


def _benchmark_cell(config_path, output, arm: str, seed: int) -> dict:
    """Benchmark one finished cell and publish ``benchmarks/<cell>.receipt.json``."""
    frozen = _authenticate_freeze(config_path, output, "benchmark")
    development = _authenticate_development(frozen, "benchmark")
    del development
    cells = _authenticate_cells_subset(frozen, [(arm, seed)], "benchmark")
    cell = _cell_name(arm, seed)
    path = frozen.output / BENCHMARK_DIR / f"{cell}.receipt.json"
    if path.exists():
        raise PublishConflictError(f"benchmark: {path} already exists; cell {cell} is benchmarked once.")
    document = cells[(arm, seed)]["document"]
    attempt = frozen.output / CELLS_DIR / cell / document["body"]["attempt"]
    import torch

    torch.set_num_threads(frozen.config.torch_threads)
    result = benchmark_scorer(attempt, frozen.train_path)
    path.parent.mkdir(exist_ok=True)
    write_receipt(path, kind="study_benchmark", schema_version=SCHEMA_VERSION,
                  body={"cell": cell, "arm": arm, "seed": seed, **result},
                  inputs={"freeze": frozen.receipt_path, "cell": cells[(arm, seed)]["path"]})
    return result


def _authenticate_cells_subset(frozen: _Frozen, wanted, step: str) -> dict:
    cells = {}
    for arm, seed in wanted:
        if (arm, seed) not in frozen.config.cells:
            raise _fail("cell", f"{arm}-s{seed}", "a declared cell", "see the freeze receipt's cells", call=step)
        path = frozen.output / CELLS_DIR / _cell_name(arm, seed) / CELL_RECEIPT
        _require(path, f"the final receipt of cell {arm}-s{seed}", step,
                 f"run `qhlab study run-fit ... --variant {arm} --seed {seed}` first")
        document = read_receipt(path, kind="study_cell", schema_version=SCHEMA_VERSION)
        cells[(arm, seed)] = {"path": path, "document": document}
    return cells


# ============================================================================ 6. report


def report_study(config_path, output):
    """Compare all ten charged final cells; never select an intermediate checkpoint.

    Requires every declared cell's final receipt (authenticated, chained to this freeze and
    development). Writes ``report/report.json``, ``report/report.md`` and PNG figures, then
    ``report/report.receipt.json`` binding every cell receipt.

    Returns:
        The report (the content of ``report.json``).
    """
    frozen = _authenticate_freeze(config_path, output, "report_study")
    development = _authenticate_development(frozen, "report_study")
    cells = _authenticate_cells(frozen, "report_study")
    directory = frozen.output / REPORT_DIR
    if (directory / REPORT_RECEIPT).exists():
        raise PublishConflictError(f"report_study: {directory / REPORT_RECEIPT} already exists; the report is written once.")
    benchmarks = {}
    for arm, seed in frozen.config.cells:
        path = frozen.output / BENCHMARK_DIR / f"{_cell_name(arm, seed)}.receipt.json"
        if path.is_file():
            benchmarks[(arm, seed)] = {"path": path, "document": read_receipt(path, kind="study_benchmark", schema_version=SCHEMA_VERSION)}
    if len(benchmarks) != len(frozen.config.cells):
        benchmarks = {}
    report = _build_report(frozen.config, frozen.body, development["body"],
                                  {k: v["document"]["body"] for k, v in cells.items()},
                                  {k: v["document"]["body"] for k, v in benchmarks.items()})
    if directory.exists() and any(directory.iterdir()):
        raise PublishConflictError(f"report_study: {directory} holds a partial report; remove it by hand after inspection.")
    # The whole report is staged in a hidden temporary sibling and renamed into place once its
    # receipt is written, so a crash never leaves a partial report/ (receipt paths are relative).
    staging = frozen.output / f".{REPORT_DIR}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    outputs = _publish_report(report, staging)
    inputs = {"freeze": frozen.receipt_path, "development": frozen.output / DEVELOPMENT_RECEIPT}
    inputs.update({f"cell/{_cell_name(a, s)}": v["path"] for (a, s), v in cells.items()})
    inputs.update({f"benchmark/{_cell_name(a, s)}": v["path"] for (a, s), v in benchmarks.items()})
    write_receipt(staging / REPORT_RECEIPT, kind="study_report", schema_version=SCHEMA_VERSION,
                  body={"study": frozen.config.name, "summary": report["summary"]},
                  inputs=inputs, outputs=outputs)
    os.rename(staging, directory)  # atomic; refused if a report/ with content appeared meanwhile
    return report


# ---------------------------------------------------------------------------- report content


def _interval(values: np.ndarray, config: QhArchitectureStudyConfig, other: np.ndarray | None = None) -> dict:
    return _bootstrap_interval(values, config.bootstrap, other)


def _bootstrap_interval(values: np.ndarray, bootstrap: BootstrapConfig, other: np.ndarray | None = None) -> dict:
    from qhlab.finite_horizon.studies.statistics import paired_scene_bootstrap, scene_mean_interval

    options = dict(confidence=bootstrap.confidence, n_resamples=bootstrap.resamples, rng_seed=bootstrap.seed)
    if other is None:
        return scene_mean_interval(values, **options).as_dict()
    return paired_scene_bootstrap(values, other, **options).as_dict()


REFERENCE_NAMES = ("best_fixed_index", "straight_strike", "myopic_oracle")
ORACLE_MARK = "(oracle: reads validation labels)"
_REFERENCE_LABELS = {
    "best_fixed_index": "best fixed index (TRAIN-chosen: index {index})",
    "straight_strike": "straight strike (index {index})",
    "myopic_oracle": "myopic oracle (argmax Q*_1)",
}
_BEATS_RULE = ("beats = the baseline's scene-weighted regret_H is below the heuristic's AND the upper "
               "bound of the paired scene-bootstrap interval of (baseline - heuristic) regret_H is < 0")


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def reference_comparisons(references: dict, baseline_regret: dict, *, scene_ids: Sequence[int],
                          bootstrap: BootstrapConfig | dict, baseline_arm: str = "baseline") -> dict:
    """The report's heuristic references and its headline, from per-scene values (pure of files).

    Every interval uses the study's scene-bootstrap settings, as the paired comparisons between
    arms do. The headline asks one question: does the learned baseline beat the best
    TRAIN-chosen heuristic (the best fixed index; the straight strike is itself a fixed index,
    so the TRAIN choice covers it) on every seed? The myopic oracle reads validation labels, so
    it is shown but never the headline's yardstick.

    Args:
        references: the development receipt's ``references`` (as written by
            ``qhlab.finite_horizon.evaluation.population_heuristic_references``): for each name
            of ``REFERENCE_NAMES``, ``per_scene`` = {``scene_id`` [n_scenes], ``regret``
            [n_scenes][H]} and the policy fields (``policy``, ``oracle``, ``index``...).
        baseline_regret: {seed: float [n_scenes, H]}, the baseline arm's per-scene regret of
            each seed, scenes in ``scene_ids`` order.
        scene_ids: [n_scenes], the scene order of the cells' evaluation; every reference must
            have been evaluated on exactly these scenes in this order.
        bootstrap: the study's ``BootstrapConfig`` (or its dict: resamples, seed, confidence).
        baseline_arm: the baseline arm's name, recorded in every paired entry.

    Returns:
        JSON-able {``references``: {name: entry}, ``headline``: {...}}. An entry has ``label``,
        ``policy``, ``oracle``, ``note`` (``ORACLE_MARK`` for the oracle, else None), ``index``,
        ``chosen_on``, ``regret`` [H], ``regret_interval`` (scene bootstrap at H) and ``paired``:
        per seed, the interval of (baseline - reference) regret_H. The headline has ``text``
        (one plain sentence), ``beats_every_seed``, ``rule``, the heuristic's ``index`` and
        ``heuristic_regret``, and ``per_seed`` (baseline regret_H, ``ratio`` baseline /
        heuristic or None when the heuristic's regret is 0, the paired interval, ``beats``).
    """
    call = "reference_comparisons"
    settings = bootstrap if isinstance(bootstrap, BootstrapConfig) else BootstrapConfig.model_validate(bootstrap)
    order = [int(s) for s in scene_ids]
    if not isinstance(references, dict) or set(references) != set(REFERENCE_NAMES):
        raise _fail("references", sorted(references) if isinstance(references, dict) else references,
                    f"exactly {list(REFERENCE_NAMES)}",
                    "pass the development receipt's references (population_heuristic_references)", call=call)
    if not baseline_regret:
        raise _fail("baseline_regret", baseline_regret, "one [n_scenes, H] array per seed",
                    "pass the baseline arm's per-scene regret of every seed", call=call)
    per_scene: dict[str, np.ndarray] = {}
    for name in REFERENCE_NAMES:
        ref = references[name]
        if [int(s) for s in ref["per_scene"]["scene_id"]] != order:
            raise EvidenceError(f"{call}: reference {name} was evaluated on other scenes (or another "
                                "order) than the cells. HINT: references and cells must both use the "
                                "sealed validation population.")
        per_scene[name] = np.asarray(ref["per_scene"]["regret"], dtype=np.float64)
    horizon = per_scene[REFERENCE_NAMES[0]].shape[1] if per_scene[REFERENCE_NAMES[0]].ndim == 2 else 0
    seeds = list(baseline_regret)
    baseline = {s: np.asarray(baseline_regret[s], dtype=np.float64) for s in seeds}
    for label, values in [*((f"references[{n!r}]", v) for n, v in per_scene.items()),
                          *((f"baseline_regret[{s!r}]", v) for s, v in baseline.items())]:
        if values.shape != (len(order), horizon) or horizon < 1 or not np.isfinite(values).all():
            raise _fail(label, f"shape {values.shape}", f"finite values of shape {(len(order), max(horizon, 1))}",
                        "per-scene regret [n_scenes][H] in the cells' scene order", call=call)
    section: dict[str, Any] = {}
    for name in REFERENCE_NAMES:
        ref, values = references[name], per_scene[name]
        oracle = bool(ref.get("oracle", False))
        section[name] = {
            "reference": name,
            "label": _REFERENCE_LABELS[name].format(index=ref.get("index")),
            "policy": ref.get("policy"),
            "oracle": oracle,
            "note": ORACLE_MARK if oracle else None,
            "index": ref.get("index"),
            "chosen_on": ref.get("chosen_on"),
            "regret": [float(v) for v in values.mean(axis=0)],
            "regret_interval": _bootstrap_interval(values[:, -1], settings),
            "paired": [{"arm": baseline_arm, "seed": s, "relation": "baseline minus reference",
                        "metric": "regret", "horizon": horizon,
                        "interval": _bootstrap_interval(baseline[s][:, -1], settings, values[:, -1])}
                       for s in seeds],
        }
    best = section["best_fixed_index"]
    heuristic = best["regret"][-1]
    rows = []
    for paired in best["paired"]:
        seed, interval = paired["seed"], paired["interval"]
        own = float(baseline[seed][:, -1].mean())
        high = interval["high"]
        rows.append({
            "seed": seed, "baseline_regret": own, "heuristic_regret": heuristic,
            "ratio": own / heuristic if heuristic > 0 else None,
            "difference": interval["estimate"], "low": interval["low"], "high": high,
            "method": interval["method"],
            "beats": bool(own < heuristic and high is not None and high < 0),
        })
    beats_every_seed = all(r["beats"] for r in rows)
    every = "both seeds" if len(rows) == 2 else ("its seed" if len(rows) == 1 else f"all {len(rows)} seeds")
    level = f"{settings.confidence:.0%}"
    parts = []
    for r in rows:
        ratio = "ratio undefined: the heuristic's regret is 0" if r["ratio"] is None else f"ratio {r['ratio']:.3g}"
        verdict = "" if beats_every_seed else (": beats" if r["beats"] else ": does not beat")
        parts.append(f"seed {r['seed']}: baseline regret_{horizon} {_g(r['baseline_regret'])} vs heuristic "
                     f"{_g(heuristic)} ({ratio}), "
                     f"paired {level} CI of baseline minus heuristic [{_g(r['low'])}, {_g(r['high'])}]{verdict}")
    text = (f"The learned {baseline_arm} {'beats' if beats_every_seed else 'does not beat'} the best "
            f"TRAIN-chosen heuristic (fixed candidate index {best['index']}) on {every} at H={horizon}"
            + ("" if beats_every_seed else f" (it does on {sum(r['beats'] for r in rows)} of {len(rows)})")
            + ": " + "; ".join(parts) + ".")
    headline = {
        "text": text, "beats_every_seed": beats_every_seed, "rule": _BEATS_RULE,
        "baseline_arm": baseline_arm, "heuristic": "best_fixed_index", "index": best["index"],
        "horizon": horizon, "heuristic_regret": heuristic, "per_seed": rows,
    }
    return {"references": section, "headline": headline}


def _build_report(config: QhArchitectureStudyConfig, freeze: dict, development: dict,
                  cells: dict[tuple[str, int], dict], benchmarks: dict[tuple[str, int], dict]) -> dict:
    """Every number of the report from the authenticated cell bodies (pure of files).

    Per-scene arrays are [n_scenes][H] in the evaluation's scene order, which must be the same
    for every cell (the same sealed validation population).
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
            "mae_interval": _interval(constant_scene["mae"][:, primary], config),
            "regret_interval": _interval(constant_scene["regret"][:, primary], config),
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
            "mae_intervals": [_interval(values["mae"][:, h], config) for h in range(horizon)],
            "regret_intervals": [_interval(values["regret"][:, h], config) for h in range(horizon)],
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
            "seed_mean_mae_interval": _interval(pooled["mae"][:, primary], config),
            "seed_mean_regret_interval": _interval(pooled["regret"][:, primary], config),
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
                                         "interval": _interval(x, config, y)})
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
    return report


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci(interval: dict) -> str:
    return f"[{_fmt(interval['low'])}, {_fmt(interval['high'])}]"


def _reference_lines(report: dict) -> list[str]:
    """The headline sentence (the report's first paragraph) and the heuristic references table."""
    h, seeds = report["horizon"], report["seeds"]
    level = f"{report['bootstrap']['confidence']:.0%}"
    lines = [
        report["headline"]["text"],
        "",
        "## Heuristic references (validation chain rows, scenes weighted equally)",
        "",
        "The fixed index was chosen on TRAIN only; the straight strike is candidate 0 (the target "
        "struck at the goal centre); the myopic oracle acts on the exact Q*_1 labels, so it reads "
        "validation labels and is no deployable policy. Paired columns: per seed, (baseline - "
        f"reference) regret_{h} on the same scenes with its {level} scene-bootstrap interval; below 0 "
        "favours the baseline.",
        "",
        "| reference | " + " | ".join(f"regret_{i}" for i in range(1, h + 1)) + f" | regret_{h} {level} CI | "
        + " | ".join(f"baseline - reference, seed {s}" for s in seeds) + " |",
        "|" + "---|" * (1 + h + 1 + len(seeds)),
    ]
    for ref in report["references"].values():
        label = f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"]
        paired = {p["seed"]: p["interval"] for p in ref["paired"]}
        lines.append(
            f"| {label} | " + " | ".join(_fmt(v) for v in ref["regret"]) + f" | {_ci(ref['regret_interval'])} | "
            + " | ".join(f"{_fmt(paired[s]['estimate'])} {_ci(paired[s])}" for s in seeds) + " |"
        )
    return lines + [""]


def _markdown(report: dict) -> str:
    from qhlab.finite_horizon.studies.statistics import MIN_SCENES_FOR_ROBUST

    h = report["horizon"]
    lines = [
        f"# Architecture study `{report['study']}`",
        "",
        *_reference_lines(report),
        f"Lane `{report['profile']}`; {report['n_scenes']} validation scenes; horizon H={h} is primary; "
        f"seeds {report['seeds']}. Statistical unit: the scene. {report['states_used']}.",
        f"Thresholds: tie_band={report['thresholds']['tie_band']}, regret_fraction="
        f"{report['thresholds']['regret_fraction']}, mae_fraction={report['thresholds']['mae_fraction']}. "
        f"Intervals: {report['bootstrap']['confidence']:.0%} scene bootstrap (BCa unless noted), "
        f"{report['bootstrap']['resamples']} resamples, seed {report['bootstrap']['seed']}.",
        "",
    ]
    if report["n_scenes"] < MIN_SCENES_FOR_ROBUST:
        # Said once, up front, in plain words: a reader must not mistake a retention table on a
        # handful of scenes for evidence (statistics labels every such decision inconclusive).
        lines += [
            f"There are fewer than {MIN_SCENES_FOR_ROBUST} validation scenes ({report['n_scenes']}), "
            "so no retention decision is labelled robust: every decision below is inconclusive.",
            "",
        ]
    lines += [
        "## Every arm and seed (final states)",
        "",
        "| arm | role | seed | " + " | ".join(f"MAE_{i}" for i in range(1, h + 1)) + " | "
        + " | ".join(f"regret_{i}" for i in range(1, h + 1)) + f" | MAE_{h} 95% CI | regret_{h} 95% CI | updates |",
        "|" + "---|" * (3 + 2 * h + 3),
    ]
    for c in report["cells"]:
        lines.append(
            f"| {c['arm']} | {c['role']} | {c['seed']} | " + " | ".join(_fmt(v) for v in c["mae"]) + " | "
            + " | ".join(_fmt(v) for v in c["regret"]) + f" | {_ci(c['mae_intervals'][-1])} | "
            f"{_ci(c['regret_intervals'][-1])} | {c['observed_updates']} |"
        )
    k = report["constant"]
    lines.append(
        "| TRAIN constant | reference | - | " + " | ".join(_fmt(v) for v in k["mae"]) + " | "
        + " | ".join(_fmt(v) for v in k["regret"]) + f" | {_ci(k['mae_interval'])} | {_ci(k['regret_interval'])} | - |"
    )
    lines += ["", "## Seed-mean per arm (per-scene values averaged over both seeds)", "",
              f"| arm | role | MAE_{h} | 95% CI | regret_{h} | 95% CI |", "|---|---|---|---|---|---|"]
    for a in report["arms"]:
        lines.append(f"| {a['arm']} | {a['role']} | {_fmt(a['seed_mean_mae'][-1])} | {_ci(a['seed_mean_mae_interval'])} | "
                     f"{_fmt(a['seed_mean_regret'][-1])} | {_ci(a['seed_mean_regret_interval'])} |")
    lines += ["", f"## Paired differences at H={h} (same scenes, same seed)", "",
              "| arm | against | relation | seed | metric | difference | 95% CI | method |", "|---|---|---|---|---|---|---|---|"]
    for p in report["paired"]:
        i = p["interval"]
        lines.append(f"| {p['arm']} | {p['against']} | {p['relation']} | {p['seed']} | {p['metric']} | "
                     f"{_fmt(i['estimate'])} | {_ci(i)} | {i['method']} |")
    lines += ["", "## Retention rule", "",
              "D_reg = mean_s(r_v,s - regret_fraction * r_c,s) against the structural control; "
              "D_mae = mean_s(m_v,s - mae_fraction * m_m,s) against the matched control. Retained iff "
              f"both <= 0 (point estimates decide). With one-sided {report['bootstrap']['confidence']:.0%} "
              "scene-bootstrap bounds: a retention is robust iff both upper bounds are <= 0; a rejection "
              "is robust iff at least one failing margin (> 0) has its lower bound > 0, whatever the "
              f"passing margin's bound; nothing is robust on fewer than {MIN_SCENES_FOR_ROBUST} scenes; "
              "otherwise inconclusive.",
              "", "| variant | control | matched | seed | D_reg | upper | lower | D_mae | upper | lower "
              "| retained | label |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["retention"]:
        for seed, d in r["per_seed"].items():
            lines.append(f"| {r['variant']} | {r['structural_control']} | {r['matched_control']} | {seed} | "
                         f"{_fmt(d['d_reg']['estimate'])} | {_fmt(d['d_reg']['upper']['high'])} | "
                         f"{_fmt(d['d_reg']['lower']['low'])} | "
                         f"{_fmt(d['d_mae']['estimate'])} | {_fmt(d['d_mae']['upper']['high'])} | "
                         f"{_fmt(d['d_mae']['lower']['low'])} | "
                         f"{'yes' if d['retained'] else 'no'} | {d['label']} |")
        if r["seeds_disagree"]:
            lines.append(f"\n**Seeds disagree for `{r['variant']}`**: the decision is not replicated.\n")
    if any("benchmark" in c for c in report["cells"]):
        lines += ["", "## Scorer benchmark (canonical first TRAIN chain, no updates)", "",
                  "| arm | seed | median forward (ms) | encoder (ms, hooked) | readout (ms, hooked) | tensors with grad |",
                  "|---|---|---|---|---|---|"]
        for c in report["cells"]:
            b = c.get("benchmark")
            if b:
                lines.append(f"| {c['arm']} | {c['seed']} | {b['median_forward_seconds'] * 1e3:.3f} | "
                             f"{b['encoder_seconds'] * 1e3:.3f} | {b['readout_seconds'] * 1e3:.3f} | "
                             f"{b['parameters_receiving_gradients']} |")
    lines += ["", "Figures: `arms.png` (each arm's MAE and regret with intervals), "
              "`paired_differences.png` (paired differences against controls).", ""]
    return "\n".join(lines)


def _figures(report: dict) -> dict[str, Callable[[Path], None]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = report["horizon"]

    def arms_figure(path: Path) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, metric in zip(axes, ("mae", "regret")):
            labels = []
            for i, c in enumerate(report["cells"]):
                iv = c[f"{metric}_intervals"][-1]
                low = iv["low"] if iv["low"] is not None else iv["estimate"]
                high = iv["high"] if iv["high"] is not None else iv["estimate"]
                ax.errorbar([i], [iv["estimate"]], yerr=[[iv["estimate"] - low], [high - iv["estimate"]]],
                            fmt="o", capsize=3, color=f"C{report['seeds'].index(c['seed'])}")
                labels.append(f"{c['arm']}\ns{c['seed']}")
            ax.axhline(report["constant"][metric][-1], color="grey", linestyle="--", label="TRAIN constant")
            if metric == "regret":
                # The heuristics are policies (no MAE); the oracle line is labelled as such.
                for ref, style in zip(report["references"].values(), (":", "-.", (0, (1, 3)))):
                    ax.axhline(ref["regret"][-1], color="C3" if ref["oracle"] else "black",
                               linestyle=style, linewidth=0.9,
                               label=f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"])
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(f"{metric} at H={h} (m)")
            ax.set_title(f"{metric.upper() if metric == 'mae' else metric}_{h}, 95% scene-bootstrap CI")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)

    def paired_figure(path: Path) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * max(4, len(report["paired"]) // 2) + 1.5))
        for ax, metric in zip(axes, ("regret", "mae")):
            rows = [p for p in report["paired"] if p["metric"] == metric]
            for i, p in enumerate(rows):
                iv = p["interval"]
                low = iv["low"] if iv["low"] is not None else iv["estimate"]
                high = iv["high"] if iv["high"] is not None else iv["estimate"]
                ax.errorbar([iv["estimate"]], [i], xerr=[[iv["estimate"] - low], [high - iv["estimate"]]],
                            fmt="o", capsize=3, color=f"C{report['seeds'].index(p['seed'])}")
            ax.axvline(0.0, color="grey", linestyle="--")
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels([f"{p['arm']} - {p['against']} (s{p['seed']})" for p in rows], fontsize=7)
            ax.set_xlabel(f"paired difference of {metric} at H={h} (m)")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)

    return {"arms.png": arms_figure, "paired_differences.png": paired_figure}


def _publish_report(report: dict, directory: Path) -> dict[str, Path]:
    from qhlab.evidence import publish_file

    outputs = {"report.json": directory / "report.json", "report.md": directory / "report.md"}
    publish_json(outputs["report.json"], report)
    publish_bytes(outputs["report.md"], _markdown(report).encode("utf-8"))
    for name, writer in _figures(report).items():
        publish_file(directory / name, writer)
        outputs[name] = directory / name
    return outputs


# ============================================================================ command line

_SUBCOMMANDS = ("freeze", "admit-canaries", "prepare-development", "run-fit", "benchmark", "report", "run")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the study subcommands to ``parser`` (shared by ``qhlab study`` and ``main``)."""
    sub = parser.add_subparsers(dest="study_command", metavar="STEP", required=True)
    helps = {
        "freeze": "validate the config, resolve TRAIN, bind source and arms (step 1)",
        "admit-canaries": "select the canary row and run the two TRAIN canaries: the E0 gate (step 2)",
        "prepare-development": "seal validation and the TRAIN-only constant after E0 passes (step 3)",
        "run-fit": "fit one declared cell to its final budget (step 4)",
        "benchmark": "time verified final scorers on the canonical first TRAIN chain (step 5)",
        "report": "compare all charged final cells; report.json, report.md, figures (step 6)",
        "run": "every step in order, skipping steps whose receipts authenticate (the main job)",
    }
    for name in _SUBCOMMANDS:
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("config", help="study TOML (e.g. examples/default-study.toml)")
        # dest is not "output": a study directory outlives any one failed step, so the CLI's
        # "remove a new --output on bad input" net must not delete a study's finished steps.
        # Each step validates before it writes, so bad input still writes nothing.
        p.add_argument("--output", dest="study_output", metavar="DIR", required=True, help="study directory")
        if name in ("run-fit", "benchmark"):
            p.add_argument("--variant", required=name == "run-fit", help="declared arm")
            p.add_argument("--seed", type=int, required=name == "run-fit", help="declared seed")
        if name == "run-fit":
            p.add_argument("--canary-role", default=None, choices=CANARY_ROLES,
                           help="run a canary of the E0 gate (normally done by admit-canaries)")
        if name == "run":
            p.add_argument("--workers", type=int, default=None,
                           help="override the config's parallel fits (does not change results)")


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the study step named by ``args.study_command``; returns the exit code."""
    console = _console()
    command = args.study_command
    config, output = args.config, Path(args.study_output)
    if command == "freeze":
        body = freeze_study(config, output)
        console.print(f"[green]frozen[/] {output / FREEZE_RECEIPT}: {len(body['cells'])} cells, TRAIN "
                      f"{body['train']['support']['scenes']} scenes / {body['train']['support']['chain_states']} states")
        return 0
    if command == "admit-canaries":
        return _say_e0(console, admit_canaries(config, output))
    if command == "prepare-development":
        body = prepare_development(config, output)
        console.print(f"[green]sealed[/] validation {body['validation']['support']['scenes']} scenes; "
                      f"TRAIN constant {body['train_constant']}; best fixed index (TRAIN-chosen) "
                      f"{body['references']['best_fixed_index']['index']}")
        return 0
    if command == "run-fit":
        body = run_fit(config, output, variant=args.variant, seed=args.seed, canary_role=args.canary_role)
        console.print(f"[green]cell {body['cell']}[/] finished: {body['observed_updates']} updates")
        return 0
    if command == "benchmark":
        return _benchmark_all(console, config, output, args.variant, args.seed)
    if command == "report":
        report = report_study(config, output)
        console.print(f"[green]report[/] {output / REPORT_DIR / 'report.md'} ({report['summary']['n_cells']} cells)")
        return 0
    return _run_all(console, config, output, workers=getattr(args, "workers", None))


def _say_e0(console, body: dict) -> int:
    if body["passed"]:
        console.print(f"[green]E0 passed[/]: {body['reason']}")
        return 0
    from rich.markup import escape

    # The reason holds brackets-free numbers and names today, but it is data: escape it so it
    # is never read as markup, and do not wrap it, so each failure stays one greppable line.
    console.print(f"[red]E0 failed[/]: {escape(body['reason'])}; broad fits will not run.", soft_wrap=True)
    return 1


def _benchmark_all(console, config_path, output, variant, seed) -> int:
    frozen = _authenticate_freeze(config_path, output, "benchmark")
    if (variant is None) != (seed is None):
        raise _fail("--variant/--seed", (variant, seed), "both or neither", "omit both to benchmark every cell",
                    call="benchmark")
    wanted = [(variant, seed)] if variant is not None else list(frozen.config.cells)
    for arm, s in wanted:
        path = frozen.output / BENCHMARK_DIR / f"{_cell_name(arm, s)}.receipt.json"
        if path.exists() and variant is None:
            read_receipt(path, kind="study_benchmark", schema_version=SCHEMA_VERSION)
            continue
        result = _benchmark_cell(config_path, output, arm, s)
        console.print(f"benchmark {arm}-s{s}: median forward {result['median_forward_seconds'] * 1e3:.3f} ms, "
                      f"{len(result['parameters_receiving_gradients'])} tensors with gradient")
    return 0


def _cell_worker(config_path: str, output: str, arm: str, seed: int) -> dict:
    """Process-pool entry: one broad cell (``run_fit`` sets the config's torch threads)."""
    os.environ["QHLAB_FIT_PROGRESS"] = "0"
    body = run_fit(config_path, output, variant=arm, seed=seed)
    return {"cell": body["cell"], "mae": body["evaluation"]["mae"], "regret": body["evaluation"]["regret"],
            "wall_seconds": body.get("wall_seconds")}


def _run_cells(console, frozen: _Frozen, pending: list[tuple[str, int]], workers: int) -> None:
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    config_path, output = str(frozen.config_path), str(frozen.output)
    workers = max(1, min(workers, len(pending)))
    columns = (TextColumn("[bold]broad fits"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("fits", total=len(pending))
        if workers == 1:
            for arm, seed in pending:
                summary = _cell_worker(config_path, output, arm, seed)
                progress.console.print(f"  cell {summary['cell']}: MAE_H {summary['mae'][-1]:.4f}, "
                                       f"regret_H {summary['regret'][-1]:.4f}")
                progress.advance(task)
            return
        errors = []
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(_cell_worker, config_path, output, arm, seed): (arm, seed) for arm, seed in pending}
            for future in as_completed(futures):
                try:
                    summary = future.result()
                except Exception as exc:  # noqa: BLE001 - reported after every other cell finished
                    errors.append(exc)
                    arm, seed = futures[future]
                    progress.console.print(f"  [red]cell {arm}-s{seed} failed[/]: {exc}")
                else:
                    progress.console.print(f"  cell {summary['cell']}: MAE_H {summary['mae'][-1]:.4f}, "
                                           f"regret_H {summary['regret'][-1]:.4f}")
                progress.advance(task)
        if errors:
            raise errors[0]


def _run_all(console, config_path, output: Path, *, workers: int | None = None) -> int:
    """Every step in order; a step whose receipt authenticates is verified and skipped."""
    started = time.perf_counter()
    ran: list[str] = []
    verified: list[str] = []
    if (output / FREEZE_RECEIPT).exists():
        frozen = _authenticate_freeze(config_path, output, "run")
        verified.append("freeze")
    else:
        console.rule("[bold]1/6 freeze")
        freeze_study(config_path, output)
        frozen = _authenticate_freeze(config_path, output, "run")
        ran.append("freeze")
    config = frozen.config
    if (output / CANARY_DIR / E0_RECEIPT).exists():
        e0 = _authenticate_e0(frozen, "run")["body"]
        verified.append("admit-canaries")
    else:
        console.rule("[bold]2/6 canaries (E0 gate)")
        e0 = admit_canaries(config_path, output)
        ran.append("admit-canaries")
    if not e0["passed"]:
        return _say_e0(console, e0)
    if (output / DEVELOPMENT_RECEIPT).exists():
        _authenticate_development(frozen, "run")
        verified.append("prepare-development")
    else:
        console.rule("[bold]3/6 development")
        prepare_development(config_path, output)
        ran.append("prepare-development")
    pending = []
    for arm, seed in config.cells:
        path = output / CELLS_DIR / _cell_name(arm, seed) / CELL_RECEIPT
        if path.exists():
            read_receipt(path, kind="study_cell", schema_version=SCHEMA_VERSION)
        else:
            pending.append((arm, seed))
    if pending:
        console.rule(f"[bold]4/6 broad fits ({len(pending)} of {len(config.cells)} cells, "
                     f"{workers or config.workers} at a time)")
        _run_cells(console, frozen, pending, workers or config.workers)
        ran.append("run-fit")
    else:
        verified.append("run-fit")
    missing_bench = [c for c in config.cells
                     if not (output / BENCHMARK_DIR / f"{_cell_name(*c)}.receipt.json").exists()]
    # Once the report is published the study is closed: benchmarks are not added afterwards.
    if missing_bench and not (output / REPORT_DIR / REPORT_RECEIPT).exists():
        console.rule("[bold]5/6 benchmark")
        _benchmark_all(console, config_path, output, None, None)
        ran.append("benchmark")
    else:
        for arm, seed in config.cells:
            path = output / BENCHMARK_DIR / f"{_cell_name(arm, seed)}.receipt.json"
            if path.exists():
                read_receipt(path, kind="study_benchmark", schema_version=SCHEMA_VERSION)
        verified.append("benchmark")
    if (output / REPORT_DIR / REPORT_RECEIPT).exists():
        read_receipt(output / REPORT_DIR / REPORT_RECEIPT, kind="study_report", schema_version=SCHEMA_VERSION)
        _authenticate_cells(frozen, "run")
        verified.append("report")
    else:
        console.rule("[bold]6/6 report")
        report_study(config_path, output)
        ran.append("report")
    elapsed = time.perf_counter() - started
    if not ran:
        console.print(f"[green]study {output} is complete[/]: every receipt authenticated "
                      f"({', '.join(verified)}); nothing was run ({elapsed:.1f} s).")
    else:
        console.print(f"[green]study {output} finished[/]: ran {', '.join(ran)}"
                      + (f"; verified {', '.join(verified)}" if verified else "")
                      + f" ({elapsed:.1f} s). Report: {output / REPORT_DIR / 'report.md'}")
    return 0


def main():
    """Execute one explicit, immutable study operation from the command line."""
    try:
        code = _main(sys.argv[1:])
    except QhError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = exc.exit_code
    sys.exit(code)


def _main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (``STEP CONFIG --output DIR ...``, no program name); run it; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m qhlab.finite_horizon.studies.architecture_study",
        description="The pre-registered, paired architecture study (seed 002).",
    )
    _add_arguments(parser)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return _dispatch(args)


if __name__ == "__main__":
    main()
