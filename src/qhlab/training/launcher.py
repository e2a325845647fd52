"""The fit launcher seam: one admitted execution profile -> one Lightning fit -> evidence.

Owns: counting optimizer updates from the optimizer's own state
(:func:`observed_optimizer_updates`), building the ``Trainer`` from an admitted profile,
stopping a fit at exactly the observed update budget (:class:`UpdateBudgetCallback`),
write-once segment checkpoints and SIGINT handling at a transaction boundary
(:class:`SegmentCheckpointCallback`), the offline-by-default ``WandbLogger``, resuming into a
new local segment (:func:`load_resume_state`) and the seam itself (:func:`admit_launch`,
:func:`launch_fit`): cold initialization, ``Trainer.fit``, final state, fit receipt and
closing the W&B attempt.

Does not own: any learning rule, scorer, recipe schema or population (``qhlab.finite_horizon``
composes those and passes a module factory and a datamodule), profiles and W&B identity
(``qhlab.training.execution_profile``), or tensor files (``qhlab.training.tensor_state``).
This module never imports ``qhlab.finite_horizon``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer, seed_everything

from qhlab.evidence import (
    EvidenceError,
    MissingEvidenceError,
    QhError,
    QhInputError,
    fresh_directory,
    publish_bytes,
    read_receipt,
    sha256_file,
    source_package_digest,
    to_jsonable,
    write_receipt,
)
from qhlab.training.execution_profile import (
    execution_profile,
    publish_wandb_attempt,
    verified_cold_initialization_lineage,
)
from qhlab.training.tensor_state import (
    COLD_INIT_RECEIPT,
    COLD_INIT_STATE,
    COLD_INIT_STRUCTURE,
    load_tensor_state,
    save_tensor_state,
    structure_path,
    write_cold_initialization,
)

__all__ = [
    "AdmittedLaunch",
    "FitInterrupted",
    "LaunchResult",
    "ResumeState",
    "SegmentCheckpointCallback",
    "UpdateBudgetCallback",
    "admit_launch",
    "build_trainer",
    "capture_training_state",
    "launch_fit",
    "load_resume_state",
    "observed_optimizer_updates",
    "wandb_logger",
]

FIT_KIND = "fit"
FIT_SCHEMA_VERSION = 1
CHECKPOINT_KIND = "segment_checkpoint"
CHECKPOINT_SCHEMA_VERSION = 1
FINAL_STATE = "final_state.safetensors"
FIT_RECEIPT = "fit.receipt.json"
WANDB_RECEIPT = "wandb_attempt.receipt.json"
_CHECKPOINT_RE = re.compile(r"^segment_checkpoint_u(\d{8})\.receipt\.json$")
_MOMENT_KEYS = ("exp_avg", "exp_avg_sq", "step")


class FitInterrupted(QhError):
    """The fit stopped on SIGINT after publishing a segment checkpoint. Exit status 130."""

    exit_code = 130


# --------------------------------------------------------------------- observed updates


def _unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    # Lightning hands callbacks a LightningOptimizer wrapper; the state lives on the inner one.
    return getattr(optimizer, "optimizer", optimizer) if not isinstance(optimizer, torch.optim.Optimizer) else optimizer


def observed_optimizer_updates(optimizer: Any) -> int:
    """Count successful optimizer updates from the optimizer's own per-parameter state.

    Reads AdamW's ``state[p]["step"]`` for every parameter of every param group. A skipped
    AMP step (GradScaler found inf/NaN) does not advance it, unlike ``trainer.global_step``.
    A parameter that received no gradient in some update has a smaller count, so the
    maximum is the number of updates the optimizer performed.

    Args:
        optimizer: a ``torch.optim.Optimizer`` (or Lightning's ``LightningOptimizer`` wrapper).

    Returns:
        The number of completed updates; 0 when no parameter has state yet.

    Raises:
        QhError: a parameter's state has no integral ``step`` (not an Adam-family optimizer).
    """
    inner = _unwrap_optimizer(optimizer)
    counts = []
    for group in inner.param_groups:
        for param in group["params"]:
            state = inner.state.get(param)
            if not state:
                continue
            step = state.get("step")
            if step is None:
                raise QhError(
                    f"observed_optimizer_updates: optimizer={type(inner).__name__} keeps no 'step' in its "
                    "parameter state; allowed: an Adam-family optimizer (AdamW). HINT: the update count "
                    "must come from the optimizer, never from batch counts."
                )
            value = float(step.item()) if isinstance(step, torch.Tensor) else float(step)
            if value != int(value) or value < 0:
                raise QhError(f"observed_optimizer_updates: step={value!r} is not a non-negative integer.")
            counts.append(int(value))
    return max(counts, default=0)


# --------------------------------------------------------------------------- tensor state


def _parameter_names(module: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}


def capture_training_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor], dict]:
    """Detached CPU copies of the module state and the optimizer moments, plus their structure.

    Tensor keys: ``module.state_dict()`` keys as they are (``online.*``, ``target.*`` for the
    QH module), and ``optim.<i>.exp_avg`` / ``optim.<i>.exp_avg_sq`` / ``optim.<i>.step``
    with ``i`` the index of the parameter in optimizer order. Live tensors are not changed.

    Returns:
        ``(tensors, structure)``; ``structure`` holds ``param_groups`` (hyper-parameters and
        parameter indices), ``param_names`` (optimizer order), ``steps`` per parameter index
        and ``observed_updates``.
    """
    tensors = {name: t.detach().to("cpu", copy=True) for name, t in module.state_dict().items()}
    structure: dict[str, Any] = {"module_keys": sorted(tensors), "param_groups": [], "param_names": [], "steps": {}}
    if optimizer is None:
        structure["observed_updates"] = 0
        return tensors, structure
    inner = _unwrap_optimizer(optimizer)
    names = _parameter_names(module)
    index = 0
    for group in inner.param_groups:
        hyper = {k: to_jsonable(v) for k, v in group.items() if k != "params"}
        indices = []
        for param in group["params"]:
            structure["param_names"].append(names.get(id(param), f"<unnamed:{index}>"))
            indices.append(index)
            state = inner.state.get(param) or {}
            for key in _MOMENT_KEYS:
                if key in state:
                    value = state[key]
                    value = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                    tensors[f"optim.{index}.{key}"] = value.detach().to("cpu", copy=True)
            if "step" in state:
                step = state["step"]
                structure["steps"][str(index)] = int(step.item() if isinstance(step, torch.Tensor) else step)
            index += 1
        structure["param_groups"].append({"hyper_parameters": hyper, "params": indices})
    structure["observed_updates"] = observed_optimizer_updates(inner)
    return tensors, structure


def _module_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if not k.startswith("optim.")}


def _restore_optimizer(optimizer: Any, tensors: Mapping[str, torch.Tensor], structure: Mapping) -> None:
    """Load saved AdamW moments into a live optimizer whose hyper-parameters must match."""
    inner = _unwrap_optimizer(optimizer)
    saved_groups = structure["param_groups"]
    if len(saved_groups) != len(inner.param_groups):
        raise EvidenceError(
            f"resume: the saved state has {len(saved_groups)} param groups but the optimizer has "
            f"{len(inner.param_groups)}. HINT: resume only with the recipe that wrote the state."
        )
    live_state = inner.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for saved, live in zip(saved_groups, live_state["param_groups"], strict=True):
        live_hyper = {k: to_jsonable(v) for k, v in live.items() if k != "params"}
        if saved["hyper_parameters"] != live_hyper or saved["params"] != list(live["params"]):
            raise EvidenceError(
                f"resume: saved param group {saved['hyper_parameters']} differs from the live optimizer's "
                f"{live_hyper}. HINT: resume only with the recipe that wrote the state."
            )
        for i in saved["params"]:
            moments = {k: tensors[f"optim.{i}.{k}"] for k in _MOMENT_KEYS if f"optim.{i}.{k}" in tensors}
            if moments:
                state[i] = {k: v.clone() for k, v in moments.items()}
    inner.load_state_dict({"state": state, "param_groups": live_state["param_groups"]})


# ----------------------------------------------------------------------------- callbacks


def _positive_int(call: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QhInputError(
            f"{call}: {field}={value!r} is not allowed; allowed: an int >= 1. "
            "HINT: budgets and intervals count observed optimizer updates."
        )
    return value


class UpdateBudgetCallback(Callback):
    """Stop the fit at exactly ``update_budget`` observed optimizer updates.

    Runs after the optimizer step of every training batch (``on_train_batch_end``), reads
    the count from the optimizer state and asks Lightning to stop once the budget is met;
    ``max_steps`` is only a backstop. Place it after caller callbacks so gates observe the
    final update before the loop ends (``should_stop`` does not skip later callbacks).

    Args:
        update_budget: final number of observed updates (int >= 1).
        start_updates: updates already present in a resumed optimizer state (int >= 0).
    """

    def __init__(self, update_budget: int, *, start_updates: int = 0) -> None:
        self.update_budget = _positive_int("UpdateBudgetCallback", "update_budget", update_budget)
        if isinstance(start_updates, bool) or not isinstance(start_updates, int) or not 0 <= start_updates < update_budget:
            raise QhInputError(
                f"UpdateBudgetCallback: start_updates={start_updates!r} is not allowed; allowed: an int in "
                f"[0, {update_budget}). HINT: a finished fit is never continued."
            )
        self.start_updates = start_updates
        self.observed_updates = start_updates

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if observed != self.start_updates:
            raise QhError(
                f"UpdateBudgetCallback: the optimizer starts at {observed} observed updates but "
                f"start_updates={self.start_updates}. HINT: the resumed optimizer state was not restored."
            )

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if observed > self.update_budget:
            raise QhError(
                f"UpdateBudgetCallback: observed {observed} updates, beyond update_budget={self.update_budget}. "
                "HINT: gradient accumulation or a second optimizer step per batch is not supported."
            )
        self.observed_updates = observed
        if observed == self.update_budget:
            trainer.should_stop = True


class _InterruptAtBoundary(Exception):
    """Raised at a transaction boundary after the SIGINT checkpoint is published."""


class SegmentCheckpointCallback(Callback):
    """Write-once segment checkpoints every ``every`` observed updates and on SIGINT.

    A checkpoint is ``segment_checkpoint_u<NNNNNNNN>.safetensors`` (module state and AdamW
    moments/steps; no RNG state), its ``.json`` structure and a ``segment_checkpoint``
    receipt, written at a transaction boundary: the start of the next training batch, when
    the previous update and all its batch-end hooks (e.g. a target refresh) are complete.
    SIGINT is deferred by :meth:`sigint_handler`: the next boundary publishes a checkpoint
    and ends the fit, so an interrupt never captures a half-applied update. A second SIGINT
    interrupts at once.

    Args:
        directory: the segment directory (exists).
        every: updates between periodic checkpoints (int >= 1).
        update_budget: the final budget; no periodic checkpoint is written at the budget
            (the final state is).
        body: JSON facts copied into every checkpoint receipt (recipe digest, identities).
        inputs: files bound as inputs of every checkpoint receipt (e.g. the cold init).
    """

    def __init__(
        self,
        directory: Path,
        *,
        every: int,
        update_budget: int,
        body: Mapping[str, Any],
        inputs: Mapping[str, Path],
        start_updates: int = 0,
    ) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise QhInputError(
                f"SegmentCheckpointCallback: directory={str(directory)!r} is not allowed; allowed: an existing "
                "segment directory. HINT: the launcher creates it before the fit."
            )
        self.every = _positive_int("SegmentCheckpointCallback", "every", every)
        self.update_budget = _positive_int("SegmentCheckpointCallback", "update_budget", update_budget)
        self.body = dict(body)
        self.inputs = dict(inputs)
        self.start_updates = int(start_updates)
        self.interrupt_requested = False
        self.interrupted_at: int | None = None
        self.written: list[int] = []

    def sigint_handler(self, signum: int, frame: Any) -> None:
        """Defer the first SIGINT to the next transaction boundary; a second one interrupts now."""
        if self.interrupt_requested:
            raise KeyboardInterrupt
        self.interrupt_requested = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # The start of the next batch is the transaction boundary: the previous update and
        # every on_train_batch_end hook (the module's target refresh runs after callbacks)
        # have completed, and the next update has not begun.
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if self.interrupt_requested:
            if observed not in self.written:
                self.write(pl_module, trainer.optimizers[0], observed, reason="interrupt")
            self.interrupted_at = observed
            raise _InterruptAtBoundary(observed)
        if (
            observed % self.every == 0
            and self.start_updates < observed < self.update_budget
            and observed not in self.written
        ):
            self.write(pl_module, trainer.optimizers[0], observed, reason="periodic")

    def write(self, module: LightningModule, optimizer: Any, observed: int, *, reason: str) -> Path:
        """Publish one checkpoint at ``observed`` updates; return its receipt path."""
        tensors, structure = capture_training_state(module, optimizer)
        state = self.directory / f"segment_checkpoint_u{observed:08d}.safetensors"
        digest = save_tensor_state(state, tensors, structure)
        receipt = state.with_name(state.name.replace(".safetensors", ".receipt.json"))
        write_receipt(
            receipt,
            kind=CHECKPOINT_KIND,
            schema_version=CHECKPOINT_SCHEMA_VERSION,
            body={**self.body, "observed_updates": observed, "reason": reason, "state_sha256": digest},
            inputs=self.inputs,
            outputs={"state": state, "structure": structure_path(state)},
        )
        self.written.append(observed)
        return receipt


class _ResumeRestoreCallback(Callback):
    """Load the resumed module state and optimizer moments once the optimizer exists."""

    def __init__(self, resume: ResumeState) -> None:
        self.resume = resume

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # configure_optimizers has run (strategy setup precedes on_fit_start); params are on device.
        if len(trainer.optimizers) != 1:
            raise QhError(f"resume: {len(trainer.optimizers)} optimizers; allowed: exactly one.")
        _restore_optimizer(trainer.optimizers[0], self.resume.tensors, self.resume.structure)


@contextlib.contextmanager
def _deferred_sigint(handler: Callable[[int, Any], None]) -> Iterator[None]:
    # signal.signal works only in the main thread (Ray workers and test threads skip it).
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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


def wandb_logger(attempt: Any, directory: Path, *, project: str = "qhlab", config: Mapping | None = None) -> Any:
    """A ``WandbLogger`` for one attempt, writing under ``directory/wandb``.

    Offline attempts never touch the network (``mode="offline"``, silent, no code, git,
    stats or machine-info capture: they also cost start-up time). Each offline segment is
    a new run ``attempt.run_id`` grouped by ``attempt.logical_run_id``.
    """
    from lightning.pytorch.loggers import WandbLogger
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")
    settings = wandb.Settings(
        console="off",
        disable_git=True,
        save_code=False,
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        silent=True,
    )
    # mode comes from attempt.apply; WandbLogger(offline=True) would set WANDB_MODE process-wide.
    init = attempt.apply({"project": project})
    return WandbLogger(
        save_dir=str(directory),
        settings=settings,
        config=dict(config or {}),
        name=attempt.resolved_local_attempt_id,
        log_model=False,
        **init,
    )


# --------------------------------------------------------------------------------- the seam


@dataclasses.dataclass(frozen=True)
class AdmittedLaunch:
    """A profile admitted on this host and the recipe it applied.

    Attributes:
        profile: the ``QhExecutionProfile``.
        runtime: JSON-able ``admit_runtime()`` evidence.
        recipe: ``profile.apply(recipe)``: only backend fields changed.
    """

    profile: Any
    runtime: dict
    recipe: Any


def admit_launch(profile_name: str, recipe: Any) -> AdmittedLaunch:
    """Resolve the profile, admit the real runtime and apply the profile to the recipe.

    Call before creating any directory: a refusal writes nothing.

    Raises:
        QhInputError: unknown profile, or the host does not admit it (names expected and actual).
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
    return AdmittedLaunch(profile=profile, runtime=_jsonable_evidence(runtime), recipe=profile.apply(recipe))


def _jsonable_evidence(value: Any) -> dict:
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    elif hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return to_jsonable(dict(value) if isinstance(value, Mapping) else {"value": value})


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
        raise QhInputError(
            f"resume: recipe_digest={recipe_digest!r} is not allowed; allowed: {body.get('recipe_digest')!r} "
            f"(the recipe of segment {previous.name!r}). HINT: resume with the same recipe and profile."
        )
    state_path = receipt_path.with_name(f"segment_checkpoint_u{updates:08d}.safetensors")
    tensors, structure = load_tensor_state(state_path, expected_sha256=body["state_sha256"])
    return ResumeState(
        previous_local_attempt_id=previous.name,
        previous_directory=previous,
        cold_init=previous / COLD_INIT_STATE,
        lineage=_lineage_record(lineage),
        state_path=state_path,
        state_sha256=body["state_sha256"],
        start_updates=updates,
        logical_run_id=body.get("logical_run_id"),
        recipe_digest=recipe_digest,
        tensors=tensors,
        structure=structure,
    )


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """What one launched segment published.

    Attributes:
        directory: the segment directory.
        observed_updates: final count read from the optimizer state.
        cold_init: ``cold_init.safetensors``.
        final_state: ``final_state.safetensors``.
        final_state_sha256: digest of its bytes.
        fit_receipt: ``fit.receipt.json``.
        wandb_receipt: ``wandb_attempt.receipt.json``.
        finalize_files: files the ``finalize`` hook published (e.g. the evaluation receipt).
        metrics: metrics handed to ``publish_wandb_attempt``.
        wall_seconds: seconds from the start of the seam to the W&B receipt.
    """

    directory: Path
    observed_updates: int
    cold_init: Path
    final_state: Path
    final_state_sha256: str
    fit_receipt: Path
    wandb_receipt: Path
    finalize_files: dict
    metrics: dict
    wall_seconds: float


def _lineage_record(lineage: Any) -> dict:
    # Paths stay out of receipts (they are host-specific); names and digests identify the lineage.
    return {
        "cold_init": Path(lineage.path).name,
        "sha256": lineage.sha256,
        "seed": lineage.seed,
        "source_package_digest": lineage.source_package_digest,
    }


def _copy_cold_initialization(source_dir: Path, directory: Path) -> Path:
    for name in (COLD_INIT_STATE, COLD_INIT_STRUCTURE, COLD_INIT_RECEIPT):
        publish_bytes(directory / name, (source_dir / name).read_bytes())
    return directory / COLD_INIT_STATE


def launch_fit(
    admitted: AdmittedLaunch,
    *,
    module_factory: Callable[[Any], LightningModule],
    datamodule: LightningDataModule,
    update_budget: int,
    seed: int,
    attempt: Any,
    directory: Path,
    recipe_digest: str,
    inputs: Mapping[str, Path] | None = None,
    resume: ResumeState | None = None,
    extra_callbacks: Sequence[Callback] = (),
    max_allocated_bytes: int | None = None,
    segment_checkpoint_every: int | None = None,
    progress: bool = True,
    finalize: Callable[[LightningModule, Path, str], tuple[dict[str, Path], dict[str, float]]] | None = None,
) -> LaunchResult:
    """Run one segment: seed, cold init, ``Trainer.fit``, final state, fit receipt, W&B close.

    The caller has validated everything and called :func:`admit_launch`; this function
    creates ``directory`` (it must not exist) and publishes write-once files into it.

    Args:
        admitted: the admitted profile and applied recipe.
        module_factory: applied recipe -> LightningModule whose ``configure_optimizers``
            returns one AdamW optimizer.
        datamodule: yields training batches.
        update_budget: final observed update count of the lineage.
        seed: the recipe seed (cold init, lineage and Lightning seeding).
        attempt: the ``WandbAttempt`` of this segment.
        directory: ``attempt.output_directory(output, cell)``.
        recipe_digest: digest of the applied recipe (bound in every receipt).
        inputs: files the fit read (population manifests), bound in the fit receipt.
        resume: state from :func:`load_resume_state`, or None for a fresh lineage.
        extra_callbacks: caller callbacks (e.g. commissioning gates); they run before the
            launcher's budget and checkpoint callbacks in every hook.
        max_allocated_bytes: memory cap for ``prepare_memory_accounting``.
        segment_checkpoint_every: updates between periodic checkpoints (default budget/4).
        progress: Lightning progress bar.
        finalize: hook ``(module, final_state_path, final_state_sha256) -> (files, metrics)``
            run after the fit receipt (evaluation); its files and metrics are published
            with the W&B attempt.

    Raises:
        FitInterrupted: SIGINT; a segment checkpoint was published first.
        QhError: the observed update count differs from the budget, or a callback failed.
    """
    started = time.perf_counter()
    profile, recipe = admitted.profile, admitted.recipe
    update_budget = _positive_int("launch_fit", "update_budget", update_budget)
    start_updates = resume.start_updates if resume is not None else 0
    every = segment_checkpoint_every or max(1, update_budget // 4)
    source = source_package_digest()
    directory = fresh_directory(directory)

    seed_everything(seed, workers=True, verbose=False)
    profile.prepare_memory_accounting(max_allocated_bytes)
    module = module_factory(recipe)

    if resume is None:
        tensors = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        cold_init = write_cold_initialization(
            directory,
            tensors,
            seed=seed,
            source_package_digest=source["sha256"],
            structure={"module_keys": sorted(tensors), "recipe_digest": recipe_digest, "observed_updates": 0},
        )
        lineage: dict[str, Any] = {"kind": "fresh", "segment": 0}
    else:
        cold_init = _copy_cold_initialization(resume.previous_directory, directory)
        verified = verified_cold_initialization_lineage(cold_init, source_package_digest=source["sha256"], seed=seed)
        module.load_state_dict(_module_tensors(resume.tensors), strict=True)
        lineage = {
            "kind": "resumed",
            "previous_local_attempt_id": resume.previous_local_attempt_id,
            "previous_state": resume.state_path.name,
            "previous_state_sha256": resume.state_sha256,
            "start_updates": start_updates,
            "cold_initialization": _lineage_record(verified),
        }

    identity = {
        "recipe_digest": recipe_digest,
        "local_attempt_id": attempt.resolved_local_attempt_id,
        "logical_run_id": attempt.logical_run_id,
        "seed": seed,
        "cold_init_sha256": sha256_file(cold_init),
    }
    checkpoints = SegmentCheckpointCallback(
        directory,
        every=every,
        update_budget=update_budget,
        body=identity,
        inputs={"cold_init": cold_init},
        start_updates=start_updates,
    )
    budget = UpdateBudgetCallback(update_budget, start_updates=start_updates)
    callbacks: list[Callback] = [_ResumeRestoreCallback(resume)] if resume is not None else []
    callbacks += [*extra_callbacks, budget, checkpoints]

    logger = wandb_logger(attempt, directory, config={"recipe_digest": recipe_digest, "seed": seed})
    remaining = update_budget - start_updates
    # A GradScaler may skip steps that global_step still counts; allow for them.
    max_steps = remaining if recipe.precision == "32-true" else 2 * remaining + 100
    trainer = build_trainer(
        recipe,
        max_steps=max_steps,
        callbacks=callbacks,
        logger=logger,
        progress=progress,
        log_every_n_steps=max(1, min(50, remaining // 20)),
    )
    try:
        with _deferred_sigint(checkpoints.sigint_handler):
            trainer.fit(module, datamodule=datamodule)
    except _InterruptAtBoundary:
        _finish_wandb(logger, exit_code=130)
        raise FitInterrupted(
            f"fit interrupted at {checkpoints.interrupted_at} observed updates (budget {update_budget}); segment "
            f"checkpoint written in {directory}. HINT: continue with --resume {directory.name}."
        ) from None
    except BaseException:
        _finish_wandb(logger, exit_code=1)
        raise

    optimizer = trainer.optimizers[0]
    observed = observed_optimizer_updates(optimizer)
    if observed != update_budget:
        _finish_wandb(logger, exit_code=1)
        raise QhError(
            f"launch_fit: observed {observed} optimizer updates but update_budget={update_budget}. HINT: the fit "
            "ended early (max_steps backstop or data exhausted); no final state was published."
        )
    tensors, structure = capture_training_state(module, optimizer)
    final_state = directory / FINAL_STATE
    final_sha = save_tensor_state(final_state, tensors, structure)
    memory = _jsonable_evidence(profile.memory_evidence())

    body = {
        "recipe": to_jsonable(recipe.model_dump(mode="json") if hasattr(recipe, "model_dump") else recipe),
        "recipe_digest": recipe_digest,
        "profile": profile.name,
        "runtime": admitted.runtime,
        "update_budget": update_budget,
        "observed_updates": observed,
        "observed_updates_source": "optimizer.state[p]['step']",
        "global_step": int(trainer.global_step),
        # CPU reductions depend on the thread count: bit-identical reruns need the same value.
        "torch_num_threads": torch.get_num_threads(),
        "segment_start_updates": start_updates,
        "seed": seed,
        "source_package": source,
        "memory": memory,
        "wandb": _jsonable_evidence(attempt.evidence()),
        "local_attempt_id": attempt.resolved_local_attempt_id,
        "logical_run_id": attempt.logical_run_id,
        "lineage": lineage,
        "segment_checkpoints": sorted(checkpoints.written),
        "final_state_sha256": final_sha,
        "cold_init_sha256": identity["cold_init_sha256"],
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    fit_inputs = {**(inputs or {}), "cold_init": cold_init, "cold_init_receipt": directory / COLD_INIT_RECEIPT}
    write_receipt(
        directory / FIT_RECEIPT,
        kind=FIT_KIND,
        schema_version=FIT_SCHEMA_VERSION,
        body=body,
        inputs=fit_inputs,
        outputs={"final_state": final_state, "final_state_structure": structure_path(final_state)},
    )
    files, metrics = finalize(module, final_state, final_sha) if finalize is not None else ({}, {})
    metrics = {"observed_updates": float(observed), **metrics}
    if logger is not None:
        logger.log_metrics(metrics, step=observed)
    # Publish while the run is still active: online publication attaches the summary and
    # the artifact to wandb.run. The offline run's .wandb file is not bound: wandb-core
    # still appends to it asynchronously after finish() returns, so its bytes are not final.
    published = {"fit_receipt": directory / FIT_RECEIPT, "final_state": final_state, **files}
    publish_wandb_attempt(attempt, directory / WANDB_RECEIPT, published, metrics)
    _finish_wandb(logger, exit_code=0)
    return LaunchResult(
        directory=directory,
        observed_updates=observed,
        cold_init=cold_init,
        final_state=final_state,
        final_state_sha256=final_sha,
        fit_receipt=directory / FIT_RECEIPT,
        wandb_receipt=directory / WANDB_RECEIPT,
        finalize_files=dict(files),
        metrics=metrics,
        wall_seconds=time.perf_counter() - started,
    )


def _finish_wandb(logger: Any, *, exit_code: int) -> None:
    # Close the run so its .wandb file is complete before it is digested.
    experiment = getattr(logger, "_experiment", None)
    if experiment is not None:
        with contextlib.suppress(Exception):
            experiment.finish(exit_code=exit_code)
