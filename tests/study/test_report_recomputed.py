"""`qhlab verify` recomputes a study's report from the receipts it binds, and export reads only that.

The forger's case: one cell receipt's per-scene MAE and regret zeroed, the cell, its benchmark and
the report receipts resealed, ``report.json`` untouched. Every digest then agrees; only rebuilding
the report from the cell bodies shows that it is not theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import canonical_json, sha256_file
from qhlab.evidence.layout import REPORT_DIR
from record_forgery import reseal

pytestmark = pytest.mark.slow


def _rebind(receipt: Path, files: dict[tuple[str, ...], Path]) -> None:
    """Bind each of ``files`` (by the tail of the path the receipt names it by) as it is now, and reseal."""
    document = json.loads(receipt.read_text())
    for entry in document["inputs"].values():
        for tail, file in files.items():
            # Bound by the path the study had where it was made (this is a copy): the file's own.
            if Path(entry["path"]).parts[-len(tail) :] == tail:
                entry["sha256"] = sha256_file(file)
    receipt.chmod(0o644)
    receipt.write_bytes(canonical_json(document))
    reseal(receipt)


def _zero_a_cell(study: Path) -> None:
    cell = study / "cells" / "baseline-s0" / "cell.receipt.json"
    document = json.loads(cell.read_text())
    evaluation = document["body"]["evaluation"]
    for key in ("scene_mae", "scene_regret"):
        evaluation[key] = [[0.0 for _ in row] for row in evaluation[key]]
    cell.chmod(0o644)
    cell.write_bytes(canonical_json(document))
    reseal(cell)
    benchmark = study / "benchmarks" / "baseline-s0.receipt.json"
    _rebind(benchmark, {("cells", "baseline-s0", "cell.receipt.json"): cell})
    _rebind(
        study / REPORT_DIR / "report.receipt.json",
        {("cells", "baseline-s0", "cell.receipt.json"): cell, ("benchmarks", "baseline-s0.receipt.json"): benchmark},
    )


def test_verify_rebuilds_the_report_and_refuses_one_its_cells_do_not_give(study_copy, capsys, tmp_path):
    genuine = study_copy()
    assert main(["verify", str(genuine)]) == 0
    assert "report.json rebuilt from its 10 cells' receipts" in capsys.readouterr().out
    forged = study_copy()
    _zero_a_cell(forged)
    assert main(["verify", str(forged)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "is not the report its bound receipts give" in err, err
    # Export reads only a report that its cells give.
    out = tmp_path / "scenes.csv"
    assert main(["study", "export", str(forged), "--table", "scenes", "--format", "csv", "--output", str(out)]) == 2
    assert "is not the report its bound receipts give" in capsys.readouterr().err
    assert not out.exists()
    # An edited report.md under a resealed receipt: the rendering of report.json it is not.
    edited = study_copy()
    markdown = edited / REPORT_DIR / "report.md"
    markdown.chmod(0o644)
    markdown.write_text(markdown.read_text().replace("undecided", "retained", 1))
    reseal(edited / REPORT_DIR / "report.receipt.json")
    assert main(["verify", str(edited)]) == 2
    assert "is not the rendering of its report.json" in capsys.readouterr().err


def test_export_refuses_a_destination_inside_an_evidence_directory(study_copy, capsys):
    study = study_copy()
    for inside in (study / "report" / "results.receipt.json", study / "cells" / "baseline-s0" / "x.csv"):
        assert main(["study", "export", str(study), "--format", "csv", "--output", str(inside)]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "a file outside every evidence directory" in err, err
        assert not inside.exists()
    assert main(["verify", str(study)]) == 0
