"""``qhlab study status DIR``: states from receipts and locks, the table and its JSON, read-only."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.design.study_records import StudyCellReceipt
from qhlab.evidence import exclusive_lock, read_receipt
from qhlab.evidence.layout import BENCHMARK_DIR, CANARY_DIR, CELL_RECEIPT, CELLS_DIR, FIT_RECEIPT, REPORT_DIR
from qhlab.study import status as status_module
from qhlab.study.status import STATES, status_lines, study_status
from qhlab.training.records import FitReceipt
from qhlab.training.wandb_attempt import WandbAttempt

CELLS = [
    f"{arm}-s{seed}"
    for arm in (
        "baseline",
        "control_global_readout",
        "control_no_interaction",
        "variant_cross_attention",
        "variant_deep",
    )
    for seed in (0, 1)
]
ROWS = ["freeze", "E0 gate", "e0-baseline-s0", "e0-baseline-s1", "development", *CELLS, "benchmarks", "report"]


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` (lock files and dot-directories too) with its mtime and size."""
    entries = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            stat = path.lstat()
            entries[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size)
    return entries


def _rows(output: Path) -> dict[str, dict]:
    return {row["row"]: row for row in study_status(output)["rows"]}


def _status_cli(output: Path, capsys, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["study", "status", str(output), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def frozen(tmp_path_factory, tiny_config) -> Path:
    """A study after `freeze` only (fast: no fit)."""
    from qhlab.finite_horizon.studies.architecture_study import freeze_study

    output = tmp_path_factory.mktemp("status-frozen") / "study"
    freeze_study(tiny_config, output)
    return output


@pytest.fixture
def frozen_copy(tmp_path, frozen) -> Path:
    target = tmp_path / "study"
    shutil.copytree(frozen, target)
    return target


# ------------------------------------------------------------------------------ fast


def test_not_a_study_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "something.txt").write_text("x")
    before = _listing(tmp_path)
    code, out, err = _status_cli(tmp_path, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith(
        f"error: study status: DIR={str(tmp_path)!r} is not allowed; allowed: a study output "
        "directory (it holds freeze.receipt.json). HINT: "
    )
    assert _listing(tmp_path) == before


def test_a_study_naming_its_recipe_file_by_a_relative_path_has_a_status(tmp_path, config_writer, population_cache):
    """As the demo's config does (``recipe = "preparation/demo-tune/recipe.toml"``)."""
    from qhlab.finite_horizon.studies.architecture_study import freeze_study

    inline = '[experiment.recipe]\nname = "tiny"\n'
    config = config_writer(tmp_path / "cfg", population_cache, **{inline: "[experiment.recipe_table]\n"})
    text = config.read_text()
    start, end = text.index("[experiment.recipe_table]"), text.index("[[experiment.arms]]")
    (tmp_path / "cfg" / "recipes").mkdir()
    (tmp_path / "cfg" / "recipes" / "tiny.toml").write_text(text[start:end].split("\n", 1)[1])
    config.write_text(text[:start] + '[experiment]\nrecipe = "recipes/tiny.toml"\n\n' + text[end:])
    output = tmp_path / "study"
    freeze_study(config, output)
    rows = _rows(output)
    assert list(rows) == ROWS and rows["freeze"]["state"] == "authenticated"


def test_frozen_study_shows_every_later_row_not_started(frozen_copy):
    rows = _rows(frozen_copy)
    assert list(rows) == ROWS
    assert rows["freeze"]["state"] == "authenticated"
    assert {rows[name]["state"] for name in ROWS[1:]} == {"not started"}
    assert all(row["state"] in STATES for row in rows.values())


def test_attempt_without_receipt_or_lock_is_crashed_and_its_gate_too(frozen_copy):
    (frozen_copy / CANARY_DIR / "e0-baseline-s0" / "e0-baseline-s0-stamp-abcd").mkdir(parents=True)
    (frozen_copy / CELLS_DIR / "baseline-s1" / "a1").mkdir(parents=True)
    (frozen_copy / CELLS_DIR / "baseline-s1" / "a2").mkdir()
    rows = _rows(frozen_copy)
    assert rows["e0-baseline-s0"]["state"] == "crashed" and rows["e0-baseline-s0"]["attempts"] == 1
    assert rows["E0 gate"]["state"] == "crashed" and "1 of 2 parts started" in rows["E0 gate"]["note"]
    assert rows["baseline-s1"]["state"] == "crashed" and rows["baseline-s1"]["attempts"] == 2
    assert "no writer holds its lock" in rows["baseline-s1"]["note"]
    assert rows["baseline-s0"]["state"] == "not started" and rows["baseline-s0"]["attempts"] == 0


def test_held_writer_lock_shows_running(frozen_copy):
    parent = frozen_copy / CELLS_DIR
    (parent / "variant_deep-s0" / "attempt").mkdir(parents=True)
    attempt = WandbAttempt(run_id="variant_deep-s0-x", offline=True, logical_run_id="variant_deep-s0")
    with attempt.local_writer_lock(parent) as lock:
        assert lock in status_module._lock_paths(parent, "variant_deep-s0")
        row = _rows(frozen_copy)["variant_deep-s0"]
        assert row["state"] == "running" and row["note"].startswith(f"writer pid {os.getpid()}")
    # Released: the lock file stays (never deleted), the attempt has no receipt.
    assert lock.exists() and _rows(frozen_copy)["variant_deep-s0"]["state"] == "crashed"


def test_held_study_cell_lock_shows_canary_and_gate_running(frozen_copy):
    parent = frozen_copy / CANARY_DIR
    cell_lock, _ = status_module._lock_paths(parent, "e0-baseline-s1")
    with exclusive_lock(cell_lock):
        rows = _rows(frozen_copy)
    assert rows["e0-baseline-s1"]["state"] == "running" and rows["E0 gate"]["state"] == "running"


def test_status_writes_nothing_even_probing_locks(frozen_copy, capsys):
    parent = frozen_copy / CELLS_DIR
    (parent / "baseline-s0" / "attempt").mkdir(parents=True)
    with WandbAttempt(run_id="baseline-s0-x", offline=True, logical_run_id="baseline-s0").local_writer_lock(parent):
        pass
    before = _listing(frozen_copy)
    for extra in ((), ("--json",)):
        code, _, err = _status_cli(frozen_copy, capsys, *extra)
        assert code == 0, err
    assert _listing(frozen_copy) == before


def test_json_parses_and_matches_the_table(frozen_copy, capsys):
    code, text, _ = _status_cli(frozen_copy, capsys)
    assert code == 0
    code, raw, _ = _status_cli(frozen_copy, capsys, "--json")
    document = json.loads(raw)
    assert document["study"] == "tiny-study" and [row["row"] for row in document["rows"]] == ROWS
    assert text.rstrip("\n").split("\n") == status_lines(document)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["row", "state", "attempts", "updates"]
    for line, row in zip(lines[2:], document["rows"]):
        assert line.startswith(row["row"]) and row["state"] in line


# ------------------------------------------------------------------------------ slow (a finished study)


@pytest.mark.slow
def test_finished_study_every_row_authenticated_with_updates_and_metrics(finished_study, capsys):
    output = finished_study["output"]
    rows = _rows(output)
    assert list(rows) == ROWS and {row["state"] for row in rows.values()} == {"authenticated"}
    assert rows["E0 gate"]["note"] == "passed"
    for name in ("e0-baseline-s0", "e0-baseline-s1"):
        assert rows[name]["updates"] == 1500 and rows[name]["attempts"] == 1 and rows[name]["wall_seconds"] > 0
    for name in CELLS:
        row = rows[name]
        receipt = read_receipt(output / CELLS_DIR / name / CELL_RECEIPT, StudyCellReceipt).record()
        assert (row["updates"], row["attempts"]) == (30, 1)
        assert row["mae_h"] == receipt["body"]["evaluation"]["mae"][-1]
        assert row["regret_h"] == receipt["body"]["evaluation"]["regret"][-1]
        assert row["wall_seconds"] == receipt["body"]["wall_seconds"] > 0
    code, text, _ = _status_cli(output, capsys)
    assert code == 0 and f"{rows['baseline-s0']['mae_h']:.4f}" in text


@pytest.mark.slow
def test_lock_names_are_the_writers(finished_study):
    """Pins ``_lock_paths`` to the files the study and the launcher really lock."""
    output = finished_study["output"]
    for parent, name in [(output / CELLS_DIR, "baseline-s0"), (output / CANARY_DIR, "e0-baseline-s1")]:
        assert all(path.is_file() for path in status_module._lock_paths(parent, name))
        receipt = read_receipt(parent / name / CELL_RECEIPT, StudyCellReceipt).record()
        fit = read_receipt(parent / name / receipt["body"]["attempt"] / FIT_RECEIPT, FitReceipt).record()
        assert fit["body"]["logical_run_id"] == name


@pytest.mark.slow
def test_half_finished_study_shows_not_started_rows(study_copy):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR, f"{CELLS_DIR}/variant_deep-s0", f"{CELLS_DIR}/variant_deep-s1")
    rows = _rows(output)
    not_started = {"variant_deep-s0", "variant_deep-s1", "benchmarks", "report"}
    assert {name for name, row in rows.items() if row["state"] == "not started"} == not_started
    assert {rows[name]["state"] for name in set(ROWS) - not_started} == {"authenticated"}


@pytest.mark.slow
def test_crashed_and_finished_unrecorded_cells(study_copy):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    crashed = output / CELLS_DIR / "control_no_interaction-s1"
    unrecorded = output / CELLS_DIR / "variant_cross_attention-s0"
    attempt = crashed / read_receipt(crashed / CELL_RECEIPT, StudyCellReceipt).body_record()["attempt"]
    (crashed / CELL_RECEIPT).unlink()
    (attempt / FIT_RECEIPT).unlink()
    (unrecorded / CELL_RECEIPT).unlink()
    rows = _rows(output)
    # 30 updates with a checkpoint every 7: the newest segment checkpoint is at 28.
    assert (rows[crashed.name]["state"], rows[crashed.name]["updates"], rows[crashed.name]["attempts"]) == (
        "crashed",
        28,
        1,
    )
    assert (rows[unrecorded.name]["state"], rows[unrecorded.name]["updates"]) == ("finished", 30)
    assert rows[unrecorded.name]["mae_h"] is None and "adopts" in rows[unrecorded.name]["note"]


@pytest.mark.slow
def test_tampered_receipt_shows_crashed_with_the_reason(study_copy, capsys):
    output = study_copy()
    path = output / CELLS_DIR / "baseline-s1" / CELL_RECEIPT
    path.chmod(0o644)
    data = path.read_bytes()
    tampered = data.replace(b'"observed_updates": 30', b'"observed_updates": 31')
    assert tampered != data
    path.write_bytes(tampered)
    row = _rows(output)["baseline-s1"]
    assert row["state"] == "crashed" and row["updates"] is None
    assert row["note"].startswith("receipt fails authentication: read_receipt:") and "digest" in row["note"]
    code, text, _ = _status_cli(output, capsys)
    assert code == 0 and "receipt fails authentication" in text


@pytest.mark.slow
def test_finished_study_status_writes_nothing_and_json_matches(finished_study, capsys):
    output = finished_study["output"]
    before = _listing(output)
    _, text, _ = _status_cli(output, capsys)
    code, raw, _ = _status_cli(output, capsys, "--json")
    assert code == 0 and _listing(output) == before
    assert text.rstrip("\n").split("\n") == status_lines(json.loads(raw))


@pytest.mark.slow
def test_verify_and_study_status_on_a_finished_study_import_no_torch(finished_study) -> None:
    """Reading receipts needs no torch, Lightning or W&B: each runs in a fresh interpreter."""
    from test_cli_startup import _loaded

    output = str(finished_study["output"])
    assert _loaded("verify", output) == {"code": 0, "loaded": []}
    assert _loaded("study", "status", output) == {"code": 0, "loaded": []}
