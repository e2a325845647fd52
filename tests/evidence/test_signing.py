"""Signing a directory of receipts with OpenSSF model signing (key pair, offline).

A small directory of receipts written with ``qhlab.evidence`` is signed by ``qhlab sign`` and
checked by two independent verifiers: ``qhlab verify --public-key`` and the library's own
``model_signing verify key`` command. Each tampering case must be refused by both.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from note_receipt import NoteReceipt
from qhlab.cli import main
from qhlab.evidence import (
    EvidenceError,
    PublishConflictError,
    canonical_json,
    publish_bytes,
    sha256_bytes,
    write_receipt,
)
from qhlab.evidence.signing import SIGNATURE_FILE, sign_directory, verify_signature

MODEL_SIGNING = Path(sys.executable).parent / "model_signing"


def _keys(directory: Path, *, password: bytes | None = None) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    private = directory / "private.pem"
    public = directory / "public.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def _evidence(directory: Path) -> Path:
    """A finished directory: a state file bound by a receipt, and a sub-directory with its own."""
    (directory / "cell").mkdir(parents=True)
    publish_bytes(directory / "final_state.safetensors", bytes(range(256)) * 4)
    write_receipt(
        directory / "fit.receipt.json",
        NoteReceipt,
        body={"observed_updates": 12},
        outputs={"final_state": directory / "final_state.safetensors"},
    )
    write_receipt(
        directory / "cell" / "cell.receipt.json",
        NoteReceipt,
        body={"seed": 3},
        inputs={"fit": directory / "fit.receipt.json"},
    )
    return directory


def _model_signing_verify(directory: Path, public: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(MODEL_SIGNING),
            "verify",
            "key",
            str(directory),
            "--signature",
            str(directory / SIGNATURE_FILE),
            "--public_key",
            str(public),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("signing")
    private, public = _keys(root / "keys")
    directory = _evidence(root / "attempt")
    assert main(["sign", str(directory), "--private-key", str(private)]) == 0
    return directory, private, public


def test_signed_directory_verifies_with_qhlab_and_model_signing(signed, capsys) -> None:
    directory, _, public = signed
    bundle = json.loads((directory / SIGNATURE_FILE).read_text())
    # the library's standard bundle: a DSSE envelope around an in-toto statement
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    capsys.readouterr()
    assert main(["verify", str(directory), "--public-key", str(public)]) == 0
    out = capsys.readouterr().out
    assert "verified: 2 receipts" in out and f"signature: {directory / SIGNATURE_FILE} verified 3 files" in out
    assert verify_signature(directory, public_key=public)["signed_files"] == 3
    checked = _model_signing_verify(directory, public)
    assert checked.returncode == 0, checked.stderr
    assert "Verification succeeded" in checked.stdout


def test_verify_says_whether_a_directory_is_signed(signed, tmp_path, capsys) -> None:
    directory, _, _ = signed
    unsigned = _evidence(tmp_path / "unsigned")
    assert main(["verify", str(unsigned)]) == 0
    assert f"note: unsigned (no {unsigned / SIGNATURE_FILE})" in capsys.readouterr().out
    assert main(["verify", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"signature: {directory / SIGNATURE_FILE} lists exactly the" in out, out
    assert "the signature itself was not checked" in out and "proves internal consistency" in out, out
    assert main(["verify", str(unsigned), "--public-key", str(tmp_path / "absent.pem")]) == 2
    assert "is not signed" in capsys.readouterr().err


def _edit_receipt(directory: Path) -> None:
    receipt = directory / "fit.receipt.json"
    document = json.loads(receipt.read_text())
    document["body"]["observed_updates"] = 13
    del document["content_sha256"]
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    receipt.chmod(0o644)
    receipt.write_bytes(canonical_json(document))


def _flip_state_byte(directory: Path) -> None:
    state = directory / "final_state.safetensors"
    data = bytearray(state.read_bytes())
    data[100] ^= 1
    state.chmod(0o644)
    state.write_bytes(bytes(data))


def _add_file(directory: Path) -> None:
    (directory / "cell" / "notes.txt").write_text("added after signing\n")


@pytest.mark.parametrize(
    "tamper",
    [_edit_receipt, _flip_state_byte, _add_file],
    ids=["receipt-edited-and-rehashed", "state-byte-changed", "file-added"],
)
def test_both_verifiers_refuse_a_changed_directory(signed, tmp_path, tamper, capsys) -> None:
    directory, _, public = signed
    copy = tmp_path / "attempt"
    shutil.copytree(directory, copy)
    tamper(copy)
    with pytest.raises(EvidenceError, match=r"model\.sig does not verify"):
        verify_signature(copy, public_key=public)
    capsys.readouterr()
    assert main(["verify", str(copy), "--public-key", str(public)]) == 2
    assert "error:" in capsys.readouterr().err
    refused = _model_signing_verify(copy, public)
    assert refused.returncode != 0
    assert "Verification failed" in refused.stderr


def test_a_receipt_edited_without_rehashing_is_refused_before_signing(tmp_path) -> None:
    private, _ = _keys(tmp_path / "keys")
    directory = _evidence(tmp_path / "attempt")
    _flip_state_byte(directory)
    with pytest.raises(EvidenceError):
        sign_directory(directory, private_key=private)
    assert not (directory / SIGNATURE_FILE).exists()


def test_another_key_is_refused_and_a_signature_is_write_once(signed, tmp_path) -> None:
    directory, private, _ = signed
    _, other_public = _keys(tmp_path / "other")
    with pytest.raises(EvidenceError, match="does not verify"):
        verify_signature(directory, public_key=other_public)
    assert _model_signing_verify(directory, other_public).returncode != 0
    with pytest.raises(PublishConflictError, match="already exists"):
        sign_directory(directory, private_key=private)


def test_encrypted_key_is_read_with_its_password(tmp_path, monkeypatch) -> None:
    private, public = _keys(tmp_path / "keys", password=b"s3cret")
    directory = _evidence(tmp_path / "attempt")
    monkeypatch.setenv("QHLAB_TEST_KEY_PASSWORD", "s3cret")
    assert (
        main(["sign", str(directory), "--private-key", str(private), "--password-env", "QHLAB_TEST_KEY_PASSWORD"]) == 0
    )
    assert verify_signature(directory, public_key=public)["signed_files"] == 3
