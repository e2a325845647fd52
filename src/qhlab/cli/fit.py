"""``qhlab fit``: fit one recipe on one execution lane and publish its evidence.

Owns: the ``fit`` argument parser, reading the recipe file (``qhlab.design.config_files``) and
turning arguments into one ``fit_recipe`` call. Does
not own: validation, training or receipts (``qhlab.finite_horizon.fit``), error printing and
exit codes (``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qhlab.cli.command import Command
from qhlab.cli.threads import add_torch_threads_argument, checked_torch_threads
from qhlab.design.config_files import load_recipe
from qhlab.evidence import require_int
from qhlab.scenes.seals import seals_of

__all__ = ["COMMAND", "run"]

# The options that are ``FitRequest`` fields, under the same names.
_REQUEST_OPTIONS = (
    "recipe",
    "profile",
    "output",
    "train",
    "validation",
    "run_id",
    "resume",
    "cell",
    "segment_checkpoint_every",
    "offline",
    "progress",
)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", type=Path, metavar="RECIPE.toml")
    parser.add_argument("--profile", required=True, help="execution profile, e.g. cpu-fp32 (see `qhlab profiles`)")
    parser.add_argument("--output", required=True, type=Path, help="output root directory")
    parser.add_argument("--train", type=Path, default=None, help="TRAIN population (default: recipe data.train)")
    parser.add_argument(
        "--validation", type=Path, default=None, help="validation population (default: recipe data.validation)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--offline", dest="offline", action="store_true", default=True, help="offline W&B (default)")
    mode.add_argument("--online", dest="offline", action="store_false", help="log to the W&B cloud (needs an account)")
    parser.add_argument(
        "--resume",
        metavar="ATTEMPT",
        default=None,
        help="local_attempt_id of an interrupted segment of the same cell to continue",
    )
    parser.add_argument(
        "--run-id", dest="run_id", default=None, help="W&B run id of this segment (online resume: the run to resume)"
    )
    parser.add_argument("--cell", default=None, help="cell name (default: <recipe name>-s<seed>)")
    parser.add_argument(
        "--checkpoint-every",
        dest="segment_checkpoint_every",
        metavar="CHECKPOINT_EVERY",
        type=int,
        default=None,
        help="updates between write-once segment checkpoints (default: budget/4)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    add_torch_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``qhlab fit``; print a one-line JSON summary. Returns 0 on success."""
    # Lazy: keeps importing this module free of Lightning, pyarrow and numpy.
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    if args.segment_checkpoint_every is not None:
        require_int(
            "qhlab fit",
            "--checkpoint-every",
            args.segment_checkpoint_every,
            minimum=1,
            hint="omit it for a checkpoint every quarter of the budget.",
        )
    threads = checked_torch_threads(args)
    if args.validation is not None:
        _warn_if_sealed(args.validation)
    options = {name: getattr(args, name) for name in _REQUEST_OPTIONS}
    options["recipe"] = load_recipe(args.recipe)
    result = fit_recipe(FitRequest(**options, source_dir=args.recipe.expanduser().parent, torch_threads=threads))
    summary = {
        "output_directory": str(result.output_directory),
        "local_attempt_id": result.local_attempt_id,
        "observed_updates": result.observed_updates,
        "final_state_sha256": result.final_state_sha256,
        "wall_seconds": round(result.wall_seconds, 3),
        "metrics": result.metrics,
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


def _warn_if_sealed(validation: Path) -> None:
    """One warning line when a study holds ``validation`` out as its sealed validation population."""
    import sys

    seals = seals_of(validation)
    if seals:
        studies = ", ".join(sorted({str(s["study"]) for s in seals}))
        print(
            f"warning: qhlab fit: --validation {validation} is the sealed validation population of study "
            f"{studies}; a score on it is not held out from that study (tune on a tuning population instead)",
            file=sys.stderr,
        )


COMMAND = Command(
    "fit",
    help="fit one recipe and write cold init, final state, fit/evaluation/W&B receipts",
    description="Fit RECIPE.toml on one execution profile. Writes OUTPUT/<cell>/<local_attempt_id>/ "
    "(write-once). W&B runs offline unless --online is given.",
    arguments=_arguments,
    run=run,
)
