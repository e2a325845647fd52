"""Storage that refuses writes and a stdout closed by its reader.

A read-only output directory, a full disk or a file where a directory is expected ends a
command with exactly one ``error:`` line naming the path and the OS error, exit 1, no
traceback, and no temporary or half-published file. A closed stdout ends the command quietly
with exit 141 (128 + SIGPIPE, what a shell reports for a program a closed pipe ended).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from qhlab.cli import BROKEN_PIPE_EXIT, main
from qhlab.evidence import QhError, publish_bytes
from qhlab.training import tensor_state
from qhlab.training.tensor_state import save_tensor_state

QHLAB = [sys.executable, "-c", "import sys; from qhlab.cli import main; sys.exit(main())"]
GENERATE = ["scenes", "generate", "--preset", "tiny", "--split", "train", "--seed", "0"]


def _mount_tmpfs(target: Path, options: str) -> bool:
    """Mount a tmpfs at ``target`` (real kernel refusals, even for root); False where not permitted."""
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, timeout=30
    )
    return result.returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    mounted: list[Path] = []

    def _make(name: str, options: str) -> Path:
        target = tmp_path / name
        if not _mount_tmpfs(target, options):
            pytest.skip("mounting a tmpfs is not permitted here")
        mounted.append(target)
        return target

    yield _make
    for target in mounted:
        subprocess.run(["umount", str(target)], capture_output=True, timeout=30)


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*")) if directory.exists() else []


def test_read_only_output_directory_is_one_error_line(tmpfs) -> None:
    read_only = tmpfs("ro", "ro,size=1m")
    out = read_only / "population"
    result = subprocess.run([*QHLAB, *GENERATE, "--out", str(out)], capture_output=True, text=True, timeout=300)
    line = _one_error_line(result.stderr)
    assert result.returncode == 1
    assert f"cannot write {out}: [Errno 30] Read-only file system (EROFS)." in line
    assert _leftovers(read_only) == []


def test_full_disk_is_one_error_line_and_leaves_no_temporary_file(tmpfs) -> None:
    full = tmpfs("full", "size=16k")
    out = full / "population"
    result = subprocess.run([*QHLAB, *GENERATE, "--out", str(out)], capture_output=True, text=True, timeout=300)
    line = _one_error_line(result.stderr)
    assert result.returncode == 1
    assert "[Errno 28] No space left on device (ENOSPC)." in line
    assert str(out) in line
    assert not out.exists()
    assert _leftovers(full) == []


def test_file_where_the_output_directory_should_be(tmp_path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"x")
    out = blocker / "population"
    result = subprocess.run([*QHLAB, *GENERATE, "--out", str(out)], capture_output=True, text=True, timeout=300)
    line = _one_error_line(result.stderr)
    assert result.returncode == 1
    assert f"cannot write {out}: [Errno " in line
    assert blocker.read_bytes() == b"x"


def test_full_disk_at_fsync_in_process(tmp_path, monkeypatch, capsys) -> None:
    """No real full disk here: fsync, where a full disk reports a lost write, raises ENOSPC."""

    def _full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "population"
    monkeypatch.setattr(os, "fsync", _full)
    assert main([*GENERATE, "--out", str(out)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"cannot write {out}/" in line
    assert ": [Errno 28] No space left on device (ENOSPC). HINT:" in line
    assert _leftovers(tmp_path) == []


def test_publish_bytes_removes_its_temporary_file_when_storage_refuses(tmp_path, monkeypatch) -> None:
    def _full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", _full)
    with pytest.raises(QhError, match=r"publish: cannot write .*/a\.json: \[Errno 28\] No space left on device"):
        publish_bytes(tmp_path / "a.json", b"{}\n")
    assert list(tmp_path.iterdir()) == []


def test_safetensors_full_disk_names_the_state_file(tmpfs) -> None:
    full = tmpfs("state", "size=16k")
    target = full / "final_state.safetensors"
    with pytest.raises(QhError) as caught:
        save_tensor_state(target, {"w": torch.zeros(10_000)}, {})
    assert caught.value.exit_code == 1
    assert str(caught.value).startswith(
        f"publish: cannot write {target}: [Errno 28] No space left on device (ENOSPC). HINT:"
    )
    assert _leftovers(full) == []


def test_safetensors_error_becomes_the_os_error_it_carries(tmp_path, monkeypatch) -> None:
    def _refuse(tensors, filename):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)")

    monkeypatch.setattr(tensor_state, "_safetensors_save_file", _refuse)
    target = tmp_path / "cold_init.safetensors"
    with pytest.raises(
        QhError, match=r"cannot write .*cold_init\.safetensors: \[Errno 30\] Read-only file system \(EROFS\)"
    ):
        save_tensor_state(target, {"w": torch.zeros(3)}, {})
    assert list(tmp_path.iterdir()) == []


def _with_closed_stdout(arguments: list[str]) -> subprocess.CompletedProcess:
    """Run qhlab with a stdout pipe whose only reader closed before the command wrote."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*QHLAB, *arguments], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)


def test_closed_stdout_ends_profiles_quietly() -> None:
    result = _with_closed_stdout(["profiles"])
    assert result.returncode == BROKEN_PIPE_EXIT == 141
    assert result.stderr == ""


def test_closed_stdout_ends_verify_quietly(tmp_path) -> None:
    population = tmp_path / "population"
    assert main([*GENERATE, "--out", str(population)]) == 0
    result = _with_closed_stdout(["verify", str(population)])
    assert result.returncode == 141
    assert result.stderr == ""


def test_reader_that_stops_early_through_a_shell_pipe(tmp_path) -> None:
    """``qhlab profiles | head -c 1``: whether the reader left before or after the writes, no traceback."""
    command = " ".join(f"'{part}'" for part in QHLAB) + " profiles --json | head -c 1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300)
    assert result.stdout == "{"
    assert result.stderr == ""
    assert result.returncode in (0, 141)
