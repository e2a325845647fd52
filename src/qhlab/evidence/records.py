"""Typed receipts: one pydantic model per receipt kind, its kind and schema version as fields.

Owns: each kind's body at its top level, for every receipt qhlab writes. The envelope and the
registry are ``envelope``'s; the preparation's kinds are ``preparation_records``', imported here,
so that ``qhlab.evidence.records`` names every kind and importing it registers them all.
Does not own: authentication (``receipts``: digests, bound files, where a copy is judged) nor
what a body's values mean (each step that writes a kind reads it back).

A body's top-level fields are typed and closed (an unknown field is refused); the structures
nested in them (a recipe, an execution record, a curve) stay JSON mappings and lists that their
own step checks. Validation is strict: a string is never read as a number, nor a float as an
integer, nor a boolean as either.

``write_receipt(path, FitReceipt, body=...)`` validates the body before anything is published,
so qhlab never writes a receipt its own reader refuses; ``read_receipt(path, FitReceipt)``
returns a validated ``FitReceipt``. ``read_receipt(path, Receipt)`` accepts any registered kind
and returns that kind's model.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from qhlab.evidence.envelope import _SHA256, BoundFile, CreatedBy, Receipt, _Closed, _Json, receipt_kinds, receipt_model

__all__ = [
    "Receipt", "receipt_model", "receipt_kinds",
    "BoundFile", "CreatedBy",
    "FitReceipt", "SegmentCheckpointReceipt", "ColdInitializationReceipt", "WandbAttemptReceipt",
    "EvaluationReceipt", "PopulationReceipt", "PopulationGenerationReceipt",
    "StudyFreezeReceipt", "StudyDevelopmentReceipt", "StudyE0Receipt", "StudyCellReceipt",
    "StudyBenchmarkReceipt", "StudyReportReceipt", "LaneComparisonReceipt", "TuningReceipt", "PilotReceipt",
    "E0CheckReceipt",
    "CommissioningRunReceipt", "CommissioningMilestoneReceipt", "MpsMemoryReceipt",
]

# -- training ---------------------------------------------------------------------------------

class FitBody(_Closed):
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
        train_rows, scorer, study: the caller's fields (which TRAIN rows, the scorer's layout,
        the study cell), absent for a bare fit.
    """

    recipe: _Json
    recipe_digest: str
    profile: str
    runtime: _Json
    update_budget: int
    observed_updates: int
    observed_updates_source: str
    global_step: int
    torch_num_threads: int
    segment_start_updates: int
    seed: int
    source_package: _Json
    memory: _Json
    memory_accounting: _Json
    lane_checks: _Json
    execution: _Json
    wandb: _Json
    local_attempt_id: str
    logical_run_id: str
    lineage: _Json
    segment_checkpoints: list[int]
    final_state_sha256: str = Field(pattern=_SHA256)
    cold_init_sha256: str = Field(pattern=_SHA256)
    wall_seconds: float
    train_rows: _Json | None = None
    scorer: _Json | None = None
    study: _Json | None = None


class FitReceipt(Receipt):
    """``fit.receipt.json``: one finished fit."""

    kind: Literal["fit"] = "fit"
    schema_version: Literal[1] = 1
    body: FitBody


# Body fields of a fit that the launcher writes itself; a caller's receipt_fields may add only others.
FIT_CALLER_FIELDS = frozenset({"train_rows", "scorer", "study"})


class SegmentCheckpointBody(_Closed):
    """One periodic or interrupt checkpoint of a fit.

    Attributes:
        cold_init_sha256, local_attempt_id, logical_run_id, recipe_digest, seed: the fit it
        belongs to. observed_updates: where it was taken. reason: ``periodic`` or
        ``interrupt``. state_sha256: the state's digest.
    """

    cold_init_sha256: str = Field(pattern=_SHA256)
    local_attempt_id: str
    logical_run_id: str
    recipe_digest: str
    seed: int
    observed_updates: int
    reason: Literal["periodic", "interrupt"]
    state_sha256: str = Field(pattern=_SHA256)


class SegmentCheckpointReceipt(Receipt):
    """``checkpoints/updates-N.receipt.json``."""

    kind: Literal["segment_checkpoint"] = "segment_checkpoint"
    schema_version: Literal[1] = 1
    body: SegmentCheckpointBody


class ColdInitializationBody(_Closed):
    """The seeded initial state of a lineage.

    Attributes:
        seed: the seed. source_package_digest: the code that made it. state_sha256: its digest.
        tensor_count: how many tensors it holds.
    """

    seed: int
    source_package_digest: str
    state_sha256: str = Field(pattern=_SHA256)
    tensor_count: int


class ColdInitializationReceipt(Receipt):
    """``cold_init.receipt.json``."""

    kind: Literal["cold_initialization"] = "cold_initialization"
    schema_version: Literal[1] = 1
    body: ColdInitializationBody


