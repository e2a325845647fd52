"""Receipts: canonical JSON documents that bind the exact bytes a step used and made.

Owns: the receipt envelope (schema version, kind, producer, body, bound files, a digest of
its own content), writing it write-once, and authenticating it and every file it binds, where
the file is now (``authentication_roots``, ``locate_population``, ``at_or_moved``). Does not own:
what a body means (each step reads its own fields after authentication) or verifying a whole
directory (``verification``).

A receipt carries ``content_sha256``: the SHA-256 of the canonical JSON of every other
field. Any changed byte therefore changes either the content or the recorded digest, so an
edit that leaves valid JSON is still caught. A step that depends on another step's receipt
binds that receipt's file digest among its own inputs, which chains the evidence.

Evidence travels, and each bound file has exactly one place. A directory whose receipt records
where it was made (``ORIGIN_FIELD``: a study's freeze receipt) maps every absolute path made
there to one path inside it, wherever it was copied: a copy is judged on its own bytes, never
on the original's nor on a nested copy's. A file made outside every such directory (a
population) is authenticated at its recorded path, or, when it is gone, at
``ROOT/<population>/<file>`` below a population root.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from qhlab import __version__
from qhlab.evidence.canonical import canonical_json, read_json_object, sha256_bytes, sha256_file, to_jsonable
from qhlab.evidence.envelope import Receipt, receipt_model
from qhlab.evidence.errors import DigestMismatchError, EvidenceError, MissingEvidenceError, SchemaMismatchError
from qhlab.evidence.layout import MANIFEST, RECEIPT_SUFFIX
from qhlab.evidence.publish import TEMP_MARKER, publish_bytes

__all__ = [
    "DEFAULT_POPULATION_ROOT",
    "ORIGIN_FIELD",
    "SEALED_FIELD",
    "FileCopy",
    "at_or_moved",
    "authentication_roots",
    "bind_files",
    "bindings",
    "digest_or_none",
    "locate_population",
    "population_roots",
    "read_receipt",
    "recorded_origin",
    "write_receipt",
]

# Where populations are cached unless a config names another cache; ``verify_directory``
# always searches it for populations bound outside the verified directory.
DEFAULT_POPULATION_ROOT = "~/.cache/qhlab/populations"
# A population's manifest (``qhlab.scenes.manifest.MANIFEST``; this layer imports nothing
# above it). Its digest is the population's identity, so it is looked up first and names a
# missing population.
# A receipt body's field naming the absolute path of the directory the receipt was written in
# (``recorded_origin``); ``write_receipt`` refuses any other absolute path there.
ORIGIN_FIELD = "output"
# A receipt body may name directories beside it (relative, e.g. a study's copied arm sources) whose
# every file it binds: verify then refuses any file added there, not only a changed one.
SEALED_FIELD = "sealed_directories"


@dataclasses.dataclass(frozen=True)
class _Roots:
    """Where a command works (``directory``), where that directory was made (``original``: the
    absolute path its receipts name for files inside it; None when unknown) and the roots
    populations may have been copied to."""

    directory: Path
    original: Path | None
    populations: tuple[Path, ...]

    def mapped(self, target: Path) -> Path | None:
        """The working directory's own file for ``target`` recorded below ``original``, else None."""
        if self.original is None:
            return None
        try:
            return self.directory / target.relative_to(self.original)
        except ValueError:
            return None


_ROOTS: contextvars.ContextVar[_Roots | None] = contextvars.ContextVar("qhlab_roots", default=None)


