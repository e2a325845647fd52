"""Write-once publication of files and directories.

Owns: the only way qhlab puts a file at its published name: write a temporary file in the
same directory, flush and fsync it, hard-link it to the target (which fails if the target
exists, so even a race cannot overwrite), fsync the directory; and the only way it puts a
directory at its published name (``publish_directory``: stage, fsync, rename). A crash at any
point leaves at most a hidden ``.NAME.tmp-*`` file or directory, never a partial published
one. Does not own: what the files contain.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from qhlab.evidence.canonical import canonical_json, sha256_bytes, sha256_file
from qhlab.evidence.errors import PublishConflictError, QhError, QhInputError

__all__ = [
    "TEMP_MARKER",
    "file_in_the_way",
    "fresh_directory",
    "publish_bytes",
    "publish_directory",
    "publish_file",
    "publish_json",
    "remove_leftovers",
    "safe_component",
    "storage_error",
]

T = TypeVar("T")

TEMP_MARKER = ".tmp-"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def safe_component(value: Any, *, field: str, call: str = "qhlab") -> str:
    """Return ``value`` if it is one safe path component, else raise naming ``field``.

    Allowed: 1-64 characters from ``[A-Za-z0-9._-]``, not starting with ``.`` or ``-``.
    This is what keeps ``../x``, ``a/b`` and unicode look-alikes out of published paths.
    """
    if not isinstance(value, str) or not 1 <= len(value) <= 64 or value[0] in ".-" or not set(value) <= _SAFE:
        raise QhInputError(
            f"{call}: {field}={value!r} is not allowed; allowed: 1-64 characters from "
            "[A-Za-z0-9._-], not starting with '.' or '-'. HINT: names become directory names, "
            "so separators, '..' and non-ASCII are refused."
        )
    return value


def storage_error(call: str, path: Any, exc: OSError) -> QhError:
    """The runtime error (exit 1) for storage that refused a write: names ``path`` and the OS error.

    ``"<call>: cannot write <path>: [Errno 28] No space left on device (ENOSPC). HINT: ..."``.
    """
    code = exc.errno
    if isinstance(code, int):
        reason = f"[Errno {code}] {os.strerror(code)} ({errno.errorcode.get(code, '?')})"
    else:
        reason = str(exc) or type(exc).__name__
    return QhError(
        f"{call}: cannot write {path}: {reason}. HINT: the output directory must be writable and "
        "its disk must have free space; nothing was published under a partial name."
    )


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _refuse_existing(path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise PublishConflictError(
            f"publish: {path} already exists; published files are write-once. "
            "HINT: choose a fresh output path; qhlab never overwrites evidence."
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_leftovers(path: Path) -> list[Path]:
    """Remove what an interrupted publication of ``path`` left beside it; return what was removed.

    A publication stages at ``.NAME.tmp-<pid>-<hex>`` (a file or a directory) and a kill (SIGKILL,
    power loss) can leave it behind. One whose process is gone is removed by the next
    publication of the same name; one whose process still runs (a concurrent writer on this
    machine) is left alone.
    """
    prefix = f".{path.name}{TEMP_MARKER}"
    removed = []
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for sibling in siblings:
        pid = sibling.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            _remove_quietly(sibling)
        removed.append(sibling)
    return removed


def _link_into_place(tmp: Path, path: Path) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise PublishConflictError(
            f"publish: {path} already exists (created concurrently); published files are write-once."
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        # Filesystems without hard links: rename is still atomic; the existence check above
        # is the only guard left, which is acceptable where links are unsupported.
        _refuse_existing(path)
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def publish_file(path: str | os.PathLike, writer: Callable[[Path], None]) -> str:
    """Publish a file produced by ``writer(temporary_path)`` at ``path``, write-once.

    Args:
        path: the published name; its directory must exist.
        writer: writes the complete file at the temporary path it is given (e.g.
            ``pyarrow.parquet.write_table`` or ``safetensors.torch.save_file``).

    Returns:
        Hex SHA-256 of the published bytes.

    Raises:
        PublishConflictError: the target exists.
        QhInputError: the parent directory does not exist.
    """
    path = Path(path)
    _refuse_existing(path)
    if not path.parent.is_dir():
        raise QhInputError(f"publish: directory {path.parent} does not exist for {path.name}.")
    tmp = path.parent / f".{path.name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    remove_leftovers(path)
    try:
        writer(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        digest = sha256_file(tmp)
        _link_into_place(tmp, path)
        _fsync_directory(path.parent)
    except OSError as exc:
        raise storage_error("publish", path, exc) from exc
    finally:
        # The temporary file never outlives the call, published or not.
        _remove_quietly(tmp)
    return digest


def publish_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Publish ``data`` at ``path`` write-once (temp, fsync, link, fsync dir)."""

    def _write(tmp: Path) -> None:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()

    publish_file(path, _write)
    return Path(path)


