"""The report receipt, authenticated: a finished study's report chained to its freeze and cells.

Owns: ``authenticate_report`` (read by ``qhlab verify``'s recomputation, a lane comparison and a
replication). Imports no torch, so that ``qhlab verify`` stays light. Does not own: the receipt
chain below the report (``qhlab.study.authentication``) or writing the report (``build``).
"""

from __future__ import annotations

import json
from pathlib import Path

from qhlab.design.study_records import StudyReportReceipt
from qhlab.evidence import read_receipt
from qhlab.evidence.layout import REPORT_DIR, REPORT_JSON, REPORT_RECEIPT, cell_name
from qhlab.study.authentication import FrozenStudy, authenticate_cells, check_bound, require_step

__all__ = ["authenticate_report"]


def authenticate_report(frozen: FrozenStudy, step: str) -> tuple[Path, dict, dict[tuple[str, int], dict]]:
    """A finished study's report: its receipt, chained to the freeze and to every cell's final receipt.

    Returns:
        (the report receipt's path, ``report.json`` as the receipt binds it, the cells as
        ``authenticate_cells`` returns them).

    Raises:
        OrderError: a cell or the report is missing. EvidenceError: a receipt does not authenticate
            or does not bind the study's current freeze and cell receipts.
    """
    cells = authenticate_cells(frozen, step)
    path = frozen.output / REPORT_DIR / REPORT_RECEIPT
    require_step(
        path, "the report receipt", step, f"run `qhlab study run {frozen.config_path} --output {frozen.output}`"
    )
    receipt = read_receipt(path, StudyReportReceipt)
    check_bound(receipt, "freeze", frozen.receipt_path, path)
    for (arm, seed), cell in cells.items():
        check_bound(receipt, f"cell/{cell_name(arm, seed)}", cell["path"], path)
    report = json.loads((path.parent / REPORT_JSON).read_text(encoding="utf-8"))  # bound by the receipt
    return path, report, cells
