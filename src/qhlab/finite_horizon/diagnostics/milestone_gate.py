"""The commissioning gate on a live fit: observe milestones, check live state, save and reload it.

Owns: ``QhCommissioningMilestonesCallback`` and the checks a gate runs on live tensors
(residency, dtype, presence, finiteness of CPU copies), the optimizer evidence it records, and
the strict CPU scorer reconstruction under a forked RNG.

Does not own: the config, receipt record, file names and reader (``milestones``), the MPS
memory guard (``mps_memory``), counting updates (``qhlab.training.optimizer_state.
observed_optimizer_updates``, which reads AdamW ``state[p]["step"]``), capturing
module/optimizer state (``qhlab.training.optimizer_state.capture_training_state``) or tensor
files (``qhlab.training.tensor_state``).

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
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from qhlab.evidence import PublishConflictError, QhError, input_error, write_receipt
from qhlab.finite_horizon.diagnostics.milestones import (
    QhCommissioningMilestoneReceipt,
    QhCommissioningMilestonesConfig,
    budget_record,
    milestone_receipt_path,
    milestone_state_path,
)
from qhlab.finite_horizon.diagnostics.mps_memory import QhMpsMemoryBudgetCallback
from qhlab.finite_horizon.records import CommissioningMilestoneReceipt
from qhlab.training.optimizer_state import capture_training_state, observed_optimizer_updates
from qhlab.training.tensor_state import load_tensor_state, save_tensor_state, structure_path

__all__ = ["QhCommissioningMilestonesCallback"]

_CALL = "QhCommissioningMilestonesCallback"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _gate_failed(gate: int, reason: str) -> QhError:
    return QhError(f"{_CALL}: gate at successful_optimizer_updates={gate} failed: {reason}")


# ------------------------------------------------------------------------------ live checks


def _roles(pl_module: LightningModule) -> tuple[str, ...]:
    """The module's scorers: online, target and, where the recipe keeps one, the evaluated average."""
    return ("online", "target") + (("average",) if getattr(pl_module, "average", None) is not None else ())


