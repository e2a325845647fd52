"""``qhlab commission``: an engineering fit gated at observed optimizer-update milestones.

Owns: the command's arguments, turning ``--milestones`` text into integers, and the one JSON
line it prints. Does not own: validation, the fit, the gates or any receipt
(``qhlab.finite_horizon.commission.commission_recipe``), error printing and exit codes
(``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
import json

from qhlab.cli.command import Command
from qhlab.cli.threads import add_torch_threads_argument, apply_torch_threads
from qhlab.design.config_files import load_recipe
from qhlab.evidence import input_error

__all__ = ["COMMAND", "run"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE.toml", help="recipe file")
    parser.add_argument("--profile", required=True, help="execution profile (see `qhlab profiles`)")
    parser.add_argument(
        "--milestones", required=True, help="strictly increasing successful-update gates, e.g. 1,10,100"
    )
    parser.add_argument("--output", required=True, help="new directory for the evidence (must not exist)")
    parser.add_argument("--train", default=None, help="TRAIN population directory (default: the recipe's)")
    parser.add_argument("--max-allocated-bytes", type=int, default=None, help="live MPS tensor budget (mps lanes only)")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_torch_threads_argument(parser)


def _milestones(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p, 10) for p in parts)
    except ValueError:
        values = None
    if values is None or any(p.startswith("+") for p in parts):
        raise input_error(
            "qhlab commission",
            "--milestones",
            text,
            "comma-separated strictly increasing integers >= 1, e.g. 1,10,100",
            "they count successful optimizer updates.",
        )
    return values


def run(args: argparse.Namespace) -> int:
    """Run ``qhlab commission``; print a one-line JSON summary. Returns 0 on success."""
    # Lazy: keeps importing this module free of Lightning, pyarrow and numpy.
    from qhlab.finite_horizon.commission import commission_recipe

    milestones = _milestones(args.milestones)
    apply_torch_threads(args)
    result = commission_recipe(
        load_recipe(args.recipe),
        profile=args.profile,
        milestones=milestones,
        output=args.output,
        train=args.train,
        max_allocated_bytes=args.max_allocated_bytes,
        progress=not args.no_progress,
    )
    memory = result.memory_observation
    print(
        json.dumps(
            {
                "commission_receipt": str(result.receipt),
                "fit_receipt": str(result.fit.fit_receipt),
                "observed_updates": result.fit.observed_updates,
                "milestones": [
                    {
                        "successful_optimizer_updates": r.successful_optimizer_updates,
                        "receipt": str(path),
                        "state_sha256": r.state_sha256,
                        "strict_reload": r.strict_reload,
                    }
                    for r, path in zip(result.milestones, result.milestone_receipts)
                ],
                "mps_memory_observation": None if memory is None else memory.as_dict(),
            },
            sort_keys=True,
        )
    )
    return 0


COMMAND = Command(
    "commission",
    help="run an engineering fit gated at observed optimizer-update milestones",
    description="Fit RECIPE on a lane for exactly the last milestone's number of successful optimizer "
    "updates. At every milestone the live state must be finite float32 on the lane's device; "
    "it is saved (safetensors), reloaded strictly into a fresh scorer and bound by a receipt. "
    "Finally every receipt is read back and authenticated.",
    arguments=_arguments,
    run=run,
)
