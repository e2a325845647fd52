"""Torch-free evidence layer: errors, canonical JSON, digests, write-once files, receipts, locks.

Every other qhlab layer writes and checks evidence through this package only. It imports
the standard library and nothing heavier, so it is safe to use anywhere, including in a
verifier that has no torch.
"""

from qhlab.evidence.canonical import (
    canonical_json,
    sha256_bytes,
    sha256_file,
    sha256_tree,
    to_jsonable,
    tree_manifest,
)
from qhlab.evidence.errors import (
    DigestMismatchError,
    EvidenceError,
    LockHeldError,
    MissingEvidenceError,
    OrderError,
    PublishConflictError,
    QhError,
    QhInputError,
    SchemaMismatchError,
    input_error,
    require_int,
    require_number,
)
from qhlab.evidence.layout import RECEIPT_SUFFIX
from qhlab.evidence.publish import (
    fresh_directory,
    publish_bytes,
    publish_directory,
    publish_file,
    publish_json,
    safe_component,
)
from qhlab.evidence.receipts import (
    FileCopy,
    authentication_roots,
    bind_files,
    locate_population,
    population_roots,
    read_receipt,
    recorded_origin,
    verify_directory,
    write_receipt,
)
from qhlab.evidence.source import exclusive_lock, source_package_digest
from qhlab.evidence.tree import refuse_links

__all__ = [
    "QhError",
    "QhInputError",
    "EvidenceError",
    "DigestMismatchError",
    "SchemaMismatchError",
    "MissingEvidenceError",
    "PublishConflictError",
    "OrderError",
    "LockHeldError",
    "input_error",
    "require_int",
    "require_number",
    "canonical_json",
    "to_jsonable",
    "sha256_bytes",
    "sha256_file",
    "sha256_tree",
    "tree_manifest",
    "publish_bytes",
    "publish_json",
    "publish_file",
    "publish_directory",
    "fresh_directory",
    "safe_component",
    "RECEIPT_SUFFIX",
    "FileCopy",
    "bind_files",
    "authentication_roots",
    "locate_population",
    "population_roots",
    "write_receipt",
    "read_receipt",
    "recorded_origin",
    "verify_directory",
    "source_package_digest",
    "exclusive_lock",
    "refuse_links",
]
