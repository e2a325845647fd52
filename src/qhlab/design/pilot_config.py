"""The pilot config: which study's comparisons a pilot measures, on which tuning population.

Owns: ``QhPilotConfig`` (the study it serves, the tuning population, the training seeds and the
TRAIN draws) and reading a pilot TOML (``read_pilot_config``: every invalid field listed in one
error, before anything is written) and the fewest validation scenes a pilot may be scored on
(``refuse_few_validation_scenes``, at ``qhlab pilot`` and at the study's freeze). Does not own:
the study config (``qhlab.design.study_config``), whose arms, recipe, update budget, retention
fractions and lane the pilot fits, the variance arithmetic (``variance``) or running fits (``run``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from qhlab.design.config_files import ConfigForm, ConfigName, StrictInt, StudyPath, ToolExecution, TorchThreads
from qhlab.design.study_config import STUDY_PRESET_FIELDS, PopulationSource, QhArchitectureStudyConfig, declared_scenes
from qhlab.design.tool_config import read_tool_config
from qhlab.evidence import POPULATION_SEED_LIMIT, canonical_json, distinct_seeds, input_error, sha256_bytes
from qhlab.evidence.layout import MANIFEST

__all__ = [
    "PILOT_CALL",
    "QhPilotConfig",
    "min_validation_scenes",
    "pilot_digest",
    "read_pilot_config",
    "refuse_few_validation_scenes",
    "study_design",
]

PILOT_CALL = "qhlab pilot"


class QhPilotConfig(ToolExecution):
    """One pilot: every arm of a study, fitted with extra seeds on several TRAIN draws, on a tuning population.

    The design is nested: each seed is fitted on one TRAIN draw only, so that a seed's own
    effect (its initial weights) is never shared between draws and the draws' spread is the
    TRAIN-draw effect alone (``qhlab.statistics.variance``).

    Attributes:
        name: the pilot's name (W&B group of its fits' runs).
        study: the study config whose arms, recipe, ``broad_updates``, retention fractions and
            profile the pilot fits (a path, relative to this config). Its ``[preparation]`` and
            ``[seed_variance]`` are not read: they are what the pilot produces.
        train: the TRAIN population of the seed fits (a preset and seed; it may be the study's).
        validation: the tuning validation population every fit is scored on; never the study's
            validation, nor a population a study has sealed as its validation. It has at least
            min(30, the study's validation scenes) scenes (30: ``MIN_SCENES_TO_DECIDE``, the fewest a
            study decides on): each interval subtracts the pilot's residual per scene, which a few
            scenes leave mostly noise.
        seeds: the training seeds fitted for every arm on ``train`` (at least two, none of the
            study's own).
        train_draws: further TRAIN seeds of ``train.preset``, for the TRAIN-draw component (with
            ``train`` at least three draws: two or more here; empty: no draw component).
        draw_seeds: one list of seeds per entry of ``train_draws`` (each at least two), fitted
            for every arm on that draw; no seed twice in the pilot, none of the study's.
        workers: fits at once on the local executor. Not part of the record.
        executor: "local" or "ray". Not part of the record.
        torch_threads: torch intra-op threads of each fit process.
        population_cache: cache directory of generated populations.
    """

    name: ConfigName
    study: StudyPath
    train: PopulationSource
    validation: PopulationSource
    seeds: tuple[StrictInt, ...] = Field(min_length=2, max_length=64)
    train_draws: tuple[StrictInt, ...] = Field(default=(), max_length=64)
    draw_seeds: tuple[tuple[StrictInt, ...], ...] = Field(default=(), max_length=64)
    torch_threads: TorchThreads = 1

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        return distinct_seeds("seeds", seeds)

    @field_validator("train_draws")
    @classmethod
    def _draws(cls, draws: tuple[int, ...]) -> tuple[int, ...]:
        # Population seeds: only the scene sampler reads them, never a training seeder.
        distinct_seeds("train_draws", draws, limit=POPULATION_SEED_LIMIT)
        if len(draws) == 1:
            raise ValueError(
                "train_draws with one seed is not allowed; allowed: none, or two or more (with [train], "
                "three draws or more: a variance needs them)"
            )
        return draws

    @field_validator("draw_seeds")
    @classmethod
    def _draw_seeds(cls, draw_seeds: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        for i, seeds in enumerate(draw_seeds):
            distinct_seeds(f"draw_seeds[{i}]", seeds)
        return draw_seeds

    @model_validator(mode="after")
    def _design(self) -> QhPilotConfig:
        if self.train.preset is None:
            raise ValueError(
                "train.path is not allowed; allowed: a [train] preset and seed (the record names each "
                "TRAIN draw by its seed, and the draws are further seeds of its preset)"
            )
        if self.train_draws:
            if self.train.seed in self.train_draws:
                raise ValueError(
                    f"train_draws={list(self.train_draws)!r} holds train.seed {self.train.seed}; "
                    "allowed: other TRAIN seeds of the preset"
                )
        if len(self.draw_seeds) != len(self.train_draws):
            raise ValueError(
                f"draw_seeds has {len(self.draw_seeds)} lists for {len(self.train_draws)} train_draws; allowed: "
                "one list of seeds per TRAIN draw, in the order of train_draws"
            )
        for draw, seeds in zip(self.train_draws, self.draw_seeds):
            if len(seeds) < 2:
                raise ValueError(
                    f"draw_seeds for TRAIN draw {draw} is {list(seeds)!r}; allowed: two or more seeds (a "
                    "within-draw variance needs them)"
                )
        distinct_seeds("seeds and draw_seeds", self.seeds + tuple(s for seeds in self.draw_seeds for s in seeds))
        return self

    @property
    def layout(self) -> list[tuple[int, tuple[int, ...]]]:
        """Every TRAIN draw with the seeds fitted on it: ``train.seed`` with ``seeds`` first."""
        return [(int(self.train.seed), self.seeds), *zip(self.train_draws, self.draw_seeds)]

    @property
    def fits(self) -> list[tuple[int, int]]:
        """Every (draw, seed) of the design, in the layout's order."""
        return [(draw, seed) for draw, seeds in self.layout for seed in seeds]

    def identity(self) -> dict[str, Any]:
        """What the pilot's results depend on, without where files lie: the record's config less
        ``study`` (its design is digested instead) and ``population_cache``. A pilot directory
        moved, or re-run from another checkout, keeps its digest."""
        return {k: v for k, v in self.record().items() if k not in ("study", "population_cache")}

    @property
    def draws(self) -> list[int]:
        """Every TRAIN draw, ``train.seed`` first."""
        return [int(self.train.seed), *self.train_draws]


def study_design(study: QhArchitectureStudyConfig, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """What a pilot's taus depend on: every arm's recipe, the comparisons, the fractions and the lane.

    A study may use a pilot record only when its design is this one (the freeze compares them).

    Args:
        study: the study config.
        sources: ``{arm: sha256}`` of the user arms' sources (bound into their recipes, so that a
            pilot of one version of an arm is no pilot of another); None or empty: built-in arms.
    """
    recipes = {
        arm: {
            k: v
            for k, v in study.cell_recipe(arm, 0, study.broad_updates, sources=sources or None)
            .model_dump(mode="json")
            .items()
            if k not in ("name", "seed", "data")
        }
        for arm in study.arms
    }
    return {
        "profile": study.profile,
        "arms": list(study.arms),
        "recipes": recipes,
        "comparisons": [list(c) for c in study.comparisons()],
        "variants": study.variant_margins(),
        "regret_fraction": study.regret_fraction,
        "mae_fraction": study.mae_fraction,
        "broad_updates": study.broad_updates,
    }


def min_validation_scenes(study_scenes: int | None) -> int:
    """The fewest validation scenes a pilot for a study with ``study_scenes`` validation scenes may be scored on.

    ``MIN_SCENES_TO_DECIDE`` (30, the fewest a study decides on), or the study's own count where it
    has fewer: a pilot needs no more scenes than the study it serves. None (a study validation named
    by a path not generated yet): ``MIN_SCENES_TO_DECIDE``, which serves a study of any size.
    """
    # Lazy: keeps importing this module (and `qhlab pilot`'s config checks) free of scipy.
    from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE

    return MIN_SCENES_TO_DECIDE if study_scenes is None else min(MIN_SCENES_TO_DECIDE, study_scenes)


def refuse_few_validation_scenes(
    call: str, field: str, value: Any, scenes: int, study: QhArchitectureStudyConfig, *, remedy: str
) -> None:
    """Refuse a pilot scored on fewer validation scenes than ``min_validation_scenes`` of its study.

    Every interval that carries a pilot subtracts the pilot's residual per scene (``- r/(S n_p)``)
    from its seed and TRAIN-draw terms. Estimated on a few scenes, r is mostly noise, and so is the
    interval's width: a pilot scored on 3 scenes gave a 30-scene study intervals five times narrower
    than a 60-scene pilot's, covering 70%. A generator identity leaves the scene count out, so the
    distribution checks do not see this.

    Args:
        call: the command or step refusing.
        field, value: what names the pilot's validation (a config field, or the bound record).
        scenes: the validation scenes the pilot is (or was) scored on.
        study: the study it serves; its validation's scenes are read only when ``scenes`` is below 30.
        remedy: what to run in words (``"name ..."``, ``"run `qhlab pilot` again with ..."``), completed
            with a larger validation preset.

    Raises:
        QhInputError: ``scenes`` is below the minimum (one line: the field, the value, the minimum).
    """
    most = min_validation_scenes(None)
    if scenes >= most:
        return  # enough for a study of any size: the study's validation is not read
    source = study.validation
    # A path not generated yet has no count: the minimum is then the one that serves any study.
    known = source.path is None or (Path(source.path) / MANIFEST).is_file()
    theirs = declared_scenes(source, call=call) if known else None
    minimum = min_validation_scenes(theirs)
    if scenes >= minimum:
        return
    why = (
        f"min(MIN_SCENES_TO_DECIDE={most}, the study's {theirs} validation scenes)"
        if known
        else f"MIN_SCENES_TO_DECIDE={most} (the study's validation path holds no population yet: its count is unknown)"
    )
    larger = (
        f"the study's validation preset {source.preset!r} with another seed"
        if source.preset is not None
        else f"a preset of the study's validation distribution with scenes >= {minimum}"
    )
    raise input_error(
        call,
        field,
        value,
        f"a pilot validation population of at least {minimum} scenes, {why}",
        f"it has {scenes} scenes, on which the pilot's residual per scene, and with it every interval's seed "
        f"and TRAIN-draw terms, is mostly noise: {remedy} a larger validation preset ({larger})",
    )


_FORM = ConfigForm(
    QhPilotConfig,
    call=PILOT_CALL,
    what="pilot config",
    example="examples/demo-pilot.toml",
    relative=(("study",), ("train", "path"), ("validation", "path"), ("population_cache",)),
    toml_files=STUDY_PRESET_FIELDS,
)


def pilot_digest(config: QhPilotConfig, design: dict[str, Any]) -> str:
    """The digest a pilot record carries: its config's identity and the study design it measured."""
    return sha256_bytes(canonical_json({"config": config.identity(), "design": design}))


def read_pilot_config(config_path: str | os.PathLike) -> tuple[QhPilotConfig, bytes, QhArchitectureStudyConfig]:
    """Read and fully validate a pilot TOML and the study it names, before anything is written.

    Relative ``study``, ``train.path``, ``validation.path`` and ``population_cache`` are resolved
    against the config file's directory.

    Returns:
        (the validated config, the file's exact bytes, the study config).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, every invalid field at once, or a
            validation population that is the study's.
    """

    return read_tool_config(
        _FORM,
        config_path,
        _pilot_problems,
        "a pilot measures the study's comparisons on a held-apart tuning population.",
    )


def _pilot_problems(config: QhPilotConfig, study: QhArchitectureStudyConfig) -> list[str]:
    """Seeds the study uses, a layout the study does not declare, or the study's own validation population."""
    problems = []
    shared = sorted({s for _, s in config.fits} & set(study.seeds))
    if shared:
        problems.append(f"seeds: {shared} are the study's own seeds; allowed: seeds the study does not use")
    declared = None if study.preparation is None else study.preparation.pilot_layout
    ours = [{"draw": d, "seeds": list(seeds)} for d, seeds in config.layout]
    if declared is None:
        problems.append(
            f"study: {config.study!r} declares no [preparation.pilot_layout]; allowed: a study that fixes its "
            "pilot's TRAIN draws and seeds before the pilot runs (add [preparation.pilot_layout] with draws = "
            f"{[e['draw'] for e in ours]} and seeds = {[e['seeds'] for e in ours]} to it, or the layout you choose)"
        )
    elif declared.as_record() != ours:
        problems.append(
            f"seeds/train_draws/draw_seeds: the layout {ours} is not the study's; allowed: the layout its "
            f"[preparation.pilot_layout] declares, {declared.as_record()} (one pilot per design: a pilot with "
            "other seeds would be another draw of the same noise)"
        )
    if config.validation == study.validation:
        problems.append(
            f"validation: {config.validation.model_dump(mode='json', exclude_none=True)} is the study's "
            "validation population; allowed: a tuning population the study never scores on"
        )
    return problems
