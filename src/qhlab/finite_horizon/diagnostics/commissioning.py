"""Observed optimizer milestones for opt-in engineering commissioning (seed 001).

Owns: the commissioning config, the Lightning callbacks that gate a fit at declared
*successful optimizer update* counts and guard live MPS tensor allocation, the typed
milestone receipt and memory observation, and the readers that authenticate them.

Does not own: counting updates (``qhlab.training.launcher.observed_optimizer_updates``, which
reads AdamW ``state[p]["step"]``), capturing module/optimizer state
(``qhlab.training.launcher.capture_training_state``), tensor files
(``qhlab.training.tensor_state``), receipts (``qhlab.evidence``), the fit composition
(``qhlab.finite_horizon.fit``) or learning quality. These gates never replace the
authenticated final fit receipt.

Where a gate observes. Lightning's automatic optimization zeroes gradients inside the
closure *before* the next backward (``loops/optimization/automatic.py``), so at
``on_train_batch_end`` the gradients that produced the just-completed update are still
present. Callback hooks run before the LightningModule's own ``on_train_batch_end``, so a
gate sees the state right after optimizer update ``n`` and before the module refreshes its
target network for that update. Checkpoint callbacks run after every other callback, so a
failed gate raises before any checkpoint of that batch is written.

A gate only reads live tensors: device/dtype checks read metadata, values are checked on
detached CPU copies, and the strict scorer reconstruction runs under
``torch.random.fork_rng`` (CPU and the live device), so the training RNG is untouched.

Files (in ``output_dir``, all write-once)::

    milestone_u<NNNNNNNN>.safetensors   online.*, target.*, grad.online.*, optim.<i>.{exp_avg,exp_avg_sq,step}
    milestone_u<NNNNNNNN>.json          dtype/shape per tensor, digest, structure
    milestone_u<NNNNNNNN>.receipt.json  kind "commissioning_milestone", binds both files
    mps_memory_observation.receipt.json kind "mps_memory_observation" (memory guard only)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from qhlab.evidence import (
    EvidenceError,
    MissingEvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    read_receipt,
    write_receipt,
)
from qhlab.training.launcher import capture_training_state, observed_optimizer_updates
from qhlab.training.tensor_state import load_tensor_state, save_tensor_state, structure_path

__all__ = [
    "MILESTONE_KIND",
    "MPS_MEMORY_KIND",
    "MPS_MEMORY_RECEIPT",
    "QhCommissioningMilestoneReceipt",
    "QhCommissioningMilestonesCallback",
    "QhCommissioningMilestonesConfig",
    "QhMpsMemoryBudgetCallback",
    "QhMpsMemoryObservation",
    "milestone_receipt_path",
    "read_commissioning_milestones",
    "read_mps_memory_observation",
]

MILESTONE_KIND = "commissioning_milestone"
MILESTONE_SCHEMA_VERSION = 1
MPS_MEMORY_KIND = "mps_memory_observation"
MPS_MEMORY_SCHEMA_VERSION = 1
MPS_MEMORY_RECEIPT = "mps_memory_observation.receipt.json"

_DEVICES = ("cpu", "cuda", "mps")
_MILESTONE_RE = re.compile(r"^milestone_u(\d{8})\.receipt\.json$")
# The sampler source is part of the sampling scope, so an injected (test) sampler can never
# pass for torch.mps evidence.
_SCOPE_MPS = "callback_instance_train_batch_end:torch.mps"
_SCOPE_INJECTED = "callback_instance_train_batch_end:injected_sampler"
_SCOPES = (_SCOPE_MPS, _SCOPE_INJECTED)
_RECEIPT_FIELDS = (
    "schema_version",
    "successful_optimizer_updates",
    "expected_device",
    "context_ids",
    "state_filename",
    "state_sha256",
    "strict_reload",
    "optimizer_evidence",
    "memory_observation",
)
_BODY_FIELDS = frozenset(_RECEIPT_FIELDS) | {"engineering_budget"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stem(successful_optimizer_updates: int) -> str:
    return f"milestone_u{successful_optimizer_updates:08d}"


def milestone_receipt_path(output_dir: str | Path, successful_optimizer_updates: int) -> Path:
    """Path of the receipt of the gate at ``successful_optimizer_updates`` in ``output_dir``."""
    return Path(output_dir) / f"{_stem(successful_optimizer_updates)}.receipt.json"


def _state_path(output_dir: Path, successful_optimizer_updates: int) -> Path:
    return output_dir / f"{_stem(successful_optimizer_updates)}.safetensors"


# ------------------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True, kw_only=True)
class QhCommissioningMilestonesConfig:
    """Declare observed gates and source/input context before fitting.

    Attributes:
        milestones: Strictly increasing successful-update gates (ints >= 1); the final count
            is the engineering budget (the fit stops there).
        expected_device: Required live tensor residency: ``"cpu"``, ``"cuda"`` or ``"mps"``;
            CPU is for focused verification only.
        max_allocated_bytes: Opt-in live MPS tensor-allocation limit (int >= 1) or None;
            driver/cache bytes are separate evidence. When set, the fit must also run a
            :class:`QhMpsMemoryBudgetCallback` with the same budget, placed before this gate.
        context_ids: Composition-provided source/config/input identities (non-empty strings,
            at least one) sealed in each receipt.

    Raises:
        QhInputError: on construction, naming the field, the value and what is allowed.
    """

    milestones: tuple[int, ...]
    expected_device: str
    max_allocated_bytes: int | None = None
    context_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        call = "QhCommissioningMilestonesConfig"
        milestones = self.milestones
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            milestones = None
        if (
            not milestones
            or not all(_is_int(m) and m >= 1 for m in milestones)
            or any(b <= a for a, b in zip(milestones, milestones[1:]))
        ):
            raise QhInputError(
                f"{call}: milestones={self.milestones!r} is not allowed; allowed: a non-empty sequence "
                "of strictly increasing ints >= 1. HINT: gates count successful optimizer updates, "
                "e.g. (1, 10, 100); the last one is the engineering budget."
            )
        if self.expected_device not in _DEVICES:
            raise QhInputError(
                f"{call}: expected_device={self.expected_device!r} is not allowed; allowed: "
                f"{', '.join(_DEVICES)}. HINT: name the device type of the execution profile."
            )
        budget = self.max_allocated_bytes
        if budget is not None and (not _is_int(budget) or budget < 1):
            raise QhInputError(
                f"{call}: max_allocated_bytes={budget!r} is not allowed; allowed: an int >= 1 or None. "
                "HINT: the live MPS tensor budget is given in bytes."
            )
        ids = self.context_ids
        if (
            isinstance(ids, (str, bytes))
            or not isinstance(ids, Sequence)
            or not ids
            or not all(isinstance(i, str) and i for i in ids)
        ):
            raise QhInputError(
                f"{call}: context_ids={ids!r} is not allowed; allowed: a non-empty sequence of non-empty "
                "strings. HINT: pass the recipe digest, source package digest and population manifest digests."
            )
        object.__setattr__(self, "milestones", tuple(milestones))
        object.__setattr__(self, "context_ids", tuple(ids))


@dataclasses.dataclass(frozen=True, kw_only=True)
class QhMpsMemoryObservation:
    """Current allocator values and sampled maxima, never an unsampled peak.

    Attributes:
        schema_version: Fixed serialized observation schema (1).
        sampling_scope: What the maxima and count cover: this callback instance's
            train-batch-end samples, and which sampler took them (``torch.mps`` or injected).
        sample_count: Positive number of completed samples represented.
        current_allocated_bytes: Live MPS tensor bytes at the latest sample (excludes the cache).
        driver_allocated_bytes: MPS driver bytes at the same sample (cache and driver resources).
        max_sampled_current_allocated_bytes: Largest live-tensor sample; a sampled maximum only.
        max_sampled_driver_allocated_bytes: Largest driver sample; never compared to the budget.
        max_allocated_bytes: Declared live MPS tensor budget (bytes).
        within_live_tensor_budget: Whether the latest live-tensor sample is <= the budget.

    Raises:
        QhInputError: an inconsistent record (negative bytes, latest above the maximum, a
            flag that disagrees with the values).
    """

    schema_version: int = MPS_MEMORY_SCHEMA_VERSION
    sampling_scope: str
    sample_count: int
    current_allocated_bytes: int
    driver_allocated_bytes: int
    max_sampled_current_allocated_bytes: int
    max_sampled_driver_allocated_bytes: int
    max_allocated_bytes: int
    within_live_tensor_budget: bool

    def __post_init__(self) -> None:
        call = "QhMpsMemoryObservation"
        problems = []
        if self.schema_version != MPS_MEMORY_SCHEMA_VERSION or not _is_int(self.schema_version):
            problems.append(f"schema_version={self.schema_version!r} (allowed: {MPS_MEMORY_SCHEMA_VERSION})")
        if self.sampling_scope not in _SCOPES:
            problems.append(f"sampling_scope={self.sampling_scope!r} (allowed: {', '.join(_SCOPES)})")
        if not _is_int(self.sample_count) or self.sample_count < 1:
            problems.append(f"sample_count={self.sample_count!r} (allowed: an int >= 1)")
        for name in (
            "current_allocated_bytes",
            "driver_allocated_bytes",
            "max_sampled_current_allocated_bytes",
            "max_sampled_driver_allocated_bytes",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                problems.append(f"{name}={value!r} (allowed: an int >= 0)")
        if not _is_int(self.max_allocated_bytes) or self.max_allocated_bytes < 1:
            problems.append(f"max_allocated_bytes={self.max_allocated_bytes!r} (allowed: an int >= 1)")
        if not isinstance(self.within_live_tensor_budget, bool):
            problems.append(f"within_live_tensor_budget={self.within_live_tensor_budget!r} (allowed: a bool)")
        if not problems:
            if self.current_allocated_bytes > self.max_sampled_current_allocated_bytes:
                problems.append("current_allocated_bytes exceeds max_sampled_current_allocated_bytes")
            if self.driver_allocated_bytes > self.max_sampled_driver_allocated_bytes:
                problems.append("driver_allocated_bytes exceeds max_sampled_driver_allocated_bytes")
            if self.within_live_tensor_budget != (self.current_allocated_bytes <= self.max_allocated_bytes):
                problems.append(
                    f"within_live_tensor_budget={self.within_live_tensor_budget!r} disagrees with "
                    f"current_allocated_bytes={self.current_allocated_bytes} and "
                    f"max_allocated_bytes={self.max_allocated_bytes}"
                )
        if problems:
            raise QhInputError(
                f"{call}: " + "; ".join(problems) + ". HINT: observations come from QhMpsMemoryBudgetCallback."
            )

    def as_dict(self) -> dict[str, Any]:
        """The observation as plain JSON values (the serialized form in receipts)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QhCommissioningMilestoneReceipt:
    """Typed observed gate bound to CPU state bytes and declared context.

    Attributes:
        schema_version: Fixed serialized milestone schema (1): binds observed gates, never
            batch or global-step counts.
        successful_optimizer_updates: The exact completed-update count (>= 1) observed after a
            training batch; identifies this milestone.
        expected_device: Declared device of the live parameters, gradients and moments.
        context_ids: Source/config/input identities copied from the config.
        state_filename: Milestone-local file name of the saved CPU state (write-once).
        state_sha256: SHA-256 of the exact saved state-file bytes.
        strict_reload: True: a fresh scorer loaded the online and target state strictly and
            every tensor reloaded from the file equals its live clone exactly.
        optimizer_evidence: Update identity, tensor counts, residency/dtypes and finiteness.
        memory_observation: Latest MPS memory sample when the live-tensor guard is enabled;
            None otherwise.
    """

    schema_version: int = MILESTONE_SCHEMA_VERSION
    successful_optimizer_updates: int
    expected_device: str
    context_ids: tuple[str, ...]
    state_filename: str
    state_sha256: str
    strict_reload: bool
    optimizer_evidence: Mapping[str, Any]
    memory_observation: QhMpsMemoryObservation | None

    def as_dict(self) -> dict[str, Any]:
        """The receipt attributes as plain JSON values."""
        return {
            "schema_version": self.schema_version,
            "successful_optimizer_updates": self.successful_optimizer_updates,
            "expected_device": self.expected_device,
            "context_ids": list(self.context_ids),
            "state_filename": self.state_filename,
            "state_sha256": self.state_sha256,
            "strict_reload": self.strict_reload,
            "optimizer_evidence": dict(self.optimizer_evidence),
            "memory_observation": None if self.memory_observation is None else self.memory_observation.as_dict(),
        }


