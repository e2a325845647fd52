"""``qhlab study {freeze,admit-canaries,prepare-development,run-fit,benchmark,report,run}``.

Owns: registering the ``study`` command group. Does not own: any step's behaviour or its
arguments, which live in ``qhlab.finite_horizon.studies.architecture_study`` (so that
``python -m ...architecture_study`` and ``qhlab study`` parse exactly the same way).
"""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers) -> None:
    """Add the ``study`` parser and its steps; the handler is :func:`run`."""
    from qhlab.finite_horizon.studies import architecture_study

    parser = subparsers.add_parser(
        "study",
        help="the pre-registered, paired architecture study (`qhlab study run CONFIG --output DIR`)",
        description="Freeze, gate, fit, benchmark and report a paired architecture study.",
    )
    architecture_study._add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the study step named on the command line; returns the exit status."""
    from qhlab.finite_horizon.studies import architecture_study

    return architecture_study._dispatch(args)
