"""Run a frozen, paired architecture development study: the study application's entry point.

Owns: the path-based step functions (``freeze_study``, ``admit_canaries``,
``prepare_development``, ``run_fit``, ``report_study``: each one call of ``qhlab.study.Study``),
the study's command (``run_study_command``, which ``qhlab study`` and ``main`` share) and
``main``. ``QhArchitectureStudyConfig`` (``qhlab.design.study_config``, below the pipeline so
that the preparation records read it) and ``benchmark_scorer`` (``qhlab.finite_horizon.benchmark``,
the measurement of one fit) are named here as this module's API too. ``python -m
qhlab.finite_horizon.studies.architecture_study STEP CONFIG --output DIR`` runs ``main``.

The study's order: ``freeze_study`` -> ``admit_canaries`` (E0 gate) -> ``prepare_development``
-> ``run_fit`` for every declared cell -> ``benchmark_scorer`` -> ``report_study``.

Scientific guard rails, each enforced by the steps:
* the statistical unit is the scene (evaluation and bootstrap work on per-scene values);
* TRAIN is digested at freeze and re-authenticated once by each process that runs a later step;
  validation is not opened before ``prepare_development`` and only after a passed E0 gate; no
  test data exists;
* exactly the declared cells (arm x seed) run, each once to its final budget; only a crashed
  cell (no final receipt) is attempted again, as a new recorded attempt;
* the report uses final states only, never an intermediate checkpoint;
* the qhlab source package may not change after freeze (``source_package_digest``).

This owner composes existing diagnostic fits and evaluation receipts; it does not implement
another optimizer loop (``qhlab.finite_horizon.fit.fit_recipe`` is the only one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from qhlab.design.study_config import QhArchitectureStudyConfig, read_study_config
from qhlab.evidence import QhError, require_int
from qhlab.evidence.layout import FREEZE_RECEIPT, REPORT_DIR, REPORT_MARKDOWN
from qhlab.execution import JobRunner
from qhlab.finite_horizon.benchmark import benchmark_scorer
from qhlab.lanes.compare import run_command as compare_lanes_command
from qhlab.replication.run import replicate
from qhlab.study.arguments import add_study_arguments
from qhlab.study.freeze import describe_family
from qhlab.study.report_run import log_report_run
from qhlab.study.run import say_benchmark, say_e0
from qhlab.study.status import status_lines, study_status
from qhlab.study.study import Study
from qhlab.study.terminal import console as study_console
from qhlab.training.console import console_verbose

__all__ = [
    "QhArchitectureStudyConfig",
    "admit_canaries",
    "benchmark_scorer",
    "freeze_study",
    "main",
    "prepare_development",
    "report_study",
    "run_fit",
    "run_study_command",
]


def freeze_study(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Bind TRAIN support, source and controls without constructing held-out data (``Study.freeze``).

    Returns:
        The freeze receipt body.
    """
    return Study.open(config_path, output).freeze()


