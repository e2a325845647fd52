"""The source-package digest, the runtime versions and host-local writer locks.

Owns: the identity of the qhlab code that produced an artifact (sorted relative paths plus
the bytes of every ``.py`` file of the package), the versions of Python and of the packages that
can change a result (``runtime_versions``) and non-blocking exclusive locks. Does not
own: which steps take a lock or bind the digest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

from qhlab import __version__
from qhlab.evidence.errors import LockHeldError, MissingEvidenceError

__all__ = ["STUDY_PACKAGES", "exclusive_lock", "runtime_versions", "source_package_digest"]


# The distributions whose versions can change a study's files or numbers: the fits (torch,
# lightning), the statistics (numpy, scipy), the labels (pymunk), population bytes (pyarrow)
# and the run record (wandb). The freeze records them with Python's version.
STUDY_PACKAGES = ("torch", "lightning", "numpy", "scipy", "pymunk", "pyarrow", "wandb")


def runtime_versions() -> dict[str, str | None]:
    """{"python": version, package: installed version or None} for ``STUDY_PACKAGES``."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in STUDY_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def source_package_digest(package_root: str | os.PathLike | None = None) -> dict:
    """Digest the ``.py`` files of the qhlab package.

    Args:
        package_root: directory of a ``qhlab`` package checkout (the folder holding
            ``__init__.py``); None means the imported package.

    Returns:
        ``{"package": "qhlab", "version": str, "sha256": hex, "files": int}``; the digest
        covers each file's relative POSIX path and bytes, in sorted path order.
    """
    root = Path(package_root) if package_root is not None else Path(__file__).resolve().parent.parent
    if not (root / "__init__.py").is_file():
        raise MissingEvidenceError(f"source_package_digest: {root} is not a package directory.")
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts and p.is_file())
    digest = hashlib.sha256()
    for path in files:
        rel = path.relative_to(root).as_posix().encode("utf-8")
        data = path.read_bytes()
        digest.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return {"package": "qhlab", "version": __version__, "sha256": digest.hexdigest(), "files": len(files)}


@contextlib.contextmanager
def exclusive_lock(
    lock_path: str | os.PathLike,
    *,
    admit: Callable[[], None] | None = None,
    hint: str = "another writer is publishing this logical run; wait for it or use another run id",
) -> Iterator[Path]:
    """Hold a non-blocking exclusive ``fcntl.flock`` on ``lock_path`` for the ``with`` body.

    The lock file is created if needed and never deleted (deleting a lock file lets two
    processes lock two different inodes). The kernel drops the lock when the process dies,
    so a crashed holder never blocks a later run. The holder's pid is written into the file
    only once the lock is held and ``admit`` (if given) has returned: a refused writer (the
    lock is held, or ``admit`` raises, e.g. because the work is already done) leaves the lock
    file's bytes and mtime exactly as they were.

    Args:
        lock_path: the lock file.
        admit: called with the lock held, before anything is written; what it raises
            propagates after the lock is released.
        hint: what a refused writer should do, after the holder's pid.

    Raises:
        LockHeldError: at once, naming the lock file and its recorded holder.
    """
    path = Path(lock_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise LockHeldError(f"lock: {path} is held by another process (pid {holder}). HINT: {hint}.") from None
        try:
            if admit is not None:
                admit()
            holder = f"{os.getpid()}\n".encode("ascii")
            if os.pread(fd, 64, 0) != holder:  # a pid already recorded is not rewritten
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder, 0)
            yield path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
