"""One commissioning run: an engineering fit gated at observed optimizer-update milestones.

Owns: ``commission_recipe`` (validate everything, derive the commissioning context from the
recipe, applied-recipe, source package and population digests, run ``fit_recipe`` with the
gates, read every gate back and publish the closing ``commission.receipt.json``) and
``CommissionResult``. Does not own: the gates and their receipts
(``qhlab.finite_horizon.diagnostics``), the fit (``qhlab.finite_horizon.fit``) or argument
parsing and printing (``qhlab.cli.commission``).

Output layout (``output``, which must not exist)::

    output/milestone_u<NNNNNNNN>.{safetensors,json,receipt.json}   one triple per milestone
    output/mps_memory_observation.receipt.json                      with max_allocated_bytes
    output/fit/<cell>/<local_attempt_id>/...                        the engineering fit's own evidence
    output/commission.receipt.json                                  kind "commissioning_run"

The engineering fit replaces the recipe's update budget by the last milestone; the context
ids and the closing receipt say so. It is not evaluated: commissioning gates engineering,
never learning quality.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from qhlab.evidence import PublishConflictError, input_error, require_instance, source_package_digest, write_receipt
from qhlab.evidence.layout import COMMISSION_RECEIPT, MPS_MEMORY_RECEIPT
from qhlab.finite_horizon.data import Population, load_population
from qhlab.finite_horizon.diagnostics.milestone_gate import QhCommissioningMilestonesCallback
from qhlab.finite_horizon.diagnostics.milestones import (
    QhCommissioningMilestoneReceipt,
    QhCommissioningMilestonesConfig,
    milestone_receipt_path,
    read_commissioning_milestones,
    require_milestones,
)
from qhlab.finite_horizon.diagnostics.mps_memory import (
    QhMpsMemoryBudgetCallback,
    QhMpsMemoryObservation,
    read_mps_memory_observation,
)
from qhlab.finite_horizon.fit import FitRequest, FitResult, fit_recipe
from qhlab.finite_horizon.recipe import QhRecipe, recipe_digest
from qhlab.finite_horizon.records import CommissioningRunReceipt
from qhlab.training.execution_profile import QhExecutionProfile, execution_profile

__all__ = ["CommissionResult", "commission_recipe"]


@dataclasses.dataclass(frozen=True)
class CommissionResult:
    """What one ``commission_recipe`` call published.

    Attributes:
        output_directory: the commissioning directory (``output``).
        receipt: the closing ``commission.receipt.json``.
        config: the gates and context the fit was commissioned with.
        milestones: the authenticated receipt of every gate, in milestone order.
        milestone_receipts: the receipt file of every gate, in the same order.
        memory_observation: the authenticated MPS memory observation, or None without a budget.
        fit: the engineering fit (``evaluation_receipt`` is None: it is not evaluated).
    """

    output_directory: Path
    receipt: Path
    config: QhCommissioningMilestonesConfig
    milestones: tuple[QhCommissioningMilestoneReceipt, ...]
    milestone_receipts: tuple[Path, ...]
    memory_observation: QhMpsMemoryObservation | None
    fit: FitResult


def _require_new_output(call: str, output: Path) -> None:
    """Refuse an ``output`` that already exists (a symlink included): the evidence is write-once."""
    if output.exists() or output.is_symlink():
        raise PublishConflictError(
            f"{call}: output={str(output)!r} already exists; allowed: a new directory. "
            "HINT: commissioning evidence is write-once."
        )


def _budget_lane(call: str, profile: str, max_allocated_bytes: int | None) -> QhExecutionProfile:
    """The execution profile named ``profile``, refused when a memory budget comes without an mps device."""
    lane = execution_profile(profile)
    if max_allocated_bytes is not None and lane.device_type != "mps":
        raise input_error(
            call,
            "max_allocated_bytes",
            max_allocated_bytes,
            f"None with profile {lane.name!r} (device {lane.device_type!r}): a budget needs an mps profile",
            "the live MPS tensor guard samples torch.mps allocator counters.",
        )
    return lane


def _train_directory(call: str, recipe: QhRecipe, train: Path | str | None) -> Path:
    """The TRAIN population directory: ``train``, else the recipe's ``data.train``; refused if neither."""
    if train is None and recipe.data.train:
        train = recipe.data.train
    if train is None:
        raise input_error(
            call,
            "train",
            train,
            "a TRAIN population directory when the recipe names no data.train",
            "generate one with `qhlab scenes generate --split train`.",
        )
    return Path(train)


def _commissioning_config(
    recipe: QhRecipe,
    engineering: QhRecipe,
    lane: QhExecutionProfile,
    gates: tuple[int, ...],
    max_allocated_bytes: int | None,
    population: Population,
) -> QhCommissioningMilestonesConfig:
    """The gates and the context ids (recipe, engineering recipe, source package, population digests)."""
    return QhCommissioningMilestonesConfig(
        milestones=gates,
        expected_device=lane.device_type,
        max_allocated_bytes=max_allocated_bytes,
        context_ids=(
            f"recipe_sha256:{recipe_digest(recipe)}",
            f"engineering_recipe_sha256:{recipe_digest(lane.apply(engineering))}",
            f"engineering_updates:{gates[-1]}(replaces recipe updates {recipe.updates})",
            f"source_package_sha256:{source_package_digest()['sha256']}",
            f"train_population_manifest_sha256:{population.digest}",
        ),
    )