class WandbAttemptBody(_Closed):
    """What a fit published to W&B.

    Attributes:
        attempt: the run identity. files: digests of the files logged. metrics: the summary.
        links: the logical run. publication: offline or online, and where.
    """

    attempt: _Json
    files: _Json
    metrics: _Json
    links: _Json
    publication: _Json


class WandbAttemptReceipt(Receipt):
    """``wandb.receipt.json``."""

    kind: Literal["wandb_attempt"] = "wandb_attempt"
    schema_version: Literal[1] = 1
    body: WandbAttemptBody


# -- evaluation and populations ---------------------------------------------------------------

class EvaluationBody(_Closed):
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
    counts: _Json
    per_scene: _Json
    population: _Json
    final_state_sha256: str = Field(pattern=_SHA256)
    curve: list[_Json] | None = None


class EvaluationReceipt(Receipt):
    """``evaluation.receipt.json``."""

    kind: Literal["evaluation"] = "evaluation"
    schema_version: Literal[1] = 1
    body: EvaluationBody


class PopulationBody(_Closed):
    """A published population.

    Attributes:
        name: the population's name. split: train or validation. counts: scenes, rows and
        chains. generator: the preset, seed and generator settings.
    """

    name: str
    split: str
    counts: _Json
    generator: _Json


class PopulationReceipt(Receipt):
    """``population.receipt.json``."""

    kind: Literal["population"] = "population"
    schema_version: Literal[1] = 1
    body: PopulationBody


class PopulationGenerationBody(_Closed):
    """How a population was labelled (facts of the run, not of the population).

    Attributes:
        executor: local or ray. ray_address: the cluster, when Ray. driver: the driver host.
        label_seconds: labelling time. processes: local worker processes. cluster_cpus,
        nodes: the Ray cluster's CPUs and nodes.
    """

    executor: str
    ray_address: str | None
    driver: _Json
    label_seconds: float
    processes: int | None = None
    cluster_cpus: int | None = None
    nodes: _Json | None = None


class PopulationGenerationReceipt(Receipt):
    """``generation.receipt.json``."""

    kind: Literal["population_generation"] = "population_generation"
    schema_version: Literal[1] = 1
    body: PopulationGenerationBody


# -- the study --------------------------------------------------------------------------------

class StudyFreezeBody(_Closed):
    """A study's pre-registration.

    Attributes:
        study, study_id: name and identity. output: the absolute directory it was frozen in.
        config: the config as read. profile: the lane. arms, seeds, cells: the design.
        recipes: each arm's recipe. budgets: update budgets. thresholds: the decision rules.
        train, validation: the populations. test_data: the test data's status. versions:
        packages. source_package: the code's digest. max_allocated_bytes: the memory limit.
        only_architecture_differs: the arms' recipes differ only in the architecture.
        preparation: the tuning record, when one is named. sealed_directories: directories
        whose every file the receipt binds (a user family's sources).
    """

    study: str
    study_id: str
    output: str
    config: _Json
    profile: str
    arms: list[Any]
    seeds: list[int]
    cells: list[Any]
    recipes: _Json
    budgets: _Json
    thresholds: _Json
    train: _Json
    validation: _Json
    test_data: str
    versions: _Json
    source_package: _Json
    max_allocated_bytes: int | None
    only_architecture_differs: bool
    preparation: _Json | None
    sealed_directories: list[str] | None = None


class StudyFreezeReceipt(Receipt):
    """``freeze.receipt.json``."""

    kind: Literal["study_freeze"] = "study_freeze"
    schema_version: Literal[1] = 1
    body: StudyFreezeBody


class StudyDevelopmentBody(_Closed):
    """The sealed validation and its references.

    Attributes:
        study: the study. validation: the sealed validation population. references: the
        oracle and constant references. constant_on_validation: the constant predictor's
        scores. train_constant: the constant fitted on TRAIN, shape [H].
    """

    study: str
    validation: _Json
    references: _Json
    constant_on_validation: _Json
    train_constant: list[Any]


class StudyDevelopmentReceipt(Receipt):
    """``development.receipt.json``."""

    kind: Literal["study_development"] = "study_development"
    schema_version: Literal[1] = 1
    body: StudyDevelopmentBody


class StudyE0Body(_Closed):
    """The E0 gate's decision.

    Attributes:
        study: the study. canary_updates: the canaries' budget. selection: the selected row.
        canaries: each canary's result. failures: what failed. passed: the decision.
        reason: why.
    """

    study: str
    canary_updates: int
    selection: _Json
    canaries: list[Any]
    failures: list[Any]
    passed: bool
    reason: str


class StudyE0Receipt(Receipt):
    """``e0.receipt.json``."""

    kind: Literal["study_e0"] = "study_e0"
    schema_version: Literal[1] = 1
    body: StudyE0Body


