"""A signal handler for the length of a block: the one place qhlab changes how a signal is taken.

Owns: ``handling(signum, handler)``, used by the command line (SIGTERM unwinds a command) and by
a fit (SIGINT defers to the next update boundary). Does not own: what a handler does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["handling"]


@contextlib.contextmanager
def handling(signum: int, handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` takes ``signum`` inside the block; the previous handler is restored after it.

    Only the main thread can install a handler: in any other (a Ray worker's, a test runner's)
    nothing changes.

    Args:
        signum: the signal (e.g. ``signal.SIGTERM``).
        handler: called as ``handler(signum, frame)`` in the main thread when the signal arrives.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        # None: a handler installed outside Python, which cannot be put back; the default can.
        signal.signal(signum, signal.SIG_DFL if previous is None else previous)
