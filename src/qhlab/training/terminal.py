"""What the study shows on a terminal: the rich console and its progress bars.

Owns: the console the study command prints to, the population-generation bar (fed by
``qhlab.scenes.cached_population``'s ``progress(done, planned)``), the broad-fits bar of
``qhlab study run`` and ``FitBoard`` (the progress of every running fit, as its workers report it:
a bar per fit in a terminal, a line every few seconds otherwise; used by the study's canaries and
cells and by the preparation tools' fits), and ``fit_runner``, the job runner whose workers print
as this process does. Does not own: what is printed (``command``) or any
step's behaviour; nothing here changes a file or a number.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from qhlab.execution import FIT_WORKER_IMPORTS, ExecutorChoice, JobRunner
from qhlab.training.console import configure_console, console_verbose

__all__ = ["FitBoard", "GenerationProgress", "console", "fit_runner", "fits_progress"]


def console() -> Any:
    """The rich console of the study command (stdout, no highlighting).

    In a terminal it wraps at the terminal's width; elsewhere (a pipe, a CI log, a test's captured
    output) it prints every line whole, so that no sentence is broken at a width nobody sees and a
    long path never splits the words around it.
    """
    import sys

    from rich.console import Console

    return Console(stderr=False, highlight=False, soft_wrap=not sys.stdout.isatty())


def fits_progress(out: Any) -> Any:
    """A rich ``Progress`` for the broad fits of ``qhlab study run``, printing to ``out``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Each task names itself: the cells' counter ("broad fits") and each running fit's bar (``FitBoard``).
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=out, transient=False)


class GenerationProgress:
    """A rich progress bar fed by ``cached_population``'s ``progress(done, planned)``.

    It starts at the first report, so a population reused from the cache draws nothing.
    """

    def __init__(self, label: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} simulations"),
            TimeElapsedColumn(),
            transient=False,
        )
        self._task = None
        self._label = label

    def __call__(self, done: int, planned: int) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=planned)
        self._progress.update(self._task, completed=done, total=planned)

    def close(self) -> None:
        """Stop the bar (if it started)."""
        if self._task is not None:
            self._progress.stop()


class FitBoard:
    """The progress of every running fit, fed by ``report(label, done, total)``.

    In a terminal, one bar per running fit, removed when the fit finishes (on ``progress``, a
    rich ``Progress`` already drawing, or on one of its own). Otherwise one line per fit every
    ``every`` seconds, so a log shows that a long step is alive. ``report`` may be called from
    any thread (``qhlab.execution.JobRunner.run``'s ``on_progress``).

    Args:
        out: the rich console.
        progress: a started ``Progress`` to add the bars to (None: the board's own).
        every: seconds between two lines of one fit when the output is no terminal.
    """

    def __init__(self, out: Any, progress: Any = None, *, every: float = 10.0) -> None:
        self._out = out
        self._given = progress
        self._progress = progress
        self._every = float(every)
        self._tasks: dict[str, Any] = {}
        self._last: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> FitBoard:
        if self._progress is None and self._out.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._progress = Progress(*columns, console=self._out, transient=True)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._progress is not None:
                for task in self._tasks.values():
                    self._progress.remove_task(task)
                if self._given is None:
                    self._progress.stop()
            self._tasks.clear()

    def report(self, label: str, done: int, total: int) -> None:
        """One fit's observed updates against its budget."""
        with self._lock:
            now = time.monotonic()
            started = self._started.setdefault(label, now)
            if not self._out.is_terminal or self._progress is None:
                if done < total and now - self._last.get(label, started) >= self._every:
                    self._last[label] = now
                    self._out.print(f"  fit {label}: {done}/{total} updates ({now - started:.0f} s)", highlight=False)
                return
            task = self._tasks.get(label)
            if done >= total:
                if task is not None:
                    self._progress.remove_task(self._tasks.pop(label))
                return
            if task is None:
                self._tasks[label] = self._progress.add_task(f"  fit {label}", total=total, completed=done)
            else:
                self._progress.update(task, completed=done, total=total)


def fit_runner(choice: ExecutorChoice, workers: int, call: str) -> JobRunner:
    """The job runner of a command's fits (the study's, a preparation tool's): local warm workers
    (or Ray tasks) that print in this process's console mode."""
    return JobRunner(
        choice,
        workers,
        call=call,
        initializer=configure_console,
        initargs=(console_verbose(),),
        verbose=console_verbose(),
        warm_imports=FIT_WORKER_IMPORTS,
    )
