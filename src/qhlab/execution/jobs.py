"""The one job runner: independent jobs in this process, on a local pool of warm workers, or on Ray.

Owns: ``JobRunner`` (opened at its first use and kept for its life, so that several steps of one
command share its workers; ``run`` hands every job to the executor and every result back, each
job running even when another fails) and ``worker_memo`` (what a worker process keeps across
the jobs it is given, e.g. a study authenticated once). Population labelling, the study's canaries
and cells, tuning trials, pilot fits and E0 draws all run through it. Does not own: what a job
does (a picklable function of its arguments), choosing or connecting an executor
(``executors``) or what a caller prints.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from qhlab.evidence import require_workers
from qhlab.execution.executors import ExecutorChoice, RayExecutor, open_executor
from qhlab.execution.progress import ProgressRelay, prefixed, progress_sink, run_reporting

__all__ = ["JobRunner", "worker_memo"]

# open_executor's options that a runner passes on, checked when the runner is made (it opens later).
_OPTIONS = frozenset(inspect.signature(open_executor).parameters) - {"choice", "workers", "call"}
# What this process keeps for the jobs it runs (a pool worker runs many): key -> value.
_MEMO: dict[Hashable, Any] = {}


def worker_memo(key: Hashable, make: Callable[[], Any]) -> Any:
    """``make()``'s value, made once per process for ``key`` and kept for the later jobs there."""
    if key not in _MEMO:
        _MEMO[key] = make()
    return _MEMO[key]


class JobRunner:
    """Independent jobs on one executor, opened when first used and closed with the runner.

    A local runner with one worker runs every job in this process; with more it forks its
    workers from a server that imported ``warm_imports`` once (``open_executor``). A Ray runner
    submits each job as a task. Results never depend on where a job ran.

    Args:
        choice: local or Ray (``qhlab.execution.ExecutorChoice``).
        workers: local processes (or the CPUs of a Ray started here).
        call: the command named in refusals.
        **options: the rest of ``open_executor``'s options, by name: ``initializer`` and
            ``initargs`` (run in each local worker process, e.g. the console mode), ``verbose``
            (let Ray log and forward worker output), ``warm_imports`` (modules a local worker
            needs before its first job).
    """

    def __init__(self, choice: ExecutorChoice, workers: int, *, call: str, **options: Any) -> None:
        require_workers("JobRunner", "workers", workers, hint="one job per core is the fastest")
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ValueError(
                f"JobRunner: {unknown} is not allowed; allowed: {sorted(_OPTIONS)}. HINT: they are "
                "open_executor's keyword arguments."
            )
        self.choice = choice
        self.workers = workers
        self._options = {"call": call, **options}
        self._stack = contextlib.ExitStack()
        self._executor: concurrent.futures.Executor | None = None
        self._opened = False
        self._relay: ProgressRelay | None = None

    def __enter__(self) -> JobRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        # The exception goes on to the executor: an interrupted or terminated command stops its
        # pool's workers (``open_executor``) instead of waiting for their jobs.
        try:
            self._stack.__exit__(*exc)
        finally:
            self._executor, self._opened, self._relay = None, False, None

    def close(self) -> None:
        """Shut the executor down after its jobs (a local pool's workers finish their job first)."""
        self.__exit__(None, None, None)

    @property
    def kind(self) -> str:
        """``"local"`` or ``"ray"``."""
        return self.choice.kind

    def executor(self) -> concurrent.futures.Executor | None:
        """The opened executor: a process pool, a ``RayExecutor``, or None (this process)."""
        if not self._opened:
            self._executor = self._stack.enter_context(open_executor(self.choice, self.workers, **self._options))
            self._opened = True
        return self._executor

    def ray(self) -> RayExecutor:
        """The Ray executor of a Ray runner (connected at first use)."""
        executor = self.executor()
        if not isinstance(executor, RayExecutor):
            raise ValueError(f"JobRunner.ray: this runner's executor is {self.kind!r}, not ray")
        return executor

    def runs_here(self, jobs: int) -> bool:
        """Whether ``run`` would run ``jobs`` jobs in this process (a local runner of one worker,
        or fewer than two jobs), so that a caller may hand them what this process already holds."""
        return self.kind == "local" and (self.workers == 1 or jobs < 2)

    def run(
        self,
        function: Callable[..., Any],
        jobs: Sequence[tuple],
        *,
        on_result: Callable[[int, Any], None] | None = None,
        on_error: Callable[[int, BaseException], None] | None = None,
        in_order: bool = True,
        on_progress: Callable[[str, int, int], None] | None = None,
        progress_prefixes: Sequence[str] | None = None,
    ) -> list[Any]:
        """``function(*job)`` for every job; the results in job order.

        Every job runs even when one fails; the first failure (in job order) is raised after the
        others finished, so an interrupted step keeps every result it made. A local runner of one
        worker, or one job, runs in this process.

        Args:
            function: a picklable function (a module-level one).
            jobs: the argument tuples.
            on_result: called as ``on_result(index, result)`` for each finished job: in job order
                (``in_order``), else as each finishes.
            on_error: called as ``on_error(index, exception)`` for each failed job, likewise.
            in_order: report in job order (True) or as jobs finish (False).
            on_progress: called as ``on_progress(label, done, total)`` in this process, in a
                thread of its own for a pool, with the progress of each running fit (display
                only). Jobs on Ray report none.
            progress_prefixes: one per job, put before its fits' labels (where the fits of two
                jobs share names, e.g. each E0 draw's canaries); None: none.

        Returns:
            The results, ``results[i]`` of ``jobs[i]``.
        """
        results: list[Any] = [None] * len(jobs)
        errors: dict[int, BaseException] = {}

        def done(index: int, future_or_value: Any, failed: BaseException | None) -> None:
            if failed is not None:
                errors[index] = failed
                if on_error is not None:
                    on_error(index, failed)
                return
            results[index] = future_or_value
            if on_result is not None:
                on_result(index, future_or_value)

        prefixes = list(progress_prefixes) if progress_prefixes is not None else [""] * len(jobs)
        if len(prefixes) != len(jobs):
            raise ValueError(f"JobRunner.run: {len(prefixes)} progress_prefixes for {len(jobs)} jobs")
        if self.runs_here(len(jobs)):
            for index, job in enumerate(jobs):
                try:
                    with progress_sink(prefixed(on_progress, prefixes[index])):
                        value = function(*job)
                except Exception as exc:  # noqa: BLE001 - raised after every other job finished
                    done(index, None, exc)
                else:
                    done(index, value, None)
        else:
            executor = self.executor()
            following = contextlib.nullcontext()
            if on_progress is not None and self.kind == "local" and self._relay is None:
                try:
                    self._relay = ProgressRelay()
                    self._stack.callback(self._relay.close)
                except Exception:  # noqa: BLE001 - display only: without a relay the jobs run unreported
                    on_progress = None
            if on_progress is not None and self._relay is not None:
                following = self._relay.following(on_progress)
                channel = self._relay.channel
                function, jobs = run_reporting, [(channel, p, function, *job) for p, job in zip(prefixes, jobs)]
            with following:
                futures = {executor.submit(function, *job): index for index, job in enumerate(jobs)}
                ordered = sorted(futures, key=futures.get) if in_order else concurrent.futures.as_completed(futures)
                for future in ordered:
                    try:
                        value = future.result()
                    except Exception as exc:  # noqa: BLE001 - raised after every other job finished
                        done(futures[future], None, exc)
                    else:
                        done(futures[future], value, None)
        if errors:
            raise errors[min(errors)]
        return results
