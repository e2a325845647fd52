"""The receipt kinds of the science core: a fit's evaluation and the commissioning gates.

Owns: the body models of ``evaluation`` (a final state scored on a population),
``commissioning_run``, ``commissioning_milestone`` and ``mps_memory_observation``, each registered
by its kind when defined. Torch-free. Does not own: computing them (``evaluation``, ``fit``,
``diagnostics``) or authentication (``qhlab.evidence``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt

__all__ = [
    "CommissioningMilestoneBody",
    "CommissioningMilestoneReceipt",
    "CommissioningRunBody",
    "CommissioningRunReceipt",
    "EvaluationBody",
    "EvaluationReceipt",
    "MpsMemoryBody",
    "MpsMemoryReceipt",
]


class EvaluationBody(Closed):
    """A final state scored on a validation population.

    Attributes:
        horizon: H. weighting: how horizons are weighted. tie_band: the tie band. mae, regret:
        per horizon, shape [H]. mae_primary, regret_primary: at H. counts: scenes and rows.
        per_scene: per-scene arrays, shape [n_scenes][H]. population: its name and digest.
        final_state_sha256: the state scored. curve: the validation curve at observed
        updates, when one was recorded.
    """

    horizon: int
    weighting: str
    tie_band: float
    mae: list[float]
    regret: list[float]
    mae_primary: float
    regret_primary: float
    counts: Json
    per_scene: Json
    population: Json
    final_state_sha256: str = Field(pattern=SHA256)
    curve: list[Json] | None = None


class EvaluationReceipt(Receipt, kind="evaluation", version=1):
    """``evaluation.receipt.json``."""

    body: EvaluationBody


class CommissioningRunBody(Closed):
    """A commissioning run's gates.

    Attributes:
        profile, expected_device, context_ids: the lane. recipe_sha256, fit_recipe_sha256,
        recipe_updates, engineering_updates, update_budget, observed_updates: what ran.
        milestones: each gate's milestone. final_state_sha256: the end state. evaluated:
        whether it was scored. max_allocated_bytes: the memory limit.
    """

    profile: str
    expected_device: str
    context_ids: list[Any]
    recipe_sha256: str
    fit_recipe_sha256: str
    recipe_updates: int
    engineering_updates: int
    update_budget: str
    observed_updates: int
    milestones: list[Any]
    final_state_sha256: str = Field(pattern=SHA256)
    evaluated: bool
    max_allocated_bytes: int | None


class CommissioningRunReceipt(Receipt, kind="commissioning_run", version=1):
    """``commission.receipt.json``."""

    body: CommissioningRunBody


class CommissioningMilestoneBody(Closed):
    """One engineering gate at an observed optimizer update.

    Attributes:
        schema_version: the milestone layout. successful_optimizer_updates: where.
        engineering_budget: the budget. expected_device, context_ids: the lane.
        optimizer_evidence: the optimizer's step counters. state_filename, state_sha256: the
        state. strict_reload: reload check. memory_observation: MPS memory, when sampled.
    """

    schema_version: int
    successful_optimizer_updates: int
    engineering_budget: Json
    expected_device: str
    context_ids: list[Any]
    optimizer_evidence: Json
    state_filename: str
    state_sha256: str = Field(pattern=SHA256)
    strict_reload: bool
    memory_observation: Json | None


class CommissioningMilestoneReceipt(Receipt, kind="commissioning_milestone", version=1):
    """``milestones/…receipt.json``."""

    body: CommissioningMilestoneBody


class MpsMemoryBody(Closed):
    """An MPS memory observation.

    Attributes:
        schema_version: the observation layout. sampling_scope: what was sampled.
        sample_count: how many samples. current_allocated_bytes, driver_allocated_bytes,
        max_allocated_bytes, max_sampled_current_allocated_bytes,
        max_sampled_driver_allocated_bytes: bytes. within_live_tensor_budget: the verdict.
    """

    schema_version: int
    sampling_scope: str
    sample_count: int
    current_allocated_bytes: int
    driver_allocated_bytes: int
    max_allocated_bytes: int
    max_sampled_current_allocated_bytes: int
    max_sampled_driver_allocated_bytes: int
    within_live_tensor_budget: bool


class MpsMemoryReceipt(Receipt, kind="mps_memory_observation", version=1):
    """An MPS memory observation's receipt."""

    body: MpsMemoryBody


# Imported last and re-exported: the preparation's kinds are registered wherever this module is.
