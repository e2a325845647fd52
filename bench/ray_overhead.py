"""Benchmark: labelling the ``bench`` preset on Ray vs on the local process pool, same cores.

Measured in one run on the same machine:

1. ``generate_population("bench", ...)`` with the local executor and ``--workers`` processes.
2. The same call with ``--executor ray --ray-address`` on an existing cluster: a one-node
   ``ray.cluster_utils.Cluster`` with ``num_cpus=--workers`` started here before timing (the
   issue's use case: a cluster is already up), or ``--ray-address``. Connecting the driver,
   starting or reusing Ray's worker processes and shipping every chunk are inside the timed
   call, as the local pool's process start-up is inside the local one. The idle cluster's
   own processes run during the local runs too.

The order alternates over ``--repeats`` pairs (local first, then Ray first, ...) and the
median of each is taken, so a load change on a shared machine does not favour one side.
Every Ray population is compared with the local one file by file (Parquet files, manifest,
population receipt). Prints ONE JSON line: ``ratio = ray_seconds / local_seconds`` (target
<= 1.25 on 2 cores) and ``identical``. Run: ``python bench/ray_overhead.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from qhlab.execution import ExecutorChoice
from qhlab.scenes import generate_population

_IDENTITY = ("scenes.parquet", "states.parquet", "candidates.parquet", "manifest.json", "population.receipt.json")


def _timed(out: Path, workers: int, choice: ExecutorChoice) -> float:
    started = time.perf_counter()
    generate_population("bench", "train", 0, out, workers=workers, executor=choice)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="cores for both executors")
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs (order alternates)")
    parser.add_argument("--ray-address", default=None, help="an existing cluster (default: start Ray here)")
    args = parser.parse_args()
    cluster = None
    if args.ray_address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.workers, "include_dashboard": False})
        import ray

        ray.shutdown()  # Cluster connects this process; the timed calls connect themselves
    ray_choice = ExecutorChoice("ray", args.ray_address or cluster.address)
    local_seconds, ray_seconds, identical = [], [], True
    with tempfile.TemporaryDirectory(prefix="qhlab-bench-ray-") as tmp:
        root = Path(tmp)
        reference = None
        for i in range(args.repeats):
            order = [("local", ExecutorChoice()), ("ray", ray_choice)]
            for name, choice in order if i % 2 == 0 else order[::-1]:
                out = root / f"{name}-{i}"
                seconds = _timed(out, args.workers, choice)
                (local_seconds if name == "local" else ray_seconds).append(seconds)
                if reference is None:
                    reference = out
                identical &= all((out / f).read_bytes() == (reference / f).read_bytes() for f in _IDENTITY)
    if cluster is not None:
        cluster.shutdown()
    local, ray = statistics.median(local_seconds), statistics.median(ray_seconds)
    print(
        json.dumps(
            {
                "bench": "ray_overhead",
                "ratio": round(ray / local, 3),
                "target": "<= 1.25",
                "identical": identical,
                "local_seconds": [round(s, 2) for s in local_seconds],
                "ray_seconds": [round(s, 2) for s in ray_seconds],
                "workers": args.workers,
                "ray_cluster": args.ray_address or "one-node Cluster started before timing",
                "load_average_1min": round(os.getloadavg()[0], 2),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
