"""What runs inside a Ray worker for a study cell: the cell task.

Owns: ``fit_on_worker`` (the try reports to the ``TryLedger`` first; the populations arrive
through Ray's object store and are written into the try's own directory on its node
(``qhlab.execution.ray_tries.try_directory``), the cell's ``FitJob`` runs there as it runs
anywhere (``run_fit_job``), and every file of the attempt comes back with its digest; the
directory is removed). Does not own: a try's directory
and ledger (``qhlab.execution.ray_tries``), submitting tasks or publishing what they return
(``remote``).

This module imports nothing heavy at module level, and a task's arguments are plain data (the
fit job, whose recipe is a pydantic model): a worker unpickles them without importing Lightning, so nothing (such as
matplotlib's font cache, which importing Lightning writes) is written before the task has
moved third-party caches into its own directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from qhlab.evidence import sha256_bytes
from qhlab.evidence.source import runtime_versions
from qhlab.execution import where_am_i
from qhlab.execution.ray_tries import try_directory
from qhlab.finite_horizon.fit_job import FitJob, run_fit_job
from qhlab.study.family import provide_shipped
from qhlab.training.console import configure_console
from qhlab.training.wandb_attempt import teardown_wandb

__all__ = ["fit_on_worker"]


def fit_on_worker(job: dict, populations: Any, ledger: Any) -> dict:
    """A Ray task: one broad cell's fit in this node's temporary directory; returns its files.

    Args:
        job: ``{"fit": the cell's FitJob (its population paths the driver's), "verbose", "arm_source":
            a user arm's frozen source as bytes or None}``.
        populations: object-store reference to ``{"train"|"validation": {file name: bytes}}``.
        ledger: the ``TryLedger`` actor.

    Returns:
        ``{"attempt", "files": {relative path: bytes}, "sha256": {relative path: hex},
        "where", "try", "versions"}``.
    """
    import ray

    fit: FitJob = job["fit"]
    # On record first, before the slow imports: a try whose worker dies later is still listed.
    where = where_am_i()
    try:
        number = ray.get(ledger.start.remote(fit.cell, where), timeout=60)
    except Exception:  # noqa: BLE001 - a lost ledger loses the record, not the fit
        number = None
    with try_directory(fit.cell) as root:
        configure_console(job["verbose"])
        local = {}
        for role, files in ray.get(populations).items():
            directory = root / "populations" / role
            directory.mkdir(parents=True)
            for name, data in files.items():
                (directory / name).write_bytes(data)
            local[role] = directory

        # Checked against the freeze's digests before it is imported (FrozenSource.check).
        provide_shipped(job.get("arm_source"), root / "family")
        # The job run as anywhere, in this try's own directory; receipts name the populations where
        # the driver keeps them (the bytes are the same).
        attempt, _ = run_fit_job(
            dataclasses.replace(fit, output=str(root / "cells")),
            train=local["train"],
            validation=local["validation"],
            progress=False,
            recorded_populations={"train": Path(fit.train), "validation": Path(fit.validation)},
        )
        # wandb-core appends to the offline run file after finish(); stop it so the file is whole.
        teardown_wandb()
        files = {p.relative_to(attempt).as_posix(): p.read_bytes() for p in sorted(attempt.rglob("*")) if p.is_file()}
        return {
            "attempt": attempt.name,
            "files": files,
            "sha256": {k: sha256_bytes(v) for k, v in files.items()},
            "where": where,
            "try": number,
            "versions": runtime_versions(),
        }
