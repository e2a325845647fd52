"""Tests for the torch-free evidence layer: canonical JSON, digests, write-once, receipts, locks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from note_receipt import NoteReceipt
from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    LockHeldError,
    MissingEvidenceError,
    PublishConflictError,
    QhInputError,
    SchemaMismatchError,
    canonical_json,
    exclusive_lock,
    fresh_directory,
    publish_bytes,
    publish_json,
    read_receipt,
    safe_component,
    sha256_bytes,
    sha256_file,
    sha256_tree,
    source_package_digest,
    verify_directory,
    write_receipt,
)
from qhlab.evidence.envelope import Receipt, receipt_kinds, receipt_model
from qhlab.training.records import FitReceipt, SegmentCheckpointReceipt


def test_canonical_json_is_sorted_utf8_with_trailing_newline():
    data = canonical_json({"b": 1, "a": [1.5, "é"], "schema_version": 1})
    assert data == '{\n  "a": [\n    1.5,\n    "é"\n  ],\n  "b": 1,\n  "schema_version": 1\n}\n'.encode()
    assert canonical_json({"a": 1, "b": 2}) == canonical_json({"b": 2, "a": 1})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_canonical_json_refuses_non_finite_and_names_the_path(bad):
    with pytest.raises(QhInputError, match=r"\$\.metrics\.mae\[1\]"):
        canonical_json({"metrics": {"mae": [0.1, bad]}})


def test_canonical_json_refuses_unsupported_types():
    with pytest.raises(QhInputError, match="type set"):
        canonical_json({"x": {1, 2}})


def test_digests_of_bytes_files_and_trees(tmp_path):
    assert sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"abc")
    (tmp_path / "y.bin").write_bytes(b"")
    assert sha256_file(tmp_path / "d" / "x.bin") == sha256_bytes(b"abc")
    before = sha256_tree(tmp_path)
    (tmp_path / "y.bin").write_bytes(b"!")
    assert sha256_tree(tmp_path) != before
    with pytest.raises(MissingEvidenceError, match="nope"):
        sha256_file(tmp_path / "nope")


def test_publish_is_write_once_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    digest = publish_json(target, {"x": 1})
    assert digest == sha256_file(target)
    with pytest.raises(PublishConflictError, match="a.json"):
        publish_bytes(target, b"other")
    assert json.loads(target.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_publish_requires_existing_directory(tmp_path):
    with pytest.raises(QhInputError, match="does not exist"):
        publish_bytes(tmp_path / "missing" / "a.bin", b"x")


def test_fresh_directory_refuses_existing(tmp_path):
    made = fresh_directory(tmp_path / "a" / "b")
    assert made.is_dir()
    with pytest.raises(PublishConflictError, match="already exists"):
        fresh_directory(made)


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "-x", "é", "x" * 65, None, 3])
def test_safe_component_refuses(name):
    with pytest.raises(QhInputError, match="cell="):
        safe_component(name, field="cell")


def test_safe_component_accepts():
    assert safe_component("baseline_s0.v-1", field="cell") == "baseline_s0.v-1"


def _receipt(tmp_path):
    (tmp_path / "state.bin").write_bytes(b"state")
    outside = tmp_path.parent / f"{tmp_path.name}-input.bin"
    outside.write_bytes(b"input")
    path = tmp_path / "step.receipt.json"
    write_receipt(
        path,
        NoteReceipt,
        body={"updates": 20},
        inputs={"population": outside},
        outputs={"state": tmp_path / "state.bin"},
    )
    return path, outside


def test_receipt_round_trip_binds_relative_and_absolute_files(tmp_path):
    path, outside = _receipt(tmp_path)
    doc = read_receipt(path, NoteReceipt).record()
    assert doc["body"] == {"updates": 20}
    assert doc["outputs"]["state"] == {"path": "state.bin", "sha256": sha256_bytes(b"state")}
    assert doc["inputs"]["population"]["path"] == str(outside)


def _resealed(path, **changes):
    """Rewrite a receipt's envelope fields and reseal its content digest (a forger's edit)."""
    document = json.loads(path.read_text())
    document.update(changes)
    del document["content_sha256"]
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    path.chmod(0o644)
    path.write_bytes(canonical_json(document))


def test_receipt_refuses_kind_schema_and_missing(tmp_path):
    path, _ = _receipt(tmp_path)
    with pytest.raises(SchemaMismatchError, match=r"field kind = 'test_note'; allowed: 'fit' \(FitReceipt\)"):
        read_receipt(path, FitReceipt)
    _resealed(path, schema_version=2)
    with pytest.raises(SchemaMismatchError, match=r"field schema_version = 2; allowed: 1 for kind 'test_note'"):
        read_receipt(path, NoteReceipt)
    _resealed(path, schema_version=1, kind="made_up")
    with pytest.raises(SchemaMismatchError, match=r"field kind='made_up' is not a receipt kind; allowed: .*study_cell"):
        read_receipt(path, Receipt)
    with pytest.raises(MissingEvidenceError, match="nope.receipt.json"):
        read_receipt(tmp_path / "nope.receipt.json", NoteReceipt)


_CHECKPOINT = {
    "cold_init_sha256": "a" * 64,
    "local_attempt_id": "r1",
    "logical_run_id": "run",
    "recipe_digest": "d",
    "seed": 3,
    "observed_updates": 8,
    "reason": "periodic",
    "state_sha256": "b" * 64,
}


def test_a_typed_receipt_round_trips_as_its_model(tmp_path):
    path = tmp_path / "x.receipt.json"
    write_receipt(path, SegmentCheckpointReceipt, body=_CHECKPOINT)
    receipt = read_receipt(path, SegmentCheckpointReceipt)
    assert isinstance(receipt, SegmentCheckpointReceipt) and receipt.kind == "segment_checkpoint"
    assert receipt.schema_version == 1 and receipt.body.seed == 3 and receipt.body.reason == "periodic"
    assert receipt.body_record() == _CHECKPOINT
    # Any kind: the model of the kind read comes back.
    assert type(read_receipt(path, Receipt)) is SegmentCheckpointReceipt
    with pytest.raises(ValidationError):
        receipt.body.seed = 4  # frozen


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("seed", "3", r"field body\.seed = '3': Input should be a valid integer"),
        ("seed", True, r"field body\.seed = True: Input should be a valid integer"),
        ("reason", "whim", r"field body\.reason = 'whim': Input should be 'periodic' or 'interrupt'"),
        ("state_sha256", "short", r"field body\.state_sha256 = 'short': String should match pattern"),
        ("extra", 1, r"field body\.extra = 1: Extra inputs are not permitted"),
    ],
)
def test_a_body_of_the_wrong_shape_is_never_written_nor_read(tmp_path, field, value, message):
    path = tmp_path / "x.receipt.json"
    with pytest.raises(SchemaMismatchError, match="write_receipt: .*" + message + ".*SegmentCheckpointReceipt"):
        write_receipt(path, SegmentCheckpointReceipt, body={**_CHECKPOINT, field: value})
    assert not path.exists()
    # A forger who edits and reseals a published receipt is refused by the reader, naming the field.
    write_receipt(path, SegmentCheckpointReceipt, body=_CHECKPOINT)
    _resealed(path, body={**_CHECKPOINT, field: value})
    with pytest.raises(SchemaMismatchError, match="read_receipt: .*" + message):
        read_receipt(path, SegmentCheckpointReceipt)
    with pytest.raises(SchemaMismatchError, match="missing"):
        _resealed(path, body={k: v for k, v in _CHECKPOINT.items() if k != "seed"})
        read_receipt(path, Receipt)


def test_a_missing_body_field_is_named_and_exits_2(tmp_path, capsys):
    from qhlab.cli import main

    path = tmp_path / "x.receipt.json"
    write_receipt(path, SegmentCheckpointReceipt, body=_CHECKPOINT)
    _resealed(path, body={k: v for k, v in _CHECKPOINT.items() if k != "seed"})
    assert main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.receipt.json field body.seed = missing" in err[0], err


def test_every_kind_qhlab_writes_has_a_model():
    assert receipt_kinds() == sorted(receipt_kinds())
    assert {
        "fit",
        "segment_checkpoint",
        "cold_initialization",
        "wandb_attempt",
        "evaluation",
        "population",
        "population_generation",
        "study_freeze",
        "study_development",
        "study_e0",
        "study_cell",
        "study_benchmark",
        "study_report",
        "lane_comparison",
        "tuning",
        "commissioning_run",
        "commissioning_milestone",
        "mps_memory_observation",
    } <= set(receipt_kinds())
    for kind in receipt_kinds():
        assert receipt_model(kind).KIND == kind


def test_receipt_detects_changed_bound_file_and_missing_file(tmp_path):
    path, outside = _receipt(tmp_path)
    (tmp_path / "state.bin").write_bytes(b"stale")
    with pytest.raises(DigestMismatchError, match="state.bin"):
        read_receipt(path, NoteReceipt).record()
    (tmp_path / "state.bin").write_bytes(b"state")
    outside.unlink()
    with pytest.raises(MissingEvidenceError, match="population"):
        read_receipt(path, NoteReceipt).record()


def test_every_single_byte_flip_of_a_receipt_is_detected(tmp_path):
    path, _ = _receipt(tmp_path)
    original = path.read_bytes()
    for index in range(len(original)):
        flipped = bytearray(original)
        flipped[index] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(EvidenceError):
            read_receipt(path, NoteReceipt).record()
    path.write_bytes(original)
    assert read_receipt(path, NoteReceipt).kind == "test_note"


def test_verify_directory_counts_bound_and_unbound(tmp_path):
    _receipt(tmp_path)
    (tmp_path / "log.txt").write_text("free text")
    result = verify_directory(tmp_path)
    assert [r["kind"] for r in result["receipts"]] == ["test_note"]
    assert result["bound_files"] == 2
    assert result["unbound_files"] == ["log.txt"]
    with pytest.raises(MissingEvidenceError, match="does not exist"):
        verify_directory(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingEvidenceError, match="holds no"):
        verify_directory(tmp_path / "empty")


def test_source_package_digest_changes_with_code(tmp_path):
    pkg = tmp_path / "qhlab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    first = source_package_digest(pkg)
    assert first["files"] == 1
    (pkg / "mod.py").write_text("y = 2\n")
    second = source_package_digest(pkg)
    assert second["files"] == 2 and second["sha256"] != first["sha256"]
    (pkg / "mod.py").write_text("y = 3\n")
    assert source_package_digest(pkg)["sha256"] != second["sha256"]
    assert source_package_digest()["files"] > 5


def test_exclusive_lock_refuses_second_holder_in_another_process(tmp_path):
    lock = tmp_path / "locks" / "run.lock"
    script = textwrap.dedent(
        f"""
        import sys
        from qhlab.evidence import exclusive_lock, LockHeldError
        try:
            with exclusive_lock({str(lock)!r}):
                print("acquired")
        except LockHeldError as exc:
            print("refused:", exc)
            sys.exit(3)
        """
    )
    with exclusive_lock(lock):
        busy = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert busy.returncode == 3
        assert str(lock) in busy.stdout and "held by another process" in busy.stdout
        with pytest.raises(LockHeldError):
            with exclusive_lock(lock):
                pass
    free = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert free.returncode == 0 and "acquired" in free.stdout


def test_evidence_layer_imports_no_torch():
    code = "import sys, qhlab.evidence, qhlab.cli.verify; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False False"


# ---------------------------------------------------------------- directories and messages


def test_publish_directory_publishes_whole_or_nothing(tmp_path) -> None:
    from qhlab.evidence import publish_directory, publish_json

    def write(staging):
        publish_json(staging / "a.json", {"a": 1})
        (staging / "sub").mkdir()
        publish_json(staging / "sub" / "b.json", {"b": 2})
        return staging.name

    staged_name = publish_directory(tmp_path / "out", write)
    assert staged_name.startswith(".out.tmp-")
    assert json.loads((tmp_path / "out" / "sub" / "b.json").read_text()) == {"b": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left behind

    def crash(staging):
        publish_json(staging / "a.json", {"a": 1})
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        publish_directory(tmp_path / "other", crash)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing published, staging removed
    with pytest.raises(PublishConflictError, match="publish_directory: .*out already exists.*HINT"):
        publish_directory(tmp_path / "out", write)
    (tmp_path / "empty").mkdir()
    publish_directory(tmp_path / "empty", write)  # an empty directory is replaced
    assert (tmp_path / "empty" / "a.json").is_file()


def test_one_message_form_for_refusals() -> None:
    from qhlab.evidence import input_error, require_int, require_number

    error = input_error("freeze_study", "seeds", [0], "exactly two seeds", "declare two seeds")
    assert isinstance(error, QhInputError)
    assert str(error) == "freeze_study: seeds=[0] is not allowed; allowed: exactly two seeds. HINT: declare two seeds"
    assert isinstance(input_error("c", "f", 1, "a", "h", error=DigestMismatchError), DigestMismatchError)
    assert require_int("c", "workers", 3, minimum=1, hint="h") == 3
    for bad in (True, 2.0, "3", 0):
        with pytest.raises(
            QhInputError, match=rf"c: workers={bad!r} is not allowed; allowed: an integer >= 1\. HINT: h"
        ):
            require_int("c", "workers", bad, minimum=1, hint="h")
    assert require_number("c", "tau", 1, minimum=0.0, hint="h") == 1.0
    for bad in (False, float("nan"), float("inf"), "1", -0.5):
        with pytest.raises(QhInputError, match=r"c: tau=.* is not allowed; allowed: a finite number >= 0.0\. HINT: h"):
            require_number("c", "tau", bad, minimum=0.0, hint="h")
    from qhlab.evidence import require_instance

    assert require_instance("c", "d", {"a": 1}, dict, hint="h") == {"a": 1}
    with pytest.raises(QhInputError, match=r"^c: d='list' is not allowed; allowed: dict or tuple\. HINT: h$"):
        require_instance("c", "d", [1], (dict, tuple), hint="h")
    with pytest.raises(QhInputError, match=r"^c: d='int' is not allowed; allowed: a mapping\. HINT: h$"):
        require_instance("c", "d", 1, dict, allowed="a mapping", hint="h")


def test_verify_finds_moved_directories_and_populations_by_digest(tmp_path, monkeypatch):
    """Files bound by absolute path are found by digest where the directory and its
    populations were copied; a missing population is named with its manifest digest."""
    import shutil

    from qhlab.cli import main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    population = tmp_path / "old" / "cache" / "pop-train-1"
    population.mkdir(parents=True)
    (population / "manifest.json").write_text("a manifest")
    study = tmp_path / "old" / "study"
    (study / "cells").mkdir(parents=True)
    # As a study's freeze receipt does, it records where its directory was made.
    write_receipt(
        study / "freeze.receipt.json",
        NoteReceipt,
        body={"output": str(study)},
        inputs={"train/manifest.json": population / "manifest.json"},
    )
    write_receipt(
        study / "cells" / "cell.receipt.json", NoteReceipt, body={}, inputs={"freeze": study / "freeze.receipt.json"}
    )
    shutil.copytree(study, tmp_path / "new" / "study")
    shutil.copytree(population, tmp_path / "new" / "pops" / "pop-train-1")
    shutil.rmtree(tmp_path / "old")
    moved = tmp_path / "new" / "study"
    result = verify_directory(moved, [tmp_path / "new" / "pops"])
    assert len(result["receipts"]) == 2 and result["unbound_files"] == []
    assert main(["verify", str(moved), "--populations", str(tmp_path / "new" / "pops")]) == 0
    digest = sha256_bytes(b"a manifest")
    with pytest.raises(MissingEvidenceError, match=f"population pop-train-1 \\(manifest sha256 {digest}\\)"):
        verify_directory(moved)
    assert main(["verify", str(moved)]) == 2
    # The default cache is always searched.
    shutil.copytree(tmp_path / "new" / "pops", tmp_path / "home" / ".cache" / "qhlab" / "populations")
    assert len(verify_directory(moved)["receipts"]) == 2
    # A copy with other bytes is no substitute.
    (tmp_path / "home" / ".cache" / "qhlab" / "populations" / "pop-train-1" / "manifest.json").write_text("forged")
    with pytest.raises(MissingEvidenceError, match=digest):
        verify_directory(moved)


def test_a_copy_is_verified_on_its_own_bytes_never_vouched_for_by_the_original(tmp_path):
    """A copied study binds its own receipts by the original's absolute paths; verifying the
    copy checks the copy's files, so an intact original cannot hide a changed copy."""
    import shutil

    study = tmp_path / "original"
    (study / "cells").mkdir(parents=True)
    publish_bytes(study / "selection.json", b'{"row": 3}\n')
    write_receipt(study / "freeze.receipt.json", NoteReceipt, body={"output": str(study)})
    write_receipt(
        study / "cells" / "cell.receipt.json", NoteReceipt, body={}, inputs={"selection": study / "selection.json"}
    )  # outside cells/: an absolute path
    copy = tmp_path / "copy"
    shutil.copytree(study, copy)
    assert len(verify_directory(copy)["receipts"]) == 2
    (copy / "selection.json").write_bytes(b'{"row": 4}\n')  # the original stays intact
    with pytest.raises(DigestMismatchError, match="this directory's copy of"):
        verify_directory(copy)
    assert len(verify_directory(study)["receipts"]) == 2


