"""Verifying a whole directory: every receipt below it, and every file each binds, each at its one place.

Owns: ``verify_directory`` (what ``qhlab verify`` and ``qhlab sign`` authenticate), the anchors
that map paths made elsewhere to their one place in a copy (directories whose receipts record
their origin), the sealed directories a receipt binds whole, and the lists of files no receipt
binds, links a killed fit left and leftovers of an interrupted publication. Does not own:
reading one receipt or locating one moved file (``receipts``), or the record checks ``qhlab
verify`` runs after it (``qhlab.evidence.envelope.record_checks``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from qhlab.evidence.accounting import account_for_unbound
from qhlab.evidence.canonical import sha256_file
from qhlab.evidence.envelope import Receipt
from qhlab.evidence.errors import DigestMismatchError, EvidenceError, MissingEvidenceError, QhInputError
from qhlab.evidence.layout import RECEIPT_SUFFIX
from qhlab.evidence.publish import TEMP_MARKER
from qhlab.evidence.receipts import (
    DEFAULT_POPULATION_ROOT,
    SEALED_FIELD,
    at_or_moved,
    bindings,
    digest_or_none,
    read_receipt,
    recorded_origin,
)
from qhlab.evidence.tree import logger_leftover, refuse_links

__all__ = ["verify_directory"]


@dataclasses.dataclass(frozen=True)
class _Anchor:
    """A directory below the verified one (``here``) that was made at ``origin``."""

    here: Path
    origin: Path


def _anchors(root: Path, directories: Sequence[Path]) -> list[_Anchor]:
    """Every directory below ``root`` that records its origin, the nearest such directory above
    ``root`` (verifying a part of a copied study), else ``root`` as made where it is.

    Raises:
        EvidenceError: two directories record the same origin, or one inside another's at
            another relative place than where it was made: a file made there would have two
            places in ``root``, and verify refuses to choose.
    """
    recorded = [_Anchor(d, origin) for d in directories if (origin := recorded_origin(d)) is not None]
    if not any(a.here == root for a in recorded):
        above = next(
            ((parent, origin) for parent in root.parents if (origin := recorded_origin(parent)) is not None), None
        )
        # Where the directory itself was made: as its nearest anchor above says, else where it is.
        recorded.append(_Anchor(above[0], above[1]) if above else _Anchor(root, root))
    for i, a in enumerate(recorded):
        for b in recorded[i + 1 :]:
            if _same_places(a, b) or _same_places(b, a):
                continue
            if a.origin == b.origin or a.origin.is_relative_to(b.origin) or b.origin.is_relative_to(a.origin):
                raise EvidenceError(
                    f"verify: {a.here} and {b.here} are both copies of files made in {a.origin}"
                    + ("" if a.origin == b.origin else f" and {b.origin}")
                    + f" (a nested copy), so a file bound there has two places in {root}. HINT: verify each "
                    "copy on its own, after moving the nested one out; a file's place is never chosen."
                )
    return recorded


def _same_places(inner: _Anchor, outer: _Anchor) -> bool:
    """Whether ``inner`` was made strictly inside ``outer`` and lies at that same relative place
    in it now (a study made inside a directory that was verified or moved whole): a file made in
    ``inner`` then has one place whichever anchor maps it."""
    return (
        inner.origin != outer.origin
        and inner.origin.is_relative_to(outer.origin)
        and inner.here == outer.here / inner.origin.relative_to(outer.origin)
    )


def _place(anchors: Sequence[_Anchor], recorded: Path) -> Path | None:
    """The one path in the verified directory of a file bound at absolute ``recorded``, or None
    when it was made outside every anchor (a population)."""
    for anchor in anchors:
        if recorded.is_relative_to(anchor.origin):
            return anchor.here / recorded.relative_to(anchor.origin)
    return None


def _locate_below(
    root: Path,
    anchors: Sequence[_Anchor],
    populations: Sequence[Path],
    receipt: Path,
    section: str,
    name: str,
    entry: dict,
) -> Path:
    """Where ``verify_directory`` authenticates one bound file, and only there.

    A relative path is beside the receipt; an absolute path made inside an anchor is at its one
    place below ``root`` (never the original's bytes, never a nested copy's); any other absolute
    path (a population) is at its recorded path, or, when gone, at ``ROOT/<population>/<file>``
    below each population root.
    """
    recorded = Path(entry["path"])
    if not recorded.is_absolute():
        place = Path(os.path.normpath(receipt.parent / recorded))
        if not place.is_relative_to(root):
            raise EvidenceError(
                f"verify: {receipt} binds {section} file {name!r} at {entry['path']!r}, outside "
                f"{root}. HINT: a relative path stays inside the directory it is read in."
            )
    else:
        place = _place(anchors, Path(os.path.normpath(recorded)))
    if place is None:
        return at_or_moved(
            receipt, section, name, entry, recorded, populations, "verify", "`qhlab verify DIR --populations ROOT`"
        )
    if place.is_symlink():
        raise EvidenceError(
            f"verify: {receipt} binds {section} file {name!r} at {place}, a symbolic link (to "
            f"{os.readlink(place)!r}). HINT: a bound file is a regular file of the directory."
        )
    digest = digest_or_none(place)
    if digest == entry["sha256"]:
        return place
    copy = "" if place == recorded else f", this directory's copy of {recorded}"
    if digest is None:
        raise MissingEvidenceError(
            f"verify: {section} file {name!r} ({place}{copy}) bound by {receipt} is missing. HINT: a copied "
            "directory is judged on its own files; copy it whole."
        )
    raise DigestMismatchError(
        f"verify: {section} file {name!r} ({place}{copy}) has sha256 {digest}; {receipt} binds "
        f"{entry['sha256']}. HINT: a published file is never edited; restore it from the original or rerun "
        "the step that made it."
    )


def _is_temporary(relative: str) -> bool:
    """A file publication left behind: its name, or a directory it is in, carries ``TEMP_MARKER``."""
    return any(TEMP_MARKER in part for part in relative.split("/"))


def _refuse_unbound_in_sealed(
    root: Path, full: Path, rel: str, receipt: Receipt, own: set[Path], files: list[Path]
) -> None:
    """Refuse a file below a directory ``receipt`` seals that ``receipt`` itself does not bind."""
    for name in getattr(receipt.body, SEALED_FIELD, None) or []:
        parts = Path(str(name)).parts
        if not parts or Path(str(name)).is_absolute() or ".." in parts:
            raise DigestMismatchError(f"verify: {rel} seals {name!r}; allowed: a directory below the receipt's own.")
        directory = full.parent / str(name)
        extra = sorted(f.relative_to(root).as_posix() for f in files if directory in f.parents and f not in own)
        if extra:
            raise DigestMismatchError(
                f"verify: {', '.join(extra[:5])} lie(s) in {directory.relative_to(root).as_posix()}/, which {rel} "
                "seals, but it does not bind them. HINT: a sealed directory holds exactly the files its receipt "
                "binds; remove what was added."
            )


def verify_directory(directory: str | os.PathLike, populations: Sequence[str | os.PathLike] = ()) -> dict:
    """Authenticate every receipt below ``directory`` and every file each binds, each at one place.

    Where a bound file is follows one rule (``_locate_below``): each directory whose receipts
    record their origin (``recorded_origin``; a study's freeze receipt) maps every path made
    there to exactly one path below it, as the study steps do (``authentication_roots``); two
    copies of one origin below ``directory`` are refused. Links and special files anywhere
    below ``directory`` are refused before anything is read (``refuse_links``), except the log
    link a fit killed in its logger's start-up leaves (``logger_leftover``), which is listed.
    A file no receipt binds is listed with its kind (``accounting.account_for_unbound``),
    except below a directory a receipt seals (``sealed_directories`` in its body), or in a
    study where no step writes such a file (an unknown file, a report no receipt binds), where
    it is refused.

    What a pass proves without a signature: the directory is internally consistent (every
    receipt's content digest and every bound file's digest agree). It does not prove origin:
    anyone can rewrite a file and reseal every receipt above it; only ``qhlab verify
    --public-key`` checks who made the bytes.

    Args:
        directory: the directory to verify.
        populations: further roots populations were copied to (``qhlab verify --populations``).

    Returns:
        ``{"receipts": [{"path", "kind", "schema_version", "sha256"}], "bound_files": n,
        "unbound_files": [relative paths of files no receipt binds], "unbound": [{"path", "kind"}
        for each of them, ``kind`` one of ``accounting.UNBOUND_KINDS``], "temporary_files": [...
        files of interrupted publications, in a staging directory or under a temporary name],
        "linked_logs": [W&B log links a killed fit left (``tree.logger_leftover``): never followed],
        "populations": [absolute directories of every population inside or bound, as found]}``.

    Raises:
        QhInputError: ``directory`` is, or holds, a symbolic link, a special file or a file
            hard-linked outside it (each named).
        EvidenceError: (or a subclass) at the first receipt or file that fails, or a study holds
            a file no receipt binds and no study step writes there.
        MissingEvidenceError: the directory is missing or holds no receipt.
    """
    if str(directory) == "":
        raise QhInputError(
            "verify: directory='' is not allowed; allowed: the path of a directory of receipts. "
            "HINT: pass the directory to verify, e.g. `qhlab verify runs/demo-study`."
        )
    root = Path(os.path.abspath(directory))
    if not root.is_dir():
        raise MissingEvidenceError(f"verify: {directory} does not exist or is not a directory.")
    linked_logs = refuse_links("qhlab verify", root, tolerate=logger_leftover)
    extra = [Path(p).expanduser().absolute() for p in populations]
    roots = [root, *extra, Path(DEFAULT_POPULATION_ROOT).expanduser()]
    receipts, bound, temporary, all_files, population_dirs = [], set(), [], [], {}
    documents: list[tuple[Path, str, Receipt]] = []
    directories: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        if not _is_temporary(here.relative_to(root).as_posix()):
            directories.append(here)
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(root).as_posix()
            if _is_temporary(rel):
                temporary.append(rel)
                continue
            all_files.append(full)
            if name.endswith(RECEIPT_SUFFIX):
                documents.append((full, rel, read_receipt(full, Receipt, verify_files=False)))
    anchors = _anchors(root, directories)
    for full, rel, document in documents:
        located = [
            _locate_below(root, anchors, roots, full, section, name, entry)
            for section, name, entry in bindings(document)
        ]
        receipts.append(
            {"path": rel, "kind": document.kind, "schema_version": document.schema_version, "sha256": sha256_file(full)}
        )
        _refuse_unbound_in_sealed(root, full, rel, document, {Path(os.path.abspath(p)) for p in located}, all_files)
        bound.add(full)
        bound.update(Path(os.path.abspath(p)) for p in located)
        # Populations (inside or bound from outside) for label checks a layer up.
        for path in (full, *located):
            if (
                Path(path).name in ("population.receipt.json", "manifest.json")
                and (Path(path).parent / "population.receipt.json").is_file()
            ):
                population_dirs.setdefault(os.path.abspath(Path(path).parent), None)
    if not receipts:
        raise MissingEvidenceError(f"verify: {root} holds no *{RECEIPT_SUFFIX} file.")
    unbound = sorted(f.relative_to(root).as_posix() for f in all_files if f not in bound)
    # Every file is accounted for: an unbound one is named with its kind, and refused in a study.
    kinds = account_for_unbound("verify", str(root), unbound, (f.relative_to(root).as_posix() for f in all_files))
    bound_inside = sum(1 for f in all_files if f in bound)
    return {
        "receipts": receipts,
        "bound_files": bound_inside,
        "unbound_files": unbound,
        "unbound": kinds,
        "temporary_files": temporary,
        "linked_logs": linked_logs,
        "populations": list(population_dirs),
    }
