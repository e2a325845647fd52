"""``qhlab commission``: an engineering fit gated at observed optimizer-update milestones.

Owns: the command's arguments, validating them before anything is written, the
commissioning context (recipe, applied-recipe, source package and population digests), the
output layout and the closing ``commission.receipt.json``. Does not own: the gates
(``qhlab.finite_horizon.diagnostics.commissioning``) or the fit (``qhlab.finite_horizon.fit``).

Output layout (``--output DIR``, which must not exist)::

    DIR/milestone_u<NNNNNNNN>.{safetensors,json,receipt.json}   one triple per milestone
    DIR/mps_memory_observation.receipt.json                      with --max-allocated-bytes
    DIR/fit/<cell>/<local_attempt_id>/...                        the engineering fit's own evidence
    DIR/commission.receipt.json                                  kind "commissioning_run"

The engineering fit replaces the recipe's update budget by the last milestone; the context
ids and the closing receipt say so. It is not evaluated: commissioning gates engineering,
never learning quality.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qhlab.cli import add_torch_threads_argument, apply_torch_threads
from qhlab.evidence import QhInputError

__all__ = ["register", "run"]

COMMISSION_RECEIPT = "commission.receipt.json"
COMMISSION_KIND = "commissioning_run"
COMMISSION_SCHEMA_VERSION = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``commission`` command."""
    parser = subparsers.add_parser(
        "commission",
        help="run an engineering fit gated at observed optimizer-update milestones",
        description=(
            "Fit RECIPE on a lane for exactly the last milestone's number of successful optimizer "
            "updates. At every milestone the live state must be finite float32 on the lane's device; "
            "it is saved (safetensors), reloaded strictly into a fresh scorer and bound by a receipt. "
            "Finally every receipt is read back and authenticated."
        ),
    )
    parser.add_argument("recipe", metavar="RECIPE.toml", help="recipe file")
    parser.add_argument("--profile", required=True, help="execution profile (see `qhlab profiles`)")
    parser.add_argument(
        "--milestones", required=True, help="strictly increasing successful-update gates, e.g. 1,10,100"
    )
    parser.add_argument("--output", required=True, help="new directory for the evidence (must not exist)")
    parser.add_argument("--train", default=None, help="TRAIN population directory (default: the recipe's)")
    parser.add_argument(
        "--max-allocated-bytes", type=int, default=None, help="live MPS tensor budget (mps lanes only)"
    )
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_torch_threads_argument(parser)
    parser.set_defaults(handler=run)


def _milestones(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p, 10) for p in parts)
    except ValueError:
        values = None
    if values is None or any(p.startswith("+") for p in parts):
        raise QhInputError(
            f"qhlab commission: --milestones={text!r} is not allowed; allowed: comma-separated strictly "
            "increasing integers >= 1, e.g. 1,10,100. HINT: they count successful optimizer updates."
        )
    return values


