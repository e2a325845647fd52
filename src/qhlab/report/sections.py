"""The report's section contract: what a section computes from, and what a section is.

Owns: ``ReportInputs`` (the authenticated receipt bodies every section reads), ``Section`` (one
statistic: its computation, its markdown and its W&B tables) and ``Tables``. Does not own: any
section (``report``, ``seed_aware``), the figures and files (``render``) or the W&B run
(``wandb_run``); every one of them imports this module, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.evidence import EvidenceError

__all__ = ["ReportInputs", "Section", "Tables"]

Tables = dict[str, tuple[list[str], list[list[Any]]]]
"""W&B tables of a section: {name: (columns, rows)}, logged as ``report/<name>``."""


@dataclass(frozen=True)
class ReportInputs:
    """What every section computes from: the authenticated receipt bodies (pure of files).

    Attributes:
        config: the study config.
        freeze: the freeze receipt body.
        development: the development receipt body (with ``references``).
        cells: {(arm, seed): cell receipt body} for every declared cell.
        benchmarks: {(arm, seed): benchmark receipt body} for every cell, or empty.
    """

    config: QhArchitectureStudyConfig
    freeze: dict
    development: dict
    cells: dict[tuple[str, int], dict]
    benchmarks: dict[tuple[str, int], dict]

    @property
    def horizon(self) -> int:
        """H, the primary horizon."""
        return int(self.freeze["train"]["support"]["H"])

    @property
    def primary(self) -> int:
        """The index of H in the horizon axis."""
        return self.horizon - 1

    @property
    def scene_ids(self) -> list[int]:
        """The evaluation's scene order (the first cell's; ``per_scene`` checks every cell's)."""
        return next(iter(self.cells.values()))["evaluation"]["scene_ids"]

    @cached_property
    def per_scene(self) -> dict[tuple[str, int], dict[str, np.ndarray]]:
        """{(arm, seed): {"mae" | "regret": float [n_scenes, H]}}, scenes in ``scene_ids`` order.

        Raises:
            EvidenceError: a cell was evaluated on other scenes (the sealed validation is one).
        """
        arrays = {}
        for key, body in self.cells.items():
            ev = body["evaluation"]
            if ev["scene_ids"] != self.scene_ids:
                raise EvidenceError(f"report_study: cell {body['cell']} was evaluated on other scenes.")
            arrays[key] = {
                m: np.asarray(ev[f"scene_{m}"], dtype=np.float64).reshape(len(self.scene_ids), self.horizon)
                for m in ("mae", "regret")
            }
        return arrays

    @cached_property
    def roles(self) -> dict[str, dict]:
        """{arm: the freeze's arm record (``role``, ``control``, ``matched``)}."""
        return {a["arm"]: a for a in self.freeze["arms"]}

    @cached_property
    def comparisons(self) -> list[tuple[str, str, str]]:
        """(arm, against, relation) of every paired comparison, in report order (the config's)."""
        return self.config.comparisons()

    def at_h(self, arm: str, seed: int, metric: str) -> np.ndarray:
        """float [n_scenes]: one cell's per-scene ``metric`` ("mae" | "regret") at H."""
        return self.per_scene[(arm, seed)][metric][:, self.primary]


@dataclass(frozen=True)
class Section:
    """One statistic of the report: its computation, its markdown and its W&B tables.

    Attributes:
        name: the section's name.
        build: ``build(inputs, report)`` adds the section's fields to ``report`` and its
            entries to ``report["summary"]``; it may read and extend what sections before it
            in ``SECTIONS`` wrote.
        markdown: ``markdown(report) -> lines`` of ``report.md`` (from the report dict only).
        tables: ``tables(report) -> Tables`` of the W&B report run (from ``report.json``).
        lead: its markdown opens ``report.md``, before every section with a smaller ``lead``
            (0: not a lead section; the others follow in order).
    """

    name: str
    build: Callable[[ReportInputs, dict], None]
    markdown: Callable[[dict], list[str]] = lambda report: []
    tables: Callable[[dict], Tables] = lambda report: {}
    lead: int = 0
