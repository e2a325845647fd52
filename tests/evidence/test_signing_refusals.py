"""`qhlab sign` names the real cause of a refusal: a link inside DIR by its path, a key only when it is the key.

Each refusal exits 2 with one `error:` line and writes nothing (no DIR/model.sig). The
directories are small synthetic ones (receipts written with ``qhlab.evidence``); signing what a
real fit or study writes is tested in ``tests/finite_horizon`` (fast) and the slow README tour.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from note_receipt import NoteReceipt
from qhlab.cli import main
from qhlab.evidence import EvidenceError, publish_bytes, write_receipt
from qhlab.evidence.signing import SIGNATURE_FILE, sign_directory, verify_signature


def _write_key(path: Path, key, *, password: bytes | None = None) -> Path:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path


def _ec_keys(directory: Path, *, password: bytes | None = None) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private = _write_key(directory / "private.pem", key, password=password)
    public = directory / "public.pem"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def _evidence(directory: Path) -> Path:
    """A finished directory: a state file bound by a receipt, and a run log no receipt binds."""
    (directory / "wandb" / "run" / "logs").mkdir(parents=True)
    publish_bytes(directory / "final_state.safetensors", bytes(range(256)) * 4)
    publish_bytes(directory / "wandb" / "run" / "logs" / "debug.log", b"a log line\n")
    write_receipt(
        directory / "fit.receipt.json",
        NoteReceipt,
        body={"observed_updates": 12},
        outputs={"final_state": directory / "final_state.safetensors"},
    )
    return directory


@pytest.fixture
def key(tmp_path) -> Path:
    return _ec_keys(tmp_path / "keys")[0]


def _sign_refused(directory: Path, private: Path, capsys, *extra: str) -> str:
    capsys.readouterr()
    assert main(["sign", str(directory), "--private-key", str(private), *extra]) == 2
    assert not (directory / SIGNATURE_FILE).exists() and not (directory / SIGNATURE_FILE).is_symlink()
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("make_link", ["file-inside", "directory-inside", "absolute-outside"])
def test_a_link_inside_dir_is_named_by_its_path_and_not_blamed_on_the_key(tmp_path, key, capsys, make_link):
    directory = _evidence(tmp_path / "attempt")
    outside = tmp_path / "elsewhere.log"
    outside.write_text("outside the directory\n")
    if make_link == "file-inside":  # wandb/debug.log -> run/logs/debug.log
        link, target = directory / "wandb" / "debug.log", "run/logs/debug.log"
    elif make_link == "directory-inside":  # wandb/latest-run -> run
        link, target = directory / "wandb" / "latest-run", "run"
    else:  # <run>/logs/debug-core.log -> ~/.cache/wandb/logs/core-debug-<time>.log
        link, target = directory / "wandb" / "run" / "logs" / "debug-core.log", str(outside)
    link.symlink_to(target)
    err = _sign_refused(directory, key, capsys)
    assert (
        f"error: sign_directory: directory={str(directory)!r} is not allowed; allowed: a directory of regular "
        "files and directories, no symbolic links. HINT: 1 symbolic link(s) below it: "
        f"{str(link)!r} -> {target!r}. A link's target is not part of the directory"
    ) in err
    assert "private_key" not in err and "key.pem" not in err
    assert link.is_symlink()  # nothing below DIR was changed either


def test_many_links_are_counted_and_the_first_five_named(tmp_path, key, capsys):
    directory = _evidence(tmp_path / "attempt")
    for i in range(7):
        (directory / f"link{i}").symlink_to("final_state.safetensors")
    err = _sign_refused(directory, key, capsys)
    assert "HINT: 7 symbolic link(s) below it: " in err and "; and 2 more." in err
    assert f"{str(directory / 'link4')!r}" in err and "link5" not in err


def test_dir_itself_a_link_is_refused_naming_its_target(tmp_path, key, capsys):
    directory = _evidence(tmp_path / "attempt")
    alias = tmp_path / "alias"
    alias.symlink_to(directory)
    err = _sign_refused(alias, key, capsys)
    assert (
        f"error: sign_directory: directory={str(alias)!r} is not allowed; allowed: a real directory, not a "
        f"symbolic link. HINT: it links to {str(directory)!r}; pass the directory itself ({directory})."
    ) in err
    assert not (directory / SIGNATURE_FILE).exists()


def test_a_special_file_inside_dir_is_named(tmp_path, key, capsys):
    directory = _evidence(tmp_path / "attempt")
    fifo = directory / "wandb" / "pipe"
    os.mkfifo(fifo)
    err = _sign_refused(directory, key, capsys)
    assert (
        f"directory={str(directory)!r} is not allowed; allowed: a directory of regular files and directories. "
        f"HINT: 1 special file(s) below it: {str(fifo)!r} (a FIFO (named pipe))."
    ) in err


def test_a_key_that_is_not_an_ec_key_is_blamed_on_the_key(tmp_path, capsys):
    directory = _evidence(tmp_path / "attempt")
    private = _write_key(tmp_path / "rsa.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    err = _sign_refused(directory, private, capsys)
    assert (
        f"error: sign_directory: private_key={str(private)!r} is not allowed; allowed: a PEM elliptic-curve "
        "private key (P-256, P-384 or P-521) and its password if it is encrypted. HINT: it is not an "
        "elliptic-curve key"
    ) in err


def test_a_file_that_is_no_pem_key_is_blamed_on_the_key(tmp_path, capsys):
    directory = _evidence(tmp_path / "attempt")
    private = tmp_path / "garbage.pem"
    private.write_text("not a key\n")
    err = _sign_refused(directory, private, capsys)
    assert f"sign_directory: private_key={str(private)!r} is not allowed" in err
    assert "HINT: the signer could not load it: " in err and "symbolic link" not in err


def test_an_encrypted_key_without_or_with_a_wrong_password_is_blamed_on_the_key(tmp_path, capsys, monkeypatch):
    directory = _evidence(tmp_path / "attempt")
    private, _ = _ec_keys(tmp_path / "keys", password=b"s3cret")
    err = _sign_refused(directory, private, capsys)
    assert f"private_key={str(private)!r} is not allowed" in err
    assert "HINT: it is encrypted: pass its password with --password-env VAR" in err
    monkeypatch.setenv("QHLAB_TEST_WRONG_PASSWORD", "wrong")
    err = _sign_refused(directory, private, capsys, "--password-env", "QHLAB_TEST_WRONG_PASSWORD")
    assert f"private_key={str(private)!r} is not allowed" in err and "Incorrect password" in err


def test_a_missing_key_is_refused_before_anything_is_hashed(tmp_path, capsys):
    directory = _evidence(tmp_path / "attempt")
    err = _sign_refused(directory, tmp_path / "absent.pem", capsys)
    assert f"private_key={str(tmp_path / 'absent.pem')!r} is not allowed; allowed: an existing PEM key file" in err


def test_a_link_added_after_signing_is_named_by_verify(tmp_path, key, capsys):
    directory = _evidence(tmp_path / "attempt")
    public = key.parent / "public.pem"
    assert sign_directory(directory, private_key=key)["signed_files"] == 3
    link = directory / "wandb" / "latest-run"
    link.symlink_to("run")
    with pytest.raises(
        EvidenceError,
        match=r"verify_signature: directory=.* is not allowed; allowed: a directory "
        r"of regular files and directories, no symbolic links\. HINT: 1 "
        r"symbolic link\(s\) below it: .*latest-run' -> 'run'",
    ):
        verify_signature(directory, public_key=public)
    capsys.readouterr()
    assert main(["verify", str(directory), "--public-key", str(public)]) == 2
    assert "latest-run' -> 'run'" in capsys.readouterr().err
    link.unlink()
    assert verify_signature(directory, public_key=public)["signed_files"] == 3