def _live_tensors(pl_module: LightningModule, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """Live references (no copies) grouped by what they are, keyed by their state-file name."""
    groups: dict[str, dict[str, torch.Tensor]] = {r: {} for r in _roles(pl_module)}
    groups.update(gradient={}, moment={})
    for role in _roles(pl_module):
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
        raise _gate_failed(
            gate,
            f"{len(offenders)} live tensor(s) are not float32 on {device!r}: "
            + "; ".join(offenders)
            + ". HINT: the lane must keep every parameter, gradient and moment on its device in FP32.",
        )
    return groups


def _finite_elements(tensors: Mapping[str, torch.Tensor], gate: int) -> int:
    """Element count of the CPU copies after requiring every one of them to be finite."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise _gate_failed(
            gate,
            f"{len(bad)} tensor(s) hold NaN or Inf: {', '.join(sorted(bad))}. HINT: the fit diverged or "
            "a non-finite gradient reached the optimizer; no receipt is written for this gate.",
        )
    return int(sum(t.numel() for t in tensors.values()))


def _fork_devices(device: torch.device) -> tuple[list[Any], str]:
    if device.type == "cpu":
        return [], "cpu"
    return [device if device.index is not None else torch.device(device.type, 0)], device.type


def _strict_reload(
    pl_module: LightningModule, loaded: Mapping[str, torch.Tensor], device: torch.device, gate: int
) -> None:
    """Rebuild every scorer (online, target, average) on CPU, load strictly and require exact equality."""
    devices, device_type = _fork_devices(device)
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        for role in _roles(pl_module):
            prefix = f"{role}."
            state = {k[len(prefix) :]: v for k, v in loaded.items() if k.startswith(prefix)}
            scorer = pl_module.build_scorer()
            try:
                scorer.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                raise _gate_failed(gate, f"strict reload of the {role} scorer refused the saved state: {exc}") from exc
            rebuilt = scorer.state_dict()
            unequal = [k for k, v in rebuilt.items() if not torch.equal(v, state[k]) or v.dtype != state[k].dtype]
            if set(rebuilt) != set(state) or unequal:
                raise _gate_failed(
                    gate, f"the reconstructed {role} scorer differs from the saved state in {sorted(unequal)}."
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
    return {
        "optimizer": type(optimizer).__name__,
        "successful_optimizer_updates": gate,
        "observed_from": "optimizer.state[param]['step']",
        "parameter_steps": steps,
        "trainer_global_step_not_used": int(global_step),
        "tensor_counts": {group: len(members) for group, members in groups.items()},
        "residency": {group: sorted({str(t.device) for t in members.values()}) for group, members in groups.items()},
        "dtypes": {
            group: sorted({_dtype_name(t.dtype) for t in members.values()}) for group, members in groups.items()
        },
        "finite": True,
        "elements": _finite_elements(tensors, gate),
        "state_tensor_count": len(tensors),
    }


# ------------------------------------------------------------------------------ callback


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

    def __init__(self, config: QhCommissioningMilestonesConfig, output_dir: str | Path) -> None:
        if not isinstance(config, QhCommissioningMilestonesConfig):
            raise input_error(
                _CALL, "config", config, "a QhCommissioningMilestonesConfig", "declare the gates before fitting."
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
        missing = [a for a in ("online", "target", "build_scorer") if not hasattr(pl_module, a)]
        if missing:
            raise input_error(
                _CALL,
                "pl_module",
                type(pl_module).__name__,
                f"a QH module (this one lacks {missing})",
                "gates inspect a QH module with online/target scorers and build_scorer().",
            )
        device = trainer.strategy.root_device
        if device.type != self.config.expected_device:
            raise input_error(
                _CALL,
                "device",
                str(device),
                f"expected_device={self.config.expected_device!r} from the config",
                "commission with the profile whose device type the config declares.",
            )
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise input_error(
                _CALL,
                "output_dir",
                str(self.output_dir),
                "a directory",
                "choose a directory path for the milestone files.",
            )
        for gate in self.config.milestones:
            state = milestone_state_path(self.output_dir, gate)
            for target in (state, structure_path(state), milestone_receipt_path(self.output_dir, gate)):
                if target.exists():
                    raise PublishConflictError(
                        f"{_CALL}: {target} already exists; milestone files are write-once. "
                        "HINT: choose a fresh output directory."
                    )
        if self.config.max_allocated_bytes is not None:
            position = trainer.callbacks.index(self)
            guards = [
                (i, cb)
                for i, cb in enumerate(trainer.callbacks)
                if isinstance(cb, QhMpsMemoryBudgetCallback)
                and cb.max_allocated_bytes == self.config.max_allocated_bytes
            ]
            if not guards or guards[0][0] > position:
                raise input_error(
                    _CALL,
                    "max_allocated_bytes",
                    self.config.max_allocated_bytes,
                    "None, or a budget with a QhMpsMemoryBudgetCallback of the same budget placed before this callback",
                    "pass [QhMpsMemoryBudgetCallback(...), QhCommissioningMilestonesCallback(...)] in that order.",
                )
            self._memory = guards[0][1]
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise QhError(
                f"{_CALL}: {len(trainer.optimizers)} optimizers are not allowed; "
                "allowed: exactly one (AdamW). HINT: the QH module configures one optimizer."
            )
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if observed >= self.config.milestones[0]:
            raise QhError(
                f"{_CALL}: the fit starts at {observed} successful updates, at or past "
                f"the first milestone {self.config.milestones[0]}; gates are observed, never inferred. "
                "HINT: commission from a cold start."
            )
        self._last_observed = observed

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        optimizer = trainer.optimizers[0]
        observed = observed_optimizer_updates(optimizer)
        milestones = self.config.milestones
        if self._next >= len(milestones):
            if observed > milestones[-1]:
                raise QhError(
                    f"{_CALL}: observed {observed} successful updates past the "
                    f"engineering budget {milestones[-1]}. HINT: the fit must stop at the last milestone."
                )
            return
        gate = milestones[self._next]
        if observed > gate:
            raise QhError(
                f"{_CALL}: the successful-update count went from {self._last_observed} "
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
                f"{_CALL}: captured state reports observed_updates="
                f"{structure.get('observed_updates')!r} at milestone {gate}."
            )
        evidence = _optimizer_evidence(inner, groups, tensors, structure, gate, trainer.global_step)
        state = milestone_state_path(self.output_dir, gate)
        digest = save_tensor_state(
            state,
            tensors,
            {**structure, "successful_optimizer_updates": gate, "gradient_keys": sorted(groups["gradient"])},
        )
        loaded, _ = load_tensor_state(state, expected_sha256=digest)
        differing = sorted(
            k
            for k in tensors
            if k not in loaded or loaded[k].dtype != tensors[k].dtype or not torch.equal(loaded[k], tensors[k])
        )
        if differing or set(loaded) != set(tensors):
            raise _gate_failed(gate, f"{state} does not reproduce the live clones for {differing}.")
        _strict_reload(pl_module, loaded, pl_module.device, gate)
        memory = self._memory.observation() if self._memory is not None else None
        if self._memory is not None and memory is None:
            raise QhError(
                f"{_CALL}: the memory guard took no sample before this gate. HINT: it must precede this callback."
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
            CommissioningMilestoneReceipt,
            body={**receipt.as_dict(), "engineering_budget": budget_record(self.config)},
            outputs={"state": state, "structure": structure_path(state)},
        )
        return receipt

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Require the complete engineering budget; never infer absent gates."""
        missing = self.config.milestones[self._next :]
        if missing:
            raise QhError(
                f"{_CALL}: the fit ended at {self._last_observed} successful "
                f"optimizer updates; milestones {list(missing)} were never observed. HINT: the engineering "
                f"budget is the last milestone ({self.config.milestones[-1]}); give the fit enough data/steps."
            )
