"""Execution: where independent jobs run (this process, a local pool of warm workers, or Ray).

Sits just above ``qhlab.evidence`` so that population labelling, the study's canaries and
cells and the preparation tools' fits use one seam: ``executors`` (choosing and opening an
executor), ``jobs`` (``JobRunner``, the one job runner, and ``worker_memo``), ``progress``
(the progress of running fits, carried to the process that shows it) and ``ray_tries`` (a Ray
try's own directory on its node, and the ledger of every try). Imports nothing
else of qhlab; ``ray`` is imported only when chosen.
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
from qhlab.execution.jobs import JobRunner, worker_memo
from qhlab.execution.progress import progress_sink, report_progress, reporting

__all__ = [
    "EXECUTORS",
    "FIT_WORKER_IMPORTS",
    "ExecutorChoice",
    "JobRunner",
    "RayExecutor",
    "add_executor_arguments",
    "executor_choice",
    "open_executor",
    "progress_sink",
    "report_progress",
    "reporting",
    "where_am_i",
    "worker_memo",
]
