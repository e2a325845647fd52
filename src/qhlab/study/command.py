"""The study command: ``qhlab study STEP CONFIG --output DIR`` and ``python -m ...architecture_study``.

Owns: the study's arguments (``add_study_arguments``), running the named step and printing
what it did (``run_study_command``), ``qhlab study run`` (every step in order, skipping steps
whose receipts authenticate, canaries and broad fits in a process pool), printing ``qhlab study status DIR
[--json]`` (``status``), and ``main``. This is the one entry of the study's command line:
``qhlab.cli.study`` registers it. Does not own: any step's behaviour (the step modules), or
mapping errors to exit codes inside ``qhlab`` (``qhlab.cli``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from qhlab.evidence import QhError, authentication_roots, locate_population, population_roots, read_receipt
from qhlab.evidence.records import StudyBenchmarkReceipt, StudyCellReceipt, StudyReportReceipt
from qhlab.execution import FIT_WORKER_IMPORTS, add_executor_arguments, open_executor
from qhlab.study.admission import decide_e0, publish_selection
from qhlab.study.authentication import (
    FrozenStudy,
    authenticate_cells,
    authenticate_development,
    authenticate_e0,
    authenticate_freeze,
    recorded_output,
)
from qhlab.study.benchmarks import benchmark_cells
from qhlab.study.cells import fit_cell
from qhlab.study.config import read_study_config
from qhlab.study.development import seal_development
from qhlab.study.freeze import describe_family, freeze
from qhlab.study.lanes import run_command
from qhlab.study.layout import (
    CANARY_DIR,
    CANARY_ROLES,
    CELL_RECEIPT,
    DEVELOPMENT_RECEIPT,
    E0_RECEIPT,
    FREEZE_RECEIPT,
    REPORT_DIR,
    REPORT_MARKDOWN,
    REPORT_RECEIPT,
    benchmark_receipt_path,
    cell_name,
    cell_receipt_path,
)
from qhlab.study.remote import check_cells_feasible, run_cells_on_ray
from qhlab.study.report import write_report
from qhlab.study.report_run import log_report_run
from qhlab.study.status import status_lines, study_status
from qhlab.study.terminal import console as study_console
from qhlab.study.terminal import fits_progress
from qhlab.training.console import configure_console, console_verbose

__all__ = ["add_study_arguments", "main", "run_study_command"]

_SUBCOMMANDS = ("freeze", "admit-canaries", "prepare-development", "run-fit", "benchmark", "report", "run")


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the study steps as subcommands of ``parser`` (shared by ``qhlab study`` and ``main``).

    The parsed namespace has ``study_command`` (the step), ``config``, ``study_output`` and,
    per step, ``variant``, ``seed``, ``canary_role`` and ``workers``; pass it to
    ``run_study_command``. ``status`` reads a study and takes only ``DIR`` (``study_output``)
    and ``--json``: no config. ``compare-lanes`` takes two study directories (``lane_a``,
    ``lane_b``), ``--output`` and ``--margin`` (``lanes.compare_lanes``).
    """
    sub = parser.add_subparsers(dest="study_command", metavar="STEP", required=True)
    helps = {
        "freeze": "validate the config, resolve TRAIN, bind source and arms (step 1)",
        "admit-canaries": "select the canary row and run the two TRAIN canaries: the E0 gate (step 2)",
        "prepare-development": "seal validation and the TRAIN-only constant after E0 passes (step 3)",
        "run-fit": "fit one declared cell to its final budget (step 4)",
        "benchmark": "time verified final scorers on the canonical first TRAIN chain (step 5)",
        "report": "compare all charged final cells; report.json, report.md, figures (step 6)",
        "run": "every step in order, skipping steps whose receipts authenticate (the main job)",
    }
    for name in _SUBCOMMANDS:
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("config", help="study TOML (e.g. examples/default-study.toml)")
        # dest is not "output": a study directory outlives any one failed step, so the CLI's
        # "remove a new --output on bad input" net must not delete a study's finished steps.
        # Each step validates before it writes, so bad input still writes nothing.
        p.add_argument("--output", dest="study_output", metavar="DIR", required=True, help="study directory")
        if name in ("run-fit", "benchmark"):
            p.add_argument("--variant", required=name == "run-fit", help="declared arm")
            p.add_argument("--seed", type=int, required=name == "run-fit", help="declared seed")
        if name == "run-fit":
            p.add_argument("--canary-role", default=None, choices=CANARY_ROLES,
                           help="run a canary of the E0 gate (normally done by admit-canaries)")
        if name == "run":
            p.add_argument("--workers", type=int, default=None,
                           help="override the config's parallel fits (does not change results)")
        _add_populations_argument(p)
        if name in ("freeze", "prepare-development", "run"):
            add_executor_arguments(p, what="population labelling" + (" and broad fits" if name == "run" else ""),
                                   default_help="the config's executor, local unless it says ray")
    status = sub.add_parser("status", help="where a study stands, read from its receipts (writes nothing)",
                            description="One row per step and cell: state, attempts, updates, MAE_H, "
                                        "regret_H, wall time. Reads receipts only.")
    status.add_argument("study_output", metavar="DIR", help=f"study directory (holds {FREEZE_RECEIPT})")
    status.add_argument("--json", action="store_true", help="print the table as one JSON object")
    _add_populations_argument(status)
    lanes = sub.add_parser("compare-lanes", help="is study B (another lane) the same science as study A?",
                           description="Re-authenticate two finished studies frozen identically but for the "
                                       "profile; publish lanes.json, lanes.md, lanes.png and their receipt.")
    lanes.add_argument("lane_a", metavar="A", help="lane A's finished study directory")
    lanes.add_argument("lane_b", metavar="B", help="lane B's finished study directory")
    lanes.add_argument("--output", required=True, metavar="DIR", help="new directory for the lane report")
    lanes.add_argument("--margin", type=float, default=None,
                       help="TOST equivalence margin on regret_H (metres); default: --margin-mde-multiple x the "
                            "study's regret MDE (lane A's largest D_reg MDE)")
    lanes.add_argument("--margin-mde-multiple", type=float, default=1.0, metavar="K",
                       help="without --margin, the margin is K x the study's regret MDE (default 1)")
    _add_populations_argument(lanes)