def run(args: argparse.Namespace) -> int:
    """Validate, fit with the gates, read every gate back, publish the closing receipt; return 0."""
    from qhlab.evidence import PublishConflictError, source_package_digest, write_receipt
    from qhlab.finite_horizon.data import load_population
    from qhlab.finite_horizon.diagnostics.commissioning import (
        MPS_MEMORY_RECEIPT,
        QhCommissioningMilestonesCallback,
        QhCommissioningMilestonesConfig,
        QhMpsMemoryBudgetCallback,
        milestone_receipt_path,
        read_commissioning_milestones,
        read_mps_memory_observation,
    )
    from qhlab.finite_horizon.fit import fit_recipe
    from qhlab.finite_horizon.recipe import load_recipe, recipe_digest
    from qhlab.training.execution_profile import execution_profile

    call = "qhlab commission"
    milestones = _milestones(args.milestones)
    output = Path(args.output)
    if output.exists() or output.is_symlink():
        raise PublishConflictError(
            f"{call}: --output={str(output)!r} already exists; allowed: a new directory. "
            "HINT: commissioning evidence is write-once."
        )
    profile = execution_profile(args.profile)
    if args.max_allocated_bytes is not None and profile.device_type != "mps":
        raise QhInputError(
            f"{call}: --max-allocated-bytes={args.max_allocated_bytes!r} is not allowed with profile "
            f"{profile.name!r} (device {profile.device_type!r}); allowed: mps profiles only. HINT: the live "
            "MPS tensor guard samples torch.mps allocator counters."
        )
    recipe = load_recipe(args.recipe)
    train = Path(args.train) if args.train is not None else (Path(recipe.data.train) if recipe.data.train else None)
    if train is None:
        raise QhInputError(
            f"{call}: --train=None is not allowed when the recipe names no data.train; allowed: a TRAIN "
            "population directory. HINT: generate one with `qhlab scenes generate --split train`."
        )
    population = load_population(train, split="train", horizon=recipe.horizon)
    engineering = recipe.model_copy(update={"updates": milestones[-1]})
    source = source_package_digest()["sha256"]
    context_ids = (
        f"recipe_sha256:{recipe_digest(recipe)}",
        f"engineering_recipe_sha256:{recipe_digest(profile.apply(engineering))}",
        f"engineering_updates:{milestones[-1]}(replaces recipe updates {recipe.updates})",
        f"source_package_sha256:{source}",
        f"train_population_manifest_sha256:{population.digest}",
    )
    config = QhCommissioningMilestonesConfig(
        milestones=milestones,
        expected_device=profile.device_type,
        max_allocated_bytes=args.max_allocated_bytes,
        context_ids=context_ids,
    )
    callbacks = []
    if config.max_allocated_bytes is not None:
        callbacks.append(QhMpsMemoryBudgetCallback(config.max_allocated_bytes, output))
    callbacks.append(QhCommissioningMilestonesCallback(config, output))

    apply_torch_threads(args)
    result = fit_recipe(
        engineering,
        profile=profile.name,
        output=output / "fit",
        train=train,
        extra_callbacks=callbacks,
        evaluate=False,
        max_allocated_bytes=args.max_allocated_bytes,
        progress=not args.no_progress,
    )
    receipts = read_commissioning_milestones(config, output)
    memory = None
    if config.max_allocated_bytes is not None:
        memory = read_mps_memory_observation(output, max_allocated_bytes=config.max_allocated_bytes)
    bound = {f"milestone_{r.successful_optimizer_updates}": milestone_receipt_path(output, r.successful_optimizer_updates)
             for r in receipts}
    bound["fit_receipt"] = result.fit_receipt
    if memory is not None:
        bound["mps_memory_observation"] = output / MPS_MEMORY_RECEIPT
    write_receipt(
        output / COMMISSION_RECEIPT,
        kind=COMMISSION_KIND,
        schema_version=COMMISSION_SCHEMA_VERSION,
        body={
            "profile": profile.name,
            "milestones": list(config.milestones),
            "expected_device": config.expected_device,
            "max_allocated_bytes": config.max_allocated_bytes,
            "context_ids": list(config.context_ids),
            "recipe_sha256": recipe_digest(recipe),
            "recipe_updates": recipe.updates,
            "engineering_updates": milestones[-1],
            "update_budget": "the recipe's update budget was replaced by the last milestone for this engineering fit",
            "fit_recipe_sha256": result.recipe_digest,
            "observed_updates": result.observed_updates,
            "final_state_sha256": result.final_state_sha256,
            "evaluated": False,
        },
        inputs=bound,
    )
    print(json.dumps({
        "commission_receipt": str(output / COMMISSION_RECEIPT),
        "fit_receipt": str(result.fit_receipt),
        "observed_updates": result.observed_updates,
        "milestones": [
            {
                "successful_optimizer_updates": r.successful_optimizer_updates,
                "receipt": str(milestone_receipt_path(output, r.successful_optimizer_updates)),
                "state_sha256": r.state_sha256,
                "strict_reload": r.strict_reload,
            }
            for r in receipts
        ],
        "mps_memory_observation": None if memory is None else memory.as_dict(),
    }, sort_keys=True))
    return 0
