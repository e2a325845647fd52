"""The E0 check config: which study's E0 gate is run, on which fresh TRAIN draws.

Owns: ``QhE0CheckConfig`` (the study it serves, the fresh TRAIN seeds, the pass share the check
must reach), ``e0_design`` (what a gate's outcome depends on: the lane, the TRAIN preset, the
canary seeds, budget, row margin and tie band, and the baseline's canary recipe) and reading a
check TOML (``read_e0_config``: every invalid field listed in one error, before anything is
written). Does not own: the study config (``qhlab.design.study_config``) or the gate's rules
(``qhlab.design.canary``).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, field_validator

from qhlab.design.config_files import ConfigForm, PlainNumber, StrictInt, StudyPath, ToolExecution
from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.design.tool_config import read_tool_config
from qhlab.evidence import POPULATION_SEED_LIMIT, canonical_json, distinct_seeds, sha256_bytes

__all__ = ["E0_CHECK_CALL", "QhE0CheckConfig", "e0_design", "e0_digest", "read_e0_config"]

E0_CHECK_CALL = "qhlab e0-check"
# Recipe fields that are each sub-study's own, never part of the gate's design.
_OWN_FIELDS = ("name", "seed", "data")


class QhE0CheckConfig(ToolExecution):
    """One E0 check: a study's E0 gate, run as a new study on each of several fresh TRAIN draws.

    Attributes:
        name: the check's name (each sub-study is ``<name>-<seed>``).
        study: the study config whose E0 gate is checked (a path, relative to this config): its
            TRAIN preset, seeds, ``canary_updates``, ``canary_gap_multiple``, ``tie_band``,
            baseline recipe and lane. Its ``[preparation]`` is not read.
        train_seeds: fresh TRAIN seeds of the study's TRAIN preset (at least three; never the
            study's own TRAIN seed): each is frozen as a study of its own and gated.
        min_pass_share: the share of draws whose gate must pass; a study may bind only a check
            that reached it.
        workers: draws gated at once on the local executor. Not part of the record.
        executor: "local" or "ray" (where each draw's TRAIN population is labelled). Not part of
            the record.
        population_cache: cache directory of generated populations.
    """

    name: str = Field(min_length=1, max_length=48, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    study: StudyPath
    train_seeds: tuple[StrictInt, ...] = Field(min_length=3, max_length=100)
    min_pass_share: PlainNumber = Field(default=0.95, gt=0.0, le=1.0)

    @field_validator("train_seeds")
    @classmethod
    def _seeds(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        # Population seeds: only the scene sampler reads them, never a training seeder.
        return distinct_seeds("train_seeds", seeds, limit=POPULATION_SEED_LIMIT)

    def identity(self) -> dict[str, Any]:
        """What the check's outcome depends on, without where files lie: the record's config less
        ``study`` (its gate design is digested instead) and ``population_cache``."""
        return {k: v for k, v in self.record().items() if k not in ("study", "population_cache")}


_FORM = ConfigForm(
    QhE0CheckConfig,
    call=E0_CHECK_CALL,
    what="E0 check config",
    example="examples/demo-e0.toml",
    relative=(("study",), ("population_cache",)),
)


def e0_design(study: QhArchitectureStudyConfig) -> dict[str, Any]:
    """What a study's E0 gate depends on: a study may bind an E0 check only of this design.

    Returns:
        ``{"profile", "train_preset", "seeds", "canary_updates", "canary_gap_multiple", "tie_band",
        "recipe"}``; ``recipe`` is the baseline's recipe at ``canary_updates`` without its name,
        seed and data (the canary rule of ``qhlab.design.canary`` is applied to it by the gate).
    """
    recipe = study.cell_recipe(study.baseline_arm, study.seeds[0], study.canary_updates).model_dump(mode="json")
    return {
        "profile": study.profile,
        "train_preset": study.train.preset,
        "seeds": list(study.seeds),
        "canary_updates": study.canary_updates,
        "canary_gap_multiple": float(study.canary_gap_multiple),
        "tie_band": float(study.tie_band),
        "recipe": {k: v for k, v in recipe.items() if k not in _OWN_FIELDS},
    }


def e0_digest(config: QhE0CheckConfig, design: dict[str, Any]) -> str:
    """The digest an E0 record carries: its config's identity and the gate design it checked."""
    return sha256_bytes(canonical_json({"config": config.identity(), "design": design}))


def read_e0_config(config_path: str | os.PathLike) -> tuple[QhE0CheckConfig, bytes, QhArchitectureStudyConfig]:
    """Read and fully validate an E0 check TOML and the study it names, before anything is written.

    Relative ``study`` and ``population_cache`` are resolved against the config file's directory.

    Returns:
        (the validated config, the file's exact bytes, the study config).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, every invalid field at once, a study
            whose TRAIN is a path, or a train seed that is the study's.
    """

    return read_tool_config(
        _FORM, config_path, _e0_problems, "an E0 check runs the study's own gate on TRAIN draws the study never sees."
    )


def _e0_problems(config: QhE0CheckConfig, study: QhArchitectureStudyConfig) -> list[str]:
    """A study whose TRAIN is a path (no fresh draws of it exist), or a train seed that is the study's."""
    if study.train.preset is None:
        return [
            f"study: {config.study!r} names TRAIN by path; allowed: a study whose [train] is a preset and "
            "seed (the check draws fresh TRAIN seeds of that preset)"
        ]
    if study.train.seed in config.train_seeds:
        return [
            f"train_seeds: {study.train.seed} is the study's own TRAIN seed; allowed: fresh seeds of "
            f"{study.train.preset} the study does not train on"
        ]
    return []