class StudyCellBody(_Closed):
    """One (arm, seed) cell: an evaluated fit, or an E0 canary.

    Attributes:
        study, cell, arm, seed: which cell. recipe_digest, fit_recipe_digest: the frozen and
        the fitted recipe. profile: the lane. update_budget, observed_updates: updates.
        attempt: the adopted attempt's directory. previous_attempts: earlier attempts.
        adopted: adopted after a restart. final_state_sha256: the state. wall_seconds: time.
        execution: where it ran. evaluation: the validation scores (an evaluated cell).
        canary: the recovery check (a canary).
    """

    study: str
    cell: str
    arm: str
    seed: int
    recipe_digest: str
    fit_recipe_digest: str
    profile: str
    update_budget: int
    observed_updates: int
    attempt: str
    previous_attempts: list[str]
    adopted: bool
    final_state_sha256: str = Field(pattern=_SHA256)
    wall_seconds: float
    execution: _Json
    evaluation: _Json | None = None
    canary: _Json | None = None


class StudyCellReceipt(Receipt):
    """``cell.receipt.json``."""

    kind: Literal["study_cell"] = "study_cell"
    schema_version: Literal[1] = 1
    body: StudyCellBody


class StudyBenchmarkBody(_Closed):
    """One cell's forward-time and gradient-flow benchmark.

    Attributes:
        arm, seed, cell: which cell. profile, device_type, precision, torch_threads: the
        lane. final_state_sha256: the state timed. rows: batch rows. warmup_forwards,
        timed_forwards, forward_seconds, median_forward_seconds: the timing.
        module_timings: per module. h1_huber_loss, updates_applied,
        parameters_receiving_gradients, parameters_without_gradients: the gradient check.
        canonical_first_chain: the chain used. memory, memory_accounting: memory evidence.
    """

    arm: str
    seed: int
    cell: str
    profile: str
    device_type: str
    precision: str
    torch_threads: int
    final_state_sha256: str = Field(pattern=_SHA256)
    rows: int
    warmup_forwards: int
    timed_forwards: int
    forward_seconds: list[float]
    median_forward_seconds: float
    module_timings: _Json
    h1_huber_loss: float
    updates_applied: int
    parameters_receiving_gradients: list[str]
    parameters_without_gradients: list[str]
    canonical_first_chain: _Json
    memory: _Json
    memory_accounting: _Json


class StudyBenchmarkReceipt(Receipt):
    """``benchmarks/<cell>.receipt.json``."""

    kind: Literal["study_benchmark"] = "study_benchmark"
    schema_version: Literal[1] = 1
    body: StudyBenchmarkBody


class StudyReportBody(_Closed):
    """A study's report.

    Attributes:
        study: the study. summary: the headline decisions and statistics.
    """

    study: str
    summary: _Json


class StudyReportReceipt(Receipt):
    """``report/report.receipt.json``."""

    kind: Literal["study_report"] = "study_report"
    schema_version: Literal[1] = 1
    body: StudyReportBody


class LaneComparisonBody(_Closed):
    """Two lanes' reports of one study, compared.

    Attributes:
        study: the study. profiles: each lane's report. margin: the agreement margin.
        summary: the comparison.
    """

    study: str
    profiles: _Json
    margin: float
    summary: _Json


class LaneComparisonReceipt(Receipt):
    """``lanes.receipt.json``."""

    kind: Literal["lane_comparison"] = "lane_comparison"
    schema_version: Literal[1] = 1
    body: LaneComparisonBody


# -- commissioning ----------------------------------------------------------------------------

class CommissioningRunBody(_Closed):
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
    final_state_sha256: str = Field(pattern=_SHA256)
    evaluated: bool
    max_allocated_bytes: int | None


class CommissioningRunReceipt(Receipt):
    """``commission.receipt.json``."""

    kind: Literal["commissioning_run"] = "commissioning_run"
    schema_version: Literal[1] = 1
    body: CommissioningRunBody


class CommissioningMilestoneBody(_Closed):
    """One engineering gate at an observed optimizer update.

    Attributes:
        schema_version: the milestone layout. successful_optimizer_updates: where.
        engineering_budget: the budget. expected_device, context_ids: the lane.
        optimizer_evidence: the optimizer's step counters. state_filename, state_sha256: the
        state. strict_reload: reload check. memory_observation: MPS memory, when sampled.
    """

    schema_version: int
    successful_optimizer_updates: int
    engineering_budget: _Json
    expected_device: str
    context_ids: list[Any]
    optimizer_evidence: _Json
    state_filename: str
    state_sha256: str = Field(pattern=_SHA256)
    strict_reload: bool
    memory_observation: _Json | None


class CommissioningMilestoneReceipt(Receipt):
    """``milestones/…receipt.json``."""

    kind: Literal["commissioning_milestone"] = "commissioning_milestone"
    schema_version: Literal[1] = 1
    body: CommissioningMilestoneBody


class MpsMemoryBody(_Closed):
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


class MpsMemoryReceipt(Receipt):
    """An MPS memory observation's receipt."""

    kind: Literal["mps_memory_observation"] = "mps_memory_observation"
    schema_version: Literal[1] = 1
    body: MpsMemoryBody


# Imported last and re-exported: the preparation's kinds are registered wherever this module is.
from qhlab.evidence.preparation_records import E0CheckReceipt, PilotReceipt, TuningReceipt  # noqa: E402