def _add_populations_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--populations", metavar="ROOT", action="append", default=[],
                        help="a directory the study's populations were copied to (repeatable; as for "
                             "`qhlab verify`); ~/.cache/qhlab/populations is always searched")


def run_study_command(args: argparse.Namespace) -> int:
    """Run the study step named by ``args.study_command`` and print what it did.

    The study is authenticated once (``authenticate_freeze``), and the step (every step, for
    ``run``) works on that ``FrozenStudy``.

    Args:
        args: a namespace parsed by a parser given ``add_study_arguments``.

    Returns:
        The exit status: 0, or 1 when the E0 gate failed (its receipt stays).

    Raises:
        QhError: a step refused or failed (the caller maps it to an exit status).
    """
    if args.study_command == "compare-lanes":  # two studies, each authenticated in its own directory

        return run_command(args)
    # Every step authenticates the study's own bytes, wherever it was copied to.
    with authentication_roots(args.study_output, args.populations, original=recorded_output(args.study_output)):
        return _run_step(args)


# The call each step names in its refusals.
_STEP_CALLS = {"admit-canaries": "admit_canaries", "prepare-development": "prepare_development",
               "run-fit": "run_fit", "benchmark": "benchmark", "report": "report_study"}


def _run_step(args: argparse.Namespace) -> int:
    command = args.study_command
    if command == "status":
        status = study_status(args.study_output)
        print(json.dumps(status, indent=2) if args.json else "\n".join(status_lines(status)))
        return 0
    console = study_console()
    output = Path(args.study_output)
    executor, config = _executor(args)
    if command == "freeze":
        with _executor_session(executor, config, cells=False, call="qhlab study freeze"):
            frozen = freeze(args.config, output, executor=executor)
        body = frozen.body
        console.print(f"[green]frozen[/] {output / FREEZE_RECEIPT}: {len(body.cells)} cells, TRAIN "
                      f"{body.train['support']['scenes']} scenes / {body.train['support']['chain_states']} states")
        for line in describe_family(frozen):
            console.print(line, highlight=False, markup=False)
        return 0
    if command == "run":
        with _executor_session(executor, config):
            return _run_all(console, args.config, output, workers=args.workers, executor=executor)
    call = _STEP_CALLS[command]
    if command == "run-fit" and args.canary_role is not None:
        call = "run_fit(canary)"
    frozen = authenticate_freeze(args.config, output, call)
    if command == "admit-canaries":
        e0 = decide_e0(frozen)
        return _say_e0(console, e0["passed"], e0["reason"])
    if command == "prepare-development":
        with _executor_session(executor, config, cells=False, call="qhlab study prepare-development"):
            body = seal_development(frozen, executor=executor)
        console.print(f"[green]sealed[/] validation {body['validation']['support']['scenes']} scenes; "
                      f"TRAIN constant {body['train_constant']}; best fixed index (TRAIN-chosen) "
                      f"{body['references']['best_fixed_index']['index']}")
        return 0
    if command == "run-fit":
        body = fit_cell(frozen, variant=args.variant, seed=args.seed, canary_role=args.canary_role)
        console.print(f"[green]cell {body['cell']}[/] finished: {body['observed_updates']} updates")
        return 0
    if command == "benchmark":
        return _benchmark_all(console, frozen, args.variant, args.seed)
    report = write_report(frozen)
    console.print(f"[green]report[/] {output / REPORT_DIR / REPORT_MARKDOWN} ({report['summary']['n_cells']} cells)")
    console.print(f"W&B report run (offline): {log_report_run(output)}")
    return 0


