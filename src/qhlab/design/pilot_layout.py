"""The pilot's layout a study fixes before its pilot runs (``[preparation.pilot_layout]``).

Owns: ``PilotLayout`` (the pilot's TRAIN draws and the seeds fitted on each, as the study config
declares them) and ``pilot_layout_problem`` (the study-level rule: a study that binds a pilot
declares its layout, none of whose seeds is the study's). Does not own: the study config
(``qhlab.design.study_config``), the pilot config that must match it (``pilot_config``) or the
freeze's check of a bound record (``qhlab.study.preparation``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from qhlab.design.config_files import FROZEN, StrictInt
from qhlab.evidence import POPULATION_SEED_LIMIT, distinct_seeds

__all__ = ["PilotLayout", "pilot_layout_problem"]


class PilotLayout(BaseModel):
    """The pilot a study binds, fixed by the study before the pilot runs: its TRAIN draws and seeds.

    A pilot is one draw of its own noise. Were its seeds free, a researcher could run several and
    bind the quietest (binding the quietest of five covers 84.5% at 95%). Declared here, in the
    config the freeze binds, ``qhlab pilot`` refuses any other layout before it fits, and the
    freeze refuses a record of any other.

    Attributes:
        draws: the pilot's TRAIN seeds: its ``train.seed`` first, then its ``train_draws``.
        seeds: one list of training seeds per draw, in the order of ``draws`` (at least two each,
            none twice, none of the study's own ``seeds``).
    """

    model_config = FROZEN

    draws: tuple[StrictInt, ...] = Field(min_length=1, max_length=65)
    seeds: tuple[tuple[StrictInt, ...], ...] = Field(min_length=1, max_length=65)

    @model_validator(mode="after")
    def _layout(self) -> PilotLayout:
        distinct_seeds("preparation.pilot_layout.draws", self.draws, limit=POPULATION_SEED_LIMIT)
        if len(self.seeds) != len(self.draws) or any(len(s) < 2 for s in self.seeds):
            raise ValueError(
                f"preparation.pilot_layout.seeds={[list(s) for s in self.seeds]!r} is not allowed; allowed: one list "
                f"of two or more training seeds per draw ({len(self.draws)} draws)"
            )
        distinct_seeds("preparation.pilot_layout.seeds", tuple(s for seeds in self.seeds for s in seeds))
        return self

    def as_record(self) -> list[dict[str, Any]]:
        """The layout as a pilot record holds it: ``[{"draw", "seeds"}]`` in draw order."""
        return [{"draw": d, "seeds": list(s)} for d, s in zip(self.draws, self.seeds)]


def pilot_layout_problem(preparation: Any, seeds: tuple[int, ...]) -> str | None:
    """Why a study's ``[preparation]`` breaks the layout rule (None: it keeps it).

    Args:
        preparation: the study's ``PreparationConfig`` (None: no preparation).
        seeds: the study's own training seeds.

    Returns:
        The refusal's text: a pilot bound without a declared layout, or a layout holding one of
        ``seeds``; None otherwise.
    """
    if preparation is None:
        return None
    layout = preparation.pilot_layout
    if preparation.pilot is not None and layout is None:
        return (
            "preparation.pilot_layout is missing; allowed: with preparation.pilot, the pilot's TRAIN draws and "
            "seeds declared before it ran ([preparation.pilot_layout] draws = [...], seeds = [[...], ...]), "
            "so that no other pilot of this design can be bound"
        )
    shared = [] if layout is None else sorted({s for group in layout.seeds for s in group} & set(seeds))
    if shared:
        return (
            f"preparation.pilot_layout.seeds holds {shared}, the study's own seeds; allowed: seeds the study "
            "does not report (a pilot measures the seed variance on seeds of its own)"
        )
    return None