def test_a_file_changed_in_place_is_refused_whatever_intact_copies_exist(tmp_path):
    """Only a file that is gone may be found elsewhere by digest; one present at its recorded
    path with other bytes was edited, and an intact copy under a population root is no alibi."""
    import shutil

    population = tmp_path / "pops" / "P"
    population.mkdir(parents=True)
    (population / "manifest.json").write_text("a manifest")
    study = tmp_path / "study"
    study.mkdir()
    write_receipt(
        study / "freeze.receipt.json",
        NoteReceipt,
        body={},
        inputs={"train/manifest.json": population / "manifest.json"},
    )
    backup = tmp_path / "backup"
    shutil.copytree(tmp_path / "pops", backup)
    (population / "manifest.json").write_text("an edited manifest")
    with pytest.raises(DigestMismatchError, match="binds"):
        verify_directory(study, [backup])
    shutil.rmtree(population)  # gone: now the intact copy is found by digest
    assert len(verify_directory(study, [backup])["receipts"]) == 1


def test_file_copy_is_digested_where_read_and_bound_under_its_original(tmp_path) -> None:
    from qhlab.evidence import DigestMismatchError, FileCopy, read_receipt, write_receipt

    original = tmp_path / "driver" / "manifest.json"
    copy = tmp_path / "worker-tmp" / "manifest.json"
    for path in (original, copy):
        path.parent.mkdir(parents=True)
        path.write_bytes(b'{"a": 1}')
    receipt = tmp_path / "attempt" / "fit.receipt.json"
    receipt.parent.mkdir()
    write_receipt(receipt, NoteReceipt, body={}, inputs={"train_manifest": FileCopy(copy, original)})
    document = read_receipt(receipt, NoteReceipt).record()
    assert document["inputs"]["train_manifest"] == {"path": original.as_posix(), "sha256": sha256_bytes(b'{"a": 1}')}
    copy.unlink()  # the worker's directory is gone; the original vouches
    assert read_receipt(receipt, NoteReceipt).record()["inputs"]["train_manifest"]["path"] == str(original)
    original.write_bytes(b'{"a": 2}')  # a copy that was not byte-identical fails at the original
    with pytest.raises(DigestMismatchError, match="train_manifest"):
        read_receipt(receipt, NoteReceipt).record()
    with pytest.raises(EvidenceError, match="must be absolute"):
        write_receipt(
            tmp_path / "other.receipt.json",
            NoteReceipt,
            body={},
            inputs={"x": FileCopy(original, Path("relative/manifest.json"))},
        )


