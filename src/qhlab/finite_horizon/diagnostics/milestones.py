"""Observed optimizer milestones: what a commissioning gate declares, records and authenticates.

Owns: the commissioning config (``QhCommissioningMilestonesConfig``), the typed milestone
receipt (``QhCommissioningMilestoneReceipt``), the milestone file names, the engineering
budget record sealed in every receipt, and ``read_commissioning_milestones``, which
authenticates every declared gate from its files alone.

Does not own: taking the gates on a live fit (``milestone_gate``), the MPS memory guard and
its observation (``mps_memory``), tensor files (``qhlab.training.tensor_state``), receipts
(``qhlab.evidence``) or learning quality. These gates never replace the authenticated final
fit receipt.

Files (in ``output_dir``, all write-once)::

    milestone_u<NNNNNNNN>.safetensors   online.*, target.*, grad.online.*, optim.<i>.{exp_avg,exp_avg_sq,step}
    milestone_u<NNNNNNNN>.json          dtype/shape per tensor, digest, structure
    milestone_u<NNNNNNNN>.receipt.json  kind "commissioning_milestone", binds both files
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from qhlab.evidence import EvidenceError, MissingEvidenceError, input_error, read_receipt, require_instance, require_int
from qhlab.finite_horizon.diagnostics.mps_memory import QhMpsMemoryObservation, observation_from_record
from qhlab.finite_horizon.records import CommissioningMilestoneReceipt
from qhlab.training.tensor_state import load_tensor_state

__all__ = [
    "DEVICES",
    "QhCommissioningMilestoneReceipt",
    "QhCommissioningMilestonesConfig",
    "budget_record",
    "milestone_receipt_path",
    "milestone_state_path",
    "read_commissioning_milestones",
    "require_milestones",
]

DEVICES = ("cpu", "cuda", "mps")
"""Device types a gate can require of the live tensors."""

_MILESTONE_RE = re.compile(r"^milestone_u(\d{8})\.receipt\.json$")
_READER = "read_commissioning_milestones"
_REGENERATE = "gates are never edited; re-run commissioning into a fresh directory."


def _stem(successful_optimizer_updates: int) -> str:
    return f"milestone_u{successful_optimizer_updates:08d}"


def milestone_receipt_path(output_dir: str | Path, successful_optimizer_updates: int) -> Path:
    """Path of the receipt of the gate at ``successful_optimizer_updates`` in ``output_dir``."""
    return Path(output_dir) / f"{_stem(successful_optimizer_updates)}.receipt.json"


def milestone_state_path(output_dir: str | Path, successful_optimizer_updates: int) -> Path:
    """Path of the saved CPU state (safetensors) of the gate at ``successful_optimizer_updates``."""
    return Path(output_dir) / f"{_stem(successful_optimizer_updates)}.safetensors"


def require_milestones(call: str, milestones: Any) -> tuple[int, ...]:
    """``milestones`` as a tuple, refusing anything but strictly increasing ints >= 1.

    Args:
        call: the public call refusing (named in the message).
        milestones: a non-empty sequence of successful-update gates; the last is the budget.

    Returns:
        The gates as a tuple.

    Raises:
        QhInputError: ``"<call>: milestones=<value> is not allowed; ..."``.
    """
    gates = None if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence) else milestones
    if (
        not gates
        or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in gates)
        or any(b <= a for a, b in zip(gates, gates[1:]))
    ):
        raise input_error(
            call,
            "milestones",
            milestones,
            "a non-empty sequence of strictly increasing ints >= 1",
            "gates count successful optimizer updates, e.g. (1, 10, 100); the last one is the engineering budget.",
        )
    return tuple(gates)


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
        milestones = require_milestones(call, self.milestones)
        if self.expected_device not in DEVICES:
            raise input_error(
                call,
                "expected_device",
                self.expected_device,
                ", ".join(DEVICES),
                "name the device type of the execution profile.",
            )
        if self.max_allocated_bytes is not None:
            require_int(
                call,
                "max_allocated_bytes",
                self.max_allocated_bytes,
                minimum=1,
                hint="the live MPS tensor budget is given in bytes; None declares no budget.",
            )
        ids = self.context_ids
        if (
            isinstance(ids, (str, bytes))
            or not isinstance(ids, Sequence)
            or not ids
            or not all(isinstance(i, str) and i for i in ids)
        ):
            raise input_error(
                call,
                "context_ids",
                ids,
                "a non-empty sequence of non-empty strings",
                "pass the recipe digest, source package digest and population manifest digests.",
            )
        object.__setattr__(self, "milestones", milestones)
        object.__setattr__(self, "context_ids", tuple(ids))


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

    schema_version: int = CommissioningMilestoneReceipt.SCHEMA_VERSION
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


def budget_record(config: QhCommissioningMilestonesConfig) -> dict[str, Any]:
    """The engineering budget sealed in every milestone receipt body (``engineering_budget``)."""
    return {
        "milestones": list(config.milestones),
        "successful_optimizer_updates": config.milestones[-1],
        "max_allocated_bytes": config.max_allocated_bytes,
    }


# ------------------------------------------------------------------------------ reader


def _refused(path: Path, field: str, value: Any, allowed: str) -> EvidenceError:
    return input_error(f"{_READER}: {path}", field, value, allowed, _REGENERATE, error=EvidenceError)


def _read_one(config: QhCommissioningMilestonesConfig, output_dir: Path, gate: int) -> QhCommissioningMilestoneReceipt:
    path = milestone_receipt_path(output_dir, gate)
    if not path.is_file():
        raise MissingEvidenceError(
            f"{_READER}: {path} is missing; milestone {gate} declared by the config "
            "has no receipt. HINT: gates are never inferred; re-run commissioning."
        )
    document = read_receipt(path, CommissioningMilestoneReceipt)
    body = document.body
    expected = {
        "schema_version": CommissioningMilestoneReceipt.SCHEMA_VERSION,
        "successful_optimizer_updates": gate,
        "expected_device": config.expected_device,
        "context_ids": list(config.context_ids),
        "state_filename": milestone_state_path(output_dir, gate).name,
        "strict_reload": True,
        "engineering_budget": budget_record(config),
    }
    for field, value in expected.items():
        if getattr(body, field) != value:
            raise _refused(path, field, getattr(body, field), f"the declared {value!r}")
    outputs = document.outputs
    state = output_dir / body.state_filename
    if set(outputs) != {"state", "structure"} or outputs["state"].path != state.name:
        raise _refused(path, "outputs", sorted(outputs), f"exactly its state ({state.name}) and structure files")
    digest = body.state_sha256
    if outputs["state"].sha256 != digest:
        raise _refused(path, "state_sha256", digest, "the 64-hex digest the receipt binds for its state file")
    try:
        tensors, structure = load_tensor_state(state, expected_sha256=digest)
    except EvidenceError as exc:
        raise EvidenceError(f"{_READER}: {path}: state file {state} failed authentication: {exc}") from None
    counts = (structure.get("successful_optimizer_updates"), structure.get("observed_updates"))
    if counts != (gate, gate):
        raise _refused(
            path, f"{state.name} (successful_optimizer_updates, observed_updates)", counts, f"({gate}, {gate})"
        )
    bad = sorted(
        n
        for n, t in tensors.items()
        if t.is_floating_point() and (t.dtype != torch.float32 or not bool(torch.isfinite(t).all()))
    )
    if bad:
        raise _refused(path, f"{state.name} non-finite or non-float32 tensors", bad, "none")
    evidence = body.optimizer_evidence
    if evidence.get("successful_optimizer_updates") != gate or evidence.get("parameter_steps", [None])[-1:] != [gate]:
        raise _refused(path, "optimizer_evidence", evidence, f"evidence of successful update {gate}")
    memory = body.memory_observation
    if config.max_allocated_bytes is None:
        if memory is not None:
            raise _refused(path, "memory_observation", memory, "None (the config declares no max_allocated_bytes)")
        observation = None
    else:
        observation = observation_from_record(memory, path)
        if observation.max_allocated_bytes != config.max_allocated_bytes or not observation.within_live_tensor_budget:
            raise _refused(
                path,
                "memory_observation",
                memory,
                f"an observation within the declared max_allocated_bytes={config.max_allocated_bytes}",
            )
    return QhCommissioningMilestoneReceipt(
        successful_optimizer_updates=gate,
        expected_device=body.expected_device,
        context_ids=tuple(body.context_ids),
        state_filename=body.state_filename,
        state_sha256=digest,
        strict_reload=True,
        optimizer_evidence=evidence,
        memory_observation=observation,
    )


def read_commissioning_milestones(
    config: QhCommissioningMilestonesConfig, output_dir: str | Path
) -> tuple[QhCommissioningMilestoneReceipt, ...]:
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
        QhInputError: ``config`` is not a ``QhCommissioningMilestonesConfig``.
        EvidenceError: (or a subclass) naming the file at the first mismatch, missing gate or
            altered byte.
    """
    require_instance(
        _READER,
        "config",
        config,
        QhCommissioningMilestonesConfig,
        hint="pass the config the fit was commissioned with.",
    )
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise MissingEvidenceError(f"{_READER}: {output_dir} is not a directory.")
    declared = set(config.milestones)
    for candidate in sorted(output_dir.iterdir()):
        match = _MILESTONE_RE.match(candidate.name)
        if match and int(match.group(1)) not in declared:
            raise EvidenceError(
                f"{_READER}: {candidate} is a milestone the config does not declare "
                f"(declared: {list(config.milestones)})."
            )
    return tuple(_read_one(config, output_dir, gate) for gate in config.milestones)
