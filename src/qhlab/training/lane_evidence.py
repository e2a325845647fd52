"""Lane evidence of one fit: device checks at fit start and on the final state, CPU fallbacks.

Owns: :class:`LaneEvidenceCallback`, which runs the device check (``device_check_record``:
parameters, buffers and optimizer moments FP32 on the lane's device) when training starts and
when it ends, observes MPS CPU-fallback operators during the fit
(``captured_fallback_operations``) and refuses any operator that the profile's reviewed
``allowed_cpu_fallback_operations`` does not list; and the record the fit receipt carries.

Does not own: the checks themselves (``qhlab.training.device_checks``), the lane policy
(``qhlab.training.profiles``), the fit (``qhlab.training.launcher``) or receipts
(``qhlab.evidence``). Every check only reads tensors: a fit is bit-identical with and without
this callback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from qhlab.evidence import QhError
from qhlab.training.device_checks import captured_fallback_operations, device_check_record
from qhlab.training.profiles import QhExecutionProfile

__all__ = ["LaneEvidenceCallback"]


class LaneEvidenceCallback(Callback):
    """Check the live state's device and dtype at both ends of training; watch MPS fallbacks.

    The checks run in ``on_train_start`` and ``on_train_end``: Lightning has moved the module
    (and restored a resumed optimizer) to the device by the first, and moves them back to the
    CPU only after the second, so both see what training used.

    Args:
        profile: the admitted execution profile.
    """

    def __init__(self, profile: QhExecutionProfile) -> None:
        self.profile = profile
        self.fit_start: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        self.fallback_operations: list[str] | None = None

    def _check(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        return device_check_record(pl_module, self.profile.device_type, optimizer=optimizer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.fit_start = self._check(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.final = self._check(trainer, pl_module)

    @contextlib.contextmanager
    def observing_fallbacks(self) -> Iterator[None]:
        """Wrap ``Trainer.fit``: on MPS lanes, capture the operators that fell back to the CPU."""
        if self.profile.device_type != "mps":
            yield
            return
        with captured_fallback_operations() as observed:
            try:
                yield
            finally:
                self.fallback_operations = list(observed)

    def record(self) -> dict[str, Any]:
        """The fit receipt's ``lane_checks``: both device checks and the CPU-fallback observation.

        Raises:
            QhError: a device check did not run (training never started or never ended), or an
                MPS operator fell back to the CPU that the profile's reviewed
                ``allowed_cpu_fallback_operations`` does not list.
        """
        if self.fit_start is None or self.final is None:
            raise QhError(
                "train_segment: the lane's device checks did not run at fit start and end. "
                "HINT: LaneEvidenceCallback must be among the trainer's callbacks."
            )
        allowed = self.profile.allowed_cpu_fallback_operations
        unreviewed = [op for op in self.fallback_operations or [] if op not in allowed]
        if unreviewed:
            raise QhError(
                f"train_segment: MPS operator(s) {unreviewed} fell back to the CPU; allowed: the reviewed "
                f"list {list(allowed)} of profile {self.profile.name!r}. HINT: review the operator "
                "and add it to the profile, or unset PYTORCH_ENABLE_MPS_FALLBACK."
            )
        if self.profile.device_type == "mps":
            fallback = {
                "observed": True,
                "captured": list(self.fallback_operations or []),
                "allowed": list(allowed),
            }
        else:
            fallback = {"observed": False, "reason": f"no CPU fallback exists on a {self.profile.device_type!r} lane"}
        return {
            "device_checks": {"fit_start": self.fit_start, "final": self.final},
            "cpu_fallback_operations": fallback,
        }