@contextlib.contextmanager
def authentication_roots(
    directory: str | os.PathLike,
    populations: Sequence[str | os.PathLike] = (),
    *,
    original: str | os.PathLike | None = None,
) -> Iterator[None]:
    """Within this block, ``read_receipt`` judges ``directory`` on its own bytes.

    A file a receipt binds by absolute path below ``original`` (where ``directory`` was made,
    e.g. a study's recorded output) is authenticated at the same relative path in
    ``directory`` and only there: a copied study is judged on its own bytes, a file missing from
    the copy is missing, and an intact original (or a nested copy) never vouches for a changed
    copy. A file bound outside ``original`` (a population) is authenticated at its recorded
    path, or, when it is gone from there, found by digest below each of ``populations``
    (inherited from an enclosing block too) and ``DEFAULT_POPULATION_ROOT``.

    Args:
        directory: the directory a command works in (a study).
        populations: further roots populations were copied to (``--populations``).
        original: the absolute path ``directory`` had when its receipts were written; None:
            ``directory`` itself (nothing was moved).
    """
    outer = _ROOTS.get()
    extra = tuple(Path(p).expanduser().absolute() for p in populations)
    default = Path(DEFAULT_POPULATION_ROOT).expanduser()
    inherited = tuple(r for r in (outer.populations if outer else ()) if r not in extra and r != default)
    here = Path(os.path.abspath(directory))
    token = _ROOTS.set(_Roots(here, Path(original) if original is not None else here, (*extra, *inherited, default)))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def population_roots() -> tuple[Path, ...]:
    """The population roots of the enclosing ``authentication_roots`` (none outside one), to hand
    to a process that starts without them."""
    roots = _ROOTS.get()
    return roots.populations if roots else ()


def locate_population(recorded: str | os.PathLike, manifest_sha256: str) -> Path:
    """The directory that now holds the population a receipt bound at ``recorded`` by digest.

    Outside ``authentication_roots`` this is ``recorded``. Within, a population recorded inside
    the working directory's original is its own copy; otherwise ``recorded`` itself, then a copy
    below any population root whose manifest has the bound digest.

    Raises:
        MissingEvidenceError: within roots, no manifest with that digest is found (names the
            population, its digest and the roots; HINT: ``--populations ROOT``).
    """
    recorded = Path(recorded)
    roots = _ROOTS.get()
    if roots is None:
        return recorded
    manifest = recorded / MANIFEST
    own = roots.mapped(manifest)
    candidates = [own] if own is not None else [manifest, *_relocations(manifest, roots.populations)]
    for candidate in candidates:
        if candidate.is_file() and sha256_file(candidate) == manifest_sha256:
            return candidate.parent
    raise MissingEvidenceError(
        f"locate_population: population {recorded.name} (manifest sha256 {manifest_sha256}) not found at "
        f"{own or recorded} nor under {', '.join(map(str, roots.populations))}. HINT: pass the directory the "
        "populations were copied to with --populations ROOT."
    )


def _locate_in(roots: _Roots, path: Path, section: str, name: str, entry: dict) -> Path:
    """``_locate`` within ``authentication_roots``: own files by exact relative path, others by digest."""
    target = _resolve(path.parent, entry["path"])
    own = roots.mapped(target) if Path(entry["path"]).is_absolute() else None
    if own is not None:
        digest = sha256_file(own) if own.is_file() else None
        if digest == entry["sha256"]:
            return own
        if digest is None:
            raise MissingEvidenceError(
                f"read_receipt: {section} file {name!r} ({own}, this directory's copy of {target}) bound by {path} "
                "is missing. HINT: a copied study is judged on its own files; copy the study whole."
            )
        raise DigestMismatchError(
            f"read_receipt: {section} file {name!r} ({own}, this directory's copy of {target}) has sha256 {digest}; "
            f"{path} binds {entry['sha256']}. HINT: a published file is never edited."
        )
    return at_or_moved(path, section, name, entry, target, roots.populations, "read_receipt", "--populations ROOT")


def _reference(receipt_dir: Path, target: Path) -> str:
    target = Path(os.path.abspath(target))
    try:
        return target.relative_to(Path(os.path.abspath(receipt_dir))).as_posix()
    except ValueError:
        return target.as_posix()


@dataclasses.dataclass(frozen=True)
class FileCopy:
    """A file read from a byte-identical copy: digested at ``local``, bound as ``recorded``.

    A Ray worker reads the study's populations from copies in its own temporary directory
    (no shared filesystem); its receipts must name them where the driver knows them, or the
    driver could not authenticate what the worker returns. The binding stays honest because
    every reader re-hashes the file at ``recorded``: a copy that was not byte-identical fails
    there.

    Attributes:
        local: where the bytes were read.
        recorded: the path the receipt names (absolute; the original the copy was made from).
    """

    local: Path
    recorded: Path


