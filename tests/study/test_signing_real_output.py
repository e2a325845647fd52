"""The documented signing tour, run as written, on what qhlab really writes (slow).

The commands are read from the docs (the "quick tour on the tiny preset" block of
docs/guide/command-line.md and the "Signing" block of docs/guide/signing.md) and run one by one in a
shell, with ``/tmp/`` replaced by a test directory, ``.venv/bin/`` by this interpreter's bin
directory and ``examples/`` by the repository's. Then the session's finished tiny study (``qhlab
study run``, the ``finished_study`` fixture) is signed on a copy and checked by both verifiers, and
a forged receipt in it is refused by both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from qhlab.evidence import EvidenceError, canonical_json, sha256_bytes, sha256_file
from qhlab.evidence.signing import SIGNATURE_FILE, verify_signature
from qhlab.report.render import FIGURES

REPO = Path(__file__).resolve().parents[2]
TOUR = REPO / "docs" / "guide" / "command-line.md"
SIGNING = REPO / "docs" / "guide" / "signing.md"
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _bash_block_after(marker: str, page: Path) -> list[str]:
    """The commands of the first ```bash block after ``marker`` in ``page`` (continuations joined)."""
    text = page.read_text(encoding="utf-8")
    start = text.index(marker)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, f"no ```bash block after {marker!r} in {page}"
    return [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def _localize(command: str, tmp: Path) -> str:
    # /tmp/ first: the venv or the repository may themselves live under /tmp (a fresh clone in CI).
    return (
        command.replace("/tmp/", f"{tmp}/")
        .replace(".venv/bin/", f"{VENV_BIN}/")
        .replace("examples/", f"{REPO}/examples/")
    )


def _run(command: str, cwd: Path, *, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == expect, f"{command}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _links_and_escapes(root: Path) -> list[str]:
    found, real_root = [], root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                found.append(f"link {path} -> {os.readlink(path)}")
            elif not path.resolve().is_relative_to(real_root):
                found.append(f"outside {path}")
    return found


def _keys(cwd: Path, signing: list[str]) -> list[str]:
    """Run the documented openssl lines (or, without openssl, write the same key pair with
    ``cryptography``); return the remaining signing commands."""
    openssl = [c for c in signing if c.startswith("openssl ")]
    assert len(openssl) == 2, signing
    if shutil.which("openssl"):
        for command in openssl:
            _run(command, cwd)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        (cwd / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (cwd / "pub.pem").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    assert (cwd / "key.pem").is_file() and (cwd / "pub.pem").is_file()
    return [c for c in signing if not c.startswith("openssl ")]


def _sign_and_verify(directory: Path, cwd: Path) -> None:
    """`qhlab sign`, `qhlab verify --public-key` and `model_signing verify key` on ``directory``."""
    signed = _run(f"{VENV_BIN}/qhlab sign {directory} --private-key key.pem", cwd).stdout
    count = int(re.search(r"^signed: (\d+) files \(\d+ receipts authenticated first\) in ", signed, re.M).group(1))
    assert count == sum(1 for p in directory.rglob("*") if p.is_file() and p.name != SIGNATURE_FILE)
    verified = _run(f"{VENV_BIN}/qhlab verify {directory} --public-key pub.pem", cwd).stdout
    assert f"signature: {directory / SIGNATURE_FILE} verified {count} files with pub.pem" in verified
    checked = _run(
        f"{VENV_BIN}/model_signing verify key {directory} --signature {directory / SIGNATURE_FILE} "
        "--public_key pub.pem",
        cwd,
    )
    assert "Verification succeeded" in checked.stdout


def test_readme_tour_signs_a_real_fit_and_commissioning_run(tmp_path):
    tour = _bash_block_after("A quick tour on the tiny preset", TOUR)
    signing = _bash_block_after("## Signing", SIGNING)
    cwd = tmp_path / "work"
    cwd.mkdir()
    for command in tour:
        _run(_localize(command, tmp_path), cwd)
    fits, commission = tmp_path / "fits", tmp_path / "commission"
    assert fits.is_dir() and commission.is_dir()
    assert _links_and_escapes(fits) == [] and _links_and_escapes(commission) == []
    # Each attempt keeps its whole offline W&B run: the .wandb file and its logs, as real files.
    for attempt in [*fits.glob("*/*/wandb"), *commission.glob("fit/*/*/wandb")]:
        (run,) = attempt.iterdir()
        assert run.name.startswith("offline-run-") and next(run.glob("run-*.wandb")).stat().st_size > 0
        assert sorted(p.name for p in (run / "logs").iterdir()) == ["debug-internal.log", "debug.log"]
    commands = _keys(cwd, signing)
    assert [c.split()[:2] for c in commands] == [
        [".venv/bin/qhlab", "sign"],
        [".venv/bin/qhlab", "verify"],
        [".venv/bin/model_signing", "verify"],
    ]
    for command in commands:
        done = _run(_localize(command, tmp_path), cwd)
        if " sign " in command:
            assert f"in {fits}; signature {fits / SIGNATURE_FILE}" in done.stdout
        elif "model_signing" in command:
            assert "Verification succeeded" in done.stdout
        else:
            assert f"signature: {fits / SIGNATURE_FILE} verified " in done.stdout
    # The commissioning run (the tour's other directory) signs the same way.
    _sign_and_verify(commission, cwd)


def _forge_report(study: Path) -> None:
    """What a forger with write access does: flip the headline's verdict in report.json, then
    rewrite the report receipt to match (its output digest and its own content digest)."""
    report_dir = study / "report"
    report_file = report_dir / "report.json"
    report = json.loads(report_file.read_text())
    report["summary"]["beats_best_heuristic_every_seed"] = not report["summary"]["beats_best_heuristic_every_seed"]
    report_file.chmod(0o644)
    report_file.write_text(json.dumps(report, indent=2, sort_keys=True))
    receipt_file = report_dir / "report.receipt.json"
    receipt = json.loads(receipt_file.read_text())
    receipt["body"]["summary"] = report["summary"]
    (entry,) = [e for e in receipt["outputs"].values() if e["path"] == "report.json"]
    entry["sha256"] = sha256_file(report_file)
    del receipt["content_sha256"]
    receipt["content_sha256"] = sha256_bytes(canonical_json(receipt))
    receipt_file.chmod(0o644)
    receipt_file.write_bytes(canonical_json(receipt))


def test_a_real_study_signs_and_a_forged_receipt_is_refused_by_both_verifiers(finished_study, tmp_path):
    signing = _bash_block_after("## Signing", SIGNING)
    cwd = tmp_path / "work"
    cwd.mkdir()
    _keys(cwd, signing)
    study = tmp_path / "study"
    shutil.copytree(finished_study["output"], study, symlinks=True)  # a link would stay a link
    assert _links_and_escapes(study) == []
    (report_run,) = (study / "wandb-report").iterdir()
    (run,) = (report_run / "wandb").iterdir()
    assert next(run.glob("run-*.wandb")).stat().st_size > 0
    assert len(list(run.glob("files/media/images/report/*.png"))) == len(FIGURES)  # the figures, copied
    _sign_and_verify(study, cwd)

    forged = tmp_path / "forged"
    shutil.copytree(study, forged, symlinks=True)
    _forge_report(forged)
    with pytest.raises(EvidenceError, match=r"model\.sig does not verify"):
        verify_signature(forged, public_key=cwd / "pub.pem")
    refused = _run(f"{VENV_BIN}/qhlab verify {forged} --public-key pub.pem", cwd, expect=2)
    assert refused.stderr.startswith("error: ") and "does not verify" in refused.stderr
    refused = _run(
        f"{VENV_BIN}/model_signing verify key {forged} --signature {forged / SIGNATURE_FILE} --public_key pub.pem",
        cwd,
        expect=1,
    )
    assert "Verification failed" in refused.stderr
