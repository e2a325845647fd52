"""Canonical JSON and SHA-256 digests of bytes, files and directory trees.

Owns: the one byte form of every qhlab JSON document and every digest, and ``differing_keys``
(where two records disagree, as every refusal that compares them names it) and
``read_json_object`` (a published JSON document's bytes and object). Does not own:
where documents are written (``publish``) or what they mean (``receipts``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qhlab.evidence.errors import EvidenceError, MissingEvidenceError, QhInputError

__all__ = [
    "canonical_json",
    "differing_keys",
    "read_json_object",
    "sha256_bytes",
    "sha256_file",
    "sha256_tree",
    "to_jsonable",
    "tree_manifest",
]

_CHUNK = 1 << 20


def to_jsonable(obj: Any, *, _where: str = "$") -> Any:
    """Return ``obj`` as plain JSON types, refusing anything that has no exact JSON form.

    Accepts dict (str keys), list, tuple, str, int, bool, None, finite float, and numpy
    scalars (through ``.item()``). ``pathlib.Path`` becomes its POSIX string.

    Raises:
        QhInputError: naming the JSON path of a NaN/Infinity or an unsupported type.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise QhInputError(
                f"canonical_json: value at {_where} is {obj!r}; allowed: finite numbers only. "
                "HINT: receipts never carry NaN or Infinity; report a missing value as null."
            )
        return obj
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise QhInputError(
                    f"canonical_json: key {key!r} at {_where} is a {type(key).__name__}; allowed: str keys only."
                )
            out[key] = to_jsonable(value, _where=f"{_where}.{key}")
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, _where=f"{_where}[{i}]") for i, v in enumerate(obj)]
    item = getattr(obj, "item", None)
    if type(obj).__module__ == "numpy" and callable(item):
        return to_jsonable(item(), _where=_where)
    raise QhInputError(
        f"canonical_json: value at {_where} has type {type(obj).__name__}; allowed: dict, list, "
        "str, int, finite float, bool, None. HINT: convert tensors/arrays to lists first."
    )


def canonical_json(obj: Any) -> bytes:
    """Serialize ``obj`` to qhlab's canonical JSON bytes.

    UTF-8, sorted keys, two-space indentation, no NaN/Infinity, trailing newline. Two equal
    documents always give the same bytes, so their SHA-256 identifies them.
    """
    text = json.dumps(to_jsonable(obj), sort_keys=True, ensure_ascii=False, allow_nan=False, indent=2)
    return (text + "\n").encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's exact bytes.

    Raises:
        MissingEvidenceError: naming the path when it is absent or not a regular file.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingEvidenceError(f"sha256_file: {path} does not exist or is not a file.")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_excluded(rel: str, exclude: Iterable[str]) -> bool:
    parts = rel.split("/")
    return any(rel == e or rel.startswith(e.rstrip("/") + "/") or e in parts for e in exclude)


def tree_manifest(directory: str | os.PathLike, *, exclude: Iterable[str] = ()) -> dict[str, str]:
    """Map each regular file below ``directory`` (relative POSIX path) to its SHA-256.

    Args:
        directory: root of the tree.
        exclude: relative paths, directory prefixes or path components to leave out.
    """
    root = Path(directory)
    if not root.is_dir():
        raise MissingEvidenceError(f"tree_manifest: {root} does not exist or is not a directory.")
    exclude = tuple(exclude)
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink() or _is_excluded(rel, exclude):
                continue
            out[rel] = sha256_file(full)
    return dict(sorted(out.items()))


def sha256_tree(directory: str | os.PathLike, *, exclude: Iterable[str] = ()) -> str:
    """One SHA-256 over the sorted (relative path, file digest) pairs of a tree."""
    lines = "".join(f"{rel}\0{digest}\n" for rel, digest in tree_manifest(directory, exclude=exclude).items())
    return sha256_bytes(lines.encode("utf-8"))


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ between two mappings (a key only one has included), sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def dotted(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"outer.inner": leaf}`` (an empty mapping is a leaf), so a message or a
    table can name the one field that differs."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(dotted(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def read_json_object(path: Path, call: str) -> tuple[bytes, dict]:
    """A JSON document that must be one object: (its exact bytes, the object).

    Raises:
        EvidenceError: the bytes are not UTF-8 JSON, or hold something other than an object.
    """
    raw = path.read_bytes()
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{call}: {path} is not valid UTF-8 JSON ({exc}).") from None
    if not isinstance(document, dict):
        raise EvidenceError(f"{call}: {path} holds a {type(document).__name__}; allowed: a JSON object.")
    return raw, document