def publish_json(path: str | os.PathLike, obj: Any) -> str:
    """Publish ``obj`` as canonical JSON, write-once; return the SHA-256 of its bytes."""
    data = canonical_json(obj)
    publish_bytes(path, data)
    return sha256_bytes(data)


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The file at ``path`` or at its nearest existing ancestor that keeps a directory from being
    made there (None: ``path`` is, or may become, a directory)."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    return None if existing is None or existing.is_dir() else existing


def fresh_directory(path: str | os.PathLike) -> Path:
    """Create ``path`` (and missing parents); refuse one that already exists."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise PublishConflictError(
            f"fresh_directory: {path} already exists. HINT: every attempt publishes into a new "
            "directory; pick another output path or attempt id."
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise PublishConflictError(f"fresh_directory: {path} was created concurrently.") from None
    except OSError as exc:
        raise storage_error("fresh_directory", path, exc) from exc
    return path


def publish_directory(target: str | os.PathLike, writer: Callable[[Path], T]) -> T:
    """Publish a directory made by ``writer(staging)`` at ``target``, all at once or not at all.

    ``writer`` fills a hidden sibling staging directory; it is then fsynced (files and
    directory) and renamed to ``target`` in one atomic step, so a reader never sees a partial
    directory. On any failure (or interrupt) the staging directory is removed and nothing is
    published.

    Args:
        target: directory to publish; must not exist (an empty directory is replaced).
        writer: fills the staging directory (given as a Path) and returns any value.

    Returns:
        What ``writer`` returned (e.g. the paths it wrote, under the staging name; callers
        that need published paths rebase them on ``target``).

    Raises:
        PublishConflictError: ``target`` exists with content, before or after staging.
    """
    target = Path(target)
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        raise PublishConflictError(
            f"publish_directory: {target} already exists; published directories are write-once. "
            "HINT: inspect it and choose a fresh output path; qhlab never overwrites evidence."
        )
    staging = target.parent / f".{target.name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    remove_leftovers(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:
        raise storage_error("publish_directory", target, exc) from exc
    try:
        result = writer(staging)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_directory(staging)
        # rename() replaces an empty directory and refuses a non-empty one: a target that got
        # content meanwhile is never overwritten.
        try:
            os.rename(staging, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise storage_error("publish_directory", target, exc) from exc
            raise PublishConflictError(
                f"publish_directory: {target} was created concurrently; nothing was published. "
                "HINT: another process published it; inspect it."
            ) from None
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise storage_error("publish_directory", target, exc) from exc
    except QhError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if type(exc) is QhError and isinstance(exc.__cause__, OSError):
            # A file inside the staging directory could not be written: name the directory
            # the user asked for, not its hidden staging name (which is gone now).
            raise QhError(str(exc).replace(str(staging), str(target))) from exc.__cause__
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        _fsync_directory(target.parent)
    except OSError as exc:
        raise storage_error("publish_directory", target, exc) from exc
    return result