def _executor(args: argparse.Namespace) -> tuple[Any, Any]:
    """The ``ExecutorChoice`` of a step (the CLI's ``--executor``/``--ray-address``, else the
    config's) and the config it was read from; (None, None) for a step without those options.

    Refuses a bad choice before the step writes anything (the config is read and validated here).
    """
    if not hasattr(args, "executor"):
        return None, None  # a step that runs nothing in parallel
    config, _, _ = read_study_config(args.config)
    return config.executor_choice(args.executor, args.ray_address, call=f"qhlab study {args.study_command}"), config


@contextlib.contextmanager
def _executor_session(choice: Any, config: Any, *, cells: bool = True,
                      call: str = "qhlab study run") -> Iterator[None]:
    """Connect to Ray once for a step (for ``study run``, labelling and cells share the
    connection); an unreachable cluster, or (``cells``) one where no node can run a cell, is
    refused here, before the step writes."""
    if choice.kind != "ray":
        yield
        return

    with open_executor(choice, os.cpu_count() or 1, call=call, verbose=console_verbose()):
        if cells:
            check_cells_feasible(config, call)
        yield


def _say_e0(console: Any, passed: bool, reason: str) -> int:
    """Print the E0 decision; 0 when it passed, else 1."""
    if passed:
        console.print(f"[green]E0 passed[/]: {reason}")
        return 0
    from rich.markup import escape

    # The reason holds brackets-free numbers and names today, but it is data: escape it so it
    # is never read as markup, and do not wrap it, so each failure stays one greppable line.
    console.print(f"[red]E0 failed[/]: {escape(reason)}; broad fits will not run.", soft_wrap=True)
    return 1


def _benchmark_all(console: Any, frozen: FrozenStudy, variant: str | None, seed: int | None) -> int:
    """Benchmark one cell or every cell not benchmarked yet, printing one line per new benchmark."""

    def say(arm: str, s: int, result: dict) -> None:
        console.print(f"benchmark {arm}-s{s}: median forward {result['median_forward_seconds'] * 1e3:.3f} ms, "
                      f"{len(result['parameters_receiving_gradients'])} tensors with gradient")

    benchmark_cells(frozen, variant, seed, on_result=say)
    return 0


# A pool worker process authenticates its study once, for every cell it runs.
_WORKER_STUDIES: dict[tuple[str, str], FrozenStudy] = {}


