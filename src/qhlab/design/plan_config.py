"""The plan config: which study a power plan is for, the pilot it reads, and the MDE it must reach.

Owns: ``QhPlanConfig`` (the study, its pilot record, an optional tuning record of the study's
margins, the target MDE and the validation sizes to weigh) and reading a plan TOML
(``read_plan_config``: every invalid field listed in one error, and a study that cannot decide
refused, before anything is written).
Does not own: the predictions (``plan_record``), the pilot (``pilot_config``) or the study config.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, Field, field_validator

from qhlab.design.config_files import FROZEN, ConfigForm, ConfigName, PlainNumber, StrictInt, StudyPath
from qhlab.design.study_config import QhArchitectureStudyConfig, declared_scenes
from qhlab.design.tool_config import read_tool_config
from qhlab.evidence import input_error

__all__ = ["PLAN_CALL", "PlanTarget", "QhPlanConfig", "read_plan_config"]

PLAN_CALL = "qhlab plan"


class PlanTarget(BaseModel):
    """The largest MDE a study may have, per retention margin (the reward's unit, two-sided at its level, 80% power).

    Attributes:
        d_reg: the largest D_reg MDE (retention's regret margin) allowed over the study's variants:
            a design whose largest predicted D_reg MDE is above it cannot detect a difference the
            study must see, so it does not reach the target.
        d_mae: the largest D_mae MDE (retention's calibration margin) allowed over the study's
            variants, for the same reason.
    """

    model_config = FROZEN

    d_reg: PlainNumber = Field(gt=0.0, le=10.0)
    d_mae: PlainNumber = Field(gt=0.0, le=10.0)


class QhPlanConfig(BaseModel):
    """One power plan, written before the study's fits.

    Attributes:
        name: the plan's name: the title of ``plan.md`` and the name a study's report gives the
            plan it binds.
        study: the study config planned for (a path, relative to this config): its arms, seeds,
            validation preset and level fix the design whose MDEs are predicted. Its
            ``[preparation]`` is not read: the plan is one of its records.
        pilot: the study's pilot record (``.../pilot.json``): each comparison's seed, TRAIN-draw and
            scene variance components, from which every MDE is predicted without the study's fits.
            The study may bind the plan only with this same pilot.
        tuning: a tuning record of the study's margins (``qhlab tune`` with metric "mde"), whose
            trials are weighed as recipe alternatives with their own costs; None: only the
            study's recipe is weighed.
        target: the MDE the study must reach; the cheapest design that reaches it is chosen, and
            when none does the command exits 1 (the plan published all the same).
        validation_scenes: validation sizes weighed beside the study's own, to show what more
            scenes would buy and cost (each at least ``MIN_SCENES_TO_DECIDE``, 30: a study of fewer
            is always "undecided", so a plan never weighs one; empty: the study's size alone).
    """

    model_config = FROZEN

    name: ConfigName
    study: StudyPath
    pilot: str = Field(min_length=1)
    tuning: str | None = None
    target: PlanTarget
    validation_scenes: tuple[StrictInt, ...] = Field(default=(), max_length=16)

    @field_validator("validation_scenes")
    @classmethod
    def _sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        # Lazy: keeps reading a plan config free of scipy.
        from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE as least

        if len(set(sizes)) != len(sizes) or any(n < least or n > 1_000_000 for n in sizes):
            raise ValueError(
                f"validation_scenes={list(sizes)!r} is not allowed; allowed: distinct sizes in [{least}, 1000000] "
                f"(MIN_SCENES_TO_DECIDE={least}: a study of fewer scenes is always undecided, so the plan never "
                "weighs one)"
            )
        return sizes

    def record(self) -> dict[str, Any]:
        """The config as the plan record keeps it."""
        return self.model_dump(mode="json")

    def identity(self) -> dict[str, Any]:
        """What the plan depends on besides its records' digests: the config less its paths."""
        return {k: v for k, v in self.record().items() if k not in ("study", "pilot", "tuning")}


_FORM = ConfigForm(
    QhPlanConfig,
    call=PLAN_CALL,
    what="plan config",
    example="examples/demo-plan.toml",
    relative=(("study",), ("pilot",), ("tuning",)),
)


def read_plan_config(config_path: str | os.PathLike) -> tuple[QhPlanConfig, bytes, QhArchitectureStudyConfig]:
    """Read and fully validate a plan TOML and the study it names, before anything is written.

    Relative ``study``, ``pilot`` and ``tuning`` are resolved against the config file's directory.

    Returns:
        (the validated config, the file's exact bytes, the study config).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, every invalid field at once, or a study
            of fewer than ``MIN_SCENES_TO_DECIDE`` validation scenes (one line: the plan weighs the
            study's own design, and a study of fewer is always undecided).
    """
    config, data, study = read_tool_config(_FORM, config_path)
    # Lazy: as in the validator.
    from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE

    scenes = declared_scenes(study.validation, call=PLAN_CALL)
    if scenes < MIN_SCENES_TO_DECIDE:
        source = study.validation
        named = f"preset {source.preset!r}" if source.preset is not None else f"path {source.path!r}"
        raise input_error(
            PLAN_CALL,
            "study",
            config.study,
            f"a study of at least MIN_SCENES_TO_DECIDE={MIN_SCENES_TO_DECIDE} validation scenes (its validation, "
            f"{named}, has {scenes})",
            "a study of fewer scenes is always undecided, so no design of it can reach a target; give the study a "
            f"validation population of {MIN_SCENES_TO_DECIDE} or more scenes and plan it again",
        )
    return config, data, study
