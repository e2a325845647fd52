"""The main job's fits: the E0 canaries side by side and the broad cells, on the run's job runner.

Owns: ``cell_job`` (what a worker runs for one cell or canary: the study authenticated once per
worker), ``fit_canaries``, ``run_cells`` (a bar counting the cells and one line per finished
cell, on the local pool or as Ray tasks) and the lines the steps print (``say_e0``,
``say_benchmark``). Does not own: the order of the steps (``Study.run``), any step's behaviour
(the step modules), running jobs (``qhlab.execution.JobRunner``) or Ray's shipping of cells
(``remote``).
"""

from __future__ import annotations

from typing import Any

from qhlab.evidence import authentication_roots, locate_population, population_roots, recorded_origin
from qhlab.evidence.layout import CANARY_DIR, CELL_RECEIPT, cell_name
from qhlab.execution import JobRunner, progress_sink, reporting, worker_memo
from qhlab.study.admission import publish_selection
from qhlab.study.authentication import FrozenStudy, authenticate_development, authenticate_freeze
from qhlab.study.cells import fit_cell
from qhlab.study.remote import run_cells_on_ray
from qhlab.training.console import console_verbose
from qhlab.training.terminal import FitBoard, fits_progress

__all__ = ["cell_job", "fit_canaries", "run_cells", "say_benchmark", "say_e0"]


def cell_job(
    config_path: str, output: str, populations: tuple[str, ...], arm: str, seed: int, canary_role: str | None = None
) -> dict:
    """One broad cell, or a canary, in a job runner's worker (the fit sets the config's torch threads).

    A worker authenticates its study once (``worker_memo``) for every cell it is given;
    ``populations`` are the driver's population roots (a worker starts without them).

    Returns:
        ``{"cell", "mae", "regret", "wall_seconds"}`` of a broad cell; ``{"cell"}`` of a canary.
    """
    with authentication_roots(output, populations, original=recorded_origin(output)):
        frozen = worker_memo(
            ("study", config_path, output), lambda: authenticate_freeze(config_path, output, "run_fit")
        )
        # A worker reports its fit's progress to the driver (``JobRunner.run``'s ``on_progress``).
        body = fit_cell(frozen, variant=arm, seed=seed, canary_role=canary_role, progress=reporting())
    return _cell_summary(body) if canary_role is None else {"cell": body["cell"]}


def _cell_summary(body: dict) -> dict:
    return {
        "cell": body["cell"],
        "mae": body["evaluation"]["mae"],
        "regret": body["evaluation"]["regret"],
        "wall_seconds": body.get("wall_seconds"),
    }


def say_e0(console: Any, passed: bool, reason: str) -> int:
    """Print the E0 decision; 0 when it passed, else 1."""
    if passed:
        console.print(f"[green]E0 passed[/]: {reason}")
        return 0
    from rich.markup import escape

    # The reason is data: escape it so it is never read as markup, and do not wrap it, so each
    # failure stays one greppable line.
    console.print(f"[red]E0 failed[/]: {escape(reason)}; broad fits will not run.", soft_wrap=True)
    return 1


def fit_canaries(console: Any, frozen: FrozenStudy, runner: JobRunner) -> None:
    """Fit the missing E0 canaries side by side before ``decide_e0`` reads them.

    Each canary is one single-threaded fit, so one after the other they leave all but one core
    idle. A worker fits exactly what ``decide_e0`` would (the same ``fit_cell``, seeded and
    threaded by the frozen config); with one worker or on Ray, ``decide_e0`` fits them in this
    process.
    """
    config = frozen.config
    if publish_selection(frozen)["selected"] is None or runner.kind != "local":
        return
    pending = [
        seed
        for seed in config.seeds
        if not (frozen.output / CANARY_DIR / cell_name(config.baseline_arm, seed, "e0") / CELL_RECEIPT).exists()
    ]
    if min(runner.workers, len(pending)) < 2:
        return
    roots = tuple(str(r) for r in population_roots())
    with FitBoard(console) as board:
        runner.run(
            cell_job,
            [(str(frozen.config_path), str(frozen.output), roots, config.baseline_arm, seed, "e0") for seed in pending],
            on_progress=board.report,
        )


def run_cells(console: Any, frozen: FrozenStudy, pending: list[tuple[str, int]], runner: JobRunner) -> None:
    """Run the pending broad cells on the runner (or as Ray tasks, ``remote``), with one bar
    counting them, one line per finished cell and, on the local executor, the progress of each
    running fit (``FitBoard``: a bar per fit in a terminal, a line every few seconds otherwise).
    """
    with fits_progress(console) as progress, FitBoard(console, progress) as board:
        task = progress.add_task("broad fits", total=len(pending))
        if runner.kind == "ray":
            _run_cells_ray(progress, task, frozen, pending, runner)
            return
        from rich.markup import escape

        def done(index: int, summary: dict) -> None:
            progress.console.print(
                f"  cell {summary['cell']}: MAE_H {summary['mae'][-1]:.4f}, regret_H {summary['regret'][-1]:.4f}"
            )
            progress.advance(task)

        def failed(index: int, exc: BaseException) -> None:
            arm, seed = pending[index]
            progress.console.print(f"  [red]cell {arm}-s{seed} failed[/]: {escape(str(exc))}")
            progress.advance(task)

        if runner.runs_here(len(pending)):
            # In this process the study is already authenticated: fit on it (one authentication per run).
            with progress_sink(board.report):
                for index, (arm, seed) in enumerate(pending):
                    done(index, _cell_summary(fit_cell(frozen, variant=arm, seed=seed, progress=True)))
            return
        roots = tuple(str(r) for r in population_roots())
        runner.run(
            cell_job,
            [(str(frozen.config_path), str(frozen.output), roots, arm, seed) for arm, seed in pending],
            on_result=done,
            on_error=failed,
            in_order=False,
            on_progress=board.report,
        )


def _run_cells_ray(
    progress: Any, task: Any, frozen: FrozenStudy, pending: list[tuple[str, int]], runner: JobRunner
) -> None:
    """The pending cells as Ray tasks, with the same bar and result lines as the local pool."""
    from rich.markup import escape

    def _done(body: dict) -> None:
        progress.console.print(
            f"  cell {body['cell']}: MAE_H {body['evaluation']['mae'][-1]:.4f}, "
            f"regret_H {body['evaluation']['regret'][-1]:.4f}{_where(body)}"
        )
        progress.advance(task)

    def _failed(arm: str, seed: int, exc: Exception) -> None:
        progress.console.print(f"  [red]cell {arm}-s{seed} failed[/]: {escape(str(exc))}")
        progress.advance(task)

    sealed = authenticate_development(frozen, "run").body.validation
    errors = run_cells_on_ray(
        frozen,
        pending,
        runner,
        validation=locate_population(sealed["path"], sealed["manifest_sha256"]),
        validation_digest=sealed["manifest_sha256"],
        verbose=console_verbose(),
        on_result=_done,
        on_error=_failed,
    )
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


def say_benchmark(console: Any) -> Any:
    """The ``on_result`` of a benchmark step: one line per new benchmark."""

    def say(arm: str, seed: int, result: dict) -> None:
        console.print(
            f"benchmark {arm}-s{seed}: median forward {result['median_forward_seconds'] * 1e3:.3f} ms, "
            f"{len(result['parameters_receiving_gradients'])} tensors with gradient"
        )

    return say
