"""A published fit attempt holds no symbolic link, so `qhlab sign` works on what `qhlab fit` writes.

wandb 0.31 leaves ``wandb/latest-run``, ``wandb/debug.log``, ``wandb/debug-internal.log`` and
``<run>/logs/debug-core.log`` (an absolute link into ``~/.cache/wandb``); model signing refuses
links. The launcher turns the first three off and drops the last once the run finished
(``drop_wandb_links``); the run's real files stay whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from qhlab.cli import main
from qhlab.evidence import read_receipt, verify_directory
from qhlab.evidence.signing import sign_directory, verify_signature
from qhlab.scenes import generate_population
from qhlab.training.records import WandbAttemptReceipt
from qhlab.training.wandb_attempt import drop_wandb_links
from tiny_recipe import tiny_recipe_text


def links_and_escapes(root: Path) -> list[str]:
    """Every symbolic link below ``root``, and every path that resolves outside it."""
    found = []
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                found.append(f"link {path} -> {os.readlink(path)}")
            elif not path.resolve().is_relative_to(real_root):
                found.append(f"outside {path}")
    return found


def test_drop_wandb_links_removes_only_links_and_keeps_their_targets(tmp_path):
    run = tmp_path / "wandb" / "offline-run-x"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "debug.log").write_text("user log\n")
    (run / "run-x.wandb").write_bytes(b":W&B\xe1\xbe\x00")
    outside = tmp_path / "core-debug.log"
    outside.write_text("service log of every run\n")
    (tmp_path / "wandb" / "latest-run").symlink_to("offline-run-x")
    (tmp_path / "wandb" / "debug.log").symlink_to("offline-run-x/logs/debug.log")
    (run / "logs" / "debug-core.log").symlink_to(outside)
    dropped = drop_wandb_links(tmp_path / "wandb")
    assert dropped == [
        "debug.log -> offline-run-x/logs/debug.log",
        "latest-run -> offline-run-x",
        f"offline-run-x/logs/debug-core.log -> {outside}",
    ]
    assert links_and_escapes(tmp_path / "wandb") == []
    assert (run / "logs" / "debug.log").read_text() == "user log\n"
    assert (run / "run-x.wandb").read_bytes() == b":W&B\xe1\xbe\x00"
    assert outside.read_text() == "service log of every run\n"  # the target itself is never touched
    assert drop_wandb_links(tmp_path / "wandb") == [] and drop_wandb_links(tmp_path / "absent") == []


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """One real tiny fit (8 updates) by the in-process CLI; returns the output root."""
    root = tmp_path_factory.mktemp("no-links")
    train = generate_population("tiny", "train", 0, root / "train", workers=1)
    validation = generate_population("tiny", "validation", 1, root / "validation", workers=1)
    recipe = root / "recipe.toml"
    recipe.write_text(tiny_recipe_text(updates=8))
    out = root / "fits"
    assert (
        main(
            [
                "fit",
                str(recipe),
                "--profile",
                "cpu-fp32",
                "--output",
                str(out),
                "--train",
                str(train),
                "--validation",
                str(validation),
                "--no-progress",
            ]
        )
        == 0
    )
    return out


def test_a_published_attempt_holds_no_link_and_its_wandb_run_is_whole(published, capsys):
    (attempt,) = published.glob("tiny-baseline-s0/*")
    assert links_and_escapes(published) == []
    (run,) = (attempt / "wandb").iterdir()  # no latest-run, debug.log or debug-internal.log beside it
    assert run.name.startswith("offline-run-")
    (run_file,) = run.glob("run-*.wandb")
    assert run_file.stat().st_size > 0 and run_file.read_bytes()[:4] == b":W&B"
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["debug-internal.log", "debug.log"]
    assert (run / "files" / "requirements.txt").is_file()
    # The receipts still authenticate, and only W&B/log files are unbound.
    result = verify_directory(published)
    kinds = sorted(r["kind"] for r in result["receipts"])
    assert kinds.count("wandb_attempt") == 1 and kinds.count("fit") == 1
    assert all(f.startswith(("tiny-baseline-s0/", ".locks/")) for f in result["unbound_files"])
    assert {Path(f).name for f in result["unbound_files"]} >= {"debug.log", "debug-internal.log", run_file.name}
    wandb = read_receipt(attempt / "wandb_attempt.receipt.json", WandbAttemptReceipt).body_record()
    assert wandb["publication"]["local_wandb_run"]["dir"].startswith(str(run))


def test_the_published_directory_signs_and_verifies(published, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "key.pem", tmp_path / "pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    signed = sign_directory(published, private_key=private)
    files = sum(1 for p in published.rglob("*") if p.is_file()) - 1  # all but model.sig
    assert signed["signed_files"] == files and signed["receipts"] == len(verify_directory(published)["receipts"])
    assert verify_signature(published, public_key=public)["signed_files"] == files
    bundle = json.loads((published / "model.sig").read_text())
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
