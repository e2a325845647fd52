"""A finished study read as a whole, and the report step a ``Study`` is given.

Owns: ``REPORTER`` (the pipeline's last step: publish ``report/`` and log its W&B run, the
``qhlab.study.Reporter`` the pipeline is handed, since it never imports this package),
``open_study`` (a ``Study`` that reports: what the commands, the seed's step functions and a
replication open) and ``finished_study`` (one finished study authenticated and read for the analyses
above the report: a lane comparison and a replication). Does not own: the report's content
(``build``), the pipeline's steps (``qhlab.study``) or what the analyses compute.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qhlab.design.user_sources import family_sources
from qhlab.evidence.layout import DEVELOPMENT_RECEIPT, REPORT_JSON
from qhlab.execution import ExecutorChoice
from qhlab.report.build import write_report
from qhlab.report.receipt import authenticate_report
from qhlab.report.wandb_run import log_report_run
from qhlab.study.authentication import FrozenStudy, authenticate_development
from qhlab.study.study import Study

__all__ = ["REPORTER", "FinishedStudy", "finished_study", "open_study"]


class _StudyReporter:
    """The report step (``qhlab.study.Reporter``): ``write_report`` and ``log_report_run``."""

    def publish(self, frozen: FrozenStudy) -> dict:
        return write_report(frozen)

    def log_run(self, output: Path) -> str:
        return log_report_run(output)


REPORTER = _StudyReporter()


def open_study(
    config_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    populations: Sequence[str | os.PathLike] = (),
    executor: ExecutorChoice | None = None,
) -> Study:
    """The study at ``output`` made from ``config_path``, with the report as its last step
    (``Study.open`` with ``reporter=REPORTER``; nothing is read or written yet)."""
    return Study.open(config_path, output, populations=populations, executor=executor, reporter=REPORTER)


@dataclass(frozen=True)
class FinishedStudy:
    """One finished study, authenticated: what a lane comparison and a replication read.

    Attributes:
        frozen: the authenticated freeze.
        report: ``report.json`` as the report receipt binds it.
        cells: ``{(arm, seed): {"path": final receipt path, "document": the receipt}}``.
        development: the development receipt's body record, or None when not asked for.
        sources: ``{arm: source record}`` of the freeze's user arms.
        paths: ``{"freeze", "development", "report"}``: the files a record of the analysis binds
            (``report`` is ``report.json``).
        report_receipt: the report receipt's path.
    """

    frozen: FrozenStudy
    report: dict
    cells: dict[tuple[str, int], dict]
    development: dict | None
    sources: dict[str, dict]
    paths: dict[str, Path]
    report_receipt: Path


def finished_study(
    directory: str | os.PathLike,
    call: str,
    *,
    populations: Sequence[str | os.PathLike] = (),
    runs: bool = True,
    development: bool = False,
) -> FinishedStudy:
    """Authenticate a finished study (freeze, cells, report receipt and, if asked, development).

    Args:
        directory: the study directory.
        call: the command named in refusals.
        populations: further roots its populations were copied to (``--populations``).
        runs: this process will run study code, so it must have the frozen package versions
            (False: only read, as a lane comparison of other machines' studies does).
        development: authenticate and return the development receipt too.

    Raises:
        OrderError: a step of the study is missing. EvidenceError: a receipt does not authenticate.
    """
    study = Study.existing(directory, populations=populations)
    with study.authenticated(call, runs=runs) as frozen:
        report_receipt, report, cells = authenticate_report(frozen, call)
        developed = authenticate_development(frozen, call).body_record() if development else None
        return FinishedStudy(
            frozen=frozen,
            report=report,
            cells=cells,
            development=developed,
            sources=family_sources(frozen.body),
            paths={
                "freeze": frozen.receipt_path,
                "development": frozen.output / DEVELOPMENT_RECEIPT,
                "report": report_receipt.parent / REPORT_JSON,
            },
            report_receipt=report_receipt,
        )
