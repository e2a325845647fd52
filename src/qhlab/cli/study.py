"""``qhlab study STEP``: the study steps and `status`, `export`, `replicate` and `compare-lanes`.

Owns: the ``study`` command group's row of the command table. Does not own: the steps' arguments
(``qhlab.study.arguments``, shared with the study's ``main``) or running them
(``qhlab.finite_horizon.studies.architecture_study.run_study_command``), so that ``python -m
...architecture_study`` and ``qhlab study`` parse and print exactly the same way.
"""

from __future__ import annotations

import argparse
import json

from qhlab.cli.command import Command
from qhlab.study.arguments import add_study_arguments
from qhlab.study.export import export_study
from qhlab.study.status import status_lines, study_status

__all__ = ["COMMAND", "run"]


def run(args: argparse.Namespace) -> int:
    """Run the study step named on the command line; returns the exit status."""
    if args.study_command == "export":  # reads receipts only: no torch, Lightning or W&B
        written = export_study(args.study_output, args.export_output, table=args.export_table, fmt=args.export_format)
        print(f"{args.export_table} table of {args.study_output}: {written}")
        return 0
    if args.study_command == "status":  # reads receipts only: no torch, Lightning or W&B
        status = study_status(args.study_output, args.populations)
        print(json.dumps(status, indent=2) if args.json else "\n".join(status_lines(status)))
        return 0
    # Lazy: the steps import torch, which `qhlab --help` and `qhlab study status` never need.
    from qhlab.finite_horizon.studies.architecture_study import run_study_command

    return run_study_command(args)


COMMAND = Command(
    "study",
    help="the pre-registered, paired architecture study (`qhlab study run CONFIG --output DIR`)",
    description="Freeze, gate, fit, benchmark and report a paired architecture study.",
    arguments=add_study_arguments,
    run=run,
)
