"""The receipt kinds of a fit: the fit itself, its segment checkpoints, its cold state, its W&B run.

Owns: the body model of each kind the launcher writes (``fit``, ``segment_checkpoint``,
``cold_initialization``, ``wandb_attempt``), each registered by its kind when defined, and the
fit body's fields a caller may add (``FIT_CALLER_FIELDS``). Torch-free, so that ``qhlab verify``
reads them. Does not own: the envelope, the registry or authentication (``qhlab.evidence``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from qhlab.evidence.canonical import canonical_json, sha256_bytes
from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt

__all__ = [
    "FIT_CALLER_FIELDS",
    "ColdInitializationBody",
    "ColdInitializationReceipt",
    "FitBody",
    "FitReceipt",
    "SegmentCheckpointBody",
    "SegmentCheckpointReceipt",
    "WandbAttemptBody",
    "WandbAttemptReceipt",
    "train_rows_record",
]


class FitBody(Closed):
    """What a fit ran and made (written by the launcher; a caller may add the last three).

    Attributes:
        recipe: the recipe as run. recipe_digest: its digest. profile: the execution profile.
        runtime: versions and devices. update_budget, observed_updates: planned and observed
        optimizer updates (observed_updates_source says where they were read). global_step:
        Lightning's step. torch_num_threads: CPU threads. segment_start_updates: where this
        segment began. seed: the training seed. source_package: the code's digest. memory,
        memory_accounting: the lane's memory evidence. lane_checks: the lane's admission
        checks. execution: where it ran. wandb: the run identity. local_attempt_id,
        logical_run_id: the attempt. lineage: the cold state and continuations.
        segment_checkpoints: updates at which checkpoints were written. final_state_sha256,
        cold_init_sha256: the end and start states. wall_seconds: elapsed time.
        train_rows, scorer, study, target_values: the caller's fields (which TRAIN rows, the
        scorer's layout, the study cell, whether the target's successor values were kept as a
        table), absent for a bare fit.
    """

    recipe: Json
    recipe_digest: str
    profile: str
    runtime: Json
    update_budget: int
    observed_updates: int
    observed_updates_source: str
    global_step: int
    torch_num_threads: int
    segment_start_updates: int
    seed: int
    source_package: Json
    memory: Json
    memory_accounting: Json
    lane_checks: Json
    execution: Json
    wandb: Json
    local_attempt_id: str
    logical_run_id: str
    lineage: Json
    segment_checkpoints: list[int]
    final_state_sha256: str = Field(pattern=SHA256)
    cold_init_sha256: str = Field(pattern=SHA256)
    wall_seconds: float
    train_rows: Json | None = None
    scorer: Json | None = None
    study: Json | None = None
    target_values: Json | None = None


class FitReceipt(Receipt, kind="fit", version=1):
    """``fit.receipt.json``: one finished fit."""

    body: FitBody


# Body fields of a fit that the launcher writes itself; a caller's receipt_fields may add only others.
FIT_CALLER_FIELDS = frozenset({"train_rows", "scorer", "study", "target_values"})


class SegmentCheckpointBody(Closed):
    """One periodic or interrupt checkpoint of a fit.

    Attributes:
        cold_init_sha256, local_attempt_id, logical_run_id, recipe_digest, seed: the fit it
        belongs to. observed_updates: where it was taken. reason: ``periodic`` or
        ``interrupt``. state_sha256: the state's digest.
    """

    cold_init_sha256: str = Field(pattern=SHA256)
    local_attempt_id: str
    logical_run_id: str
    recipe_digest: str
    seed: int
    observed_updates: int
    reason: Literal["periodic", "interrupt"]
    state_sha256: str = Field(pattern=SHA256)


class SegmentCheckpointReceipt(Receipt, kind="segment_checkpoint", version=1):
    """``checkpoints/updates-N.receipt.json``."""

    body: SegmentCheckpointBody


class ColdInitializationBody(Closed):
    """The seeded initial state of a lineage.

    Attributes:
        seed: the seed. source_package_digest: the code that made it. state_sha256: its digest.
        tensor_count: how many tensors it holds.
    """

    seed: int
    source_package_digest: str
    state_sha256: str = Field(pattern=SHA256)
    tensor_count: int


class ColdInitializationReceipt(Receipt, kind="cold_initialization", version=1):
    """``cold_init.receipt.json``."""

    body: ColdInitializationBody


class WandbAttemptBody(Closed):
    """What a fit published to W&B.

    Attributes:
        attempt: the run identity. files: digests of the files logged. metrics: the summary.
        links: the logical run. publication: offline or online, and where.
    """

    attempt: Json
    files: Json
    metrics: Json
    links: Json
    publication: Json


class WandbAttemptReceipt(Receipt, kind="wandb_attempt", version=1):
    """``wandb.receipt.json``."""

    body: WandbAttemptBody


def train_rows_record(train_digest: str, rows: Sequence[int] | None) -> dict:
    """Which TRAIN rows a fit trained on: ``{"rows": sorted row indices of the loaded TRAIN or None (all),
    "sha256": digest of (TRAIN manifest digest, rows)}``; adoption compares it."""
    listed = None if rows is None else sorted(int(r) for r in rows)
    return {
        "rows": listed,
        "sha256": sha256_bytes(canonical_json({"train_manifest_sha256": train_digest, "rows": listed})),
    }
