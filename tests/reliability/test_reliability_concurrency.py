"""Concurrency: two writers of the same logical run start at once; exactly one proceeds.

Owns: racing two ``qhlab fit`` processes (same output root, same run id or same logical run)
and two ``qhlab study run-fit`` processes for the same cell; a ``study freeze`` or ``study report``
while another process holds that study's freeze or report lock. The loser must fail at once with
exit status 3 (``LockHeldError``) and one ``error:`` line naming the lock file, and must
publish nothing; the winner's evidence must authenticate. Does not own: the locks
(``qhlab.evidence.exclusive_lock``, ``WandbAttempt.local_writer_lock``).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from _reliability_support import assert_nothing_partial, start_qhlab

from qhlab.design.study_records import StudyCellReceipt

pytestmark = pytest.mark.reliability

LONG_FIT_UPDATES = 2000  # the winner must still be training when the loser reaches the lock


def _race(argv_a: list, argv_b: list, logs: tuple[Path, Path], *, stop_winner: bool, timeout: float = 300.0):
    """Start both at once; wait for the first to exit; then stop (SIGKILL) or await the other."""
    procs = [start_qhlab(argv_a, log=logs[0]), start_qhlab(argv_b, log=logs[1])]
    started = time.monotonic()
    first = None
    try:
        while first is None and time.monotonic() - started < timeout:
            for i, proc in enumerate(procs):
                if proc.poll() is not None:
                    first = i
                    break
            time.sleep(0.02)
        assert first is not None, "neither racer exited"
        first_seconds = time.monotonic() - started
        other = procs[1 - first]
        other_running = other.poll() is None
        if stop_winner and other_running:
            os.killpg(other.pid, signal.SIGKILL)
        other.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {
        "first": first,
        "first_seconds": first_seconds,
        "other_running_when_first_exited": other_running,
        "codes": [p.returncode for p in procs],
        "logs": [log.read_text(errors="replace") for log in logs],
    }


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("same", ["run-id", "logical-run"])
def test_two_fits_of_one_logical_run_exactly_one_proceeds(tmp_path, recipe_writer, same):
    recipe = recipe_writer(tmp_path / "recipe", updates=LONG_FIT_UPDATES)
    output = tmp_path / "out"
    argv = ["fit", recipe, "--profile", "cpu-fp32", "--output", output, "--no-progress"]
    if same == "run-id":
        argv += ["--run-id", "rel-race-0001"]
    race = _race(argv, argv, (tmp_path / "a.log", tmp_path / "b.log"), stop_winner=True)
    loser = race["first"]
    assert race["codes"][loser] == 3, race
    assert race["other_running_when_first_exited"], race  # it failed at once, not after waiting
    lines = _error_lines(race["logs"][loser])
    assert len(lines) == 1, race["logs"][loser]
    lock = output / ".locks" / "rel-tiny-s0.lock"
    assert str(lock) in lines[0] and "held by another process" in lines[0], lines
    assert race["codes"][1 - loser] == -signal.SIGKILL
    # Only the winner created an attempt directory; whatever it published is complete.
    attempts = [p for p in (output / "rel-tiny-s0").iterdir() if p.is_dir()]
    assert len(attempts) == 1, attempts
    assert_nothing_partial(output, context="fit race")


def test_two_study_run_fits_of_one_cell_exactly_one_proceeds(tmp_path, finished_study):
    from qhlab.evidence import read_receipt

    study = tmp_path / "study"
    shutil.copytree(finished_study["output"], study, symlinks=True)
    cell = "control_no_interaction-s1"
    shutil.rmtree(study / "cells" / cell)
    argv = [
        "study",
        "run-fit",
        finished_study["config"],
        "--output",
        study,
        "--variant",
        "control_no_interaction",
        "--seed",
        "1",
    ]
    race = _race(argv, argv, (tmp_path / "a.log", tmp_path / "b.log"), stop_winner=False)
    codes = sorted(race["codes"])
    # The loser meets the winner's lock (3), or, when it reaches the lock only after the winner
    # published the cell (a tiny cell fits in a second on an idle host), the finished cell (2).
    assert codes in ([0, 3], [0, 2]), (race["codes"], race["logs"])
    loser = race["codes"].index(codes[1])
    lines = _error_lines(race["logs"][loser])
    assert len(lines) == 1, race["logs"][loser]
    if codes[1] == 3:
        assert str(study / "cells" / f".{cell}.lock") in lines[0], lines
    else:
        assert f"cell {cell} is finished" in lines[0] and "runs once" in lines[0], lines
    receipt = read_receipt(study / "cells" / cell / "cell.receipt.json", StudyCellReceipt).record()
    attempts = [p.name for p in (study / "cells" / cell).iterdir() if p.is_dir()]
    assert attempts == [receipt["body"]["attempt"]] and receipt["body"]["previous_attempts"] == []
    assert_nothing_partial(study, context="run-fit race")


def _refused_while_held(argv: list, lock: Path, log: Path) -> str:
    """Run ``argv`` while this process holds ``lock`` (as a concurrent step would); its output."""
    from qhlab.evidence import exclusive_lock

    with exclusive_lock(lock):
        proc = start_qhlab(argv, log=log)
        assert proc.wait(timeout=300) == 3, log.read_text()
    return log.read_text(errors="replace")


def test_a_second_freeze_of_one_study_exits_3_and_writes_nothing(tmp_path, rel_study_config):
    study = tmp_path / "study"
    study.mkdir()
    lock = study / ".study-freeze.lock"
    text = _refused_while_held(["study", "freeze", rel_study_config, "--output", study], lock, tmp_path / "a.log")
    lines = _error_lines(text)
    assert len(lines) == 1 and str(lock) in lines[0] and "held by another process" in lines[0], text
    assert [p.name for p in study.iterdir()] == [lock.name]  # the holder's lock only


def test_a_second_report_of_one_study_exits_3_and_writes_nothing(tmp_path, finished_study):
    study = tmp_path / "study"
    shutil.copytree(finished_study["output"], study, symlinks=True)
    shutil.rmtree(study / "report")
    lock = study / ".study-report.lock"
    text = _refused_while_held(
        ["study", "report", finished_study["config"], "--output", study], lock, tmp_path / "a.log"
    )
    lines = _error_lines(text)
    assert len(lines) == 1 and str(lock) in lines[0], text
    assert not (study / "report").exists() and not list(study.glob(".report*"))
