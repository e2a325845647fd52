"""Progress of running fits, carried from the process a fit runs in to the process that shows it.

Owns: ``report_progress(label, done, total)`` (a fit's progress callback calls it; it does nothing
unless this process has a sink), ``reporting()``, ``progress_sink(sink)`` (a sink for the fits run
inside it, in this process) and ``ProgressRelay`` (a queue that pool workers report into, and a
thread in this process that hands every report to a callback; ``JobRunner.run`` opens one when
asked for progress). Does not own: what a fit reports (``qhlab.training.callbacks``) or how
progress is drawn (the commands).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
from collections.abc import Callable, Iterator
from multiprocessing.managers import SyncManager
from typing import Any

from qhlab.execution.reaper import driver_identity, unix_socket_fits, watch_driver

__all__ = ["ProgressRelay", "prefixed", "progress_sink", "report_progress", "reporting", "run_reporting"]

# A report: (label, observed updates, update budget).
Sink = Callable[[str, int, int], None]
_state: dict[str, Sink | None] = {"sink": None}


def report_progress(label: str, done: int, total: int) -> None:
    """Hand one fit's progress to this process's sink, if it has one (display only: a lost report
    changes nothing)."""
    sink = _state["sink"]
    if sink is not None:
        with contextlib.suppress(Exception):  # a display must never fail a fit
            sink(label, int(done), int(total))


def reporting() -> bool:
    """Whether this process's fits report their progress to a sink (instead of drawing it)."""
    return _state["sink"] is not None


@contextlib.contextmanager
def progress_sink(sink: Sink | None) -> Iterator[None]:
    """Send the progress of the fits run inside this block, in this process, to ``sink`` (None: none)."""
    before = _state["sink"]
    _state["sink"] = sink
    try:
        yield
    finally:
        _state["sink"] = before


def _put(channel: Any, prefix: str) -> Sink:
    def put(label: str, done: int, total: int) -> None:
        channel.put((prefix + label, done, total))

    return put


def run_reporting(channel: Any, prefix: str, function: Callable[..., Any], *job: Any) -> Any:
    """``function(*job)`` in a pool worker, its fits reporting into ``channel`` (a ``ProgressRelay``'s),
    each label after ``prefix`` (which job it is, where the fits of two jobs share names)."""
    with progress_sink(_put(channel, prefix)):
        return function(*job)


def prefixed(sink: Sink | None, prefix: str) -> Sink | None:
    """``sink`` with every label after ``prefix`` (None stays None)."""
    if sink is None or not prefix:
        return sink
    return lambda label, done, total: sink(prefix + label, done, total)


class ProgressRelay:
    """A queue pool workers report into, and a thread here that hands each report to a callback.

    The queue is a manager's, so that it can travel with each job to a worker the pool started
    before the relay existed (``run_reporting``).
    """

    def __init__(self) -> None:
        # A spawned manager: this process may hold torch's threads, which a fork must not copy. It
        # watches this process, so a SIGKILLed driver leaves no manager (nor its resource tracker).
        # Its socket lives under the temporary directory; where that path is too long to bind, on
        # the loopback interface instead (authenticated by the manager's key either way).
        address = None if unix_socket_fits() else ("127.0.0.1", 0)
        self._manager = SyncManager(address=address, ctx=multiprocessing.get_context("spawn"))
        self._manager.start(watch_driver, driver_identity())
        self.channel = self._manager.Queue()

    @contextlib.contextmanager
    def following(self, callback: Sink) -> Iterator[None]:
        """Hand every report to ``callback`` in a thread of this process until the block ends."""
        stop = threading.Event()

        def drain() -> None:
            while True:
                try:
                    item = self.channel.get(timeout=0.2)
                except queue.Empty:
                    if stop.is_set():
                        return
                    continue
                except (EOFError, OSError):
                    return  # the manager is gone
                with contextlib.suppress(Exception):
                    callback(*item)

        thread = threading.Thread(target=drain, name="qhlab-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)

    def close(self) -> None:
        """Stop the manager process."""
        self._manager.shutdown()