def _cell_worker(config_path: str, output: str, arm: str, seed: int, populations: tuple[str, ...] = (),
                 canary_role: str | None = None) -> dict:
    """Process-pool entry: one broad cell, or a canary (the fit sets the config's torch threads);
    ``populations`` are the driver's population roots (a spawned worker starts without them)."""
    with authentication_roots(output, populations, original=recorded_output(output)):
        frozen = _WORKER_STUDIES.get((config_path, output))
        if frozen is None:
            frozen = _WORKER_STUDIES[(config_path, output)] = authenticate_freeze(config_path, output, "run_fit")
        body = fit_cell(frozen, variant=arm, seed=seed, canary_role=canary_role, progress=False)
        return _cell_summary(body) if canary_role is None else {"cell": body["cell"]}


class _FitPool:
    """The local process pool of one ``study run``'s fits, opened at its first use and kept open
    for the rest of the run, so that the canaries and the broad cells share its workers.

    A bare worker imports torch, Lightning and W&B before its first fit (about 3.9 s each,
    ``bench/worker_startup.py``); a pool per step paid that again for the cells. The pool's
    workers are forked from a server that imported those once (``FIT_WORKER_IMPORTS``), and a
    worker is reused for every fit it is given. Each fit stays isolated as before: ``fit_cell``
    seeds, threads and publishes it on its own, and a worker holds nothing across fits but its
    authenticated study (``_WORKER_STUDIES``).
    """

    def __init__(self, stack: contextlib.ExitStack, executor: Any, workers: int) -> None:
        self._stack, self._executor, self._workers = stack, executor, workers
        self._pool: Any = None

    def get(self) -> Any:
        if self._pool is None:
            self._pool = self._stack.enter_context(open_executor(
                self._executor, self._workers, call="qhlab study run", initializer=configure_console,
                initargs=(console_verbose(),), warm_imports=FIT_WORKER_IMPORTS))
        return self._pool


def _fit_canaries(frozen: FrozenStudy, workers: int, executor: Any, pool: _FitPool | None = None) -> None:
    """Fit the missing E0 canaries side by side on the local pool, before ``decide_e0`` reads them.

    Each canary is one single-threaded fit, so in-process they left all but one core idle (the
    demo's two took 190 s one after the other). A pool worker fits exactly what ``decide_e0``
    would (the same ``fit_cell``, seeded and threaded by the frozen config); with one worker or
    on Ray, ``decide_e0`` fits them in this process as before. ``pool`` is the run's shared pool
    (None: one for these canaries alone).
    """
    config = frozen.config
    if publish_selection(frozen)["selected"] is None:
        return
    pending = [seed for seed in config.seeds if not (
        frozen.output / CANARY_DIR / cell_name(config.baseline_arm, seed, "e0") / CELL_RECEIPT).exists()]
    executor = executor or config.executor_choice()
    if executor.kind != "local" or min(workers, len(pending)) < 2:
        return
    with contextlib.ExitStack() as stack:
        workers_pool = (pool or _FitPool(stack, executor, min(workers, len(pending)))).get()
        roots = tuple(str(r) for r in population_roots())
        futures = [workers_pool.submit(_cell_worker, str(frozen.config_path), str(frozen.output),
                                       config.baseline_arm, seed, roots, "e0") for seed in pending]
        for future in futures:
            future.result()


def _cell_summary(body: dict) -> dict:
    return {"cell": body["cell"], "mae": body["evaluation"]["mae"], "regret": body["evaluation"]["regret"],
            "wall_seconds": body.get("wall_seconds")}


