"""The fit launcher seam: one admitted execution profile -> one Lightning segment -> evidence.

Owns: building the ``Trainer`` from an admitted profile (:func:`build_trainer`), the process's
torch thread count (:func:`use_torch_threads`, applied beside the seeding), the options a caller
passes through (:class:`LaunchOptions`, which ``qhlab.finite_horizon.fit.FitRequest`` extends),
and the seam's phases, each called once by the fit that owns them
(``qhlab.finite_horizon.fit.Fit``): :func:`admit_launch` (lane and memory ceiling, checked once,
before anything is written), :func:`start_segment` (the directory, seeding, memory accounting:
before the module is built), :func:`train_segment` (cold initialization, ``Trainer.fit``, final
state, fit receipt) and :func:`publish_segment` (final metrics, the W&B attempt receipt, closing
the run; or :func:`abandon_segment`). The module and the caller's files are handed in; nothing
here calls back into the caller.

Does not own: any learning rule, scorer, recipe schema or population (``qhlab.finite_horizon``
builds the module and datamodule and evaluates), profiles (``qhlab.training.profiles``), W&B
runs, their identity, logger and closing (``qhlab.training.wandb_attempt``), tensor files
(``qhlab.training.tensor_state``), or the pieces the seam composes, imported from where they are
defined: update counts and state capture (``optimizer_state``), the budget, checkpoint and
SIGINT callbacks (``callbacks``), segment file names and resuming (``segments``) and the
cold-initialization lineage (``lineage``). This module never imports ``qhlab.finite_horizon``.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer, seed_everything

from qhlab.evidence import (
    QhError,
    QhInputError,
    fresh_directory,
    publish_json,
    require_int,
    sha256_file,
    source_package_digest,
    to_jsonable,
    write_receipt,
)
from qhlab.evidence.layout import COLD_INIT_RECEIPT, CONTINUATION_FILE, FINAL_STATE, FIT_RECEIPT, WANDB_RECEIPT
from qhlab.execution import reporting, where_am_i
from qhlab.execution.signals import handling
from qhlab.training.callbacks import (
    InterruptedAtBoundary,
    QhFitProgressBar,
    ResumeRestoreCallback,
    SegmentCheckpointCallback,
    UpdateBudgetCallback,
)
from qhlab.training.console import console_verbose, fit_log
from qhlab.training.lane_evidence import LaneEvidenceCallback
from qhlab.training.lineage import copy_cold_initialization, lineage_record, verified_cold_initialization_lineage
from qhlab.training.optimizer_state import capture_training_state, module_state_tensors, observed_optimizer_updates
from qhlab.training.profiles import execution_profile
from qhlab.training.records import FIT_CALLER_FIELDS, FitReceipt
from qhlab.training.segments import ResumeState
from qhlab.training.tensor_state import save_tensor_state, structure_path, write_cold_initialization
from qhlab.training.wandb_attempt import drop_wandb_links, finish_wandb_run, publish_wandb_attempt, wandb_logger

__all__ = [
    "AdmittedLaunch",
    "FitInterrupted",
    "LaunchOptions",
    "LaunchRequest",
    "StartedSegment",
    "TrainedSegment",
    "abandon_segment",
    "admit_launch",
    "build_trainer",
    "publish_segment",
    "start_segment",
    "train_segment",
    "use_torch_threads",
]


class FitInterrupted(QhError):
    """The fit stopped on SIGINT after publishing a segment checkpoint. Exit status 130.

    Attributes:
        directory: the interrupted segment, which its checkpoint continues.
        at: the observed updates at that checkpoint.
    """

    exit_code = 130

    def __init__(self, message: str, directory: Path | None = None, at: int | None = None) -> None:
        super().__init__(message)
        self.directory, self.at = directory, at


# ------------------------------------------------------------------------------ trainer, W&B


def build_trainer(
    recipe: Any,
    *,
    max_steps: int,
    callbacks: Sequence[Callback],
    logger: Any = False,
    progress: bool = True,
    log_every_n_steps: int = 50,
) -> Trainer:
    """A ``Trainer`` whose backend fields come from the profile-applied recipe.

    Args:
        recipe: the applied recipe; reads ``accelerator``, ``devices``, ``precision``.
        max_steps: backstop on ``global_step`` (the budget callback stops the fit exactly).
        callbacks: in the order they must run (Lightning moves ``Checkpoint`` ones last).
        logger: a Lightning logger or False.
        progress: show Lightning's progress bar.
    """
    accelerator = recipe.accelerator
    return Trainer(
        accelerator=accelerator,
        devices=recipe.devices,
        precision=recipe.precision,
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        # Deterministic kernels are free on CPU; on accelerators they warn instead of failing.
        deterministic=True if accelerator == "cpu" else "warn",
        callbacks=list(callbacks),
        logger=logger,
        log_every_n_steps=log_every_n_steps,
        default_root_dir=None,
    )


# --------------------------------------------------------------------------------- the seam


@dataclasses.dataclass(frozen=True)
class AdmittedLaunch:
    """A profile admitted on this host, the recipe it applied and the memory ceiling it admitted.

    Contract: made only by ``admit_launch``, once per fit, before any directory exists; frozen and
    never persisted itself (the fit receipt binds its runtime evidence and applied recipe). It
    lives in the process that fits and never crosses to another.

    Attributes:
        profile: the ``QhExecutionProfile``.
        runtime: JSON-able ``admit_runtime()`` evidence.
        recipe: ``profile.apply(recipe)``: only backend fields changed.
        max_allocated_bytes: the allocator ceiling the segment applies (CUDA lanes only), or None.
    """

    profile: Any
    runtime: dict
    recipe: Any
    max_allocated_bytes: int | None = None


def admit_launch(profile_name: str, recipe: Any, max_allocated_bytes: int | None = None) -> AdmittedLaunch:
    """Resolve the profile, admit the real runtime and the memory ceiling, apply the profile to the recipe.

    The one check of both per fit; call it before creating any directory: a refusal writes
    nothing. Only CUDA lanes admit a ``max_allocated_bytes`` (``check_memory_ceiling``).

    Raises:
        QhInputError: unknown profile, the host does not admit it (names expected and actual),
            or a ceiling the lane cannot enforce.
    """
    try:
        profile = execution_profile(profile_name)
        runtime = profile.admit_runtime()
    except QhInputError:
        raise
    except (QhError, RuntimeError, ValueError) as exc:
        # Admission failures are usage errors here: another lane was asked for on this host.
        raise QhInputError(
            f"admit_launch: profile={profile_name!r} is not admitted on this host: {exc}. "
            "HINT: run `qhlab profiles` to see the lanes this host admits."
        ) from exc
    ceiling = profile.check_memory_ceiling(max_allocated_bytes)
    return AdmittedLaunch(
        profile=profile, runtime=_jsonable_evidence(runtime), recipe=profile.apply(recipe), max_allocated_bytes=ceiling
    )


def _jsonable_evidence(value: Any) -> dict:
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    elif hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return to_jsonable(dict(value) if isinstance(value, Mapping) else {"value": value})


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How a segment runs and is logged: what a caller passes through to the seam unchanged.

    Attributes:
        extra_callbacks: caller callbacks (e.g. commissioning gates); they run before the
            launcher's budget and checkpoint callbacks in every hook.
        segment_checkpoint_every: updates between periodic checkpoints (default budget/4).
        progress: a progress bar: qhlab's own one-line bar, or Lightning's when the console
            is verbose (``qhlab.training.console``).
        job_type: W&B job type (``fit``, ``canary``, ``cell``, ``commission``).
        tags: W&B tags (e.g. arm, ``seed-<n>``, lane).
        group: W&B group; default the attempt's logical run.
        torch_threads: torch's intra-op threads, set beside the seeding (None: the process's own).
    """

    extra_callbacks: Sequence[Callback] = ()
    segment_checkpoint_every: int | None = None
    progress: bool = True
    job_type: str = "fit"
    tags: Sequence[str] = ()
    group: str | None = None
    torch_threads: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Everything one segment needs besides the admitted profile and its module.

    Contract: the seam's only input from the science core (the launcher imports no
    ``finite_horizon`` module); frozen, in process, checked at construction.

    Attributes:
        datamodule: yields training batches.
        update_budget: final observed update count of the lineage (an int >= 1).
        seed: the recipe seed (cold init, lineage and Lightning seeding).
        attempt: the ``WandbAttempt`` of this segment.
        directory: ``attempt.output_directory(output, cell)``; must not exist.
        recipe_digest: digest of the applied recipe (bound in every receipt).
        options: callbacks, checkpoint interval, progress and W&B labels (``LaunchOptions``).
        inputs: files the fit read (population manifests), bound in the fit receipt.
        resume: state from ``qhlab.training.segments.load_resume_state``, or None for a fresh lineage.
        run_config: the W&B run's config (e.g. the whole resolved recipe, lane, populations);
            ``recipe_digest``, ``seed`` and ``qhlab.source_package_sha256`` are always added.
        receipt_fields: the caller's own fields of the fit receipt body (e.g. which TRAIN
            rows were fitted and for which study): only ``FIT_CALLER_FIELDS`` of
            the kind models beside their owners (``qhlab.evidence.envelope``).

    Raises:
        QhInputError: a receipt field the launcher writes itself.
    """

    datamodule: LightningDataModule
    update_budget: int
    seed: int
    attempt: Any
    directory: Path
    recipe_digest: str
    options: LaunchOptions = LaunchOptions()
    inputs: Mapping[str, Path] | None = None
    resume: ResumeState | None = None
    run_config: Mapping[str, Any] | None = None
    receipt_fields: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        clash = sorted(set(self.receipt_fields or {}) - FIT_CALLER_FIELDS)
        if clash:
            raise QhInputError(
                f"LaunchRequest: receipt_fields={clash!r} is not allowed; allowed: "
                f"{', '.join(sorted(FIT_CALLER_FIELDS))} (the fit receipt's caller fields). HINT: the "
                "launcher writes every other field itself."
            )


@dataclasses.dataclass(frozen=True)
class StartedSegment:
    """A segment whose process is seeded: build its module now. Nothing of it is written yet.

    Contract: made by ``start_segment`` and handed once to ``train_segment`` in the same process;
    the module must be built after it (the seeded generator draws its initialization).

    Attributes:
        admitted: the admitted profile and applied recipe.
        request: the segment's data, budget, identity and options.
        directory: the segment directory ``train_segment`` creates (it must not exist).
        source: ``source_package_digest()``, hashed once for every receipt of the segment.
        memory_accounting: the profile's memory accounting, prepared before the module is built.
        started: ``time.perf_counter()`` at the start (the receipts' wall seconds count from it).
    """

    admitted: AdmittedLaunch
    request: LaunchRequest
    directory: Path
    source: dict
    memory_accounting: Any
    started: float


@dataclasses.dataclass(frozen=True)
class TrainedSegment:
    """A segment trained to its budget, its final state and fit receipt published; its W&B run open.

    Contract: made by ``train_segment``; its files are published (write-once) and bound by the
    fit receipt. Its W&B run stays open until exactly one of ``publish_segment`` (closed as
    finished) or ``abandon_segment`` (closed as failed) is called, in the same process.

    Attributes:
        started: the ``StartedSegment``.
        logger: the open ``WandbLogger``.
        observed_updates: the optimizer's update count (the budget).
        cold_init: ``cold_init.safetensors``.
        final_state: ``final_state.safetensors``; ``final_state_sha256`` its digest.
        fit_receipt: ``fit.receipt.json``.
    """

    started: StartedSegment
    logger: Any
    observed_updates: int
    cold_init: Path
    final_state: Path
    final_state_sha256: str
    fit_receipt: Path

    @property
    def directory(self) -> Path:
        """The segment directory."""
        return self.started.directory


def use_torch_threads(threads: int | None) -> None:
    """Set this process's torch intra-op threads (None: leave them): the one place qhlab sets them."""
    if threads is not None:
        torch.set_num_threads(require_int("fit", "torch_threads", threads, minimum=1, hint="one thread per fit"))


def start_segment(admitted: AdmittedLaunch, request: LaunchRequest) -> StartedSegment:
    """Seed every generator and prepare the profile's memory accounting: what must happen before
    the module is built. Writes nothing: a module its caller then refuses leaves no directory.

    The caller has validated everything (the budget, the options) and called
    :func:`admit_launch`; ``train_segment`` creates the directory and publishes the segment's
    files write-once below it.
    """
    started = time.perf_counter()
    source = source_package_digest()
    seed_everything(request.seed, workers=True, verbose=False)
    use_torch_threads(request.options.torch_threads)
    memory_accounting = admitted.profile.prepare_memory_accounting(admitted.max_allocated_bytes)
    return StartedSegment(admitted, request, Path(request.directory), source, memory_accounting, started)


def train_segment(segment: StartedSegment, module: LightningModule) -> TrainedSegment:
    """Train ``module``: the segment directory, cold initialization, ``Trainer.fit`` to the budget,
    final state, fit receipt.

    Args:
        segment: the started segment (``start_segment``), in whose seeded process ``module`` was built.
        module: a LightningModule whose ``configure_optimizers`` returns one AdamW optimizer.

    Raises:
        PublishConflictError: the segment directory exists.
        FitInterrupted: SIGINT; a segment checkpoint was published first.
        QhError: the observed update count differs from the budget, or a callback failed. Whatever
            fails once the W&B run has started closes it as failed.
    """
    admitted, request = segment.admitted, segment.request
    budget, source = request.update_budget, segment.source
    directory = fresh_directory(segment.directory)
    cold_init, lineage = _start_lineage(module, request, directory, source["sha256"])
    identity = {
        "recipe_digest": request.recipe_digest,
        "local_attempt_id": request.attempt.resolved_local_attempt_id,
        "logical_run_id": request.attempt.logical_run_id,
        "seed": request.seed,
        "cold_init_sha256": sha256_file(cold_init),
    }
    # Device checks at both ends of training and MPS fallback capture; they only read tensors.
    lane = LaneEvidenceCallback(admitted.profile)
    with lane.observing_fallbacks():
        trainer, checkpoints, logger = _train(
            admitted, request, module, directory, identity, cold_init, budget, lane=lane, source_sha256=source["sha256"]
        )
    try:
        receipt = _publish_trained(segment, module, trainer, checkpoints, lane, directory, identity, cold_init, lineage)
    except BaseException:
        # A failed or interrupted end of the segment (a refusal, a full disk, Ctrl-C) closes its
        # run: an open run would be taken over by the next fit in this process.
        finish_wandb_run(logger, directory, exit_code=1)
        raise
    observed, final_state, final_sha = receipt
    return TrainedSegment(segment, logger, observed, cold_init, final_state, final_sha, directory / FIT_RECEIPT)


def _publish_trained(
    segment: StartedSegment,
    module: LightningModule,
    trainer: Trainer,
    checkpoints: SegmentCheckpointCallback,
    lane: LaneEvidenceCallback,
    directory: Path,
    identity: dict,
    cold_init: Path,
    lineage: dict,
) -> tuple[int, Path, str]:
    """The trained segment's checks, final state and fit receipt: ``(observed updates, final state, its sha256)``."""
    admitted, request, source = segment.admitted, segment.request, segment.source
    budget = request.update_budget
    optimizer = trainer.optimizers[0]
    observed = observed_optimizer_updates(optimizer)
    if observed != budget:
        raise QhError(
            f"train_segment: observed {observed} optimizer updates but update_budget={budget}. HINT: the fit "
            "ended early (max_steps backstop or data exhausted); no final state was published."
        )
    lane_checks = lane.record()  # refuses unreviewed MPS CPU fallbacks before the final state
    tensors, structure = capture_training_state(module, optimizer)
    final_state = directory / FINAL_STATE
    final_sha = save_tensor_state(final_state, tensors, structure)
    recipe = admitted.recipe
    body = {
        "recipe": to_jsonable(recipe.model_dump(mode="json") if hasattr(recipe, "model_dump") else recipe),
        "recipe_digest": request.recipe_digest,
        "profile": admitted.profile.name,
        "runtime": admitted.runtime,
        "update_budget": budget,
        "observed_updates": observed,
        "observed_updates_source": "optimizer.state[p]['step']",
        "global_step": int(trainer.global_step),
        # CPU reductions depend on the thread count: bit-identical reruns need the same value.
        "torch_num_threads": torch.get_num_threads(),
        "segment_start_updates": _start_updates(request),
        "seed": request.seed,
        "source_package": source,
        "memory": _jsonable_evidence(admitted.profile.memory_evidence()),
        "memory_accounting": to_jsonable(segment.memory_accounting),
        "lane_checks": lane_checks,
        # Where the lane was admitted and the fit ran: this host, or a Ray task's node.
        "execution": where_am_i(),
        "wandb": _jsonable_evidence(request.attempt.evidence()),
        "local_attempt_id": request.attempt.resolved_local_attempt_id,
        "logical_run_id": request.attempt.logical_run_id,
        "lineage": lineage,
        "segment_checkpoints": sorted(checkpoints.written),
        "final_state_sha256": final_sha,
        "cold_init_sha256": identity["cold_init_sha256"],
        "wall_seconds": round(time.perf_counter() - segment.started, 3),
    }
    body.update(to_jsonable(dict(request.receipt_fields or {})))
    fit_inputs = {**(request.inputs or {}), "cold_init": cold_init, "cold_init_receipt": directory / COLD_INIT_RECEIPT}
    if request.resume is not None:
        fit_inputs["continuation"] = directory / CONTINUATION_FILE
    write_receipt(
        directory / FIT_RECEIPT,
        FitReceipt,
        body=body,
        inputs=fit_inputs,
        outputs={"final_state": final_state, "final_state_structure": structure_path(final_state)},
    )
    return observed, final_state, final_sha


def publish_segment(
    trained: TrainedSegment, files: Mapping[str, Path] | None = None, metrics: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Log the final metrics, publish the W&B attempt receipt and close the run.

    Args:
        trained: the trained segment (``train_segment``).
        files: further files of the segment the attempt receipt binds (e.g. the evaluation receipt).
        metrics: final metrics (``observed_updates`` is always added).

    Returns:
        The metrics as logged, ``observed_updates`` first. The receipt is
        ``trained.directory / WANDB_RECEIPT``.
    """
    segment = trained.started
    directory, request, logger = segment.directory, segment.request, trained.logger
    files = dict(files or {})
    metrics = {"observed_updates": float(trained.observed_updates), **(metrics or {})}
    try:
        if logger is not None:
            logger.log_metrics(metrics, step=trained.observed_updates)
            # Final values belong in the run summary (what W&B tables and filters read), not only
            # in the history rows.
            logger.experiment.summary.update({**metrics, "final_state_sha256": trained.final_state_sha256})
        # Publish while the run is still active: online publication attaches the summary and
        # the artifact to wandb.run. The offline run's .wandb file is not bound: wandb-core
        # still appends to it asynchronously after finish() returns, so its bytes are not final.
        published = {"fit_receipt": trained.fit_receipt, "final_state": trained.final_state, **files}
        publish_wandb_attempt(request.attempt, directory / WANDB_RECEIPT, published, metrics)
    except BaseException:
        abandon_segment(trained)
        raise
    finish_wandb_run(logger, directory, exit_code=0)
    return metrics


def abandon_segment(trained: TrainedSegment) -> None:
    """Close a trained segment's W&B run as failed (its caller's step after training failed)."""
    finish_wandb_run(trained.logger, trained.started.directory, exit_code=1)


def _start_updates(request: LaunchRequest) -> int:
    return request.resume.start_updates if request.resume is not None else 0


def _start_lineage(
    module: LightningModule, request: LaunchRequest, directory: Path, source_sha256: str
) -> tuple[Path, dict]:
    """Publish a fresh cold initialization, or copy and verify the resumed lineage's one."""
    resume = request.resume
    if resume is None:
        tensors = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        cold_init = write_cold_initialization(
            directory,
            tensors,
            seed=request.seed,
            source_package_digest=source_sha256,
            structure={"module_keys": sorted(tensors), "recipe_digest": request.recipe_digest, "observed_updates": 0},
        )
        return cold_init, {"kind": "fresh", "segment": 0}
    continued = {
        "previous_local_attempt_id": resume.previous_local_attempt_id,
        "previous_state": resume.state_path.name,
        "previous_state_sha256": resume.state_sha256,
        "start_updates": resume.start_updates,
    }
    cold_init = copy_cold_initialization(resume.previous_directory, directory)
    verified = verified_cold_initialization_lineage(cold_init, source_package_digest=source_sha256, seed=request.seed)
    module.load_state_dict(module_state_tensors(resume.tensors), strict=True)
    # The previous segment is now continued (at most once): marked only once its lineage verified
    # and its state loaded, so a continuation refused here leaves the previous segment resumable.
    publish_json(directory / CONTINUATION_FILE, continued)
    return cold_init, {"kind": "resumed", **continued, "cold_initialization": lineage_record(verified)}


def _train(
    admitted: AdmittedLaunch,
    request: LaunchRequest,
    module: LightningModule,
    directory: Path,
    identity: dict,
    cold_init: Path,
    budget: int,
    *,
    lane: Callback,
    source_sha256: str,
) -> tuple[Trainer, SegmentCheckpointCallback, Any]:
    """``Trainer.fit`` with the lane, caller, budget and checkpoint callbacks; a SIGINT becomes FitInterrupted."""
    options = request.options
    start_updates = _start_updates(request)
    checkpoints = SegmentCheckpointCallback(
        directory,
        every=options.segment_checkpoint_every or max(1, budget // 4),
        update_budget=budget,
        body=identity,
        inputs={"cold_init": cold_init},
        start_updates=start_updates,
    )
    callbacks: list[Callback] = [ResumeRestoreCallback(request.resume)] if request.resume is not None else []
    callbacks += [
        lane,
        *options.extra_callbacks,
        UpdateBudgetCallback(budget, start_updates=start_updates),
        checkpoints,
    ]
    # Lightning's own bar only where this process draws (never in a worker reporting its progress).
    lightning_bar = options.progress and console_verbose() and not reporting()
    if options.progress and not lightning_bar:
        callbacks.append(QhFitProgressBar(request.attempt.logical_run_id, budget, start_updates=start_updates))
    config = dict(request.run_config or {})
    logger = wandb_logger(
        request.attempt,
        directory,
        # The source digest the fit receipt binds is hashed once, here, not again by the caller.
        config={
            **config,
            "qhlab": {**config.get("qhlab", {}), "source_package_sha256": source_sha256},
            "recipe_digest": request.recipe_digest,
            "seed": request.seed,
        },
        job_type=options.job_type,
        tags=options.tags,
        group=options.group,
    )
    remaining = budget - start_updates
    # A GradScaler may skip steps that global_step still counts; allow for them.
    max_steps = remaining if admitted.recipe.precision == "32-true" else 2 * remaining + 100
    try:
        # Start the run now and drop the link wandb-core made at its start (``<run>/logs/debug-core.log``):
        # an attempt killed mid-fit then holds no symbolic link, which `qhlab verify` and `sign` refuse.
        _ = logger.experiment
        drop_wandb_links(Path(directory) / "wandb")
        with fit_log(directory):
            trainer = build_trainer(
                admitted.recipe,
                max_steps=max_steps,
                callbacks=callbacks,
                logger=logger,
                progress=lightning_bar,
                log_every_n_steps=max(1, min(50, remaining // 20)),
            )
            with handling(signal.SIGINT, checkpoints.sigint_handler):
                trainer.fit(module, datamodule=request.datamodule)
    except InterruptedAtBoundary:
        finish_wandb_run(logger, directory, exit_code=130)
        raise FitInterrupted(
            f"fit interrupted at {checkpoints.interrupted_at} observed updates (budget {budget}); segment "
            f"checkpoint written in {directory}. HINT: continue with --resume {directory.name}.",
            directory,
            checkpoints.interrupted_at,
        ) from None
    except BaseException:
        finish_wandb_run(logger, directory, exit_code=1)
        raise
    return trainer, checkpoints, logger