def bind_files(receipt_dir: Path, files: Mapping[str, str | os.PathLike | FileCopy] | None) -> dict:
    """Digest each named file; paths inside ``receipt_dir`` are stored relative to it.

    A ``FileCopy`` is digested at its ``local`` path and bound under its ``recorded`` one.

    Returns:
        ``{name: {"path": str, "sha256": hex}}``.
    """
    bound = {}
    for name, file_path in sorted((files or {}).items()):
        if isinstance(file_path, FileCopy):
            if not Path(file_path.recorded).is_absolute():
                raise EvidenceError(
                    f"bind_files: {name!r} FileCopy.recorded={str(file_path.recorded)!r} must be absolute."
                )
            bound[name] = {
                "path": Path(os.path.abspath(file_path.recorded)).as_posix(),
                "sha256": sha256_file(file_path.local),
            }
            continue
        bound[name] = {"path": _reference(receipt_dir, Path(file_path)), "sha256": sha256_file(file_path)}
    return bound


def write_receipt(
    path: str | os.PathLike,
    record: type[Receipt],
    *,
    body: Mapping[str, Any],
    inputs: Mapping[str, str | os.PathLike | FileCopy] | None = None,
    outputs: Mapping[str, str | os.PathLike] | None = None,
) -> str:
    """Publish a receipt of kind ``record`` at ``path`` (write-once); return the SHA-256 of its bytes.

    The body is validated against ``record``'s body model before anything is written, so a
    receipt qhlab publishes is always one its reader accepts.

    Args:
        path: must end with ``.receipt.json``.
        record: the kind's model (beside its owner, e.g. ``qhlab.training.records.FitReceipt``); its kind and
            schema version are written.
        body: JSON-able facts of the step, in the layout of ``record``'s body.
        inputs: files the step read, by name; their digests are bound (a ``FileCopy`` under
            the path of the original it copies).
        outputs: files the step published, by name; their digests are bound.

    Raises:
        SchemaMismatchError: ``body`` is not in the layout of ``record`` (names the field).
        EvidenceError: a bad path, origin or output.
    """
    path = Path(path)
    if not path.name.endswith(RECEIPT_SUFFIX):
        raise EvidenceError(f"write_receipt: {path} must end with {RECEIPT_SUFFIX!r}.")
    if not (isinstance(record, type) and issubclass(record, Receipt) and record.KIND):
        raise EvidenceError(
            f"write_receipt: record={record!r} is not a receipt kind; allowed: a model of "
            "its owner, e.g. qhlab.training.records.FitReceipt."
        )
    plain = to_jsonable(dict(body))
    try:
        record.body_model().model_validate(plain)
    except ValidationError as exc:
        raise _shape_error("write_receipt", path, record, exc, prefix=("body",)) from None
    origin = plain.get(ORIGIN_FIELD)
    if (
        isinstance(origin, str)
        and Path(origin).is_absolute()
        and Path(os.path.abspath(origin)) != Path(os.path.abspath(path.parent))
    ):
        raise EvidenceError(
            f"write_receipt: {path} body {ORIGIN_FIELD}={origin!r} must be the directory the "
            f"receipt is written in ({os.path.abspath(path.parent)})."
        )
    if any(isinstance(f, FileCopy) for f in (outputs or {}).values()):
        raise EvidenceError(f"write_receipt: {path} outputs hold a FileCopy; an output is bound where it was written.")
    document = {
        "schema_version": record.SCHEMA_VERSION,
        "kind": record.KIND,
        "created_by": {"package": "qhlab", "version": __version__},
        "body": plain,
        "inputs": bind_files(path.parent, inputs),
        "outputs": bind_files(path.parent, outputs),
    }
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    data = canonical_json(document)
    publish_bytes(path, data)
    return sha256_bytes(data)


def _shape_error(
    call: str, path: Any, model: type, error: ValidationError, *, prefix: tuple[str, ...] = ()
) -> SchemaMismatchError:
    """One line naming the file, the first failing field (below ``prefix``), its value and what is
    allowed."""
    first = error.errors()[0]
    field = ".".join(str(p) for p in (*prefix, *first["loc"])) or "(document)"
    value = first.get("input")
    shown = "missing" if first["type"] == "missing" else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    more = error.error_count() - 1
    return SchemaMismatchError(
        f"{call}: {path} field {field} = {shown}: {first['msg']}; allowed: the layout of "
        f"{model.__name__}"
        + (f" ({more} more problem(s))" if more else "")
        + ". HINT: a receipt is written by qhlab and never edited; rerun the step that made it."
    )