def test_a_refused_locker_leaves_the_lock_file_untouched(tmp_path):
    import os

    from qhlab.evidence import LockHeldError, PublishConflictError, exclusive_lock

    lock = tmp_path / ".cell.lock"
    lock.write_bytes(b"4242\n")
    os.utime(lock, ns=(1_000_000_000, 1_000_000_000))

    def _finished() -> None:
        raise PublishConflictError("cell is finished")

    with pytest.raises(PublishConflictError, match="cell is finished"):
        with exclusive_lock(lock, admit=_finished):
            raise AssertionError("the body of a refused lock never runs")
    assert lock.read_bytes() == b"4242\n" and lock.stat().st_mtime_ns == 1_000_000_000
    with exclusive_lock(lock) as held:  # the refusal released the lock; now it records this pid
        assert held.read_bytes() == f"{os.getpid()}\n".encode()
        mtime = lock.stat().st_mtime_ns
        with pytest.raises(LockHeldError, match=rf"lock: {lock} is held by another process \(pid {os.getpid()}\)"):
            with exclusive_lock(lock):  # a second open file description: flock refuses it
                pass
        assert lock.read_bytes() == f"{os.getpid()}\n".encode() and lock.stat().st_mtime_ns == mtime


def test_leftovers_of_a_killed_publication_are_named_by_verify_and_removed_by_the_next_one(tmp_path):
    """A kill leaves ``.NAME.tmp-<pid>-<hex>/``: verify lists its files as leftovers (not as
    unbound files), and the next publication of NAME removes it unless its process still runs."""
    from qhlab.evidence import publish_directory

    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = int(finished.stdout)
    write_receipt(tmp_path / "freeze.receipt.json", NoteReceipt, body={})
    stale = tmp_path / f".report.tmp-{dead}-abcd"
    stale.mkdir()
    (stale / "report.json").write_text("{}")
    running = tmp_path / f".report.tmp-{os.getppid()}-ef01"  # a live writer's staging: kept
    running.mkdir()
    result = verify_directory(tmp_path)
    assert result["temporary_files"] == [f".report.tmp-{dead}-abcd/report.json"]
    assert result["unbound_files"] == []
    publish_directory(tmp_path / "report", lambda staging: (staging / "report.json").write_text("{}"))
    assert not stale.exists() and running.is_dir() and (tmp_path / "report" / "report.json").is_file()


