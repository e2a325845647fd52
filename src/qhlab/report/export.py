"""A finished study's results as tidy tables, for the user's own statistics: ``qhlab study export``.

Owns: ``export_tables`` (the authenticated report's metrics of every cell, and the per-scene
values its cells were scored on, as two tidy tables) and ``export_study`` (one of them written
as Parquet or CSV and published whole). Does not own: computing any statistic (the report's
sections), reading receipts (``qhlab.evidence``) or the command line (``qhlab.cli.study``).

The tables, one row per value (``docs/how-to/export-results.md`` loads them with pandas and
DuckDB):

* ``cells``: ``study, arm, role, seed, horizon, metric, unit, value, low, high, confidence,
  observed_updates``: each cell's MAE_h and regret_h for h = 1..H, with its 95% scene-bootstrap
  interval, exactly as ``report.json`` holds them;
* ``scenes``: ``study, arm, role, seed, scene_id, horizon, metric, unit, value``: the value of every
  validation scene, from the cell receipts the report binds (a cell's metric is their mean).

``unit`` is the reward's unit as the report states it (``report.json``'s ``unit``), on every row, so
a table read away from its study still says what its values measure.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from qhlab.design.study_records import StudyCellReceipt, StudyReportReceipt
from qhlab.evidence import (
    RECEIPT_SUFFIX,
    EvidenceError,
    authentication_roots,
    input_error,
    publish_bytes,
    read_receipt,
    recorded_origin,
)
from qhlab.evidence.layout import CELL_RECEIPT, CELLS_DIR, REPORT_DIR, REPORT_JSON, REPORT_RECEIPT
from qhlab.report.records import recompute_report

__all__ = ["EXPORT_FORMATS", "EXPORT_TABLES", "export_study", "export_tables"]

EXPORT_TABLES = ("cells", "scenes")
EXPORT_FORMATS = ("parquet", "csv")
_CALL = "qhlab study export"
_METRICS = ("mae", "regret")
_WHO = ("study", "arm", "role", "seed")
_CELLS = (*_WHO, "horizon", "metric", "unit", "value", "low", "high", "confidence", "observed_updates")
_SCENES = (*_WHO, "scene_id", "horizon", "metric", "unit", "value")


def _report(output: Path) -> dict:
    """The study's report.json, authenticated by its receipt (and so every cell receipt it binds)."""
    import json

    receipt = output / REPORT_DIR / REPORT_RECEIPT
    if not receipt.is_file():
        raise input_error(
            _CALL,
            "STUDY",
            str(output),
            f"a finished study directory (it holds {REPORT_DIR}/{REPORT_RECEIPT})",
            "export a study whose report step ran (`qhlab study run CONFIG --output STUDY`)",
        )
    read_receipt(receipt, StudyReportReceipt)
    return json.loads((output / REPORT_DIR / REPORT_JSON).read_text(encoding="utf-8"))


def export_tables(output: str | os.PathLike) -> dict[str, Any]:
    """The study's two tidy tables, read from its authenticated report and cell receipts.

    Args:
        output: the study directory (a moved or copied one is judged on its own bytes).

    Returns:
        ``{"cells": pyarrow.Table, "scenes": pyarrow.Table}`` (columns in the module docstring).

    Raises:
        QhInputError: not a finished study.
        EvidenceError: a receipt or a file it binds does not authenticate, or a cell receipt is
            not the one the report read.
    """
    import pyarrow as pa

    output = Path(output)
    cells: list[dict] = []
    scenes: list[dict] = []
    with authentication_roots(output, (), original=recorded_origin(output)):
        report = _report(output)
        for cell in report["cells"]:
            who = {"study": report["study"], "arm": cell["arm"], "role": cell["role"], "seed": cell["seed"]}
            for metric in _METRICS:
                for h, (value, interval) in enumerate(zip(cell[metric], cell[f"{metric}_intervals"], strict=True), 1):
                    cells.append(
                        {
                            **who,
                            "horizon": h,
                            "metric": metric,
                            "unit": report["unit"],
                            "value": value,
                            "low": interval["low"],
                            "high": interval["high"],
                            "confidence": interval["confidence"],
                            "observed_updates": cell["observed_updates"],
                        }
                    )
            path = output / CELLS_DIR / cell["cell"] / CELL_RECEIPT
            body = read_receipt(path, StudyCellReceipt).body_record()
            if body["final_state_sha256"] != cell["final_state_sha256"]:
                raise EvidenceError(
                    f"{_CALL}: {path} names final state {body['final_state_sha256'][:16]}, not the "
                    f"{cell['final_state_sha256'][:16]} its report read. HINT: a cell receipt was replaced after "
                    "the report; run `qhlab verify` on the study."
                )
            evaluation, unit = body["evaluation"], report["unit"]
            for metric in _METRICS:
                for scene_id, values in zip(evaluation["scene_ids"], evaluation[f"scene_{metric}"], strict=True):
                    scenes += [
                        {**who, "scene_id": scene_id, "horizon": h, "metric": metric, "unit": unit, "value": value}
                        for h, value in enumerate(values, 1)
                    ]
    return {
        "cells": pa.Table.from_pylist(cells, schema=_schema(_CELLS)),
        "scenes": pa.Table.from_pylist(scenes, schema=_schema(_SCENES)),
    }


