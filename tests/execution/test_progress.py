"""The progress of running jobs, carried from the worker that runs them to the process that shows it."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from qhlab.execution import ExecutorChoice, JobRunner, report_progress, reporting
from qhlab.training.terminal import FitBoard


def _reporting_job(label: str, steps: int) -> bool:
    for done in range(steps + 1):
        report_progress(label, done, steps)
    return reporting()


def _collector() -> tuple[list, object]:
    reports, lock = [], threading.Lock()

    def collect(*report) -> None:
        with lock:
            reports.append(report)

    return reports, collect


def test_pool_workers_report_to_the_driver_and_nothing_without_a_callback() -> None:
    reports, collect = _collector()
    with JobRunner(ExecutorChoice("local", None), 2, call="test") as runner:
        assert runner.run(_reporting_job, [("a", 3), ("b", 2)], on_progress=collect) == [True, True]
        assert sorted(reports) == sorted([("a", d, 3) for d in range(4)] + [("b", d, 2) for d in range(3)])
        assert [r for r in reports if r[0] == "a"] == [("a", d, 3) for d in range(4)]  # in order, per job
        # Without a callback the workers' fits draw their own progress (none is reported).
        assert runner.run(_reporting_job, [("c", 1), ("d", 1)]) == [False, False]


def test_jobs_run_here_report_in_this_process_only_inside_the_run() -> None:
    reports, collect = _collector()
    with JobRunner(ExecutorChoice("local", None), 1, call="test") as runner:
        assert runner.run(_reporting_job, [("a", 1)], on_progress=collect) == [True]
    assert reports == [("a", 0, 1), ("a", 1, 1)] and not reporting()
    report_progress("a", 1, 1)  # no sink: nothing happens
    assert len(reports) == 2


def test_the_fit_board_draws_a_bar_per_running_fit_in_a_terminal() -> None:
    out = Console(file=io.StringIO(), force_terminal=True, width=100)
    with FitBoard(out) as board:
        board.report("baseline-s0", 5, 30)
        board.report("baseline-s1", 10, 30)
        shown = {t.description: (t.completed, t.total) for t in board._progress.tasks}
        assert shown == {"  fit baseline-s0": (5, 30), "  fit baseline-s1": (10, 30)}
        board.report("baseline-s0", 30, 30)  # finished: its bar goes
        assert [t.description for t in board._progress.tasks] == ["  fit baseline-s1"]


def test_the_fit_board_prints_a_line_every_few_seconds_elsewhere() -> None:
    text = io.StringIO()
    out = Console(file=text, force_terminal=False, width=200)
    with FitBoard(out, every=0.0) as board:
        board.report("trial-1", 0, 600)
        board.report("trial-1", 300, 600)
        board.report("trial-1", 600, 600)  # the finished fit's own line says the rest
    lines = text.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("  fit trial-1: 300/600 updates ("), lines
    text.truncate(0)
    with FitBoard(out, every=3600.0) as board:
        board.report("trial-2", 0, 600)
        board.report("trial-2", 300, 600)
    assert text.getvalue() == ""


def test_a_runner_refuses_an_option_that_open_executor_does_not_take_when_it_is_made() -> None:
    import pytest

    with pytest.raises(ValueError, match=r"JobRunner: \['warm_import'\] is not allowed; allowed: .*'warm_imports'"):
        JobRunner(ExecutorChoice("local", None), 2, call="test", warm_import=("numpy",))


def test_an_interrupted_runner_kills_its_workers_instead_of_waiting_for_their_jobs() -> None:
    import time
    from concurrent.futures.process import BrokenProcessPool

    import pytest

    runner = JobRunner(ExecutorChoice("local", None), 2, call="test")
    with pytest.raises(KeyboardInterrupt), runner:
        pool = runner.executor()
        jobs = [pool.submit(time.sleep, 30) for _ in range(4)]
        while not jobs[0].running():
            time.sleep(0.05)
        raise KeyboardInterrupt
    # A runner that waited would have run every job to its end (no exception, not cancelled).
    assert all(job.cancelled() or isinstance(job.exception(timeout=0), BrokenProcessPool) for job in jobs)
    assert any(not job.cancelled() for job in jobs)