def _run_cells(console: Any, frozen: FrozenStudy, pending: list[tuple[str, int]], workers: int,
               executor: Any, pool: _FitPool | None = None) -> None:
    """Run the pending broad cells, ``workers`` at a time (one pool worker process each, or in-process
    for 1), or as Ray tasks (``remote``); ``pool`` is the run's shared pool (None: one for these
    cells alone).

    Each fit's own progress bar is off: the cells bar counts them, and bars of several fits
    would garble each other.
    """
    from concurrent.futures import as_completed


    config_path, output = str(frozen.config_path), str(frozen.output)
    workers = max(1, min(workers, len(pending)))
    with fits_progress(console) as progress:
        task = progress.add_task("fits", total=len(pending))
        if executor.kind == "ray":
            _run_cells_ray(progress, task, frozen, pending, executor)
            return
        if workers == 1:
            for arm, seed in pending:
                summary = _cell_summary(fit_cell(frozen, variant=arm, seed=seed, progress=False))
                progress.console.print(f"  cell {summary['cell']}: MAE_H {summary['mae'][-1]:.4f}, "
                                       f"regret_H {summary['regret'][-1]:.4f}")
                progress.advance(task)
            return
        errors = []

        # Pool workers start unconfigured: the pool gives them this process's console mode.
        with contextlib.ExitStack() as stack:
            workers_pool = (pool or _FitPool(stack, executor, workers)).get()
            roots = tuple(str(r) for r in population_roots())
            futures = {workers_pool.submit(_cell_worker, config_path, output, arm, seed, roots): (arm, seed)
                       for arm, seed in pending}
            for future in as_completed(futures):
                try:
                    summary = future.result()
                except Exception as exc:  # noqa: BLE001 - reported after every other cell finished
                    errors.append(exc)
                    arm, seed = futures[future]
                    progress.console.print(f"  [red]cell {arm}-s{seed} failed[/]: {exc}")
                else:
                    progress.console.print(f"  cell {summary['cell']}: MAE_H {summary['mae'][-1]:.4f}, "
                                           f"regret_H {summary['regret'][-1]:.4f}")
                progress.advance(task)
        if errors:
            raise errors[0]


def _run_cells_ray(progress: Any, task: Any, frozen: FrozenStudy, pending: list[tuple[str, int]],
                   executor: Any) -> None:
    """The pending cells as Ray tasks, with the same bar and result lines as the local pool."""
    from rich.markup import escape


    def _done(body: dict) -> None:
        where = _where(body)
        progress.console.print(f"  cell {body['cell']}: MAE_H {body['evaluation']['mae'][-1]:.4f}, "
                               f"regret_H {body['evaluation']['regret'][-1]:.4f}{where}")
        progress.advance(task)

    def _failed(arm: str, seed: int, exc: Exception) -> None:
        progress.console.print(f"  [red]cell {arm}-s{seed} failed[/]: {escape(str(exc))}")
        progress.advance(task)

    sealed = authenticate_development(frozen, "run").body.validation
    errors = run_cells_on_ray(frozen, pending, executor,
                              validation=locate_population(sealed["path"], sealed["manifest_sha256"]),
                              validation_digest=sealed["manifest_sha256"], verbose=console_verbose(),
                              on_result=_done, on_error=_failed)
    if errors:
        raise errors[0]


def _where(body: dict) -> str:
    """`` @ <node ip>`` (``, after n lost tries``) for a cell a Ray worker ran; empty for a local one.

    Short, so that a cell's result line fits an 80-column terminal."""
    tries = (body.get("execution") or {}).get("tries") or []
    returned = next((t for t in tries if t.get("outcome") == "returned"), None)
    if returned is None:
        return ""
    retried = f", after {len(tries) - 1} lost tr{'y' if len(tries) == 2 else 'ies'}" if len(tries) > 1 else ""
    return f" @ {returned.get('node_ip')}{retried}"


def _run_all(console: Any, config_path: str | os.PathLike, output: Path, *, workers: int | None = None,
             executor: Any = None) -> int:
    """Every step in order; a step whose receipt authenticates is verified and skipped."""
    with contextlib.ExitStack() as stack:
        return _run_steps(console, config_path, output, workers=workers, executor=executor, stack=stack)