# ------------------------------------------------------------------------------ gate logic


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _live_tensors(pl_module: LightningModule, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """Live references (no copies) grouped by what they are, keyed by their state-file name."""
    groups: dict[str, dict[str, torch.Tensor]] = {"online": {}, "target": {}, "gradient": {}, "moment": {}}
    for role in ("online", "target"):
        scorer = getattr(pl_module, role)
        for name, tensor in scorer.state_dict(keep_vars=True).items():
            groups[role][f"{role}.{name}"] = tensor
        for name, param in scorer.named_parameters():
            if param.grad is not None:
                groups["gradient"][f"grad.{role}.{name}"] = param.grad
    index = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    groups["moment"][f"optim.{index}.{key}"] = state[key]
            index += 1
    return groups


def _check_live(
    pl_module: LightningModule, optimizer: torch.optim.Optimizer, device: str, gate: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Residency, dtype and presence checks on live tensor metadata (no values read)."""
    groups = _live_tensors(pl_module, optimizer)
    offenders = []
    for group, tensors in groups.items():
        for name, tensor in tensors.items():
            if not tensor.is_floating_point():
                continue  # integer buffers are counters, not precision state
            if tensor.device.type != device or tensor.dtype != torch.float32:
                offenders.append(f"{name} ({group}): dtype={_dtype_name(tensor.dtype)} device={tensor.device}")
    for name, param in pl_module.online.named_parameters():
        if param.requires_grad and param.grad is None:
            offenders.append(f"grad.online.{name}: missing (no gradient produced update {gate})")
    index = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            if param.requires_grad and not ("exp_avg" in state and "exp_avg_sq" in state):
                offenders.append(f"optim.{index}: missing exp_avg/exp_avg_sq (not an AdamW state)")
            index += 1
    if offenders:
        raise QhError(
            f"QhCommissioningMilestonesCallback: gate at successful_optimizer_updates={gate} failed: "
            f"{len(offenders)} live tensor(s) are not float32 on {device!r}: " + "; ".join(offenders)
            + ". HINT: the lane must keep every parameter, gradient and moment on its device in FP32."
        )
    return groups


def _finite_summary(tensors: Mapping[str, torch.Tensor], gate: int) -> dict[str, int]:
    """Element counts per tensor group after requiring every CPU copy to be finite."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise QhError(
            f"QhCommissioningMilestonesCallback: gate at successful_optimizer_updates={gate} failed: "
            f"{len(bad)} tensor(s) hold NaN or Inf: {', '.join(sorted(bad))}. HINT: the fit diverged or "
            "a non-finite gradient reached the optimizer; no receipt is written for this gate."
        )
    return {"elements": int(sum(t.numel() for t in tensors.values()))}


def _fork_devices(device: torch.device) -> tuple[list[Any], str]:
    if device.type == "cpu":
        return [], "cpu"
    return [device if device.index is not None else torch.device(device.type, 0)], device.type


def _strict_reload(pl_module: LightningModule, loaded: Mapping[str, torch.Tensor], device: torch.device, gate: int) -> None:
    """Rebuild online and target scorers on CPU, load strictly and require exact equality."""
    devices, device_type = _fork_devices(device)
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        for role in ("online", "target"):
            prefix = f"{role}."
            state = {k[len(prefix):]: v for k, v in loaded.items() if k.startswith(prefix)}
            scorer = pl_module.build_scorer()
            try:
                scorer.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                raise QhError(
                    f"QhCommissioningMilestonesCallback: gate at successful_optimizer_updates={gate} failed: "
                    f"strict reload of the {role} scorer refused the saved state: {exc}"
                ) from exc
            rebuilt = scorer.state_dict()
            unequal = [k for k, v in rebuilt.items() if not torch.equal(v, state[k]) or v.dtype != state[k].dtype]
            if set(rebuilt) != set(state) or unequal:
                raise QhError(
                    f"QhCommissioningMilestonesCallback: gate at successful_optimizer_updates={gate} failed: "
                    f"the reconstructed {role} scorer differs from the saved state in {sorted(unequal)}."
                )


def _optimizer_evidence(
    optimizer: torch.optim.Optimizer,
    groups: Mapping[str, Mapping[str, torch.Tensor]],
    tensors: Mapping[str, torch.Tensor],
    structure: Mapping[str, Any],
    gate: int,
    global_step: int,
) -> dict[str, Any]:
    steps = sorted(set(structure.get("steps", {}).values()))
    evidence: dict[str, Any] = {
        "optimizer": type(optimizer).__name__,
        "successful_optimizer_updates": gate,
        "observed_from": "optimizer.state[param]['step']",
        "parameter_steps": steps,
        "trainer_global_step_not_used": int(global_step),
        "tensor_counts": {group: len(members) for group, members in groups.items()},
        "residency": {
            group: sorted({str(t.device) for t in members.values()}) for group, members in groups.items()
        },
        "dtypes": {
            group: sorted({_dtype_name(t.dtype) for t in members.values()}) for group, members in groups.items()
        },
        "finite": True,
        "elements": _finite_summary(tensors, gate)["elements"],
        "state_tensor_count": len(tensors),
    }
    return evidence


# ------------------------------------------------------------------------------ callbacks


class QhMpsMemoryBudgetCallback(Callback):
    """Guard observed live MPS tensor allocation after each training batch.

    Torch driver allocation includes its caching pool and other driver resources; it is
    recorded independently rather than compared with the live tensor limit. Sampling does not
    establish a true operation peak. No synchronization, cache eviction, model change or
    optimizer change is introduced.

    The observation is published once (``mps_memory_observation.receipt.json`` in
    ``output_dir``): at the end of the fit, at a breach (then the fit fails), or when the fit
    fails for another reason after at least one sample.

    Args:
        max_allocated_bytes: Live MPS tensor budget in bytes (int >= 1).
        output_dir: Directory receiving the observation receipt (created at setup).

    Use :meth:`with_sampler` to inject a sampler (tests on machines without MPS); an
    injected sampler is recorded in the observation's ``sampling_scope``.
    """

    def __init__(self, max_allocated_bytes, output_dir):
        if not _is_int(max_allocated_bytes) or max_allocated_bytes < 1:
            raise QhInputError(
                f"QhMpsMemoryBudgetCallback: max_allocated_bytes={max_allocated_bytes!r} is not allowed; "
                "allowed: an int >= 1. HINT: the live MPS tensor budget is given in bytes."
            )
        self.max_allocated_bytes = max_allocated_bytes
        self.output_dir = Path(output_dir)
        self._sampler: Callable[[], tuple[int, int]] | None = None
        self._count = 0
        self._current = 0
        self._driver = 0
        self._max_current = 0
        self._max_driver = 0
        self.receipt_path: Path | None = None

    @classmethod
    def with_sampler(
        cls, max_allocated_bytes: int, output_dir: str | Path, *, sampler: Callable[[], tuple[int, int]]
    ) -> QhMpsMemoryBudgetCallback:
        """A guard whose samples come from ``sampler() -> (current_bytes, driver_bytes)``.

        It runs on any device; the observation's ``sampling_scope`` says the sampler was injected.
        """
        if not callable(sampler):
            raise QhInputError(
                f"QhMpsMemoryBudgetCallback.with_sampler: sampler={sampler!r} is not allowed; allowed: a "
                "callable returning (current_allocated_bytes, driver_allocated_bytes)."
            )
        guard = cls(max_allocated_bytes, output_dir)
        guard._sampler = sampler
        return guard

    @property
    def sample_count(self) -> int:
        """Samples taken so far by this instance."""
        return self._count

    def observation(self) -> QhMpsMemoryObservation | None:
        """The latest sample and the sampled maxima, or None before the first sample."""
        if self._count == 0:
            return None
        return QhMpsMemoryObservation(
            sampling_scope=_SCOPE_MPS if self._sampler is None else _SCOPE_INJECTED,
            sample_count=self._count,
            current_allocated_bytes=self._current,
            driver_allocated_bytes=self._driver,
            max_sampled_current_allocated_bytes=self._max_current,
            max_sampled_driver_allocated_bytes=self._max_driver,
            max_allocated_bytes=self.max_allocated_bytes,
            within_live_tensor_budget=self._current <= self.max_allocated_bytes,
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        device = trainer.strategy.root_device
        if self._sampler is None and (device.type != "mps" or not torch.backends.mps.is_available()):
            raise QhInputError(
                f"QhMpsMemoryBudgetCallback: device={str(device)!r} is not allowed; allowed: mps (with "
                "torch.backends.mps available). HINT: the live MPS tensor guard samples "
                "torch.mps.current_allocated_memory(); run it only on the mps-fp32 lane, or drop "
                "--max-allocated-bytes on other lanes."
            )
        target = self.output_dir / MPS_MEMORY_RECEIPT
        if target.exists():
            raise PublishConflictError(
                f"QhMpsMemoryBudgetCallback: {target} already exists; observations are write-once. "
                "HINT: choose a fresh output directory."
            )
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def _sample(self) -> tuple[int, int]:
        if self._sampler is None:
            return int(torch.mps.current_allocated_memory()), int(torch.mps.driver_allocated_memory())
        sample = self._sampler()
        if (
            not isinstance(sample, tuple)
            or len(sample) != 2
            or not all(_is_int(v) and v >= 0 for v in sample)
        ):
            raise QhError(
                f"QhMpsMemoryBudgetCallback: sampler returned {sample!r}; allowed: a tuple of two ints >= 0 "
                "(current_allocated_bytes, driver_allocated_bytes)."
            )
        return sample

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        current, driver = self._sample()
        self._count += 1
        self._current, self._driver = current, driver
        self._max_current = max(self._max_current, current)
        self._max_driver = max(self._max_driver, driver)
        if current > self.max_allocated_bytes:
            path = self._publish()
            raise QhError(
                f"QhMpsMemoryBudgetCallback: current_allocated_bytes={current} exceeds max_allocated_bytes="
                f"{self.max_allocated_bytes} at sample {self._count} (batch {batch_idx}); the observation "
                f"is in {path}. HINT: lower the batch size or raise the declared budget."
            )

    def _publish(self) -> Path | None:
        if self.receipt_path is not None or self._count == 0:
            return self.receipt_path
        observation = self.observation()
        path = self.output_dir / MPS_MEMORY_RECEIPT
        write_receipt(
            path, kind=MPS_MEMORY_KIND, schema_version=MPS_MEMORY_SCHEMA_VERSION, body=observation.as_dict()
        )
        self.receipt_path = path
        return path

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._publish()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Samples already taken are true evidence even when the fit failed elsewhere.
        self._publish()


class QhCommissioningMilestonesCallback(Callback):
    """Observe live finite FP32 state and strict CPU scorer reconstruction.

    After every training batch the callback reads the successful-update count from the
    optimizer state. When it reaches the next declared milestone the gate: checks every live
    online/target tensor, online gradient and AdamW moment is float32 on the expected device;
    copies them to CPU and requires them finite; publishes them once with their SHA-256;
    reloads the file, rebuilds online and target scorers with ``pl_module.build_scorer()``
    under a forked RNG, loads them strictly and requires exact equality; and publishes the
    typed receipt. A failing gate raises ``QhError`` (the fit stops, no receipt for it). At
    the last milestone the callback asks Lightning to stop.

    A gate failure interrupts engineering fitting. Construction and reload run under a forked
    CPU RNG, preserving the training RNG. No live parameter, gradient, moment, forward result
    or optimizer state is modified.

    Args:
        config: The declared gates and context.
        output_dir: Directory receiving the milestone files (created at fit start).

    Attributes:
        receipts: Receipts of the gates passed so far, in order.
    """

    def __init__(self, config, output_dir):
        if not isinstance(config, QhCommissioningMilestonesConfig):
            raise QhInputError(
                f"QhCommissioningMilestonesCallback: config={type(config).__name__} is not allowed; allowed: "
                "QhCommissioningMilestonesConfig. HINT: declare the gates before fitting."
            )
        self.config = config
        self.output_dir = Path(output_dir)
        self.receipts: list[QhCommissioningMilestoneReceipt] = []
        self._next = 0
        self._last_observed: int | None = None
        self._memory: QhMpsMemoryBudgetCallback | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        call = "QhCommissioningMilestonesCallback"
        missing = [a for a in ("online", "target", "build_scorer") if not hasattr(pl_module, a)]
        if missing:
            raise QhInputError(
                f"{call}: pl_module={type(pl_module).__name__} is not allowed; it lacks {missing}. "
                "HINT: gates inspect a QH module with online/target scorers and build_scorer()."
            )
        device = trainer.strategy.root_device
        if device.type != self.config.expected_device:
            raise QhInputError(
                f"{call}: device={str(device)!r} is not allowed; allowed: expected_device="
                f"{self.config.expected_device!r} from the config. HINT: commission with the profile "
                "whose device type the config declares."
            )
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise QhInputError(f"{call}: output_dir={str(self.output_dir)!r} is not allowed; allowed: a directory.")
        for gate in self.config.milestones:
            state = _state_path(self.output_dir, gate)
            for target in (state, structure_path(state), milestone_receipt_path(self.output_dir, gate)):
                if target.exists():
                    raise PublishConflictError(
                        f"{call}: {target} already exists; milestone files are write-once. "
                        "HINT: choose a fresh output directory."
                    )
        if self.config.max_allocated_bytes is not None:
            position = trainer.callbacks.index(self)
            guards = [
                (i, cb) for i, cb in enumerate(trainer.callbacks)
                if isinstance(cb, QhMpsMemoryBudgetCallback) and cb.max_allocated_bytes == self.config.max_allocated_bytes
            ]
            if not guards or guards[0][0] > position:
                raise QhInputError(
                    f"{call}: max_allocated_bytes={self.config.max_allocated_bytes!r} is not allowed without a "
                    "QhMpsMemoryBudgetCallback of the same budget placed before this callback. HINT: pass "
                    "[QhMpsMemoryBudgetCallback(...), QhCommissioningMilestonesCallback(...)] in that order."
                )
            self._memory = guards[0][1]
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise QhError(
                f"QhCommissioningMilestonesCallback: {len(trainer.optimizers)} optimizers are not allowed; "
                "allowed: exactly one (AdamW). HINT: the QH module configures one optimizer."
            )
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if observed >= self.config.milestones[0]:
            raise QhError(
                f"QhCommissioningMilestonesCallback: the fit starts at {observed} successful updates, at or past "
                f"the first milestone {self.config.milestones[0]}; gates are observed, never inferred. "
                "HINT: commission from a cold start."
            )
        self._last_observed = observed

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        optimizer = trainer.optimizers[0]
        observed = observed_optimizer_updates(optimizer)
        milestones = self.config.milestones
        if self._next >= len(milestones):
            if observed > milestones[-1]:
                raise QhError(
                    f"QhCommissioningMilestonesCallback: observed {observed} successful updates past the "
                    f"engineering budget {milestones[-1]}. HINT: the fit must stop at the last milestone."
                )
            return
        gate = milestones[self._next]
        if observed > gate:
            raise QhError(
                f"QhCommissioningMilestonesCallback: the successful-update count went from {self._last_observed} "
                f"to {observed} in one batch, past milestone {gate} unobserved. HINT: gradient accumulation "
                "or several optimizer steps per batch are not supported."
            )
        self._last_observed = observed
        if observed == gate:
            self.receipts.append(self._gate(trainer, pl_module, gate))
            self._next += 1
            if self._next == len(milestones):
                trainer.should_stop = True

    def _gate(self, trainer: Trainer, pl_module: LightningModule, gate: int) -> QhCommissioningMilestoneReceipt:
        inner = getattr(trainer.optimizers[0], "optimizer", trainer.optimizers[0])
        device = self.config.expected_device
        groups = _check_live(pl_module, inner, device, gate)
        tensors, structure = capture_training_state(pl_module, inner)
        for name, grad in groups["gradient"].items():
            tensors[name] = grad.detach().to("cpu", copy=True)
        if structure.get("observed_updates") != gate:
            raise QhError(
                f"QhCommissioningMilestonesCallback: captured state reports observed_updates="
                f"{structure.get('observed_updates')!r} at milestone {gate}."
            )
        evidence = _optimizer_evidence(inner, groups, tensors, structure, gate, trainer.global_step)
        state = _state_path(self.output_dir, gate)
        digest = save_tensor_state(
            state,
            tensors,
            {**structure, "successful_optimizer_updates": gate, "gradient_keys": sorted(groups["gradient"])},
        )
        loaded, _ = load_tensor_state(state, expected_sha256=digest)
        differing = sorted(
            k for k in tensors if k not in loaded or loaded[k].dtype != tensors[k].dtype or not torch.equal(loaded[k], tensors[k])
        )
        if differing or set(loaded) != set(tensors):
            raise QhError(
                f"QhCommissioningMilestonesCallback: gate at successful_optimizer_updates={gate} failed: "
                f"{state} does not reproduce the live clones for {differing}."
            )
        _strict_reload(pl_module, loaded, pl_module.device, gate)
        memory = self._memory.observation() if self._memory is not None else None
        if self._memory is not None and memory is None:
            raise QhError(
                "QhCommissioningMilestonesCallback: the memory guard took no sample before this gate. "
                "HINT: it must precede this callback."
            )
        receipt = QhCommissioningMilestoneReceipt(
            successful_optimizer_updates=gate,
            expected_device=device,
            context_ids=self.config.context_ids,
            state_filename=state.name,
            state_sha256=digest,
            strict_reload=True,
            optimizer_evidence=evidence,
            memory_observation=memory,
        )
        write_receipt(
            milestone_receipt_path(self.output_dir, gate),
            kind=MILESTONE_KIND,
            schema_version=MILESTONE_SCHEMA_VERSION,
            body={**receipt.as_dict(), "engineering_budget": _budget_record(self.config)},
            outputs={"state": state, "structure": structure_path(state)},
        )
        return receipt

    def on_fit_end(self, trainer, pl_module):
        """Require the complete engineering budget; never infer absent gates."""
        missing = self.config.milestones[self._next:]
        if missing:
            raise QhError(
                f"QhCommissioningMilestonesCallback: the fit ended at {self._last_observed} successful "
                f"optimizer updates; milestones {list(missing)} were never observed. HINT: the engineering "
                f"budget is the last milestone ({self.config.milestones[-1]}); give the fit enough data/steps."
            )


def _budget_record(config: QhCommissioningMilestonesConfig) -> dict[str, Any]:
    return {
        "milestones": list(config.milestones),
        "successful_optimizer_updates": config.milestones[-1],
        "max_allocated_bytes": config.max_allocated_bytes,
    }


# ------------------------------------------------------------------------------ readers


def _observation_from(body: Any, path: Path) -> QhMpsMemoryObservation:
    fields = {f.name for f in dataclasses.fields(QhMpsMemoryObservation)}
    if not isinstance(body, dict) or set(body) != fields:
        raise EvidenceError(
            f"{path}: memory observation does not have exactly the fields {sorted(fields)}."
        )
    try:
        return QhMpsMemoryObservation(**body)
    except QhInputError as exc:
        raise EvidenceError(f"{path}: inconsistent memory observation: {exc}") from None


def _refuse(path: Path, message: str) -> EvidenceError:
    return EvidenceError(f"read_commissioning_milestones: {path}: {message}")


def _read_one(config: QhCommissioningMilestonesConfig, output_dir: Path, gate: int) -> QhCommissioningMilestoneReceipt:
    path = milestone_receipt_path(output_dir, gate)
    if not path.is_file():
        raise MissingEvidenceError(
            f"read_commissioning_milestones: {path} is missing; milestone {gate} declared by the config "
            "has no receipt. HINT: gates are never inferred; re-run commissioning."
        )
    document = read_receipt(path, kind=MILESTONE_KIND, schema_version=MILESTONE_SCHEMA_VERSION)
    body = document["body"]
    if not isinstance(body, dict) or set(body) != _BODY_FIELDS:
        raise _refuse(path, f"body does not have exactly the fields {sorted(_BODY_FIELDS)}")
    expected = {
        "schema_version": MILESTONE_SCHEMA_VERSION,
        "successful_optimizer_updates": gate,
        "expected_device": config.expected_device,
        "context_ids": list(config.context_ids),
        "state_filename": _state_path(output_dir, gate).name,
        "strict_reload": True,
        "engineering_budget": _budget_record(config),
    }
    for field, value in expected.items():
        if body[field] != value or type(body[field]) is not type(value):
            raise _refuse(path, f"{field}={body[field]!r} differs from the declared {value!r}")
    outputs = document["outputs"]
    state = output_dir / body["state_filename"]
    if set(outputs) != {"state", "structure"} or outputs["state"]["path"] != state.name:
        raise _refuse(path, "does not bind exactly its state and structure files")
    if not isinstance(body["state_sha256"], str) or not _HEX64.match(body["state_sha256"]) or (
        outputs["state"]["sha256"] != body["state_sha256"]
    ):
        raise _refuse(path, f"state_sha256={body['state_sha256']!r} differs from the bound state digest")
    try:
        tensors, structure = load_tensor_state(state, expected_sha256=body["state_sha256"])
    except EvidenceError as exc:
        raise _refuse(path, f"state file {state} failed authentication: {exc}") from None
    if structure.get("successful_optimizer_updates") != gate or structure.get("observed_updates") != gate:
        raise _refuse(path, f"state file {state} records another update count than {gate}")
    bad = [n for n, t in tensors.items() if t.is_floating_point() and (t.dtype != torch.float32 or not bool(torch.isfinite(t).all()))]
    if bad:
        raise _refuse(path, f"state file {state} holds non-finite or non-float32 tensors {sorted(bad)}")
    evidence = body["optimizer_evidence"]
    if not isinstance(evidence, dict) or evidence.get("successful_optimizer_updates") != gate or evidence.get("parameter_steps", [None])[-1:] != [gate]:
        raise _refuse(path, "optimizer_evidence does not identify this successful update")
    memory = body["memory_observation"]
    if config.max_allocated_bytes is None:
        if memory is not None:
            raise _refuse(path, "holds a memory observation although the config declares no budget")
        observation = None
    else:
        observation = _observation_from(memory, path)
        if observation.max_allocated_bytes != config.max_allocated_bytes or not observation.within_live_tensor_budget:
            raise _refuse(path, "memory observation does not satisfy the declared max_allocated_bytes")
    return QhCommissioningMilestoneReceipt(
        successful_optimizer_updates=gate,
        expected_device=body["expected_device"],
        context_ids=tuple(body["context_ids"]),
        state_filename=body["state_filename"],
        state_sha256=body["state_sha256"],
        strict_reload=True,
        optimizer_evidence=evidence,
        memory_observation=observation,
    )


def read_commissioning_milestones(config, output_dir):
    """Authenticate every declared observed gate; final fit admission is separate.

    Every milestone of ``config`` must have its receipt in ``output_dir``; each receipt, its
    state file and structure file are re-hashed; the body must match the config (update
    count, device, context ids, budget); the state must load (safetensors, float32, finite).
    A milestone receipt in ``output_dir`` that the config does not declare is refused too.

    Args:
        config: The :class:`QhCommissioningMilestonesConfig` the fit was commissioned with.
        output_dir: The callback's output directory.

    Returns:
        One receipt per milestone, in milestone order.

    Raises:
        EvidenceError: (or a subclass) naming the file at the first mismatch, missing gate or
            altered byte.
    """
    if not isinstance(config, QhCommissioningMilestonesConfig):
        raise QhInputError(
            f"read_commissioning_milestones: config={type(config).__name__} is not allowed; allowed: "
            "QhCommissioningMilestonesConfig."
        )
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise MissingEvidenceError(f"read_commissioning_milestones: {output_dir} is not a directory.")
    declared = set(config.milestones)
    for candidate in sorted(output_dir.iterdir()):
        match = _MILESTONE_RE.match(candidate.name)
        if match and int(match.group(1)) not in declared:
            raise EvidenceError(
                f"read_commissioning_milestones: {candidate} is a milestone the config does not declare "
                f"(declared: {list(config.milestones)})."
            )
    return tuple(_read_one(config, output_dir, gate) for gate in config.milestones)


def read_mps_memory_observation(output_dir, *, max_allocated_bytes):
    """Authenticate sampled memory evidence against one declared tensor budget.

    Args:
        output_dir: The memory guard's output directory.
        max_allocated_bytes: The declared live-tensor budget (int >= 1); the record must bind
            exactly this budget and no sample may exceed it.

    Returns:
        The authenticated observation.

    Raises:
        QhInputError: a bad ``max_allocated_bytes``.
        EvidenceError: (or a subclass) naming the receipt on any mismatch, altered byte or breach.
    """
    if not _is_int(max_allocated_bytes) or max_allocated_bytes < 1:
        raise QhInputError(
            f"read_mps_memory_observation: max_allocated_bytes={max_allocated_bytes!r} is not allowed; "
            "allowed: an int >= 1. HINT: pass the budget the fit declared."
        )
    path = Path(output_dir) / MPS_MEMORY_RECEIPT
    document = read_receipt(path, kind=MPS_MEMORY_KIND, schema_version=MPS_MEMORY_SCHEMA_VERSION)
    observation = _observation_from(document["body"], path)
    if observation.max_allocated_bytes != max_allocated_bytes:
        raise EvidenceError(
            f"read_mps_memory_observation: {path} binds max_allocated_bytes={observation.max_allocated_bytes}; "
            f"declared {max_allocated_bytes}."
        )
    if observation.max_sampled_current_allocated_bytes > max_allocated_bytes:
        raise EvidenceError(
            f"read_mps_memory_observation: {path} records a sampled live-tensor allocation of "
            f"{observation.max_sampled_current_allocated_bytes} bytes above the budget {max_allocated_bytes}."
        )
    return observation
