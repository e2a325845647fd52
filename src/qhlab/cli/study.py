"""``qhlab study {freeze,admit-canaries,prepare-development,run-fit,benchmark,report,run,status}``.

Owns: registering the ``study`` command group. Does not own: the steps, their arguments or
what they print, which live in the study's one command entry
(``qhlab.study.command``), so that ``python -m
...architecture_study`` and ``qhlab study`` parse and print exactly the same way.
"""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers) -> None:
    """Add the ``study`` parser and its steps; the handler is :func:`run`."""
    # Lazy: keeps importing this module free of Lightning, scipy, pyarrow and numpy.
    from qhlab.study.command import add_study_arguments

    parser = subparsers.add_parser(
        "study",
        help="the pre-registered, paired architecture study (`qhlab study run CONFIG --output DIR`)",
        description="Freeze, gate, fit, benchmark and report a paired architecture study.",
    )
    add_study_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the study step named on the command line; returns the exit status."""
    # Lazy: keeps importing this module free of Lightning, scipy, pyarrow and numpy.
    from qhlab.study.command import run_study_command

    return run_study_command(args)
