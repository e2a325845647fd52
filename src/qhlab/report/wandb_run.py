"""The study's W&B "report" run: the report's tables and figures where researchers look.

Owns: ``log_report_run(output, *, offline=True)``: after the report step, one W&B run (job
type ``report``, grouped with the study's canaries and cells under the study's name) logs
every section's tables of the authenticated ``report.json`` (``report_tables``) as a
``wandb.Table`` and both figures as ``wandb.Image``s, puts the headline in the run summary,
and, when online, logs the report directory as an artifact whose metadata carries the report
receipt's SHA-256 and the digest of every file the receipt binds. Offline runs go under ``OUTPUT/wandb-report/`` and
stay syncable later with ``wandb sync``; like a fit attempt's, the run's directory is left
without symbolic links, so the study directory can be signed. Does not own: the report itself
(``report``), the W&B run itself (``qhlab.training.wandb_attempt.log_mirror_run`` opens,
logs and closes it), or deciding anything: the run only mirrors authenticated files.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from qhlab.design.study_records import StudyReportReceipt
from qhlab.evidence import (
    EvidenceError,
    authentication_roots,
    canonical_json,
    read_receipt,
    recorded_origin,
    sha256_file,
)
from qhlab.evidence.layout import REPORT_DIR, REPORT_RECEIPT, WANDB_REPORT_DIR
from qhlab.report.build import SECTIONS
from qhlab.report.render import FIGURES
from qhlab.report.sections import Tables
from qhlab.report.tuning_figures import TUNING_FIGURES
from qhlab.training.wandb_attempt import log_mirror_run

__all__ = ["REPORT_RUN_DIR", "log_report_run", "report_tables"]

REPORT_RUN_DIR = WANDB_REPORT_DIR
"""Where the report run's offline W&B files go, beside report/ (never inside it: report/ is
published whole and bound by its receipt)."""


def report_tables(report: dict) -> Tables:
    """The report's tables as (columns, rows), exactly the numbers of ``report.json``.

    Args:
        report: the parsed ``report.json``.

    Returns:
        {table name: (columns, rows)}: every section's tables (``report.SECTIONS``), in order.
    """
    return {name: table for section in SECTIONS for name, table in section.tables(report).items()}


def log_report_run(output: str | os.PathLike, *, offline: bool = True) -> Path:
    """Log one W&B run mirroring the study's authenticated report.

    Args:
        output: the study output directory (its report step has finished).
        offline: offline (default: no account, no network) or online.

    Returns:
        The directory holding the run's W&B files.

    Raises:
        EvidenceError: the report receipt or a file it binds does not authenticate.
    """
    import json

    output = Path(output)
    report_dir = output / REPORT_DIR
    with authentication_roots(output, original=recorded_origin(output)):  # the study's own bytes
        receipt = read_receipt(report_dir / REPORT_RECEIPT, StudyReportReceipt)
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    if canonical_json(report["summary"]) != canonical_json(receipt.body.summary):
        raise EvidenceError(f"log_report_run: {report_dir / 'report.json'} does not match its receipt's summary.")
    study = str(report["study"])
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run_dir = output / REPORT_RUN_DIR / f"{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True)
    log_mirror_run(
        run_dir,
        init={
            "project": "qhlab",
            "id": f"{study[:40]}-report-{run_dir.name}",
            "name": f"{study} report",
            "group": study,
            "job_type": "report",
            "tags": ["report"],
            "config": {
                "study": study,
                "horizon": report["horizon"],
                "seeds": report["seeds"],
                "profile": report["profile"],
                "thresholds": report["thresholds"],
                "report_receipt_sha256": sha256_file(report_dir / REPORT_RECEIPT),
            },
        },
        tables={f"report/{name}": table for name, table in report_tables(report).items()},
        images={
            f"report/{figure.removesuffix('.png')}": report_dir / figure
            for figure in (*FIGURES, *TUNING_FIGURES)
            if (report_dir / figure).is_file()
        },
        summary={
            "headline": report["headline"]["text"],
            "beats_best_heuristic_every_seed": report["headline"]["beats_every_seed"],
            "n_scenes": report["n_scenes"],
        },
        artifact={
            "name": f"{study}-report",
            "type": "report",
            "metadata": {
                "report_receipt_sha256": sha256_file(report_dir / REPORT_RECEIPT),
                "outputs_sha256": {k: v.sha256 for k, v in receipt.outputs.items()},
            },
            "directory": report_dir,
        },
        offline=offline,
    )
    return run_dir
