"""A forger's tools for the record tests: edit a record's copy, then reseal its receipt.

Owns: ``reseal`` (bind every file a receipt binds beside it as the file is now, and recompute the
receipt's own digest, as anyone who can write the directory can) and ``reshaped_copy`` (a copy of a
record directory whose record document was edited). Shared by the tests of the tuning, pilot, E0
check and replication records (``pythonpath = ["tests"]``). Does not own: what each test forges or
expects of ``qhlab verify``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from qhlab.evidence import canonical_json, sha256_bytes, sha256_file

__all__ = ["reseal", "reshaped_copy"]


def reseal(receipt: Path, body: Callable[[dict], None] | None = None) -> None:
    """Rebind every file ``receipt`` binds by a relative path as it is now, let ``body`` edit the
    body (None: keep it), and recompute the receipt's content digest."""
    document = json.loads(receipt.read_bytes())
    for section in ("inputs", "outputs"):
        for entry in document[section].values():
            if not Path(entry["path"]).is_absolute():
                entry["sha256"] = sha256_file(receipt.parent / entry["path"])
    if body is not None:
        body(document["body"])
    document.pop("content_sha256")
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    receipt.chmod(0o644)
    receipt.write_bytes(canonical_json(document))


def reshaped_copy(reference: Path, target: Path, record: str, reshape: Callable[[dict], None]) -> Path:
    """A copy of the record directory ``reference`` at ``target`` whose ``record`` (e.g.
    ``"tuning.json"``) ``reshape`` edited; its receipt is not resealed yet."""
    shutil.copytree(reference, target, symlinks=True)
    path = target / record
    document = json.loads(path.read_text())
    reshape(document)
    path.chmod(0o644)
    path.write_bytes(canonical_json(document))
    return target
