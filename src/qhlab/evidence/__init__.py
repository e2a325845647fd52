"""Torch-free evidence layer: errors, canonical JSON, digests, write-once files, receipts, locks.

Every other qhlab layer writes and checks evidence through this package only. It imports
the standard library and nothing heavier, so it is safe to use anywhere, including in a
verifier that has no torch.
"""

from qhlab.evidence import errors
from qhlab.evidence.canonical import (
    canonical_json,
    differing_keys,
    sha256_bytes,
    sha256_file,
    sha256_tree,
    to_jsonable,
    tree_manifest,
)

# Every layer speaks the error vocabulary: the package exports all of it (``errors.__all__``).
from qhlab.evidence.errors import *  # noqa: F403
from qhlab.evidence.layout import RECEIPT_SUFFIX
from qhlab.evidence.model_errors import validation_error
from qhlab.evidence.publish import (
    file_in_the_way,
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
    write_receipt,
)
from qhlab.evidence.source import exclusive_lock, source_package_digest
from qhlab.evidence.tree import refuse_links
from qhlab.evidence.verification import verify_directory

__all__ = [
    *errors.__all__,
    "RECEIPT_SUFFIX",
    "FileCopy",
    "authentication_roots",
    "bind_files",
    "canonical_json",
    "differing_keys",
    "exclusive_lock",
    "file_in_the_way",
    "fresh_directory",
    "locate_population",
    "population_roots",
    "publish_bytes",
    "publish_directory",
    "publish_file",
    "publish_json",
    "read_receipt",
    "recorded_origin",
    "refuse_links",
    "safe_component",
    "sha256_bytes",
    "sha256_file",
    "sha256_tree",
    "source_package_digest",
    "to_jsonable",
    "tree_manifest",
    "validation_error",
    "verify_directory",
    "write_receipt",
]
