"""Execution: where independent tasks run (a local process pool or a Ray cluster).

Sits just above ``qhlab.evidence`` so that both ``qhlab.scenes`` (label chunks) and the study
(cells) use one seam. Imports nothing else of qhlab; ``ray`` is imported only when chosen.
"""

from qhlab.execution.executors import (
    EXECUTORS,
    FIT_WORKER_IMPORTS,
    ExecutorChoice,
    RayExecutor,
    add_executor_arguments,
    executor_choice,
    open_executor,
    where_am_i,
)

__all__ = ["EXECUTORS", "FIT_WORKER_IMPORTS", "ExecutorChoice", "RayExecutor", "add_executor_arguments",
           "executor_choice", "open_executor", "where_am_i"]
