"""Cold-initialization lineage: authenticate the cold state a (resumed) fit lineage started from.

Owns: ``verified_cold_initialization_lineage`` and its record
``ColdInitializationLineage``, carrying a verified cold-init artifact into a new segment
directory (``copy_cold_initialization``) and the host-independent form a receipt binds
(``lineage_record``).

Does not own: the tensor file format or writing the cold-init artifact
(``qhlab.training.tensor_state``), receipts and digests (``qhlab.evidence``), or choosing
which segment to resume (``qhlab.training.segments``). The public API path
``qhlab.training.execution_profile`` re-exports its public names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    MissingEvidenceError,
    SchemaMismatchError,
    input_error,
    publish_bytes,
    read_receipt,
    sha256_file,
)
from qhlab.evidence.layout import COLD_INIT_RECEIPT, COLD_INIT_STATE, COLD_INIT_STRUCTURE
from qhlab.training.records import ColdInitializationReceipt
from qhlab.training.tensor_state import (
    load_tensor_state,
    normalize_seed,
    normalize_source_package_digest,
    structure_path,
)

__all__ = [
    "ColdInitializationLineage",
    "copy_cold_initialization",
    "lineage_record",
    "verified_cold_initialization_lineage",
]


@dataclasses.dataclass(frozen=True)
class ColdInitializationLineage:
    """The authenticated cold state a (possibly resumed) fit lineage started from."""

    path: Path
    sha256: str
    seed: int
    source_package_digest: str
    receipt_path: Path


def verified_cold_initialization_lineage(
    path: Path, *, source_package_digest: str | Mapping[str, Any], seed: int
) -> ColdInitializationLineage:
    """Verify the original cold-state artifact used by a resumed fit lineage.

    Args:
        path: ``cold_init.safetensors`` (or the directory holding it), written by
            ``qhlab.training.tensor_state.write_cold_initialization``.
        source_package_digest: Expected hex digest (or ``source_package_digest()`` dict).
        seed: Expected seed.

    Returns:
        The frozen lineage record.

    Raises:
        MissingEvidenceError: the state, structure or receipt file is missing.
        DigestMismatchError: a byte of the state or structure file changed.
        EvidenceError: the receipt records another seed or source digest, or another file.
    """
    call = "verified_cold_initialization_lineage"
    seed = normalize_seed(call, seed)
    expected_source = normalize_source_package_digest(call, source_package_digest)
    path = Path(path)
    if path.is_dir():
        path = path / COLD_INIT_STATE
    if path.name != COLD_INIT_STATE:
        raise input_error(
            call,
            "path",
            str(path),
            f"a {COLD_INIT_STATE!r} file or its directory",
            "pass the cold_init.safetensors of the lineage's first segment.",
        )
    receipt_path = path.parent / COLD_INIT_RECEIPT
    for target in (path, receipt_path):
        if not target.is_file():
            raise MissingEvidenceError(
                f"{call}: file {str(target)!r} does not exist. HINT: a cold-initialization artifact is "
                f"{COLD_INIT_STATE}, cold_init.json and {COLD_INIT_RECEIPT} in one directory."
            )
    receipt = read_receipt(receipt_path, ColdInitializationReceipt)
    body, outputs = receipt.body, receipt.outputs
    if body.seed != seed:
        raise EvidenceError(
            f"{call}: file {str(receipt_path)!r} records seed={body.seed!r} but the lineage expects "
            f"seed={seed}. HINT: a resumed fit must reuse its original seed."
        )
    if body.source_package_digest != expected_source:
        raise EvidenceError(
            f"{call}: file {str(receipt_path)!r} records source_package_digest={body.source_package_digest!r} "
            f"but the lineage expects {expected_source}. HINT: the cold state was built by other source."
        )
    state_entry, structure_entry = outputs.get("state"), outputs.get("structure")
    if (
        state_entry is None
        or structure_entry is None
        or state_entry.path != COLD_INIT_STATE
        or structure_entry.path != structure_path(path).name
    ):
        raise SchemaMismatchError(
            f"{call}: file {str(receipt_path)!r} does not bind {COLD_INIT_STATE} and cold_init.json."
        )
    digest = state_entry.sha256
    if digest != body.state_sha256 or sha256_file(path) != digest:
        raise DigestMismatchError(f"{call}: file {str(path)!r} does not match the digest its receipt binds.")
    # Parse the state (safetensors, no pickle) so dtype/shape agree with cold_init.json.
    load_tensor_state(path, expected_sha256=digest)
    return ColdInitializationLineage(
        path=path, sha256=digest, seed=seed, source_package_digest=expected_source, receipt_path=receipt_path
    )


def lineage_record(lineage: ColdInitializationLineage) -> dict[str, Any]:
    """The JSON record of a verified lineage that fit and resume receipts bind.

    Paths stay out of receipts (they are host-specific); the file name and digests identify
    the lineage.
    """
    return {
        "cold_init": Path(lineage.path).name,
        "sha256": lineage.sha256,
        "seed": lineage.seed,
        "source_package_digest": lineage.source_package_digest,
    }


def copy_cold_initialization(source_dir: Path, directory: Path) -> Path:
    """Publish the cold-init artifact of ``source_dir`` write-once into ``directory``.

    Copies ``cold_init.safetensors``, ``cold_init.json`` and ``cold_init.receipt.json`` byte
    for byte, so a resumed segment carries its lineage's cold state; verify the copy with
    :func:`verified_cold_initialization_lineage`.

    Returns:
        The new ``directory / "cold_init.safetensors"``.
    """
    for name in (COLD_INIT_STATE, COLD_INIT_STRUCTURE, COLD_INIT_RECEIPT):
        publish_bytes(directory / name, (source_dir / name).read_bytes())
    return directory / COLD_INIT_STATE
