"""Tensor state files: safetensors bytes plus a JSON structure file, and the cold-init artifact.

Owns: writing and reading one tensor state (``<name>.safetensors`` write-once, with
``<name>.json`` beside it recording every tensor's dtype and shape, the digest of the
safetensors bytes and the caller's structure), and writing the cold-initialization artifact
(``cold_init.safetensors`` + ``cold_init.json`` + ``cold_init.receipt.json``).

Does not own: write-once publication, digests and receipts (``qhlab.evidence``), or
authenticating a cold-initialization lineage
(``qhlab.training.lineage.verified_cold_initialization_lineage``). Nothing here
unpickles: tensors are read with ``safetensors.torch.load`` from bytes already hashed.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _safetensors_load
from safetensors.torch import save_file as _safetensors_save_file

from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    MissingEvidenceError,
    PublishConflictError,
    QhInputError,
    SchemaMismatchError,
    canonical_json,
    input_error,
    publish_file,
    publish_json,
    require_instance,
    require_int,
    sha256_bytes,
    write_receipt,
)
from qhlab.evidence.layout import COLD_INIT_RECEIPT, COLD_INIT_STATE, COLD_INIT_STRUCTURE
from qhlab.training.records import ColdInitializationReceipt

__all__ = [
    "STRUCTURE_SCHEMA_VERSION",
    "load_tensor_state",
    "normalize_seed",
    "normalize_source_package_digest",
    "save_tensor_state",
    "structure_path",
    "write_cold_initialization",
]

STRUCTURE_SCHEMA_VERSION = 1

_HEX64 = re.compile(r"[0-9a-f]{64}")
_STRUCTURE_KEYS = frozenset({"schema_version", "format", "state_file", "state_sha256", "tensors", "structure"})


def structure_path(path: Path) -> Path:
    """Return the JSON structure file that sits beside the safetensors file ``path``."""
    return Path(path).with_suffix(".json")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_state_path(call: str, path: Path) -> Path:
    path = Path(path)
    if path.suffix != ".safetensors":
        raise input_error(
            call,
            "path",
            str(path),
            "a file name ending in '.safetensors'",
            "the structure file is written beside it with suffix '.json'.",
        )
    return path


def _os_error_of(exc: Exception, path: Path) -> OSError:
    """The ``OSError`` inside a ``SafetensorError`` (its ``os error N``), else EIO with its text."""
    found = re.search(r"(?:\bcode: |\bos error )(\d+)", str(exc))
    code = int(found.group(1)) if found else errno.EIO
    reason = os.strerror(code) if found else f"{os.strerror(code)}: {exc}"
    return OSError(code, reason, str(path))


def save_tensor_state(path: Path, tensors: dict[str, torch.Tensor], structure: dict) -> str:
    """Write a tensor state write-once and return the SHA-256 of its safetensors bytes.

    Args:
        path: Target ``*.safetensors`` file; neither it nor ``path.with_suffix(".json")`` may exist.
        tensors: Name -> tensor of any shape ``[*]`` and dtype, on any device (copied to CPU).
        structure: JSON-able description of what the tensors mean (optimizer param groups,
            step counts, ...); stored verbatim under ``"structure"`` in the JSON file.

    Returns:
        Hex SHA-256 of the published safetensors bytes (also recorded in the JSON file).

    Raises:
        QhInputError: a bad path, name, tensor or non-JSON-able structure; nothing written.
        PublishConflictError: either target already exists; nothing written.
    """
    call = "save_tensor_state"
    path = _check_state_path(call, path)
    json_path = structure_path(path)
    require_instance(
        call,
        "tensors",
        tensors,
        Mapping,
        allowed="a dict name -> torch.Tensor",
        hint="pass module.state_dict() or an explicit dict.",
    )
    require_instance(
        call,
        "structure",
        structure,
        Mapping,
        allowed="a JSON-able dict",
        hint="pass {} when there is nothing to describe.",
    )
    cpu_tensors: dict[str, torch.Tensor] = {}
    description: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise input_error(call, "tensor name", name, "a non-empty string", "use the parameter's qualified name.")
        require_instance(
            call,
            f"tensors[{name!r}]",
            tensor,
            torch.Tensor,
            allowed="torch.Tensor",
            hint="convert numbers with torch.tensor(...).",
        )
        # A private contiguous CPU copy: safetensors refuses views sharing one storage.
        cpu_tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
        description[name] = {"dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape)}
    try:
        canonical_json(dict(structure))
    except (TypeError, ValueError) as exc:
        raise QhInputError(
            f"{call}: structure is not allowed: {exc}; allowed: JSON values without NaN or "
            "Infinity. HINT: convert tensors to lists and numbers to int/float."
        ) from exc
    for target in (path, json_path):
        if target.exists():
            raise PublishConflictError(
                f"{call}: path={str(target)!r} already exists; allowed: a new path (write-once). "
                "HINT: choose a fresh output directory."
            )

    def _writer(tmp: Path) -> None:
        try:
            _safetensors_save_file(cpu_tensors, str(tmp))
        except SafetensorError as exc:
            # safetensors reports an OS failure as its own error ("... Os { code: 28, ...");
            # give it back as the OSError it is, so publish_file names the path and the OS error.
            raise _os_error_of(exc, tmp) from exc

    digest = publish_file(path, _writer)
    publish_json(
        json_path,
        {
            "schema_version": STRUCTURE_SCHEMA_VERSION,
            "format": "safetensors",
            "state_file": path.name,
            "state_sha256": digest,
            "tensors": description,
            "structure": dict(structure),
        },
    )
    return digest


def load_tensor_state(path: Path, *, expected_sha256: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Read and authenticate a tensor state written by :func:`save_tensor_state`.

    The file's bytes are read once, hashed, compared with ``expected_sha256`` (when given)
    and with the digest in the JSON structure file, and only then parsed by safetensors
    (never pickle). Every tensor's dtype and shape must equal the structure file's record,
    and the set of names must match exactly.

    Args:
        path: The ``*.safetensors`` file.
        expected_sha256: Hex digest the caller's receipt binds, or None.

    Returns:
        ``(tensors, structure)``: CPU tensors by name, and the caller's structure dict.

    Raises:
        MissingEvidenceError: the state or the structure file is missing.
        DigestMismatchError: the bytes differ from ``expected_sha256`` or the structure file.
        SchemaMismatchError: the structure file has another schema or dtype/shape differ.
        EvidenceError: the bytes are not a valid safetensors file.
    """
    call = "load_tensor_state"
    path = _check_state_path(call, path)
    json_path = structure_path(path)
    for target in (path, json_path):
        if not target.is_file():
            raise MissingEvidenceError(
                f"{call}: file {str(target)!r} does not exist. HINT: a tensor state is the pair "
                f"{path.name!r} + {json_path.name!r}; was it published completely?"
            )
    data = path.read_bytes()
    digest = sha256_bytes(data)
    if expected_sha256 is not None and digest != expected_sha256:
        raise DigestMismatchError(
            f"{call}: file {str(path)!r} has sha256={digest} but expected_sha256={expected_sha256}. "
            "HINT: the file was modified or the wrong file was named."
        )
    try:
        record = json.loads(json_path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaMismatchError(f"{call}: file {str(json_path)!r} is not valid JSON: {exc}.") from exc
    if (
        not isinstance(record, dict)
        or set(record) != _STRUCTURE_KEYS
        or record.get("schema_version") != STRUCTURE_SCHEMA_VERSION
        or record.get("format") != "safetensors"
        or not isinstance(record.get("tensors"), dict)
    ):
        raise SchemaMismatchError(
            f"{call}: file {str(json_path)!r} is not a schema_version={STRUCTURE_SCHEMA_VERSION} "
            f"tensor structure file (keys {sorted(_STRUCTURE_KEYS)}). HINT: write it with save_tensor_state."
        )
    if record["state_sha256"] != digest:
        raise DigestMismatchError(
            f"{call}: file {str(path)!r} has sha256={digest} but {json_path.name!r} records "
            f"state_sha256={record['state_sha256']}. HINT: the state file was modified after publication."
        )
    try:
        tensors = _safetensors_load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise EvidenceError(f"{call}: file {str(path)!r} is not a valid safetensors file: {exc}.") from exc
    recorded = record["tensors"]
    if set(tensors) != set(recorded):
        raise SchemaMismatchError(
            f"{call}: file {str(path)!r} holds tensors {sorted(tensors)} but {json_path.name!r} "
            f"records {sorted(recorded)}."
        )
    mismatches = []
    for name, tensor in tensors.items():
        actual = {"dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape)}
        if actual != recorded[name]:
            mismatches.append(f"{name}: file {actual}, recorded {recorded[name]}")
    if mismatches:
        raise SchemaMismatchError(
            f"{call}: file {str(path)!r} differs from {json_path.name!r}: " + "; ".join(mismatches)
        )
    return tensors, record["structure"]


def normalize_seed(call: str, seed: Any) -> int:
    """Return ``seed`` if it is a non-negative int (not bool); raise QhInputError otherwise."""
    return require_int(call, "seed", seed, minimum=0, hint="pass the recipe's integer seed.")


def normalize_source_package_digest(call: str, digest: Any) -> str:
    """Return the hex source-package digest from a hex string or ``source_package_digest()`` dict."""
    value = digest.get("sha256") if isinstance(digest, Mapping) else digest
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise input_error(
            call,
            "source_package_digest",
            digest,
            "a 64-character lowercase hex SHA-256 or the dict from qhlab.evidence.source_package_digest()",
            "pass source_package_digest()['sha256'].",
        )
    return value


def write_cold_initialization(
    directory: Path,
    tensors: dict[str, torch.Tensor],
    *,
    seed: int,
    source_package_digest: str | Mapping[str, Any],
    structure: dict,
) -> Path:
    """Publish the cold-initialization artifact of one fit lineage.

    Layout inside ``directory`` (created if missing; the three files must not exist)::

        cold_init.safetensors    the initial tensors (write-once)
        cold_init.json           dtype/shape per tensor, state digest, caller structure
        cold_init.receipt.json   kind "cold_initialization", body {seed, source_package_digest,
                                 state_sha256, tensor_count}, outputs binding both files

    Args:
        directory: Directory receiving the three files.
        tensors: Name -> initial tensor (e.g. the freshly built scorer's state_dict()).
        seed: The seed that produced ``tensors`` (int >= 0).
        source_package_digest: Hex digest (or ``source_package_digest()`` dict) of the
            package source that built the model.
        structure: JSON-able description stored in ``cold_init.json``.

    Returns:
        Path of ``cold_init.safetensors``; pass it to ``verified_cold_initialization_lineage``.
    """
    call = "write_cold_initialization"
    seed = normalize_seed(call, seed)
    source_digest = normalize_source_package_digest(call, source_package_digest)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise input_error(call, "directory", str(directory), "a directory path", "it names a file.")
    for name in (COLD_INIT_STATE, COLD_INIT_STRUCTURE, COLD_INIT_RECEIPT):
        if (directory / name).exists():
            raise PublishConflictError(
                f"{call}: path={str(directory / name)!r} already exists; allowed: a directory "
                "without a cold-initialization artifact (write-once). HINT: one lineage has one cold state."
            )
    directory.mkdir(parents=True, exist_ok=True)
    state = directory / COLD_INIT_STATE
    digest = save_tensor_state(state, tensors, structure)
    write_receipt(
        directory / COLD_INIT_RECEIPT,
        ColdInitializationReceipt,
        body={
            "seed": seed,
            "source_package_digest": source_digest,
            "state_sha256": digest,
            "tensor_count": len(tensors),
        },
        inputs=None,
        outputs={"state": state, "structure": structure_path(state)},
    )
    return state
