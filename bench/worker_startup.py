"""Benchmark: what a fit worker process costs to start, bare or forked from a warm server.

A study's fits run on a local process pool. A bare (``spawn``) worker imports what a cell needs
(``qhlab.study.run``: torch, Lightning, W&B and qhlab) before its first fit. With
``FIT_WORKER_IMPORTS`` a pool forks its workers from a ``forkserver`` that imported those once
per process, and a worker is kept for every later fit. This bench times, from the driver, the
first task of a pool that imports a cell worker's modules:

* ``spawn_cold``: a bare spawned worker (a fresh ``spawn`` pool each repeat);
* ``forkserver_start``: the first warm pool of this process (it starts the server, which imports);
* ``forkserver_cold``: a later warm pool (the server is up; the worker is forked);
* ``warm``: a second task on an already running worker.

Prints ONE JSON line with each time (medians of ``--repeats``), ``ratio = forkserver_cold /
spawn_cold`` (what a worker of a later pool costs against a bare one) and ``saved_per_pool_seconds``.
Run: ``python bench/worker_startup.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _import_cell_worker() -> int:
    """What a pool worker runs before its first cell (``qhlab.study.run.cell_job``'s module)."""
    import qhlab.study.run  # noqa: F401 - the import is the measured work

    return os.getpid()


def _first_and_second(warm_imports: tuple[str, ...]) -> tuple[float, float]:
    """Seconds of a fresh pool's first task and of a second task on the same worker."""
    from qhlab.execution import ExecutorChoice, open_executor
    from qhlab.training.console import configure_console

    # workers=2 is the smallest count for which open_executor gives a pool (1 runs in-process);
    # one task is in flight at a time, so one worker process serves both.
    with open_executor(
        ExecutorChoice("local"),
        2,
        call="bench/worker_startup.py",
        initializer=configure_console,
        initargs=(False,),
        warm_imports=warm_imports,
    ) as pool:
        started = time.perf_counter()
        first = pool.submit(_import_cell_worker).result()
        cold = time.perf_counter() - started
        started = time.perf_counter()
        again = pool.submit(_import_cell_worker).result()
        warm = time.perf_counter() - started
    if again != first:
        raise SystemExit(
            "bench/worker_startup.py: the second task ran in another process; its time would not be a warm worker's"
        )
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh pools timed per kind (default 3)")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"bench/worker_startup.py: --repeats={args.repeats!r} is not allowed; allowed: >= 1")
    from qhlab.execution import FIT_WORKER_IMPORTS

    load_before = os.getloadavg()[0]
    spawn = [_first_and_second(())[0] for _ in range(args.repeats)]
    start, warm_first = _first_and_second(FIT_WORKER_IMPORTS)
    later = [_first_and_second(FIT_WORKER_IMPORTS) for _ in range(args.repeats)]
    spawn_cold = statistics.median(spawn)
    forkserver_cold = statistics.median(c for c, _ in later)
    warm = statistics.median([warm_first, *(w for _, w in later)])
    print(
        json.dumps(
            {
                "bench": "worker_startup",
                "spawn_cold_seconds": round(spawn_cold, 3),
                "forkserver_start_seconds": round(start, 3),
                "forkserver_cold_seconds": round(forkserver_cold, 3),
                "warm_seconds": round(warm, 4),
                "ratio": round(forkserver_cold / spawn_cold, 4),
                "saved_per_pool_seconds": round(spawn_cold - forkserver_cold, 2),
                "spawn_runs": [round(c, 3) for c in spawn],
                "warm_imports": list(FIT_WORKER_IMPORTS),
                "repeats": args.repeats,
                "cores": os.cpu_count(),
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
