"""The Ray driver publishes a worker's returned attempt only after re-authenticating every file.

A returned attempt is modelled from a real finished attempt of the tiny study (its files and
digests, its node record and package versions: exactly what ``remote_worker.fit_on_worker``
sends); no Ray is needed for the driver's checks.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from qhlab.evidence import DigestMismatchError, EvidenceError, MissingEvidenceError, sha256_bytes, write_receipt
from qhlab.study.authentication import authenticate_freeze
from qhlab.study.cells import adoptable_attempt
from qhlab.study.remote import _publish_returned
from qhlab.training.records import SegmentCheckpointReceipt


def _returned(finished_study, cell: str = "baseline-s0") -> dict:
    cell_dir = finished_study["output"] / "cells" / cell
    attempt = next(p for p in sorted(cell_dir.iterdir()) if p.is_dir())
    files = {p.relative_to(attempt).as_posix(): p.read_bytes() for p in sorted(attempt.rglob("*")) if p.is_file()}
    fit = json.loads(files["fit.receipt.json"])["body"]
    freeze = json.loads((finished_study["output"] / "freeze.receipt.json").read_text())["body"]
    return {
        "attempt": attempt.name,
        "files": files,
        "sha256": {k: sha256_bytes(v) for k, v in files.items()},
        "where": fit["execution"],
        "try": 1,
        "versions": dict(freeze["versions"]),
    }


def _publish(finished_study, target: Path, returned: dict, cell: str = "baseline-s0") -> Path:
    frozen = authenticate_freeze(finished_study["config"], finished_study["output"], "test")
    arm, seed = cell.rsplit("-s", 1)
    development = json.loads((finished_study["output"] / "development.receipt.json").read_text())["body"]
    populations = {"train": frozen.train_path, "validation": Path(development["validation"]["path"])}
    return _publish_returned(
        frozen,
        cell,
        frozen.recipe(arm, int(seed), frozen.config.broad_updates),
        target,
        returned,
        populations,
        development["validation"]["manifest_sha256"],
    )


def test_an_intact_returned_attempt_is_published_byte_for_byte(finished_study, tmp_path) -> None:
    returned = _returned(finished_study)
    published = _publish(finished_study, tmp_path / "baseline-s0", returned)
    assert published == tmp_path / "baseline-s0" / returned["attempt"]
    assert {
        p.relative_to(published).as_posix(): p.read_bytes() for p in published.rglob("*") if p.is_file()
    } == returned["files"]


# A well-formed checkpoint body: what a returned receipt's shape must be before its bindings are judged.
_CHECKPOINT_BODY = {
    "cold_init_sha256": "0" * 64,
    "local_attempt_id": "x",
    "logical_run_id": "x",
    "recipe_digest": "x",
    "seed": 0,
    "observed_updates": 1,
    "reason": "periodic",
    "state_sha256": "0" * 64,
}


def _planted_receipt(returned: dict, name: str, bound: Path) -> None:
    """Add a receipt ``name`` binding ``bound`` (a real, self-consistent receipt)."""
    scratch = bound.parent / "scratch"
    scratch.mkdir(exist_ok=True)
    write_receipt(scratch / name, SegmentCheckpointReceipt, body=_CHECKPOINT_BODY, inputs={"x": bound})
    returned["files"][name] = (scratch / name).read_bytes()
    returned["sha256"][name] = sha256_bytes(returned["files"][name])


@pytest.mark.parametrize(
    "change",
    [
        "bytes and digest",
        "bytes only",
        "loose file",
        "escaping path",
        "missing output",
        "planted receipt",
        "foreign absolute binding",
        "other cell",
        "other versions",
        "other node",
        "log-like name",
        "hidden in wandb",
        "empty name",
        "file and folder",
        "case twins",
        "escaping binding",
        "renamed attempt",
        "other attempt name",
    ],
)
def test_a_changed_returned_attempt_is_refused_and_nothing_is_published(finished_study, tmp_path, change) -> None:
    returned = _returned(finished_study)
    files, digests = returned["files"], returned["sha256"]
    state, cell = "final_state.safetensors", "baseline-s0"
    if change == "bytes and digest":  # a consistent forgery: the fit receipt still binds the old digest
        files[state] = files[state][:-1] + bytes([files[state][-1] ^ 1])
        digests[state] = sha256_bytes(files[state])
        error, text = DigestMismatchError, "final_state"
    elif change == "bytes only":
        files[state] = files[state] + b"\0"
        error, text = EvidenceError, "does not match its digest"
    elif change in ("loose file", "log-like name"):
        name = "extra.bin" if change == "loose file" else "fit.logX"
        files[name] = b"planted"
        digests[name] = sha256_bytes(b"planted")
        error, text = EvidenceError, re.escape(f"returned files no receipt binds: ['{name}']")
    elif change == "escaping path":
        files["../outside.txt"] = b"x"
        digests["../outside.txt"] = sha256_bytes(b"x")
        error, text = EvidenceError, "'../outside.txt' of attempt .* is not a clean relative path"
    elif change in ("hidden in wandb", "empty name", "file and folder", "case twins"):
        planted = {
            "hidden in wandb": ["wandb/../planted.bin"],
            "empty name": [""],
            "file and folder": ["zz", "zz/y"],
            "case twins": ["wandb/Run.log", "wandb/run.LOG"],
        }[change]
        for name in planted:
            files[name] = b"p"
            digests[name] = sha256_bytes(b"p")
        error, text = (
            EvidenceError,
            {
                "hidden in wandb": "not a clean relative path",
                "empty name": "not a clean",
                "file and folder": "are also folders of other files",
                "case twins": "differ only by case",
            }[change],
        )
    elif change == "escaping binding":  # a well-formed receipt whose relative binding leaves the attempt
        from qhlab import __version__
        from qhlab.evidence import canonical_json

        document = {
            "schema_version": 1,
            "kind": "segment_checkpoint",
            "created_by": {"package": "qhlab", "version": __version__},
            "body": _CHECKPOINT_BODY,
            "inputs": {"x": {"path": "../escape.bin", "sha256": "0" * 64}},
            "outputs": {},
        }
        document["content_sha256"] = sha256_bytes(canonical_json(document))
        name = "segment_checkpoint_u00000099.receipt.json"
        files[name] = canonical_json(document)
        digests[name] = sha256_bytes(files[name])
        error, text = EvidenceError, "binds '../escape.bin', outside the attempt"
    elif change == "renamed attempt":  # e.g. a directory named like the cell receipt
        returned["attempt"] = "cell.receipt.json"
        error, text = EvidenceError, "'cell.receipt.json' is reserved"
    elif change == "other attempt name":
        returned["attempt"] = returned["attempt"][:-1] + ("0" if returned["attempt"][-1] != "0" else "1")
        error, text = EvidenceError, "holds the fit of local attempt"
    elif change == "missing output":
        del files[state], digests[state]
        error, text = MissingEvidenceError, "final_state"
    elif change == "planted receipt":  # a receipt that binds itself and a planted file
        outside = tmp_path / "elsewhere" / "planted.bin"
        outside.parent.mkdir()
        outside.write_bytes(b"p")
        _planted_receipt(returned, "x.receipt.json", outside)
        error, text = EvidenceError, "'x.receipt.json', which is not a receipt a fit writes"
    elif change == "foreign absolute binding":  # a fit-named receipt binding a driver file
        outside = tmp_path / "elsewhere" / "other-cell-state.safetensors"
        outside.parent.mkdir()
        outside.write_bytes(b"s")
        _planted_receipt(returned, "segment_checkpoint_u00000099.receipt.json", outside)
        error, text = EvidenceError, "binds x=.*; a returned receipt may bind by absolute path only"
    elif change == "other cell":  # baseline-s0's fit returned for variant_deep-s1
        cell = "variant_deep-s1"
        error, text = EvidenceError, "is not the fit of cell variant_deep-s1"
    elif change == "other versions":
        returned["versions"]["torch"] = "2.12.0"
        error, text = EvidenceError, "versions.torch='2.12.0' is not allowed"
    else:
        returned["where"] = {**returned["where"], "pid": returned["where"]["pid"] + 1}
        error, text = EvidenceError, "its try reported"
    cell_dir = tmp_path / cell
    with pytest.raises(error, match=text):
        _publish(finished_study, cell_dir, returned, cell)
    assert not (cell_dir / returned["attempt"]).exists()
    assert not cell_dir.exists() or [p for p in cell_dir.rglob("*") if p.is_file()] == []


def test_a_staging_directory_left_by_a_killed_driver_is_never_an_attempt(finished_study, tmp_path) -> None:
    cell_dir = tmp_path / "baseline-s0"
    attempt = next(p for p in sorted((finished_study["output"] / "cells" / "baseline-s0").iterdir()) if p.is_dir())
    # Complete bytes, but never renamed into place: publish_directory's staging name.
    shutil.copytree(attempt, cell_dir / f".{attempt.name}.tmp-4242-deadbeef")
    assert adoptable_attempt(cell_dir, evaluate=True) is None
    shutil.copytree(attempt, cell_dir / attempt.name)
    assert adoptable_attempt(cell_dir, evaluate=True) == cell_dir / attempt.name


def test_a_try_sweeps_only_directories_whose_worker_is_gone(tmp_path) -> None:
    import os

    from qhlab.execution.ray_tries import OWNER_FILE, own_directory, sweep_dead_tries

    dirs = {name: tmp_path / name for name in ("qhlab-dead-x1", "qhlab-alive-x2", "qhlab-no-owner-x3", "other-x4")}
    for directory in dirs.values():
        (directory / "populations").mkdir(parents=True)
    (dirs["qhlab-dead-x1"] / OWNER_FILE).write_text("12345\n")  # its try died: nobody holds the lock
    (dirs["other-x4"] / OWNER_FILE).write_text("12345\n")  # not a try's directory name
    alive = own_directory(dirs["qhlab-alive-x2"])  # a live try (another open file description of the lock)
    (tmp_path / "qhlab-link-x5").symlink_to(dirs["qhlab-dead-x1"])
    try:
        sweep_dead_tries(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "other-x4",
            "qhlab-alive-x2",
            "qhlab-link-x5",
            "qhlab-no-owner-x3",
        ]
        assert (dirs["qhlab-alive-x2"] / OWNER_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        os.close(alive)
    sweep_dead_tries(tmp_path)  # the try ended without removing its directory: now it goes
    assert not dirs["qhlab-alive-x2"].exists()


def test_a_cell_result_line_names_the_ray_node_and_lost_tries() -> None:
    from qhlab.study.run import _where

    returned = {"try": 2, "node_ip": "10.0.0.6", "outcome": "returned"}
    lost = {"try": 1, "node_ip": "10.0.0.5", "outcome": "lost: its worker died; Ray ran the task again"}
    assert _where({"execution": {"executor": "local", "process": {"pid": 1}}}) == ""
    assert _where({"execution": {"executor": "ray", "tries": [{**returned, "try": 1}]}}) == " @ 10.0.0.6"
    assert _where({"execution": {"executor": "ray", "tries": [lost, returned]}}) == " @ 10.0.0.6, after 1 lost try"
    assert _where({"execution": {"executor": "ray", "tries": [lost, lost, returned]}}).endswith("after 2 lost tries")
