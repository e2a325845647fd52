"""SIGTERM ends `qhlab study run` cleanly: its pool workers stop with it, and the study resumes.

Without this the driver ended where it stood, and its forkserver and pool workers lived on
(minutes later still, holding the command's output pipes open) with no driver to publish their fits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qhlab.execution.reaper import process_tree

pytestmark = pytest.mark.slow

_RUN_CLI = "import sys; from qhlab.cli import main; sys.exit(main(sys.argv[1:]))"


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_sigterm_stops_the_pool_workers_and_the_study_resumes(tmp_path, population_cache, config_writer) -> None:
    config = config_writer(tmp_path / "config", population_cache, **{"workers = 1": "workers = 2"})
    output = tmp_path / "study"
    argv = [sys.executable, "-c", _RUN_CLI, "study", "run", str(config), "--output", str(output)]
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        # Two canaries fitting in two pool workers: their attempts hold a cold initialization.
        while len(started := list((output / "canaries").glob("*/*/cold_init.safetensors"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        tree = process_tree([proc.pid])
        assert len(tree) >= 4, tree  # the driver, the forkserver and two workers at least
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        # The command's session, whatever is left of it (the driver, or workers it orphaned).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err.read_text()
    assert err.read_text().strip().splitlines()[-1] == "error: terminated"
    # The running fits were stopped, not waited for: their attempts never finished.
    assert not any((path.parent / "fit.receipt.json").exists() for path in started)
    written = _files(output)
    time.sleep(5)
    # Nothing of the command runs on or writes into the study once it has exited.
    survivors = {pid: start for pid, start in process_tree(list(tree)).items() if tree.get(pid) == start}
    assert survivors == {}
    assert _files(output) == written
    # The killed canaries are crashed attempts; the next run fits (or resumes) them and finishes.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    verified = subprocess.run([sys.executable, "-c", _RUN_CLI, "verify", str(output)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr


def test_a_sigkilled_driver_takes_its_workers_with_it_and_a_second_run_is_refused(
    tmp_path, population_cache, config_writer
) -> None:
    """SIGKILL of the driver alone (the OOM killer, `timeout -s KILL`): no cleanup runs in it, yet
    its workers see it gone and end; the next run starts at once. Before that, a second run of the
    study while the first runs is refused at its start, and the first never notices it."""
    config = config_writer(tmp_path / "config", population_cache, **{"workers = 1": "workers = 2"})
    output = tmp_path / "study"
    argv = [sys.executable, "-c", _RUN_CLI, "study", "run", str(config), "--output", str(output)]
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(started := list((output / "canaries").glob("*/*/cold_init.safetensors"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stderr
        assert second.stderr.count("error:") == 1 and "another `qhlab study run` is running this study" in second.stderr
        assert proc.poll() is None  # the first run goes on
        tree = process_tree([proc.pid])
        assert len(tree) >= 4, tree
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone, not its session
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            survivors = {pid: start for pid, start in process_tree(list(tree)).items() if tree.get(pid) == start}
            if not survivors:
                break
            time.sleep(0.2)
        assert survivors == {}, survivors
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not any((path.parent / "fit.receipt.json").exists() for path in started)
    # The kernel released every lock with its holder: the next run resumes and finishes.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
