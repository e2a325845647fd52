"""Tampering: flip one random byte in every file a finished tiny study's receipts bind.

Owns: the flip campaign over a finished study (receipts, safetensors states, JSON structures,
Parquet population files, selection, report, figures...): each flip is seeded and recorded,
``qhlab verify`` must refuse (exit 2, one ``error:`` line naming the file or receipt), and for
files on the study's own receipt chain ``qhlab study run`` (the next step) must refuse too.
Every file is restored byte for byte after its flip. Does not own: authentication itself
(``qhlab.evidence``) or the study.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _reliability_support import run_cli

from qhlab.evidence.envelope import Receipt

pytestmark = pytest.mark.reliability

SEED = 424242
MIN_FLIPS = 50
# Receipts that `qhlab study run` re-authenticates (with the files each binds) on a finished study.
STUDY_CHAIN = (
    "freeze.receipt.json",
    "canaries/e0.receipt.json",
    "development.receipt.json",
    "cells/*/cell.receipt.json",
    "benchmarks/*.receipt.json",
    "report/report.receipt.json",
)


def _where_verified(target: Path, root: Path) -> Path:
    """Where `qhlab verify root` authenticates a bound file: a file recorded outside root (the
    study this copy was made from) is checked in root's own copy when root holds one (the
    longest tail of its path under root), else at its recorded path (e.g. a cached population)."""
    if target.is_relative_to(root.resolve()):
        return target
    parts = target.parts[1:]
    for start in range(len(parts)):
        candidate = (root / Path(*parts[start:])).resolve()
        if candidate.is_file():
            return candidate
    return target


def _bound_files(root: Path) -> dict[Path, set[str]]:
    """Every receipt below ``root`` and every file it binds -> the receipts that bind it."""
    from qhlab.evidence import read_receipt

    bound: dict[Path, set[str]] = {}
    for receipt in sorted(root.rglob("*.receipt.json")):
        if ".tmp-" in receipt.as_posix():
            continue
        rel = receipt.relative_to(root).as_posix()
        bound.setdefault(receipt.resolve(), set()).add(rel)
        document = read_receipt(receipt, Receipt, verify_files=False).record()
        for section in ("inputs", "outputs"):
            for entry in document[section].values():
                target = Path(entry["path"])
                target = (target if target.is_absolute() else receipt.parent / target).resolve()
                bound.setdefault(_where_verified(target, root), set()).add(rel)
    return bound


def _chain_files(root: Path) -> set[Path]:
    from qhlab.evidence import read_receipt

    files: set[Path] = set()
    for pattern in STUDY_CHAIN:
        for receipt in root.glob(pattern):
            files.add(receipt.resolve())
            document = read_receipt(receipt, Receipt, verify_files=False).record()
            for section in ("inputs", "outputs"):
                for entry in document[section].values():
                    target = Path(entry["path"])
                    files.add((target if target.is_absolute() else receipt.parent / target).resolve())
    return files


@pytest.fixture(scope="module")
def tamper_study(tmp_path_factory, finished_study) -> dict:
    """A private copy of the finished study; its populations are the shared session cache, so
    every flip there is restored before the next one (and checked)."""
    import shutil

    target = tmp_path_factory.mktemp("tamper") / "study"
    shutil.copytree(finished_study["output"], target, symlinks=True)
    return {"config": finished_study["config"], "output": target}


def test_every_flip_in_a_bound_file_is_detected(tamper_study, source_snapshot):
    from qhlab.evidence import source_package_digest, verify_directory

    root = tamper_study["output"]
    baseline = verify_directory(root)
    bound = _bound_files(root)
    chain = _chain_files(root)
    files = sorted(bound)
    assert len(files) >= 40, len(files)
    kinds = {p.suffix for p in files}
    assert {".json", ".safetensors", ".parquet", ".png", ".toml", ".md"} <= kinds, kinds
    # The next step runs in this process, i.e. on the working tree's code; the study was made
    # by subprocesses on the session's source snapshot. They agree unless the tree was edited
    # during the session (never in CI); then only the next-step half is skipped.
    same_code = source_package_digest()["sha256"] == source_package_digest(source_snapshot / "qhlab")["sha256"]
    if same_code:
        # The untouched study passes the next step, so each refusal below is the flip's doing.
        untouched = run_cli(["study", "run", tamper_study["config"], "--output", root])
        assert untouched.code == 0, untouched.stderr[-2000:]
    rng = random.Random(SEED)
    # One flip per file; files drawn again at random until at least MIN_FLIPS flips.
    plan = list(files) + [rng.choice(files) for _ in range(max(0, MIN_FLIPS - len(files)))]
    made, detected_verify, chain_flips, detected_next = 0, 0, 0, 0
    record, missed = [], []
    for path in plan:
        original = path.read_bytes()
        offset = rng.randrange(len(original))
        mask = rng.randrange(1, 256)
        flipped = bytearray(original)
        flipped[offset] ^= mask
        path.write_bytes(bytes(flipped))
        made += 1
        try:
            result = run_cli(["verify", root])
            ok = result.code == 2 and len(result.error_lines) == 1
            detected_verify += ok
            entry = {
                "file": str(path),
                "offset": offset,
                "xor": mask,
                "verify_exit": result.code,
                "verify_error": result.error_lines[0][:200] if result.error_lines else None,
            }
            if not ok:
                missed.append(entry)
            if path in chain and same_code:
                chain_flips += 1
                step = run_cli(["study", "run", tamper_study["config"], "--output", root])
                entry["study_run_exit"] = step.code
                if step.code == 2 and len(step.error_lines) == 1:
                    detected_next += 1
                else:
                    missed.append({**entry, "study_run_stderr": step.stderr[-500:]})
            record.append(entry)
        finally:
            path.write_bytes(original)
        assert path.read_bytes() == original
    (root.parent / "flips.json").write_text(json.dumps(record, indent=2))
    print(
        f"\ntamper: {made} flips made, {detected_verify} detected by qhlab verify; "
        f"{chain_flips} on the study chain, {detected_next} detected by `qhlab study run`"
    )
    assert made >= MIN_FLIPS
    assert not missed, missed[:5]
    assert detected_verify == made and detected_next == chain_flips
    if same_code:
        assert chain_flips >= 30, chain_flips
    # Every restore was exact: the study verifies as before and nothing new was written.
    after = verify_directory(root)
    assert after["receipts"] == baseline["receipts"] and after["bound_files"] == baseline["bound_files"]


def test_verify_error_names_the_flipped_file(tamper_study):
    """A flip in a cell's final state: the one error line names that file (or the receipt over it)."""
    root = tamper_study["output"]
    state = next(root.glob("cells/*/*/final_state.safetensors"))
    original = state.read_bytes()
    try:
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x01
        state.write_bytes(bytes(flipped))
        result = run_cli(["verify", root])
        assert result.code == 2
        assert len(result.error_lines) == 1 and "final_state" in result.error_lines[0], result.stderr
    finally:
        state.write_bytes(original)
    assert run_cli(["verify", root]).code == 0
