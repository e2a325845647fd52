"""The report, recomputed: ``qhlab verify`` rebuilds a finished study's report from what it binds.

Owns: ``recompute_report`` (authenticate the study's freeze, development, cell and benchmark
receipts, rebuild ``report.json`` from their bodies with ``build_report``, a pure function, and
compare it, and ``report.md`` rendered from it, with the published files) and its registration as
the check of the report receipt's kind, so that a cell receipt resealed with other per-scene values
under an untouched ``report.json`` fails verify. Does not own: the report itself (``report``),
rendering (``render``) or authenticating receipts (``authentication``). The figures are drawn from
the same ``report.json`` and are not redrawn here.
"""

from __future__ import annotations

import json
from pathlib import Path

from qhlab.design.preparation_record import close_values
from qhlab.design.study_records import StudyReportReceipt
from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    authentication_roots,
    recorded_origin,
    source_package_digest,
)
from qhlab.evidence.envelope import register_check
from qhlab.evidence.layout import REPORT_JSON, REPORT_MARKDOWN, REPORT_RECEIPT, REPORT_SCHEMA_VERSION

__all__ = ["recompute_report"]

_CALL = "qhlab verify"


def recompute_report(directory: str | Path, *, call: str = _CALL) -> dict:
    """Rebuild a study's report from the receipts its report receipt binds; raise where it differs.

    Args:
        directory: the study's ``report/`` directory (or the study directory).
        call: the command named in refusals.

    Returns:
        ``{"report": the recomputed report, "cells": how many cells it read}``.

    Raises:
        EvidenceError: a receipt does not authenticate; ``report.json`` or ``report.md`` is not what
            the bound receipts give (``DigestMismatchError``); a report of another layout version.
    """
    # Lazy: keeps importing this module (which `qhlab verify` loads for every run) free of numpy,
    # scipy and the study pipeline until a report is found.
    from qhlab.report.build import SECTIONS, build_report
    from qhlab.report.receipt import authenticate_report
    from qhlab.report.render import render_markdown
    from qhlab.study.authentication import (
        authenticate_development,
        authenticate_freeze,
        frozen_config_path,
        read_benchmarks,
    )

    directory = Path(directory)
    output = directory.parent if directory.name == "report" else directory
    where = output / "report" / REPORT_JSON
    try:
        recorded = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvidenceError(
            f"{call}: {where} cannot be read as a report ({exc}). HINT: a finished study holds the "
            "report step's report.json; run `qhlab study report` on it."
        ) from exc
    if recorded.get("schema_version") != REPORT_SCHEMA_VERSION:
        raise EvidenceError(
            f"{call}: {where} has layout version {recorded.get('schema_version')!r}; this qhlab recomputes "
            f"version {REPORT_SCHEMA_VERSION}. HINT: verify it with the qhlab version that wrote it."
        )
    with authentication_roots(output, (), original=recorded_origin(output)):
        frozen = authenticate_freeze(frozen_config_path(output), output, call, runs=False, same_source=False)
        _, report, cells = authenticate_report(frozen, call)
        development = authenticate_development(frozen, call)
        benchmarks = {k: v["document"].body_record() for k, v in read_benchmarks(frozen).items()}
        again = build_report(
            frozen.config,
            frozen.receipt.body_record(),
            development.body_record(),
            {k: v["document"].body_record() for k, v in cells.items()},
            benchmarks,
        )
    frozen_source = frozen.receipt.body.source_package["sha256"]
    other_source = source_package_digest()["sha256"] != frozen_source
    if not close_values(json.loads(json.dumps(again)), report):
        differing = sorted(k for k in set(again) | set(report) if not close_values(again.get(k), report.get(k)))
        if other_source:
            # Another qhlab may word or round its report differently: only the frozen code can say
            # whether these bytes are what the cells give.
            raise DigestMismatchError(
                f"{call}: {where} is not the report this qhlab gives from its bound receipts (it differs in "
                f"{', '.join(differing)}), and the study was frozen with other qhlab source (sha256 "
                f"{frozen_source[:16]}). HINT: verify it with the qhlab source it was frozen with."
            )
        raise DigestMismatchError(
            f"{call}: {where} is not the report its bound receipts give (it differs in {', '.join(differing)}). "
            "HINT: a report is a function of its cells; rerun the report step instead of editing it."
        )
    markdown = (output / "report" / REPORT_MARKDOWN).read_text(encoding="utf-8")
    if markdown != render_markdown(report, SECTIONS):
        if other_source:
            # Another qhlab may lay its tables out differently: only the frozen code renders these bytes.
            raise DigestMismatchError(
                f"{call}: {output / 'report' / REPORT_MARKDOWN} is not this qhlab's rendering of its report.json, "
                f"and the study was frozen with other qhlab source (sha256 {frozen_source[:16]}). HINT: verify it "
                "with the qhlab source it was frozen with."
            )
        raise DigestMismatchError(
            f"{call}: {output / 'report' / REPORT_MARKDOWN} is not the rendering of its report.json. HINT: "
            "report.md is a function of report.json; rerun the report step instead of editing it."
        )
    return {"report": again, "cells": len(cells)}


def _check(directory: Path) -> dict:
    return {"cells": recompute_report(directory)["cells"]}


def _describe(directory: Path, entry: dict) -> str:
    """``qhlab verify``'s line for a recomputed report."""
    return (
        f"report: {directory}: report.json rebuilt from its {entry['cells']} cells' receipts and the freeze and "
        "development records, and report.md rendered from it (the figures are drawn from the same report.json)"
    )


register_check(StudyReportReceipt, file=REPORT_RECEIPT, check=_check, describe=_describe)
