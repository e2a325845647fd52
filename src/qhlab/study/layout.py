"""Where a study's files live: every directory and file name of a study directory, and cells' names.

Owns: the study directory layout (see docs/ARCHITECTURE.md, "Study directory"), the receipt
schema version every study receipt carries, the name of a cell and the paths derived from it
(cell receipt, benchmark receipt). Every other study module builds its paths here, so a name
is spelled once. Does not own: the files a fit writes inside an attempt directory
(``qhlab.training.launcher.FIT_RECEIPT`` / ``FINAL_STATE``,
``qhlab.finite_horizon.fit.EVALUATION_RECEIPT``) or reading and writing receipts
(``qhlab.evidence``).
"""

from __future__ import annotations

from pathlib import Path

from qhlab.evidence import RECEIPT_SUFFIX, safe_component

__all__ = [
    "FAMILY_DIR",
    "DOCUMENT_SCHEMA_VERSION",
    "STUDY_CALL",
    "CANARY_ROLES",
    "CONFIG_COPY",
    "FREEZE_RECEIPT",
    "FREEZE_LOCK",
    "REPORT_LOCK",
    "CANARY_DIR",
    "SELECTION_FILE",
    "E0_RECEIPT",
    "DEVELOPMENT_RECEIPT",
    "CELLS_DIR",
    "CELL_RECEIPT",
    "BENCHMARK_DIR",
    "REPORT_DIR",
    "REPORT_JSON",
    "REPORT_MARKDOWN",
    "REPORT_RECEIPT",
    "cell_lock_path",
    "cell_name",
    "cell_receipt_path",
    "benchmark_receipt_path",
]

# The layout version of the study's own JSON documents (selection.json, report.json, lanes.json);
# each receipt carries its kind's version (``qhlab.evidence.records``).
DOCUMENT_SCHEMA_VERSION = 1
# The call named in messages that belong to the study as a whole rather than to one step.
STUDY_CALL = "architecture_study"
CANARY_ROLES = ("e0",)

CONFIG_COPY = "study-config.toml"
# The frozen copies of user arms' sources: family/<arm>/<file or package>.
FAMILY_DIR = "family"
FREEZE_RECEIPT = "freeze.receipt.json"
# Held while a step that publishes once per study runs: a second freeze or report exits 3.
FREEZE_LOCK = ".study-freeze.lock"
REPORT_LOCK = ".study-report.lock"
CANARY_DIR = "canaries"
SELECTION_FILE = "selection.json"
E0_RECEIPT = "e0.receipt.json"
DEVELOPMENT_RECEIPT = "development.receipt.json"
CELLS_DIR = "cells"
CELL_RECEIPT = "cell.receipt.json"
BENCHMARK_DIR = "benchmarks"
REPORT_DIR = "report"
REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"
REPORT_RECEIPT = "report.receipt.json"


def cell_name(arm: str, seed: int, canary_role: str | None = None) -> str:
    """The directory name of one cell: ``<arm>-s<seed>``, or ``<role>-<arm>-s<seed>`` for a canary.

    Raises:
        QhInputError: the name is not one safe path component.
    """
    name = f"{arm}-s{seed}" if canary_role is None else f"{canary_role}-{arm}-s{seed}"
    return safe_component(name, field="cell", call=STUDY_CALL)


def cell_receipt_path(output: Path, arm: str, seed: int) -> Path:
    """``OUTPUT/cells/<arm>-s<seed>/cell.receipt.json``: the final receipt of a broad cell."""
    return Path(output) / CELLS_DIR / cell_name(arm, seed) / CELL_RECEIPT


def cell_lock_path(parent: Path, cell: str) -> Path:
    """``<parent>/.<cell>.lock``: held around a whole cell (``cells.fit_cell``)."""
    return Path(parent) / f".{cell}.lock"


def benchmark_receipt_path(output: Path, arm: str, seed: int) -> Path:
    """``OUTPUT/benchmarks/<arm>-s<seed>.receipt.json``: the benchmark receipt of a broad cell."""
    return Path(output) / BENCHMARK_DIR / f"{cell_name(arm, seed)}{RECEIPT_SUFFIX}"
