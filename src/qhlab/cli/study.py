"""``qhlab study SUBCOMMAND``: the study group's rows of the command table.

Owns: ``COMMAND`` (the ``study`` group) and ``STUDY_COMMANDS``, one ``Command`` row per
subcommand, each of which calls one ``qhlab.study.Study`` method (or, for ``status``, ``export``,
``replicate`` and ``compare-lanes``, the one function that does it) and prints what it did.
``python -m qhlab.finite_horizon.studies.architecture_study SUBCOMMAND ...`` runs these same rows
through ``qhlab.cli.main``. Does not own: each subcommand's arguments (``qhlab.study.arguments``)
or what a step does (``qhlab.study.Study``).

The steps import torch, Lightning and W&B lazily, inside their row's function, so that ``qhlab
--help``, every ``--help``, ``status`` and ``export`` never load them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qhlab.cli.command import Command
from qhlab.evidence import require_workers
from qhlab.evidence.layout import FREEZE_RECEIPT, REPORT_DIR, REPORT_MARKDOWN
from qhlab.execution import JobRunner
from qhlab.report.export import export_study
from qhlab.study.arguments import STUDY_DESCRIPTIONS, STUDY_HELPS, STUDY_SUBCOMMANDS, study_arguments
from qhlab.training.console import console_verbose
from qhlab.training.terminal import console as study_console

if TYPE_CHECKING:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.study.study import Study

__all__ = ["COMMAND", "STUDY_COMMANDS"]


def _open(args: argparse.Namespace) -> tuple[Study, Any]:
    """The study ``args`` names, with the executor its config and the command line choose (for the
    steps that label populations or run fits); returns ``(study, executor or None)``."""
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.design.study_config import read_study_config
    from qhlab.report.finished import open_study

    executor = None
    if hasattr(args, "executor"):
        config, _, _ = read_study_config(args.config)
        executor = config.executor_choice(args.executor, args.ray_address, call=f"qhlab study {args.study_command}")
    return open_study(args.config, args.study_output, populations=args.populations, executor=executor), executor


@contextlib.contextmanager
def _ray_session(choice: Any, *, call: str) -> Iterator[None]:
    """Connect to Ray once for a step that labels a population there (its labelling chunks share
    the connection); an unreachable cluster is refused before the step writes."""
    if choice is None or choice.kind != "ray":
        yield
        return

    with JobRunner(choice, os.cpu_count() or 1, call=call, verbose=console_verbose()) as runner:
        runner.ray()
        yield


def _freeze(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.study.freeze import describe_family

    console = study_console()
    study, executor = _open(args)
    with _ray_session(executor, call="qhlab study freeze"):
        body = study.freeze()
    console.print(
        f"[green]frozen[/] {Path(args.study_output) / FREEZE_RECEIPT}: {len(body['cells'])} cells, TRAIN "
        f"{body['train']['support']['scenes']} scenes / {body['train']['support']['chain_states']} states"
    )
    with study.authenticated("freeze_study") as frozen:
        for line in describe_family(frozen):
            console.print(line, highlight=False, markup=False)
    return 0


def _admit_canaries(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.study.run import say_e0

    study, _ = _open(args)
    e0 = study.admit_canaries()
    return say_e0(study_console(), e0["passed"], e0["reason"])


def _prepare_development(args: argparse.Namespace) -> int:
    study, executor = _open(args)
    with _ray_session(executor, call="qhlab study prepare-development"):
        body = study.prepare_development()
    study_console().print(
        f"[green]sealed[/] validation {body['validation']['support']['scenes']} scenes; "
        f"TRAIN constant {body['train_constant']}; best fixed index (TRAIN-chosen) "
        f"{body['references']['best_fixed_index']['index']}"
    )
    return 0


def _run_fit(args: argparse.Namespace) -> int:
    study, _ = _open(args)
    body = study.run_fit(args.variant, args.seed, canary_role=args.canary_role)
    study_console().print(f"[green]cell {body['cell']}[/] finished: {body['observed_updates']} updates")
    return 0


def _benchmark(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.study.run import say_benchmark

    study, _ = _open(args)
    study.benchmark(args.variant, args.seed, on_result=say_benchmark(study_console()))
    return 0


def _report(args: argparse.Namespace) -> int:
    console = study_console()
    study, _ = _open(args)
    report = study.report()
    where = Path(args.study_output)
    console.print(f"[green]report[/] {where / REPORT_DIR / REPORT_MARKDOWN} ({report['summary']['n_cells']} cells)")
    console.print(f"W&B report run (offline): {study.reporter.log_run(where)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    _require_workers(args)
    study, _ = _open(args)
    return study.run(workers=args.workers, console=study_console())


def _status(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.study.status import status_lines, study_status

    status = study_status(args.study_output, args.populations)
    print(json.dumps(status, indent=2) if args.json else "\n".join(status_lines(status)))
    return 0


def _export(args: argparse.Namespace) -> int:

    written = export_study(args.study_output, args.export_output, table=args.export_table, fmt=args.export_format)
    print(f"{args.export_table} table of {args.study_output}: {written}")
    return 0


def _replicate(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.design.study_config import read_study_config
    from qhlab.replication.run import replicate
    from qhlab.study.study import Study

    _require_workers(args)
    executor = None
    if args.executor is not None or args.ray_address is not None:  # else the design's own executor
        config, _, _ = read_study_config(Study.existing(args.replicate_study).config_path)
        executor = config.executor_choice(args.executor, args.ray_address, call="qhlab study replicate")
    return replicate(
        args.replicate_study,
        args.replicate_output,
        train_seed=args.train_seed,
        validation_seed=args.validation_seed,
        training_seeds=args.training_seeds,
        populations=args.populations,
        workers=args.workers,
        executor=executor,
    )


def _compare_lanes(args: argparse.Namespace) -> int:
    # Lazy: the pipeline loads numpy, and a step torch and Lightning; `--help`, `status` and `export` do not.
    from qhlab.lanes.compare import run_command

    return run_command(args)


def _require_workers(args: argparse.Namespace) -> None:
    if args.workers is not None:
        require_workers(
            f"qhlab study {args.study_command}", "--workers", args.workers, hint="one fit per core is fastest"
        )


_RUNS: dict[str, Callable[[argparse.Namespace], int]] = {
    "freeze": _freeze,
    "admit-canaries": _admit_canaries,
    "prepare-development": _prepare_development,
    "run-fit": _run_fit,
    "benchmark": _benchmark,
    "report": _report,
    "run": _run,
    "status": _status,
    "export": _export,
    "replicate": _replicate,
    "compare-lanes": _compare_lanes,
}

STUDY_COMMANDS = tuple(
    Command(
        name,
        help=STUDY_HELPS[name],
        description=STUDY_DESCRIPTIONS[name],
        arguments=study_arguments(name),
        run=_RUNS[name],
    )
    for name in STUDY_SUBCOMMANDS
)

COMMAND = Command(
    "study",
    help="the pre-registered, paired architecture study (`qhlab study run CONFIG --output DIR`)",
    description="Freeze, gate, fit, benchmark and report a paired architecture study.",
    subcommands=STUDY_COMMANDS,
    dest="study_command",
)
