"""The launcher's Lightning callbacks: the exact update budget, segment checkpoints, resume.

Owns: stopping a fit at exactly the observed update budget (:class:`UpdateBudgetCallback`),
write-once segment checkpoints and SIGINT deferred to a transaction boundary
(:class:`SegmentCheckpointCallback`, :class:`InterruptedAtBoundary`),
restoring a resumed optimizer once it exists (:class:`ResumeRestoreCallback`), and qhlab's
own one-line progress bar of a fit (:class:`QhFitProgressBar`).

Does not own: counting updates or capturing state (``qhlab.training.optimizer_state``), the
segment directory's names and receipt kinds (``qhlab.training.segments``), or building the
Trainer and turning an interrupt into ``FitInterrupted`` (``qhlab.training.launcher``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from qhlab.evidence import QhError, input_error, require_int, write_receipt
from qhlab.execution.progress import report_progress, reporting
from qhlab.training.optimizer_state import capture_training_state, observed_optimizer_updates, restore_optimizer_state
from qhlab.training.records import SegmentCheckpointReceipt
from qhlab.training.segments import ResumeState, checkpoint_state_path
from qhlab.training.tensor_state import save_tensor_state, structure_path

__all__ = [
    "InterruptedAtBoundary",
    "QhFitProgressBar",
    "ResumeRestoreCallback",
    "SegmentCheckpointCallback",
    "UpdateBudgetCallback",
]

_COUNT_HINT = "budgets and intervals count observed optimizer updates."


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
        call = "UpdateBudgetCallback"
        self.update_budget = require_int(call, "update_budget", update_budget, minimum=1, hint=_COUNT_HINT)
        require_int(call, "start_updates", start_updates, minimum=0, hint="a resumed fit starts at its checkpoint.")
        if start_updates >= update_budget:
            raise input_error(
                call,
                "start_updates",
                start_updates,
                f"an int in [0, {update_budget})",
                "a finished fit is never continued.",
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

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        observed = observed_optimizer_updates(trainer.optimizers[0])
        if observed > self.update_budget:
            raise QhError(
                f"UpdateBudgetCallback: observed {observed} updates, beyond update_budget={self.update_budget}. "
                "HINT: gradient accumulation or a second optimizer step per batch is not supported."
            )
        self.observed_updates = observed
        if observed == self.update_budget:
            trainer.should_stop = True


class InterruptedAtBoundary(Exception):
    """Raised inside ``Trainer.fit`` at a transaction boundary after the SIGINT checkpoint is published.

    ``train_segment`` catches it and raises ``FitInterrupted`` (exit 130) naming the segment.
    """


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
        call = "SegmentCheckpointCallback"
        if not self.directory.is_dir():
            raise input_error(
                call,
                "directory",
                str(directory),
                "an existing segment directory",
                "the launcher creates it before the fit.",
            )
        self.every = require_int(call, "every", every, minimum=1, hint=_COUNT_HINT)
        self.update_budget = int(update_budget)  # checked by UpdateBudgetCallback
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
            raise InterruptedAtBoundary(observed)
        if (
            observed % self.every == 0
            and self.start_updates < observed < self.update_budget
            and observed not in self.written
        ):
            self.write(pl_module, trainer.optimizers[0], observed, reason="periodic")

    def write(self, module: LightningModule, optimizer: Any, observed: int, *, reason: str) -> Path:
        """Publish one checkpoint at ``observed`` updates; return its receipt path."""
        tensors, structure = capture_training_state(module, optimizer)
        state = checkpoint_state_path(self.directory, observed)
        digest = save_tensor_state(state, tensors, structure)
        receipt = state.with_name(state.name.replace(".safetensors", ".receipt.json"))
        write_receipt(
            receipt,
            SegmentCheckpointReceipt,
            body={**self.body, "observed_updates": observed, "reason": reason, "state_sha256": digest},
            inputs=self.inputs,
            outputs={"state": state, "structure": structure_path(state)},
        )
        self.written.append(observed)
        return receipt


class ResumeRestoreCallback(Callback):
    """Load the resumed module state and optimizer moments once the optimizer exists."""

    def __init__(self, resume: ResumeState) -> None:
        self.resume = resume

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # configure_optimizers has run (strategy setup precedes on_fit_start); params are on device.
        if len(trainer.optimizers) != 1:
            raise QhError(f"resume: {len(trainer.optimizers)} optimizers; allowed: exactly one.")
        restore_optimizer_state(trainer.optimizers[0], self.resume.tensors, self.resume.structure)


class QhFitProgressBar(Callback):
    """A running fit's progress: observed optimizer updates against the budget.

    Where the fit's progress is carried to another process (``qhlab.execution.reporting``: a
    study's or a preparation tool's workers), it is reported there about once a second, and that
    process draws it. Otherwise a terminal shows one rich bar, and any other output (a log file,
    a pipe) one line every ``every`` seconds.

    Args:
        label: what the fit is (the cell or attempt).
        update_budget: final observed update count.
        start_updates: updates already made by earlier segments of the lineage.
        every: seconds between two lines when the output is no terminal.
    """

    def __init__(self, label: str, update_budget: int, *, start_updates: int = 0, every: float = 10.0) -> None:
        self.label = label
        self.update_budget = int(update_budget)
        self.start_updates = int(start_updates)
        self.every = float(every)
        self._progress: Any = None
        self._task: Any = None
        self._mode = "off"
        self._started = self._last = 0.0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._started = self._last = time.monotonic()
        if reporting():
            self._mode = "report"
            report_progress(self.label, self.start_updates, self.update_budget)
            return
        console = Console()
        if not console.is_terminal:
            self._mode = "lines"  # a transient bar in a log file would only leave blank lines behind
            return
        self._mode = "bar"
        self._progress = Progress(
            TextColumn(f"  fit {self.label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("updates"),
            TimeElapsedColumn(),
            transient=True,
            console=console,
        )
        self._task = self._progress.add_task("updates", total=self.update_budget, completed=self.start_updates)
        self._progress.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Reading the optimizer state every step would cost a few percent of a small CPU step.
        if self._mode == "off" or batch_idx % 20 != 19:
            return
        done = observed_optimizer_updates(trainer.optimizers[0])
        now = time.monotonic()
        # Display only: a closed pipe or a terminal that went away never fails the fit.
        with contextlib.suppress(Exception):
            if self._mode == "bar":
                self._progress.update(self._task, completed=done)
            elif self._mode == "report" and now - self._last >= 1.0:
                self._last = now
                report_progress(self.label, done, self.update_budget)
            elif self._mode == "lines" and now - self._last >= self.every:
                self._last = now
                print(
                    f"  fit {self.label}: {done}/{self.update_budget} updates ({now - self._started:.0f} s)",
                    flush=True,
                )

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        """End the display: a reported fit is marked done (its bar goes, whether it finished or failed)."""
        if self._mode == "report":
            report_progress(self.label, self.update_budget, self.update_budget)
        self._mode = "off"
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._progress.stop()
            self._progress = None
