"""``qhlab tune CONFIG --output DIR``: search a recipe space on the declared tuning population.

Owns: the ``tune`` argument parser and turning its arguments into one ``run_tuning`` call. Does not
own: the config, the trials, the record or the rule (``qhlab.design.tuning_config``,
``qhlab.design.tuning_record``, ``qhlab.design.tuning_rule``, ``qhlab.preparation.tune``), error
printing and exit codes (``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qhlab.evidence import require_int
from qhlab.execution import add_executor_arguments, executor_choice

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tune`` command."""
    parser = subparsers.add_parser(
        "tune",
        help="search a recipe space with Optuna on the tuning population; write tuning.json and recipe.toml",
        description=(
            "Run the trials of a tuning config as real fits (one per objective seed) on its declared tuning "
            "population, with Optuna's SQLite storage at OUTPUT/trials.db; publish OUTPUT/tuning.json (the "
            "record, with its receipt) and OUTPUT/recipe.toml (the winner by the config's rule). The same "
            "config gives the same trials with any worker count or executor; an interrupted run resumes when "
            "the same command runs again."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG.toml")
    parser.add_argument("--output", required=True, type=Path, help="the tuning directory")
    parser.add_argument(
        "--workers", type=int, default=None, help="fits at once on the local executor (default: the config's workers)"
    )
    add_executor_arguments(parser, what="the trials' fits", default_help="the config's executor")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``qhlab tune``. Returns 0 with a winner, 1 when no trial was admissible."""
    # Lazy: keeps importing this module free of numpy.
    from qhlab.preparation.tune import run_tuning

    if args.workers is not None:
        require_int("qhlab tune", "--workers", args.workers, minimum=1, hint="one fit per core is the fastest.")
    choice = None
    if args.executor is not None or args.ray_address is not None:
        choice = executor_choice(args.executor, args.ray_address, call="qhlab tune")
    record = run_tuning(args.config, args.output, workers=args.workers, executor=choice)
    return 0 if record["winner"]["number"] is not None else 1
