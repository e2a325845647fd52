"""The reaper of a local Ray: when the driver that started it dies, no Ray process outlives it.

Owns: ``start_reaper`` (called by the Ray executor right after it starts a Ray of its own) and
the reaper's loop (``python -m qhlab.execution.reaper DRIVER_PID ROOT_PID...``), and
``watch_driver``, which a local pool's workers and its progress manager start: each ends itself
(and whatever it started) once its driver is gone. Does not own
starting or stopping Ray (``executors``) or a Ray cluster this process only connects to: its
processes belong to the cluster, and Ray's own job cleanup ends the workers of a dead driver.

Why it exists: Ray's node processes die with a SIGKILLed driver, but the raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) try to report their parent's death to the
GCS that died with it and never exit, orphaned to init. The reaper runs in a session of its
own, so a kill of the driver (or of its process group) does not reach it. While the driver
lives it records every descendant of the Ray node's processes with its start time; once the
driver is gone it SIGKILLs each recorded process that still runs with the same start time (a
reused pid is never touched), then exits. After a clean ``ray.shutdown()`` every recorded
process is gone and the reaper exits at once.

Linux only (it reads ``/proc``); elsewhere ``start_reaper`` returns None and says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["driver_identity", "process_tree", "start_reaper", "stat", "unix_socket_fits", "watch_driver"]

_POLL_SECONDS = 0.5
# A driver that exits cleanly has shut its Ray down already; one that was killed has left the
# agents waiting on a dead GCS. Either way they are given this long to go by themselves.
_GRACE_SECONDS = 1.0
_PROC = Path("/proc")


def stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its parent's wait is missing
        return None
    return int(fields[1]), int(fields[19])


def process_tree(roots: Iterable[int]) -> dict[int, int]:
    """Every live process among ``roots`` and their descendants: {pid: start time}."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = stat(int(entry.name))
        if info is not None:
            children.setdefault(info[0], []).append(int(entry.name))
            starts[int(entry.name)] = info[1]
    found: dict[int, int] = {}
    pending = [pid for pid in roots if pid in starts]
    while pending:
        pid = pending.pop()
        if pid in found:
            continue
        found[pid] = starts[pid]
        pending.extend(children.get(pid, ()))
    return found


def start_reaper(driver_pid: int, roots: Iterable[int]) -> int | None:
    """Start the reaper of the Ray node processes ``roots`` for the driver ``driver_pid``.

    Returns:
        The reaper's pid, or None where ``/proc`` is not available (not Linux).
    """
    roots = [int(pid) for pid in roots]
    if not _PROC.is_dir() or not roots:
        return None
    process = subprocess.Popen(
        [sys.executable, "-m", "qhlab.execution.reaper", str(driver_pid), *map(str, roots)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return process.pid


def _alive(pid: int, start: int) -> bool:
    info = stat(pid)
    return info is not None and info[1] == start


def _reap(driver_pid: int, roots: list[int]) -> None:
    driver_start = process_tree([driver_pid]).get(driver_pid)
    if driver_start is None:
        return
    seen: dict[int, int] = {}
    while _alive(driver_pid, driver_start):
        seen.update(process_tree(roots + list(seen)))
        if seen and not any(_alive(pid, start) for pid, start in seen.items()):
            return  # the driver shut its Ray down: nothing is left to reap
        time.sleep(_POLL_SECONDS)
    deadline = time.monotonic() + _GRACE_SECONDS
    while time.monotonic() < deadline and any(_alive(pid, start) for pid, start in seen.items()):
        time.sleep(_POLL_SECONDS)
    for pid, start in seen.items():
        if _alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


_WATCH_SECONDS = 0.5


def driver_identity() -> tuple[int, int | None]:
    """This process's pid and start time (clock ticks; None where ``/proc`` is not there)."""
    own = stat(os.getpid())
    return os.getpid(), None if own is None else own[1]


def watch_driver(pid: int, start: int | None) -> None:
    """Start a daemon thread that ends this worker, and every process it started, once the driver
    ``pid`` (started at ``start``) is gone: a SIGKILLed driver (the OOM killer, ``timeout -s KILL``, a CI
    runner) runs no cleanup, and its workers would go on fitting and publishing. The start time
    keeps a reused pid from passing for the driver."""

    def alive() -> bool:
        if start is not None:
            found = stat(pid)
            return found is not None and found[1] == start
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def watch() -> None:
        while alive():
            time.sleep(_WATCH_SECONDS)
        own = os.getpid()
        # The worker's own children first (W&B's service, a fit's helpers), then the worker.
        for child in sorted(set(process_tree([own])) - {own}):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        os.kill(own, signal.SIGKILL)

    threading.Thread(target=watch, name="qhlab-driver-watch", daemon=True).start()


# The longest AF_UNIX socket path Linux and macOS accept (sun_path, less its terminating NUL), and
# what multiprocessing adds below the temporary directory: "/pymp-" and "/listener-", each followed
# by 8 random characters (34 bytes in all).
_UNIX_PATH_MAX = 103
_SOCKET_SUFFIX = 34


def unix_socket_fits(reserve: int = _SOCKET_SUFFIX) -> bool:
    """Whether a socket made ``reserve`` bytes below the temporary directory (by default, where
    multiprocessing makes a forkserver's or a manager's) has a path short enough to bind: a
    TMPDIR over about 70 characters leaves none."""
    import tempfile

    return len(os.fsencode(tempfile.gettempdir())) + reserve <= _UNIX_PATH_MAX


if __name__ == "__main__":
    _reap(int(sys.argv[1]), [int(pid) for pid in sys.argv[2:]])