def _resolve(receipt_dir: Path, reference: str) -> Path:
    ref = Path(reference)
    return ref if ref.is_absolute() else receipt_dir / ref


R = TypeVar("R", bound=Receipt)


def read_receipt(path: str | os.PathLike, record: type[R], *, verify_files: bool = True) -> R:
    """Authenticate a receipt and (by default) every file it binds; return it as its typed model.

    Args:
        path: the receipt file.
        record: the kind expected (e.g. ``qhlab.training.records.FitReceipt``), or
            ``Receipt`` for any registered kind (the model of the kind read is returned).
        verify_files: re-hash every bound input and output file.

    Raises:
        MissingEvidenceError: the receipt or a bound file is missing.
        SchemaMismatchError: an unknown or unexpected kind, a wrong schema version, or a field
            not in the kind's layout (each names the file, the field and the value).
        DigestMismatchError: the receipt's own content digest or a bound file's digest differs.
        EvidenceError: the bytes are not canonical JSON of a receipt.
    """
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise EvidenceError(
                f"read_receipt: receipt {path} is not a regular file (a FIFO, socket, device or "
                "directory). HINT: a receipt is a file qhlab published; remove this one."
            )
        raise MissingEvidenceError(f"read_receipt: receipt {path} does not exist.")
    raw, document = read_json_object(path, "read_receipt")
    try:
        canonical = canonical_json(document)
    except Exception as exc:  # noqa: BLE001 - any non-canonical content is an evidence failure
        raise EvidenceError(f"read_receipt: {path} holds a value with no canonical form ({exc}).") from None
    if canonical != raw:
        raise DigestMismatchError(f"read_receipt: {path} is not in canonical form (its bytes were edited).")
    claimed = document.get("content_sha256")
    actual = sha256_bytes(canonical_json({k: v for k, v in document.items() if k != "content_sha256"}))
    if claimed != actual:
        raise DigestMismatchError(
            f"read_receipt: {path} content digest {actual} differs from the recorded {claimed!r}."
        )
    try:
        model = receipt_model(document.get("kind"))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(f"read_receipt: {path} field {exc}") from None
    if record is not Receipt and model is not record:
        raise SchemaMismatchError(
            f"read_receipt: {path} field kind = {document['kind']!r}; allowed: {record.KIND!r} ({record.__name__})."
        )
    if document.get("schema_version") != model.SCHEMA_VERSION:
        raise SchemaMismatchError(
            f"read_receipt: {path} field schema_version = {document.get('schema_version')!r}; "
            f"allowed: {model.SCHEMA_VERSION} for kind {model.KIND!r}."
        )
    try:
        receipt = model.model_validate(document)
    except ValidationError as exc:
        raise _shape_error("read_receipt", path, model, exc) from None
    receipt.check_place(path)
    if verify_files:
        roots = _ROOTS.get()
        for section, name, entry in bindings(receipt):
            if roots is None:
                at_or_moved(path, section, name, entry, _resolve(path.parent, entry["path"]), None, "read_receipt", "")
            else:
                _locate_in(roots, path, section, name, entry)
        _check_sealed(path, receipt)
    return receipt


def _check_sealed(path: Path, receipt: Receipt) -> None:
    """Refuse a file that lies in a directory the receipt seals but that it does not bind (the same
    rule ``verify_directory`` applies to a whole tree, here for one receipt: status and steps)."""
    sealed = getattr(receipt.body, SEALED_FIELD, None) or []
    if not sealed:
        return
    bound = {os.path.normpath(entry["path"]) for _, _, entry in bindings(receipt)}
    for name in sealed:
        directory = path.parent / str(name)
        if not directory.is_dir():
            continue
        extra = sorted(
            rel
            for file in directory.rglob("*")
            if not file.is_dir() and (rel := os.path.normpath(file.relative_to(path.parent).as_posix())) not in bound
        )
        if extra:
            raise DigestMismatchError(
                f"read_receipt: {', '.join(extra[:5])} lie(s) in {name}/ beside {path}, which it seals but does "
                "not bind. HINT: a sealed directory holds exactly the files its receipt binds; remove what was added."
            )