def admit_canaries(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Gate broad fits using the original labels of one prospectively selected TRAIN row
    (``Study.admit_canaries``).

    Returns:
        The E0 receipt body (``passed``, ``reason``, ``failures``).
    """
    return Study.open(config_path, output).admit_canaries()


def prepare_development(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Seal exposed validation and TRAIN-only constant after the E0 gate passes
    (``Study.prepare_development``).

    Returns:
        The development receipt body.
    """
    return Study.open(config_path, output).prepare_development()


def run_fit(
    config_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    variant: str,
    seed: int,
    canary_role: str | None = None,
) -> dict:
    """Fit one charged cell using canonical diagnostic admission and receipts (``Study.run_fit``).

    Returns:
        The cell receipt body.
    """
    return Study.open(config_path, output).run_fit(variant, seed, canary_role=canary_role)


def report_study(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Compare all ten charged final cells; never select an intermediate checkpoint (``Study.report``).

    Returns:
        The report (the content of ``report.json``).
    """
    return Study.open(config_path, output).report()


def run_study_command(args: argparse.Namespace) -> int:
    """Run the study step named by ``args.study_command`` and print what it did.

    Args:
        args: a namespace parsed by a parser given ``qhlab.study.arguments.add_study_arguments``.

    Returns:
        The exit status: 0, or 1 when the E0 gate (or a lane comparison's check) failed.

    Raises:
        QhError: a step refused or failed (the caller maps it to an exit status).
    """
    command = args.study_command
    if getattr(args, "workers", None) is not None:
        require_int(f"qhlab study {command}", "--workers", args.workers, minimum=1, hint="one fit per core is fastest")
    if command == "compare-lanes":  # two studies, each authenticated in its own directory
        return compare_lanes_command(args)
    if command == "replicate":  # a finished study and the study of its design it runs
        executor = None
        if args.executor is not None or args.ray_address is not None:  # else the design's own executor
            config, _, _ = read_study_config(Study.existing(args.replicate_study).config_path)
            executor = config.executor_choice(args.executor, args.ray_address, call="qhlab study replicate")
        return replicate(
            args.replicate_study,
            args.replicate_output,
            train_seed=args.train_seed,
            validation_seed=args.validation_seed,
            populations=args.populations,
            workers=args.workers,
            executor=executor,
        )
    if command == "status":
        status = study_status(args.study_output, args.populations)
        print(json.dumps(status, indent=2) if args.json else "\n".join(status_lines(status)))
        return 0
    console = study_console()
    output = Path(args.study_output)
    executor = None
    if hasattr(args, "executor"):  # a step that labels populations or runs fits
        config, _, _ = read_study_config(args.config)
        executor = config.executor_choice(args.executor, args.ray_address, call=f"qhlab study {command}")
    study = Study.open(args.config, output, populations=args.populations, executor=executor)
    if command == "run":
        return study.run(workers=args.workers, console=console)
    if command in ("freeze", "prepare-development"):  # the two steps that may label a population on Ray
        with _ray_session(executor, call=f"qhlab study {command}"):
            body = study.freeze() if command == "freeze" else study.prepare_development()
        if command == "prepare-development":
            console.print(
                f"[green]sealed[/] validation {body['validation']['support']['scenes']} scenes; "
                f"TRAIN constant {body['train_constant']}; best fixed index (TRAIN-chosen) "
                f"{body['references']['best_fixed_index']['index']}"
            )
            return 0
        console.print(
            f"[green]frozen[/] {output / FREEZE_RECEIPT}: {len(body['cells'])} cells, TRAIN "
            f"{body['train']['support']['scenes']} scenes / {body['train']['support']['chain_states']} states"
        )
        with study.authenticated("freeze_study") as frozen:
            for line in describe_family(frozen):
                console.print(line, highlight=False, markup=False)
        return 0
    if command == "admit-canaries":
        e0 = study.admit_canaries()
        return say_e0(console, e0["passed"], e0["reason"])
    if command == "run-fit":
        body = study.run_fit(args.variant, args.seed, canary_role=args.canary_role)
        console.print(f"[green]cell {body['cell']}[/] finished: {body['observed_updates']} updates")
        return 0
    if command == "benchmark":
        study.benchmark(args.variant, args.seed, on_result=say_benchmark(console))
        return 0
    report = study.report()
    console.print(f"[green]report[/] {output / REPORT_DIR / REPORT_MARKDOWN} ({report['summary']['n_cells']} cells)")
    console.print(f"W&B report run (offline): {log_report_run(output)}")
    return 0


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


def main() -> NoReturn:
    """Execute one explicit, immutable study operation from the command line.

    Parses ``sys.argv[1:]`` (``STEP CONFIG --output DIR ...``), runs the step, prints
    ``error: <message>`` on a refusal or failure, and exits with the step's status.
    """
    try:
        code = _main(sys.argv[1:])
    except QhError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = exc.exit_code
    sys.exit(code)


def _main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (``STEP CONFIG --output DIR ...``, no program name); run it; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m qhlab.finite_horizon.studies.architecture_study",
        description="The pre-registered, paired architecture study.",
    )
    add_study_arguments(parser)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return run_study_command(args)


if __name__ == "__main__":
    main()