def _run_steps(console: Any, config_path: str | os.PathLike, output: Path, *, workers: int | None,
               executor: Any, stack: contextlib.ExitStack) -> int:
    """``_run_all``'s steps; the run's fit pool closes with ``stack``."""
    started = time.perf_counter()
    ran: list[str] = []
    verified: list[str] = []
    if (output / FREEZE_RECEIPT).exists():
        frozen = authenticate_freeze(config_path, output, "run")
        verified.append("freeze")
    else:
        console.rule("[bold]1/6 freeze")
        frozen = freeze(config_path, output, executor=executor)
        for line in describe_family(frozen):
            console.print(line, highlight=False, markup=False)
        ran.append("freeze")
    config = frozen.config
    pool = _FitPool(stack, executor or config.executor_choice(), workers or config.workers)
    if (output / CANARY_DIR / E0_RECEIPT).exists():
        e0 = authenticate_e0(frozen, "run").body
        passed, reason = e0.passed, e0.reason
        verified.append("admit-canaries")
    else:
        console.rule("[bold]2/6 canaries (E0 gate)")
        _fit_canaries(frozen, workers or config.workers, executor, pool)
        decided = decide_e0(frozen)
        passed, reason = decided["passed"], decided["reason"]
        ran.append("admit-canaries")
        if passed:
            _say_e0(console, passed, reason)
    if not passed:
        return _say_e0(console, passed, reason)
    if (output / DEVELOPMENT_RECEIPT).exists():
        authenticate_development(frozen, "run")
        verified.append("prepare-development")
    else:
        console.rule("[bold]3/6 development")
        seal_development(frozen, executor=executor)
        ran.append("prepare-development")
    pending = []
    for arm, seed in config.cells:
        path = cell_receipt_path(output, arm, seed)
        if path.exists():
            read_receipt(path, StudyCellReceipt)
        else:
            pending.append((arm, seed))
    if pending:
        executor = executor or config.executor_choice()
        at_once = "as Ray tasks" if executor.kind == "ray" else f"{workers or config.workers} at a time"
        console.rule(f"[bold]4/6 broad fits ({len(pending)} of {len(config.cells)} cells, {at_once})")
        _run_cells(console, frozen, pending, workers or config.workers, executor, pool)
        ran.append("run-fit")
    else:
        verified.append("run-fit")
    missing_bench = [c for c in config.cells if not benchmark_receipt_path(output, *c).exists()]
    # Once the report is published the study is closed: benchmarks are not added afterwards.
    if missing_bench and not (output / REPORT_DIR / REPORT_RECEIPT).exists():
        console.rule("[bold]5/6 benchmark")
        _benchmark_all(console, frozen, None, None)
        ran.append("benchmark")
    else:
        for arm, seed in config.cells:
            path = benchmark_receipt_path(output, arm, seed)
            if path.exists():
                read_receipt(path, StudyBenchmarkReceipt)
        verified.append("benchmark")
    if (output / REPORT_DIR / REPORT_RECEIPT).exists():
        read_receipt(output / REPORT_DIR / REPORT_RECEIPT, StudyReportReceipt)
        authenticate_cells(frozen, "run")
        verified.append("report")
    else:
        console.rule("[bold]6/6 report")
        report = write_report(frozen)
        for q in report["question"]:
            console.print(f"{q['variant']}: {q['verdict']} ({q['replication']}); MDE D_reg {q['mde_d_reg']:.4f} m, "
                          f"D_mae {q['mde_d_mae']:.4f} m", highlight=False, markup=False)
        console.print(report["headline"]["text"])
        console.print(f"W&B report run (offline): {log_report_run(output)}")
        ran.append("report")
    elapsed = time.perf_counter() - started
    if not ran:
        console.print(f"[green]study {output} is complete[/]: every receipt authenticated "
                      f"({', '.join(verified)}); nothing was run ({elapsed:.1f} s).")
    else:
        console.print(f"[green]study {output} finished[/]: ran {', '.join(ran)}"
                      + (f"; verified {', '.join(verified)}" if verified else "")
                      + f" ({elapsed:.1f} s). Report: {output / REPORT_DIR / REPORT_MARKDOWN}")
    return 0


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
        description="The pre-registered, paired architecture study (seed 002).",
    )
    add_study_arguments(parser)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return run_study_command(args)