def test_only_a_killed_fits_log_link_is_listed_every_other_link_is_refused(tmp_path):
    from qhlab.evidence import QhInputError

    directory = tmp_path / "attempt"
    directory.mkdir()
    (directory / "state.json").write_text("{}")
    write_receipt(directory / "fit.receipt.json", NoteReceipt, body={}, inputs={"state": directory / "state.json"})
    outside = tmp_path / "core-debug.log"
    outside.write_text("a service log\n")
    logs = directory / "wandb" / "offline-run-1" / "logs"
    logs.mkdir(parents=True)
    (logs / "debug-core.log").symlink_to(outside)
    assert verify_directory(directory)["linked_logs"] == [f"{str(logs / 'debug-core.log')!r} -> {str(outside)!r}"]
    (logs / "elsewhere.log").symlink_to(tmp_path)  # a link to a directory is never a log
    with pytest.raises(QhInputError, match="elsewhere.log"):
        verify_directory(directory)
    (logs / "elsewhere.log").unlink()
    (directory / "cells.log").symlink_to(outside)  # not below wandb/
    with pytest.raises(QhInputError, match="cells.log"):
        verify_directory(directory)
    (directory / "cells.log").unlink()
    # A receipt that binds a link is refused, wherever the link is.
    write_receipt(directory / "log.receipt.json", NoteReceipt, body={}, inputs={"log": logs / "debug-core.log"})
    with pytest.raises(EvidenceError, match="a symbolic link"):
        verify_directory(directory)
