"""One write-once segment directory: its file names and receipt kinds, and resuming from it.

Owns: the names inside ``OUTPUT/<cell>/<local_attempt_id>/`` that the launcher publishes
(final state, fit and W&B receipts, segment checkpoints) and their receipt kinds, and
authenticating an interrupted segment to continue from (:func:`load_resume_state`, which
returns a :class:`ResumeState`).

Does not own: writing checkpoints (``qhlab.training.callbacks``), the cold-init lineage check
(``qhlab.training.lineage``), tensor files (``qhlab.training.tensor_state``), or receipts
(``qhlab.evidence``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from qhlab.evidence import EvidenceError, MissingEvidenceError, QhInputError, input_error, read_receipt
from qhlab.training.lineage import lineage_record, verified_cold_initialization_lineage
from qhlab.training.tensor_state import COLD_INIT_STATE, load_tensor_state

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_SCHEMA_VERSION",
    "FINAL_STATE",
    "FIT_KIND",
    "FIT_RECEIPT",
    "FIT_SCHEMA_VERSION",
    "WANDB_RECEIPT",
    "ResumeState",
    "checkpoint_state_path",
    "load_resume_state",
]

FIT_KIND = "fit"
FIT_SCHEMA_VERSION = 1
CHECKPOINT_KIND = "segment_checkpoint"
CHECKPOINT_SCHEMA_VERSION = 1
FINAL_STATE = "final_state.safetensors"
FIT_RECEIPT = "fit.receipt.json"
WANDB_RECEIPT = "wandb_attempt.receipt.json"
_CHECKPOINT_RE = re.compile(r"^segment_checkpoint_u(\d{8})\.receipt\.json$")


def checkpoint_state_path(directory: Path, observed_updates: int) -> Path:
    """``directory / "segment_checkpoint_u<NNNNNNNN>.safetensors"`` for a count of updates."""
    return Path(directory) / f"segment_checkpoint_u{observed_updates:08d}.safetensors"


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """The authenticated state a new segment continues from.

    Attributes:
        previous_local_attempt_id: the segment that wrote the state.
        previous_directory: its directory.
        cold_init: its (lineage-verified) ``cold_init.safetensors``.
        lineage: what ``verified_cold_initialization_lineage`` returned (JSON-able).
        state_path: the segment checkpoint loaded.
        state_sha256: digest of its bytes.
        start_updates: observed updates in the state.
        logical_run_id: logical run recorded by the previous segment.
        recipe_digest: recipe digest recorded by the previous segment.
        tensors: CPU tensors (module state + ``optim.*``).
        structure: the checkpoint's structure JSON.
    """

    previous_local_attempt_id: str
    previous_directory: Path
    cold_init: Path
    lineage: dict
    state_path: Path
    state_sha256: str
    start_updates: int
    logical_run_id: str | None
    recipe_digest: str
    tensors: dict
    structure: dict


def load_resume_state(previous_directory: Path, *, seed: int, source_package_digest: str, recipe_digest: str) -> ResumeState:
    """Authenticate a previous segment and return its newest segment checkpoint.

    Order of checks: the previous segment exists and has no final state (a finished fit is
    never continued); its cold initialization verifies for ``seed`` and
    ``source_package_digest``; its newest checkpoint receipt and state authenticate; the
    checkpoint was written for ``recipe_digest``.

    Raises:
        QhInputError / EvidenceError: any of the above fails; nothing is written.
    """
    previous = Path(previous_directory)
    if not previous.is_dir():
        raise MissingEvidenceError(
            f"resume: segment directory {str(previous)!r} does not exist. HINT: pass the local_attempt_id "
            "of an earlier segment of this cell (a directory name under OUTPUT/<cell>/)."
        )
    if (previous / FINAL_STATE).exists() or (previous / FIT_RECEIPT).exists():
        raise QhInputError(
            f"resume: segment {previous.name!r} already finished (it has {FINAL_STATE}); allowed: an interrupted "
            "segment. HINT: a finished fit is never continued; start a new cell instead."
        )
    lineage = verified_cold_initialization_lineage(
        previous / COLD_INIT_STATE, source_package_digest=source_package_digest, seed=seed
    )
    receipts = sorted(
        (int(m.group(1)), p) for p in previous.iterdir() if (m := _CHECKPOINT_RE.match(p.name))
    )
    if not receipts:
        raise MissingEvidenceError(
            f"resume: segment {previous.name!r} has no segment checkpoint receipt. HINT: it stopped before its "
            "first checkpoint; start a new fit."
        )
    updates, receipt_path = receipts[-1]
    document = read_receipt(receipt_path, kind=CHECKPOINT_KIND, schema_version=CHECKPOINT_SCHEMA_VERSION)
    body = document["body"]
    if body.get("observed_updates") != updates:
        raise EvidenceError(
            f"resume: {receipt_path} records observed_updates={body.get('observed_updates')!r} but its name says {updates}."
        )
    if body.get("recipe_digest") != recipe_digest:
        raise input_error(
            "resume", "recipe_digest", recipe_digest,
            f"{body.get('recipe_digest')!r} (the recipe of segment {previous.name!r})",
            "resume with the same recipe and profile.",
        )
    state_path = checkpoint_state_path(previous, updates)
    tensors, structure = load_tensor_state(state_path, expected_sha256=body["state_sha256"])
    return ResumeState(
        previous_local_attempt_id=previous.name,
        previous_directory=previous,
        cold_init=previous / COLD_INIT_STATE,
        lineage=lineage_record(lineage),
        state_path=state_path,
        state_sha256=body["state_sha256"],
        start_updates=updates,
        logical_run_id=body.get("logical_run_id"),
        recipe_digest=recipe_digest,
        tensors=tensors,
        structure=structure,
    )
