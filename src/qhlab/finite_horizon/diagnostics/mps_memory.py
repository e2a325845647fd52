"""Guard on observed live MPS tensor allocation, with its typed, authenticated observation.

Owns: ``QhMpsMemoryBudgetCallback`` (samples ``torch.mps`` allocator counters after every
training batch, keeps the latest values, sampled maxima and the count, and fails the fit when a
live-tensor sample exceeds the declared budget), the ``QhMpsMemoryObservation`` record, its
receipt (``mps_memory_observation.receipt.json``, kind ``mps_memory_observation``) and
``read_mps_memory_observation``, which refuses an injected (test) sampler's evidence outside
``allow_injected_sampler_evidence()``. The commissioning gates (``milestone_gate``) copy the latest
observation into each milestone receipt.

Does not own: optimizer milestones (``milestones``, ``milestone_gate``), the profile's own
memory accounting (``qhlab.training.execution_profile``) or receipts (``qhlab.evidence``).

Sampling is not a peak: the maxima cover this callback instance's train-batch-end samples
only, and driver bytes (the caching pool and other driver resources) are recorded beside the
live-tensor bytes, never compared with the budget. The guard adds no synchronization, cache
eviction, model change or optimizer change.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from qhlab.evidence import (
    EvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    input_error,
    read_receipt,
    require_int,
    write_receipt,
)
from qhlab.evidence.layout import MPS_MEMORY_RECEIPT
from qhlab.finite_horizon.records import MpsMemoryReceipt

__all__ = [
    "QhMpsMemoryBudgetCallback",
    "QhMpsMemoryObservation",
    "allow_injected_sampler_evidence",
    "observation_from_record",
    "read_mps_memory_observation",
]


# The sampler source is part of the sampling scope, so an injected (test) sampler can never
# pass for torch.mps evidence.
_SCOPE_MPS = "callback_instance_train_batch_end:torch.mps"
_SCOPE_INJECTED = "callback_instance_train_batch_end:injected_sampler"
_SCOPES = (_SCOPE_MPS, _SCOPE_INJECTED)
# (field, smallest allowed value) of every integer field of an observation but the schema.
_COUNTS = (
    ("sample_count", 1),
    ("current_allocated_bytes", 0),
    ("driver_allocated_bytes", 0),
    ("max_sampled_current_allocated_bytes", 0),
    ("max_sampled_driver_allocated_bytes", 0),
    ("max_allocated_bytes", 1),
)
_BUDGET_HINT = "the live MPS tensor budget is given in bytes."

# Whether readers accept injected-sampler observations. The seed fixes the reader signatures
# (read_mps_memory_observation(output_dir, *, max_allocated_bytes), read_commissioning_milestones
# (config, output_dir)), so a keyword cannot opt in; a context variable set only by
# allow_injected_sampler_evidence() does, and no environment variable can flip it.
_ACCEPT_INJECTED: contextvars.ContextVar[bool] = contextvars.ContextVar("accept_injected_sampler", default=False)


@contextlib.contextmanager
def allow_injected_sampler_evidence() -> Iterator[None]:
    """Test-only: inside this context, readers accept observations from an injected sampler.

    Outside it, ``read_mps_memory_observation`` and ``read_commissioning_milestones`` refuse
    them: an injected sampler's numbers are not ``torch.mps`` evidence.
    """
    token = _ACCEPT_INJECTED.set(True)
    try:
        yield
    finally:
        _ACCEPT_INJECTED.reset(token)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
            flag that disagrees with the values), listing every problem at once.
    """

    schema_version: int = MpsMemoryReceipt.SCHEMA_VERSION
    sampling_scope: str
    sample_count: int
    current_allocated_bytes: int
    driver_allocated_bytes: int
    max_sampled_current_allocated_bytes: int
    max_sampled_driver_allocated_bytes: int
    max_allocated_bytes: int
    within_live_tensor_budget: bool

    def __post_init__(self) -> None:
        problems = []
        if self.schema_version != MpsMemoryReceipt.SCHEMA_VERSION or not _is_int(self.schema_version):
            problems.append(f"schema_version={self.schema_version!r} (allowed: {MpsMemoryReceipt.SCHEMA_VERSION})")
        if self.sampling_scope not in _SCOPES:
            problems.append(f"sampling_scope={self.sampling_scope!r} (allowed: {', '.join(_SCOPES)})")
        for name, minimum in _COUNTS:
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                problems.append(f"{name}={value!r} (allowed: an int >= {minimum})")
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
                "QhMpsMemoryObservation: "
                + "; ".join(problems)
                + ". HINT: observations come from QhMpsMemoryBudgetCallback."
            )

    def as_dict(self) -> dict[str, Any]:
        """The observation as plain JSON values (the serialized form in receipts)."""
        return dataclasses.asdict(self)


