"""What an evidence directory may hold: regular files and directories, nothing that points away.

Owns: the one walk that refuses a directory tree holding a symbolic link, a special file
(FIFO, socket, device) or a regular file hard-linked to a path outside the tree, naming each
offender by path (``refuse_links``). ``qhlab sign`` and ``qhlab verify`` both use it, so the
two agree on what a directory is. Does not own: what the files contain
(``qhlab.evidence.receipts``).

Why links are refused rather than followed: a link's target is not part of the directory that
travels, signs or is verified, so a link lets bytes outside the evidence stand in for bytes
inside it (``ln -s /tmp/out S/cells`` made ``verify`` skip every cell). A hard link is not a
pointer, but a file whose other names lie outside the tree can be changed without touching the
tree, so it is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from qhlab.evidence.errors import QhInputError, input_error

__all__ = ["logger_leftover", "refuse_links"]

_SHOWN = 5


def _shown(items: list[str]) -> str:
    more = f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return "; ".join(items[:_SHOWN]) + more


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file or directory"


def logger_leftover(root: Path, path: Path) -> bool:
    """Whether the link ``path`` is a run logger's log link that a killed fit left behind.

    W&B's service links ``<attempt>/wandb/<run>/logs/debug-core.log`` to its own log file when a
    run starts; qhlab drops the link as soon as the run has started and again when it finishes,
    so only a fit killed inside the logger's start-up leaves it. Such a link (to a regular file,
    named ``*.log``, below a directory named ``wandb``) is never followed, and a receipt that
    binds a link is refused, so it can neither hide a file nor stand in for one: ``verify``
    lists it as a leftover, and ``qhlab study run`` drops it when it resumes or retries the cell.
    """
    relative = path.relative_to(root).parts
    return path.name.endswith(".log") and "wandb" in relative[:-1] and path.is_file() and not path.is_dir()


def refuse_links(
    call: str, root: str | os.PathLike, *, error: type[QhInputError] = QhInputError, hint: str = "", tolerate=None
) -> list[str]:
    """Refuse ``root`` when it is, or holds anywhere below it, a link or a special file.

    Refused, each named by its path: ``root`` itself a symbolic link; any symbolic link below it
    (to a file or a directory; the walk never follows one); a FIFO, socket or device; a regular
    file with more hard links than the tree holds (another name for it lies outside ``root``).

    Args:
        call: the call named in the message (``"qhlab verify"``, ``"sign_directory"``).
        root: the directory; a missing one is left to the caller's own check.
        error: the error class raised (``QhInputError`` for a directory the user passed, or an
            ``EvidenceError`` subclass where the refusal is of evidence).
        hint: what to do about it, appended to the message.
        tolerate: ``tolerate(root, link) -> bool`` for links that are listed, not refused
            (``logger_leftover`` for ``verify``); None refuses every link.

    Returns:
        The tolerated links, as ``"<path> -> <target>"``.

    Raises:
        ``error``: the first kind of offender found, with up to five paths of it and a count.
    """
    root = Path(root)
    if root.is_symlink():
        raise input_error(
            call,
            "directory",
            str(root),
            "a real directory, not a symbolic link",
            f"it links to {os.readlink(root)!r}; pass the directory itself ({root.resolve()}).",
            error=error,
        )
    if not root.is_dir():
        return []
    links: list[str] = []
    tolerated: list[str] = []
    special: list[str] = []
    inodes: dict[tuple[int, int], list[str]] = {}
    nlinks: dict[tuple[int, int], int] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk lists a linked directory but never enters it
        dirnames.sort()
        for name in sorted((*dirnames, *filenames)):
            path = Path(dirpath) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                shown = f"{str(path)!r} -> {os.readlink(path)!r}"
                (tolerated if tolerate is not None and tolerate(root, path) else links).append(shown)
            elif stat.S_ISREG(info.st_mode):
                if info.st_nlink > 1:
                    key = (info.st_dev, info.st_ino)
                    inodes.setdefault(key, []).append(repr(str(path)))
                    nlinks[key] = info.st_nlink
            elif not stat.S_ISDIR(info.st_mode):
                special.append(f"{str(path)!r} ({_special_kind(info.st_mode)})")
    tail = f" {hint}" if hint else ""
    if links:
        raise input_error(
            call,
            "directory",
            str(root),
            "a directory of regular files and directories, no symbolic links",
            f"{len(links)} symbolic link(s) below it: {_shown(links)}. A link's target is not part of the "
            f"directory, so it is never followed; remove the link, or replace it by a copy of its target.{tail}",
            error=error,
        )
    if special:
        raise input_error(
            call,
            "directory",
            str(root),
            "a directory of regular files and directories",
            f"{len(special)} special file(s) below it: {_shown(special)}. Remove them.{tail}",
            error=error,
        )
    escaping = [paths[0] for key, paths in sorted(inodes.items()) if nlinks[key] > len(paths)]
    if escaping:
        raise input_error(
            call,
            "directory",
            str(root),
            "a directory whose files have no other names outside it",
            f"{len(escaping)} file(s) hard-linked to a path outside it: {_shown(escaping)}. Such a file can "
            f"change without the directory changing; replace each by a copy (cp --remove-destination).{tail}",
            error=error,
        )
    return tolerated
