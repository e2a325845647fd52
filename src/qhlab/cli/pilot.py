"""``qhlab pilot CONFIG --output DIR``: measure a study's seed and TRAIN-draw variance on a tuning population.

Owns: the ``pilot`` argument parser and turning its arguments into one ``run_pilot`` call. Does not
own: the config, the fits, the record or the arithmetic (``qhlab.design.pilot_config``,
``qhlab.design.pilot_record``, ``qhlab.statistics.variance``, ``qhlab.preparation.pilot``), error
printing and exit codes (``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qhlab.evidence import require_int
from qhlab.execution import add_executor_arguments, executor_choice

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pilot`` command."""
    parser = subparsers.add_parser(
        "pilot",
        help="fit every arm of a study with extra seeds and TRAIN draws on the tuning population; write pilot.json",
        description=(
            "Fit every arm of the study a pilot config names, with the pilot's seeds on its TRAIN population and "
            "with its draw seeds on each further TRAIN draw, all scored on the pilot's tuning validation "
            "population; publish OUTPUT/pilot.json (every fit's per-scene metrics, each comparison's and "
            "retention margin's seed effect tau and TRAIN-draw effect, and the maxima a study freezes) with its "
            "receipt. A study names it in [preparation] pilot. An interrupted run resumes when the same command "
            "runs again."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG.toml")
    parser.add_argument("--output", required=True, type=Path, help="the pilot directory")
    parser.add_argument(
        "--workers", type=int, default=None, help="fits at once on the local executor (default: the config's workers)"
    )
    add_executor_arguments(parser, what="the pilot's fits", default_help="the config's executor")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``qhlab pilot``. Returns 0."""
    # Lazy: keeps importing this module free of numpy.
    from qhlab.preparation.pilot import run_pilot

    if args.workers is not None:
        require_int("qhlab pilot", "--workers", args.workers, minimum=1, hint="one fit per core is the fastest.")
    choice = None
    if args.executor is not None or args.ray_address is not None:
        choice = executor_choice(args.executor, args.ray_address, call="qhlab pilot")
    run_pilot(args.config, args.output, workers=args.workers, executor=choice)
    return 0