def observation_from_record(body: Any, path: Path) -> QhMpsMemoryObservation:
    """The typed observation of a serialized record read from ``path``.

    Args:
        body: the record (a receipt body, or a milestone receipt's ``memory_observation``).
        path: the file it was read from (named in every refusal).

    Returns:
        The observation.

    Raises:
        EvidenceError: the record lacks a field, has an extra one or is inconsistent, or its
            sampler was injected (outside :func:`allow_injected_sampler_evidence`).
    """
    fields = sorted(f.name for f in dataclasses.fields(QhMpsMemoryObservation))
    if not isinstance(body, dict) or sorted(body) != fields:
        raise EvidenceError(f"{path}: memory observation does not have exactly the fields {fields}.")
    try:
        observation = QhMpsMemoryObservation(**body)
    except QhInputError as exc:
        raise EvidenceError(f"{path}: inconsistent memory observation: {exc}") from None
    if observation.sampling_scope == _SCOPE_INJECTED and not _ACCEPT_INJECTED.get():
        raise input_error(
            str(path),
            "sampling_scope",
            observation.sampling_scope,
            repr(_SCOPE_MPS),
            "this observation came from an injected test sampler, not torch.mps; only tests read it, "
            "inside allow_injected_sampler_evidence().",
            error=EvidenceError,
        )
    return observation


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

    def __init__(self, max_allocated_bytes: int, output_dir: str | Path) -> None:
        self.max_allocated_bytes = require_int(
            "QhMpsMemoryBudgetCallback", "max_allocated_bytes", max_allocated_bytes, minimum=1, hint=_BUDGET_HINT
        )
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

        It runs on any device; the observation's ``sampling_scope`` says the sampler was injected,
        and the readers refuse it outside :func:`allow_injected_sampler_evidence`.
        """
        if not callable(sampler):
            raise input_error(
                "QhMpsMemoryBudgetCallback.with_sampler",
                "sampler",
                sampler,
                "a callable returning (current_allocated_bytes, driver_allocated_bytes)",
                "pass a function of no arguments; omit it to sample torch.mps.",
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
            raise input_error(
                "QhMpsMemoryBudgetCallback",
                "device",
                str(device),
                "mps (with torch.backends.mps available)",
                "the live MPS tensor guard samples torch.mps.current_allocated_memory(); run it only on "
                "the mps-fp32 lane, or drop --max-allocated-bytes on other lanes.",
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
        if not isinstance(sample, tuple) or len(sample) != 2 or not all(_is_int(v) and v >= 0 for v in sample):
            raise QhError(
                f"QhMpsMemoryBudgetCallback: sampler returned {sample!r}; allowed: a tuple of two ints >= 0 "
                "(current_allocated_bytes, driver_allocated_bytes)."
            )
        return sample

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
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
        write_receipt(path, MpsMemoryReceipt, body=observation.as_dict())
        self.receipt_path = path
        return path

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._publish()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Samples already taken are true evidence even when the fit failed elsewhere.
        self._publish()


def read_mps_memory_observation(output_dir: str | Path, *, max_allocated_bytes: int) -> QhMpsMemoryObservation:
    """Authenticate sampled memory evidence against one declared tensor budget.

    Args:
        output_dir: The memory guard's output directory.
        max_allocated_bytes: The declared live-tensor budget (int >= 1); the record must bind
            exactly this budget and no sample may exceed it.

    Returns:
        The authenticated observation.

    Raises:
        QhInputError: a bad ``max_allocated_bytes``.
        EvidenceError: (or a subclass) naming the receipt on any mismatch, altered byte or breach,
            or an injected sampler (outside :func:`allow_injected_sampler_evidence`).
    """
    call = "read_mps_memory_observation"
    require_int(call, "max_allocated_bytes", max_allocated_bytes, minimum=1, hint="pass the budget the fit declared.")
    path = Path(output_dir) / MPS_MEMORY_RECEIPT
    observation = observation_from_record(read_receipt(path, MpsMemoryReceipt).body_record(), path)
    if observation.max_allocated_bytes != max_allocated_bytes:
        raise EvidenceError(
            f"{call}: {path} binds max_allocated_bytes={observation.max_allocated_bytes}; "
            f"declared {max_allocated_bytes}."
        )
    if observation.max_sampled_current_allocated_bytes > max_allocated_bytes:
        raise EvidenceError(
            f"{call}: {path} records a sampled live-tensor allocation of "
            f"{observation.max_sampled_current_allocated_bytes} bytes above the budget {max_allocated_bytes}."
        )
    return observation
