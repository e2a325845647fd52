"""The receipt kinds of a study: freeze, E0 gate, development, cell, benchmark and report.

Owns: the body model of each study step's receipt, each registered by its kind when defined.
They sit below the pipeline so that the preparation records (``e0_record``) read a sub-study's
receipts without importing it. Does not own: the steps that write them (``qhlab.study``) or
authentication (``qhlab.evidence``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt, register_check
from qhlab.evidence.errors import DigestMismatchError, EvidenceError
from qhlab.evidence.layout import CANARY_DIR, CELL_RECEIPT, CELLS_DIR, FIT_RECEIPT, FREEZE_RECEIPT
from qhlab.evidence.receipts import read_receipt
from qhlab.training.records import FitReceipt

__all__ = [
    "StudyBenchmarkBody",
    "StudyBenchmarkReceipt",
    "StudyCellBody",
    "StudyCellReceipt",
    "StudyDevelopmentBody",
    "StudyDevelopmentReceipt",
    "StudyE0Body",
    "StudyE0Receipt",
    "StudyFreezeBody",
    "StudyFreezeReceipt",
    "StudyReportBody",
    "StudyReportReceipt",
]


class StudyFreezeBody(Closed):
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
    config: Json
    profile: str
    arms: list[Any]
    seeds: list[int]
    cells: list[Any]
    recipes: Json
    budgets: Json
    thresholds: Json
    train: Json
    validation: Json
    test_data: str
    versions: Json
    source_package: Json
    max_allocated_bytes: int | None
    only_architecture_differs: bool
    preparation: Json | None
    sealed_directories: list[str] | None = None


class StudyFreezeReceipt(Receipt, kind="study_freeze", version=1):
    """``freeze.receipt.json``."""

    body: StudyFreezeBody


class StudyDevelopmentBody(Closed):
    """The sealed validation and its references.

    Attributes:
        study: the study. validation: the sealed validation population. references: the
        oracle and constant references. constant_on_validation: the constant predictor's
        scores. train_constant: the constant fitted on TRAIN, shape [H].
    """

    study: str
    validation: Json
    references: Json
    constant_on_validation: Json
    train_constant: list[Any]


class StudyDevelopmentReceipt(Receipt, kind="study_development", version=1):
    """``development.receipt.json``."""

    body: StudyDevelopmentBody


class StudyE0Body(Closed):
    """The E0 gate's decision.

    Attributes:
        study: the study. canary_updates: the canaries' budget. selection: the selected row.
        canaries: each canary's result. failures: what failed. passed: the decision.
        reason: why.
    """

    study: str
    canary_updates: int
    selection: Json
    canaries: list[Any]
    failures: list[Any]
    passed: bool
    reason: str


class StudyE0Receipt(Receipt, kind="study_e0", version=1):
    """``e0.receipt.json``."""

    body: StudyE0Body


class StudyCellBody(Closed):
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
    final_state_sha256: str = Field(pattern=SHA256)
    wall_seconds: float
    execution: Json
    evaluation: Json | None = None
    canary: Json | None = None


class StudyCellReceipt(Receipt, kind="study_cell", version=1):
    """``cell.receipt.json``."""

    body: StudyCellBody

    def check_place(self, path: Path) -> None:
        """A cell's receipt lies in its cell's directory, and that cell is its arm and seed's
        (``<arm>-s<seed>``, or ``<role>-<arm>-s<seed>`` for a canary): two swapped cell
        directories are refused wherever either receipt is read."""
        body, directory = self.body, Path(path).parent.name
        own = f"{body.arm}-s{body.seed}"
        if body.cell != directory or not (body.cell == own or body.cell.endswith(f"-{own}")):
            raise EvidenceError(
                f"read_receipt: {path} is the receipt of cell {body.cell!r} (arm {body.arm!r}, seed {body.seed}) but "
                f"lies in directory {directory!r}. HINT: a cell's receipt stays in its own directory; restore the "
                "study's cells as they were published."
            )


class StudyBenchmarkBody(Closed):
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
    final_state_sha256: str = Field(pattern=SHA256)
    rows: int
    warmup_forwards: int
    timed_forwards: int
    forward_seconds: list[float]
    median_forward_seconds: float
    module_timings: Json
    h1_huber_loss: float
    updates_applied: int
    parameters_receiving_gradients: list[str]
    parameters_without_gradients: list[str]
    canonical_first_chain: Json
    memory: Json
    memory_accounting: Json


class StudyBenchmarkReceipt(Receipt, kind="study_benchmark", version=1):
    """``benchmarks/<cell>.receipt.json``."""

    body: StudyBenchmarkBody


class StudyReportBody(Closed):
    """A study's report.

    Attributes:
        study: the study. summary: the headline decisions and statistics.
    """

    study: str
    summary: Json


class StudyReportReceipt(Receipt, kind="study_report", version=1):
    """``report/report.receipt.json``."""

    body: StudyReportBody


def check_structures(directory: Path) -> dict:
    """Every canary and cell fit of a study built the scorer structure its freeze recorded.

    A fit refuses another structure before its first update; this recomputes that claim from what
    the study binds: each cell receipt's fit receipt (``scorer.structure``) against the freeze's
    contract for the cell's arm (a freeze or fit that predates structures is skipped).

    Args:
        directory: the study directory (its ``freeze.receipt.json``).

    Returns:
        ``{"fits": fits compared, "skipped": fits without a recorded structure}``.

    Raises:
        DigestMismatchError: a fit built another structure than its freeze recorded.
    """
    directory = Path(directory)
    frozen = read_receipt(directory / FREEZE_RECEIPT, StudyFreezeReceipt, verify_files=False).body
    expected = {a["arm"]: ((a.get("contract") or {}).get("structure") or {}).get("sha256") for a in frozen.arms}
    compared = skipped = 0
    for path in sorted(
        [*(directory / CANARY_DIR).glob(f"*/{CELL_RECEIPT}"), *(directory / CELLS_DIR).glob(f"*/{CELL_RECEIPT}")]
    ):
        cell = read_receipt(path, StudyCellReceipt, verify_files=False).body
        fit = read_receipt(path.parent / cell.attempt / FIT_RECEIPT, FitReceipt, verify_files=False).body
        built = ((fit.scorer or {}).get("structure") or {}).get("sha256")
        want = expected.get(cell.arm)
        if want is None or built is None:
            skipped += 1
            continue
        if built != want:
            raise DigestMismatchError(
                f"qhlab verify: {path.parent / cell.attempt / FIT_RECEIPT} trained a scorer of structure {built[:16]}, "
                f"not the {want[:16]} the freeze recorded for arm {cell.arm!r}."
            )
        compared += 1
    return {"fits": compared, "skipped": skipped}


def _describe_structures(directory: Path, summary: dict) -> str:
    return f"structures: {directory}: {summary['fits']} fits trained the scorer structure their freeze recorded" + (
        f" ({summary['skipped']} without a recorded structure)" if summary["skipped"] else ""
    )


register_check(StudyFreezeReceipt, file=FREEZE_RECEIPT, check=check_structures, describe=_describe_structures)
