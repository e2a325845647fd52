"""Where one try of a Ray task works on its node: a private temporary directory, swept when its worker dies.

Owns: ``try_directory(name)`` (``<tmp>/qhlab-<name>-<random>/``, holding ``OWNER_FILE`` locked by
the try for its whole life, with third-party caches and settings moved into it, removed at the
end), ``sweep_dead_tries`` (the directories of earlier tries whose worker is gone),
``own_directory`` and ``TryLedger`` (a Ray actor every try of a task reports to before it starts,
so a try whose worker died and that Ray retried is on record). Does not own: what a try runs (a
study cell: ``qhlab.study.remote_worker``) or connecting to Ray (``executors``). Imports nothing
but the standard library, so a worker unpickles a task without importing anything heavy.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "LIBRARY_DIRS",
    "OWNER_FILE",
    "TRY_PREFIX",
    "TryLedger",
    "own_directory",
    "sweep_dead_tries",
    "try_directory",
]

# Each try works in ``<tmp>/qhlab-<cell>-<random>/``, holding ``OWNER_FILE`` (its worker's pid,
# flock-ed by the try while it lives).
TRY_PREFIX = "qhlab-"
OWNER_FILE = "owner.pid"

# Environment variables that move third-party caches and settings into a try's directory.
LIBRARY_DIRS = {
    "MPLCONFIGDIR": "matplotlib",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
}


def sweep_dead_tries(base: Path) -> None:
    """Remove the directories of earlier tries on this node whose worker is gone.

    A try killed with its worker (SIGKILL, OOM) cannot remove its own directory, which holds a
    copy of TRAIN and validation; the next try on the node does. A try holds an ``flock`` on
    its owner file for its whole life and the kernel drops it when the process dies, so a
    directory is removed only when that lock can be taken: never a live try's (whatever pid
    namespace or host it runs in), never a directory without an owner file.
    """
    for directory in base.glob(f"{TRY_PREFIX}*"):
        if directory.is_symlink() or not directory.is_dir():
            continue
        try:
            fd = os.open(directory / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a try's directory, or one still being created
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its try is alive
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            os.close(fd)


def own_directory(root: Path) -> int:
    """Hold the lock that marks ``root`` as a live try's; returns the descriptor to close at the end.

    The owner file is locked under a temporary name and renamed into place, so a sweeper never
    sees an owner file that is not yet locked.
    """
    pending = root / f".{OWNER_FILE}.new"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    os.rename(pending, root / OWNER_FILE)
    return fd


class TryLedger:
    """A Ray actor (no CPU) holding every try of every cell: who started it, where, when."""

    def __init__(self) -> None:
        self._tries: dict[str, list[dict]] = {}

    def start(self, cell: str, where: dict) -> int:
        tries = self._tries.setdefault(cell, [])
        tries.append({"try": len(tries) + 1, **where, "started_unix": round(time.time(), 3)})
        return len(tries)

    def tries(self, cell: str) -> list[dict]:
        return list(self._tries.get(cell, []))


@contextlib.contextmanager
def try_directory(name: str) -> Iterator[Path]:
    """This try's own directory on its node, ``<tmp>/qhlab-<name>-<random>/``; removed at the end.

    Earlier tries' directories whose worker is gone are swept first. For the try's life the
    libraries' own caches and settings (matplotlib's font cache, W&B's directories) go below it
    too (``LIBRARY_DIRS``), so a worker writes nothing outside it.
    """
    sweep_dead_tries(Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=f"{TRY_PREFIX}{name}-"))
    owner = own_directory(root)
    saved = {key: os.environ.get(key) for key in LIBRARY_DIRS}
    os.environ.update({key: str(root / "home" / sub) for key, sub in LIBRARY_DIRS.items()})
    try:
        yield root
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
        os.close(owner)