def _gate_callbacks(config: QhCommissioningMilestonesConfig, output: Path) -> list:
    """The fit's extra callbacks: the MPS memory guard (with a budget), then the milestone gates."""
    # The budget is enforced by the sampled MPS guard below, not as a lane ceiling: fit_recipe
    # admits no ceiling that the profile cannot enforce (admit_launch).
    callbacks = []
    if config.max_allocated_bytes is not None:
        callbacks.append(QhMpsMemoryBudgetCallback(config.max_allocated_bytes, output))
    callbacks.append(QhCommissioningMilestonesCallback(config, output))
    return callbacks


def _read_gates(
    config: QhCommissioningMilestonesConfig, output: Path, fit: FitResult
) -> tuple[
    tuple[QhCommissioningMilestoneReceipt, ...], tuple[Path, ...], QhMpsMemoryObservation | None, dict[str, Path]
]:
    """Every gate's authenticated receipt, their files, the memory observation, and the files to bind."""
    receipts = read_commissioning_milestones(config, output)
    memory = None
    if config.max_allocated_bytes is not None:
        memory = read_mps_memory_observation(output, max_allocated_bytes=config.max_allocated_bytes)
    milestone_files = tuple(milestone_receipt_path(output, r.successful_optimizer_updates) for r in receipts)
    bound = {f"milestone_{r.successful_optimizer_updates}": path for r, path in zip(receipts, milestone_files)}
    bound["fit_receipt"] = fit.fit_receipt
    if memory is not None:
        bound["mps_memory_observation"] = output / MPS_MEMORY_RECEIPT
    return receipts, milestone_files, memory, bound


def _commission_body(
    lane: QhExecutionProfile,
    config: QhCommissioningMilestonesConfig,
    recipe: QhRecipe,
    gates: tuple[int, ...],
    fit: FitResult,
) -> dict:
    """The closing receipt's body: the lane, the gates and context, both update budgets, the fit's digests."""
    return {
        "profile": lane.name,
        "milestones": list(config.milestones),
        "expected_device": config.expected_device,
        "max_allocated_bytes": config.max_allocated_bytes,
        "context_ids": list(config.context_ids),
        "recipe_sha256": recipe_digest(recipe),
        "recipe_updates": recipe.updates,
        "engineering_updates": gates[-1],
        "update_budget": "the recipe's update budget was replaced by the last milestone for this engineering fit",
        "fit_recipe_sha256": fit.recipe_digest,
        "observed_updates": fit.observed_updates,
        "final_state_sha256": fit.final_state_sha256,
        "evaluated": False,
    }


def commission_recipe(
    recipe: QhRecipe,
    *,
    profile: str,
    milestones: Sequence[int],
    output: Path | str,
    train: Path | str | None = None,
    max_allocated_bytes: int | None = None,
    progress: bool = True,
) -> CommissionResult:
    """Fit ``recipe`` on one lane for exactly the last milestone's number of successful updates.

    At every milestone the live state must be finite float32 on the lane's device; it is saved
    (safetensors), reloaded strictly into a fresh scorer and bound by a receipt. Finally every
    receipt is read back and authenticated, and the closing receipt binds them with the fit's.

    Args:
        recipe: the validated recipe (a file is read by ``qhlab.design.config_files.load_recipe``);
            its ``updates`` is replaced by ``milestones[-1]``.
        profile: execution profile name (e.g. ``"cpu-fp32"``).
        milestones: strictly increasing successful-update gates (ints >= 1), e.g. (1, 10, 100).
        output: new directory for the evidence (must not exist).
        train: TRAIN population directory; default the recipe's ``data.train``.
        max_allocated_bytes: live MPS tensor budget in bytes (mps profiles only), or None.
        progress: Lightning progress bar.

    Returns:
        ``CommissionResult``.

    Raises:
        PublishConflictError: ``output`` already exists.
        QhInputError: a bad milestone list, unknown profile, a budget on a non-mps profile, a
            bad recipe or population, or no TRAIN population; nothing is written.
        QhError: a gate failed (the fit stops; the gates passed so far keep their receipts).
    """
    call = "commission_recipe"
    output = Path(output)
    _require_new_output(call, output)
    lane = _budget_lane(call, profile, max_allocated_bytes)
    recipe = require_instance(
        call, "recipe", recipe, QhRecipe, hint="read a recipe file with qhlab.design.config_files.load_recipe."
    )
    train = _train_directory(call, recipe, train)
    population = load_population(train, split="train", horizon=recipe.horizon)
    gates = require_milestones(call, milestones)
    engineering = recipe.model_copy(update={"updates": gates[-1]})
    config = _commissioning_config(recipe, engineering, lane, gates, max_allocated_bytes, population)
    callbacks = _gate_callbacks(config, output)
    fit = fit_recipe(
        FitRequest(
            recipe=engineering,
            profile=lane.name,
            output=output / "fit",
            train=train,
            extra_callbacks=callbacks,
            evaluate=False,
            progress=progress,
            job_type="commission",
        )
    )
    receipts, milestone_files, memory, bound = _read_gates(config, output, fit)
    write_receipt(
        output / COMMISSION_RECEIPT,
        CommissioningRunReceipt,
        body=_commission_body(lane, config, recipe, gates, fit),
        inputs=bound,
    )
    return CommissionResult(
        output_directory=output,
        receipt=output / COMMISSION_RECEIPT,
        config=config,
        milestones=receipts,
        milestone_receipts=milestone_files,
        memory_observation=memory,
        fit=fit,
    )