def bindings(receipt: Receipt) -> Iterator[tuple[str, str, dict]]:
    """Every (section, name, entry) a receipt binds, each section's population manifests first (a
    missing population is then named as such, before any of its files)."""
    for section in ("inputs", "outputs"):
        bound = getattr(receipt, section)
        for name in sorted(bound, key=lambda n: (Path(bound[n].path).name != MANIFEST, n)):
            yield section, name, bound[name].model_dump()


def _relocations(recorded: Path, roots: Sequence[Path]) -> Iterator[Path]:
    """Where a population file bound at ``recorded`` is after its population was copied below a
    root: ``root/<population directory>/<file>``, one place per root.

    A population is copied whole, under its own (content-named) directory name, so that is the
    only place a root can hold it; no other tail of the recorded path is ever tried.
    """
    for root in roots:
        yield root / recorded.parent.name / recorded.name


def at_or_moved(
    path: Path, section: str, name: str, entry: dict, target: Path, roots: Sequence[Path] | None, call: str, option: str
) -> Path:
    """``target`` with the bound digest, or, when it is gone, a copy by digest under ``roots``."""
    digest = digest_or_none(target)
    if digest == entry["sha256"]:
        return target
    # Only a file that is gone may be found elsewhere: a file present at its recorded path with
    # other bytes was changed in place, and no intact copy anywhere vouches for it.
    if roots is not None and digest is None and Path(entry["path"]).is_absolute():
        for candidate in _relocations(target, roots):
            if digest_or_none(candidate) == entry["sha256"]:
                return candidate
        if target.name == MANIFEST:
            raise MissingEvidenceError(
                f"{call}: population {target.parent.name} (manifest sha256 {entry['sha256']}) bound by {path} "
                f"as {name!r} not found at {target.parent} nor under {', '.join(map(str, roots))}. HINT: pass "
                f"the directory the populations were copied to with {option}."
            )
    if digest is None:
        raise MissingEvidenceError(f"read_receipt: {section} file {name!r} ({target}) bound by {path} is missing.")
    raise DigestMismatchError(
        f"read_receipt: {section} file {name!r} ({target}) has sha256 {digest}; {path} binds {entry['sha256']}."
    )


def digest_or_none(path: Path) -> str | None:
    """The SHA-256 of the regular file at ``path``; None when there is none."""
    return sha256_file(path) if path.is_file() else None


def recorded_origin(directory: str | os.PathLike) -> Path | None:
    """Where ``directory`` was made, as a receipt directly in it records; None when none does.

    A receipt whose body holds ``ORIGIN_FIELD`` (a study's freeze receipt) names the absolute
    path of the directory it was written in; ``write_receipt`` refuses any other value. Every
    file below that directory was made at the same relative place below the recorded path, which
    is how receipts bind files of a directory they are not in (a report binds its cells' receipts
    by absolute path). The value is read without authentication: it only says where to look,
    and the receipt itself is authenticated like any other.

    Raises:
        EvidenceError: two receipts in ``directory`` record different origins.
    """
    directory = Path(directory)
    found: dict[str, Path] = {}
    try:
        names = sorted(
            p.name
            for p in directory.iterdir()
            if p.name.endswith(RECEIPT_SUFFIX) and TEMP_MARKER not in p.name and p.is_file() and not p.is_symlink()
        )
    except OSError:
        return None
    for name in names:
        try:
            value = json.loads((directory / name).read_text(encoding="utf-8"))["body"].get(ORIGIN_FIELD)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if isinstance(value, str) and Path(value).is_absolute():
            found[name] = Path(value)
    if len(set(found.values())) > 1:
        raise EvidenceError(
            f"verify: {directory} holds receipts that record different origins ("
            + ", ".join(f"{name}: {origin}" for name, origin in found.items())
            + "). HINT: one directory was made in one place; remove the receipt that was copied in."
        )
    return next(iter(found.values()), None)