def _schema(columns: tuple[str, ...]) -> Any:
    """The pyarrow schema of a table's ``columns`` (strings, int64 counts and ids, float64 rewards)."""
    import pyarrow as pa

    ints, floats = ("seed", "scene_id", "horizon", "observed_updates"), ("value", "low", "high", "confidence")
    return pa.schema([(c, pa.int64() if c in ints else pa.float64() if c in floats else pa.string()) for c in columns])


def _refuse_evidence_directory(destination: Path) -> None:
    """Refuse a destination inside an evidence directory (one that holds a receipt, or below one):
    a file written there is bound by nothing, and a study's or a population's directory is sealed."""
    for directory in (destination.parent.resolve(), *destination.parent.resolve().parents):
        receipts = sorted(directory.glob(f"*{RECEIPT_SUFFIX}"))
        if receipts:
            raise input_error(
                _CALL,
                "--output",
                str(destination),
                "a file outside every evidence directory",
                f"{directory} holds {receipts[0].name}: a study's or record's directory is written once, by qhlab; "
                "export next to it instead",
            )


def export_study(
    output: str | os.PathLike, destination: str | os.PathLike, *, table: str = "cells", fmt: str | None = None
) -> Path:
    """Write one of the study's tables to ``destination`` as Parquet or CSV, published whole.

    Args:
        output: the study directory.
        destination: the new file (refused if it exists).
        table: ``"cells"`` or ``"scenes"`` (``EXPORT_TABLES``).
        fmt: ``"parquet"`` or ``"csv"``; None takes it from the destination's suffix.

    Returns:
        The written file.

    Raises:
        QhInputError: a bad table, format or destination (nothing is written), or not a finished study.
        EvidenceError: as ``export_tables``.
    """
    destination = Path(destination)
    if table not in EXPORT_TABLES:
        raise input_error(
            _CALL, "--table", table, " or ".join(EXPORT_TABLES), "cells: one row per cell, metric and horizon"
        )
    if fmt is None:
        fmt = destination.suffix.lstrip(".").lower()
        if fmt not in EXPORT_FORMATS:
            raise input_error(
                _CALL,
                "--output",
                str(destination),
                "a file ending in .parquet or .csv, or --format",
                "name the file `results.parquet`, or pass --format parquet|csv",
            )
    if fmt not in EXPORT_FORMATS:
        raise input_error(_CALL, "--format", fmt, " or ".join(EXPORT_FORMATS), "parquet keeps the column types")
    if destination.exists():
        raise input_error(_CALL, "--output", str(destination), "a new file", "remove it or name another file")
    if not destination.parent.is_dir():
        raise input_error(
            _CALL, "--output", str(destination), "a file in an existing directory", "create its directory first"
        )
    _refuse_evidence_directory(destination)
    data = export_tables(output)[table]
    # Only a report its cells give is exported (the check verify runs).
    recompute_report(output, call=_CALL)
    import pyarrow.csv
    import pyarrow.parquet

    buffer = io.BytesIO()
    if fmt == "parquet":
        pyarrow.parquet.write_table(data, buffer)
    else:
        pyarrow.csv.write_csv(data, buffer)
    return publish_bytes(destination, buffer.getvalue())
