"""Every file of a finished study is accounted for: verify names each unbound file by its path and
kind, refuses a report no receipt binds and an unknown file in a study, and sign signs none of it.

The red team's cases, on copies of the session's finished tiny study (``qhlab study run``): the
report receipt deleted and report.md edited from "undecided" to "retained"; an ``answer.md``
added beside the report; a note at the study's top; a log planted in ``report/``; and a
resealed report.md that only verify's recomputation refuses, which ``qhlab sign`` must refuse too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from qhlab.cli import main
from qhlab.evidence.accounting import UNBOUND_KINDS
from qhlab.evidence.layout import REPORT_DIR, REPORT_RECEIPT, SIGNATURE_FILE
from record_forgery import reseal

pytestmark = pytest.mark.slow


def _key(tmp_path: Path) -> Path:
    key = tmp_path / "key.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key


def _refused_by_verify_and_sign(study: Path, tmp_path: Path, capsys, *needles: str) -> str:
    """Verify and sign each exit 2 with one error naming every needle; no signature is written."""
    assert main(["verify", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and all(n in err for n in needles), err
    assert main(["sign", str(study), "--private-key", str(_key(tmp_path))]) == 2
    signed = capsys.readouterr().err
    assert signed.count("error:") == 1 and all(n in signed for n in needles), signed
    assert not (study / SIGNATURE_FILE).exists()
    return err


def test_a_genuine_study_lists_every_unbound_file_by_path_and_kind(study_copy, capsys):
    study = study_copy()
    assert main(["verify", str(study), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    kinds = {entry["kind"] for entry in result["unbound"]}
    # What the study's steps write unbound: locks, fit logs and W&B run files; nothing unknown.
    assert kinds == {"lock file", "fit log", "W&B run file"} and kinds <= set(UNBOUND_KINDS)
    assert [entry["path"] for entry in result["unbound"]] == result["unbound_files"]
    logs = sorted(e["path"] for e in result["unbound"] if e["kind"] == "fit log")
    assert len(logs) == 12 and all(p.startswith(("cells/", "canaries/")) and p.endswith("/fit.log") for p in logs)
    assert main(["verify", str(study)]) == 0
    out = capsys.readouterr().out
    # Each file is named by its path: its folder on the line, its name in the parentheses.
    for path in logs:
        folder, name = path.rsplit("/", 1)
        assert f"  fit log: {folder}/ ({name})" in out, out
    assert "  lock file: .study-freeze.lock, .study-report.lock, .study-run.lock" in out
    assert f"note: {len(result['unbound'])} files are bound by no receipt" in out
    assert "unknown" not in out


def test_a_report_with_its_receipt_deleted_and_its_decision_edited_is_refused(study_copy, tmp_path, capsys):
    study = study_copy()
    (study / REPORT_DIR / REPORT_RECEIPT).unlink()
    markdown = study / REPORT_DIR / "report.md"
    markdown.chmod(0o644)
    markdown.write_text(markdown.read_text().replace("undecided", "retained"))
    _refused_by_verify_and_sign(study, tmp_path, capsys, f"{study}/report/", "report.md", f"no {REPORT_RECEIPT}")
    # study status no longer calls such a report "not started".
    assert main(["study", "status", str(study), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["rows"][-1]
    assert report["row"] == "report" and report["state"] == "crashed", report
    assert "report.md" in report["note"] and f"no {REPORT_RECEIPT} binds them" in report["note"]


def test_an_unbound_answer_beside_the_report_is_refused_by_its_path(study_copy, tmp_path, capsys):
    study = study_copy()
    (study / REPORT_DIR / "answer.md").write_text("variant_deep: **retained**\n")
    _refused_by_verify_and_sign(study, tmp_path, capsys, "report/answer.md (unknown file)")


@pytest.mark.parametrize(
    ("where", "kind"),
    [
        ("answer.md", "unknown file"),  # the study's top: still the study's own
        ("benchmarks/notes.txt", "unknown file"),
        ("report/fit.log", "fit log"),  # a known kind, but no step writes it there
        ("cells/baseline-s0/summary.json", "unknown file"),
    ],
)
def test_a_file_no_step_writes_is_refused_anywhere_in_the_study(study_copy, tmp_path, capsys, where, kind):
    study = study_copy()
    (study / where).write_text("retained\n")
    _refused_by_verify_and_sign(study, tmp_path, capsys, f"{where} ({kind})")


def test_sign_refuses_a_report_that_only_recomputation_refuses(study_copy, tmp_path, capsys):
    study = study_copy()
    markdown = study / REPORT_DIR / "report.md"
    markdown.chmod(0o644)
    markdown.write_text(markdown.read_text().replace("undecided", "retained", 1))
    reseal(study / REPORT_DIR / REPORT_RECEIPT)  # every digest agrees again
    _refused_by_verify_and_sign(study, tmp_path, capsys, "is not the rendering of its report.json")


def test_a_file_outside_any_study_is_listed_not_refused(study_copy, capsys):
    study = study_copy()
    (study.parent / "notes.md").write_text("mine\n")
    assert main(["verify", str(study.parent), "--json"]) == 0
    unbound = json.loads(capsys.readouterr().out)["unbound"]
    assert {"path": "notes.md", "kind": "unknown file"} in unbound
