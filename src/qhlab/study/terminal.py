"""What the study shows on a terminal: the rich console and its progress bars.

Owns: the console the study command prints to, the population-generation bar (fed by
``qhlab.scenes.cached_population``'s ``progress(done, planned)``) and the broad-fits bar of
``qhlab study run``. Does not own: what is printed (``command``) or any step's behaviour;
nothing here changes a file or a number. Lightning draws the bar inside a fit.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GenerationProgress", "console", "fits_progress"]


def console() -> Any:
    """The rich console of the study command (stdout, no highlighting)."""
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def fits_progress(out: Any) -> Any:
    """A rich ``Progress`` for the broad fits of ``qhlab study run``, printing to ``out``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]broad fits"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
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
