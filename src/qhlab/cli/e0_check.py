"""``qhlab e0-check CONFIG --output DIR``: run a study's E0 gate on fresh TRAIN draws; write e0.json.

Owns: the ``e0-check`` argument parser and turning its arguments into one ``run_e0_check`` call.
Does not own: the config, the draws, the record or its checks (``qhlab.design.e0_config``,
``qhlab.design.e0_record``, ``qhlab.preparation.e0_check``), error printing and exit codes
(``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qhlab.evidence import require_int
from qhlab.execution import add_executor_arguments, executor_choice

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``e0-check`` command."""
    parser = subparsers.add_parser(
        "e0-check",
        help="run a study's E0 gate on fresh TRAIN draws, each frozen as a study of its own; write e0.json",
        description=(
            "Freeze the study a check config names once per fresh TRAIN seed of its TRAIN preset (the study's "
            "settings with only the TRAIN seed changed, without its [preparation]), select each draw's canary row "
            "and run its canaries: the study's own E0 gate. Publish OUTPUT/e0.json (every draw's row, labels, "
            "canary predictions and outcome, the pass share and whether it reached the config's minimum) with its "
            "receipt. A study names it in [preparation] e0; its freeze refuses a check of another gate design or "
            "one that fell short. An interrupted run resumes when the same command runs again."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG.toml")
    parser.add_argument("--output", required=True, type=Path, help="the check directory")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="draws gated at once on the local executor (default: the config's workers)",
    )
    add_executor_arguments(parser, what="the draws' TRAIN labelling and gates", default_help="the config's executor")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``qhlab e0-check``. Returns 0."""
    # Lazy: keeps importing this module free of numpy.
    from qhlab.preparation.e0_check import run_e0_check

    if args.workers is not None:
        require_int("qhlab e0-check", "--workers", args.workers, minimum=1, hint="one draw per core is the fastest.")
    choice = None
    if args.executor is not None or args.ray_address is not None:
        choice = executor_choice(args.executor, args.ray_address, call="qhlab e0-check")
    run_e0_check(args.config, args.output, workers=args.workers, executor=choice)
    return 0
