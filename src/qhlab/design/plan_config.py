"""The plan config: which study a power plan is for, the pilot it reads, and the MDE it must reach.

Owns: ``QhPlanConfig`` (the study, its pilot record, an optional tuning record of the study's
margins, the target MDE and the validation sizes to weigh) and reading a plan TOML
(``read_plan_config``: every invalid field listed in one error, before anything is written).
Does not own: the predictions (``plan_record``), the pilot (``pilot_config``) or the study config.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from qhlab.design.study_config import PlainNumber, QhArchitectureStudyConfig, read_study_config
from qhlab.finite_horizon.recipe import read_config

__all__ = ["PLAN_CALL", "PlanTarget", "QhPlanConfig", "read_plan_config"]

PLAN_CALL = "qhlab plan"
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
_Int = Annotated[int, Strict()]


class PlanTarget(BaseModel):
    """The largest MDE a study may have, per retention margin (the reward's unit, two-sided at its level, 80% power).

    Attributes:
        d_reg: the largest D_reg MDE (retention's regret margin) allowed over the study's variants:
            a design whose largest predicted D_reg MDE is above it cannot detect a difference the
            study must see, so it does not reach the target.
        d_mae: the largest D_mae MDE (retention's calibration margin) allowed over the study's
            variants, for the same reason.
    """

    model_config = _FROZEN

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
            scenes would buy and cost (each at least 30: fewer never decide; empty: the study's
            size alone).
    """

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    study: str = Field(min_length=1)
    pilot: str = Field(min_length=1)
    tuning: str | None = None
    target: PlanTarget
    validation_scenes: tuple[_Int, ...] = Field(default=(), max_length=16)

    @field_validator("validation_scenes")
    @classmethod
    def _sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(sizes)) != len(sizes) or any(n < 30 or n > 1_000_000 for n in sizes):
            raise ValueError(
                f"validation_scenes={list(sizes)!r} is not allowed; allowed: distinct sizes in [30, 1000000] (fewer "
                "than 30 scenes never decide)"
            )
        return sizes

    def record(self) -> dict[str, Any]:
        """The config as the plan record keeps it."""
        return self.model_dump(mode="json")

    def identity(self) -> dict[str, Any]:
        """What the plan depends on besides its records' digests: the config less its paths."""
        return {k: v for k, v in self.record().items() if k not in ("study", "pilot", "tuning")}


def read_plan_config(config_path: str | os.PathLike) -> tuple[QhPlanConfig, bytes, QhArchitectureStudyConfig]:
    """Read and fully validate a plan TOML and the study it names, before anything is written.

    Relative ``study``, ``pilot`` and ``tuning`` are resolved against the config file's directory.

    Returns:
        (the validated config, the file's exact bytes, the study config).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, or every invalid field at once.
    """
    config, data, _ = read_config(
        config_path,
        QhPlanConfig,
        call=PLAN_CALL,
        what="plan config",
        example="examples/demo-plan.toml",
        relative=(("study",), ("pilot",), ("tuning",)),
    )
    return config, data, read_study_config(config.study)[0]
