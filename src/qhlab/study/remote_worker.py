"""What runs inside a Ray worker for a study cell: the cell task.

Owns: ``fit_on_worker`` (the try reports to the ``TryLedger`` first; the populations arrive
through Ray's object store and are written into the try's own directory on its node
(``qhlab.execution.ray_tries.try_directory``), ``fit_recipe`` runs there, and every file of the
attempt comes back with its digest; the directory is removed). Does not own: a try's directory
and ledger (``qhlab.execution.ray_tries``), submitting tasks or publishing what they return
(``remote``).

This module imports nothing heavy at module level, and a task's arguments are plain data (the
recipe as JSON): a worker unpickles them without importing Lightning, so nothing (such as
matplotlib's font cache, which importing Lightning writes) is written before the task has
moved third-party caches into its own directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.evidence import sha256_bytes
from qhlab.evidence.source import runtime_versions
from qhlab.execution import where_am_i
from qhlab.execution.ray_tries import try_directory
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.study.family import provide_shipped
from qhlab.training.console import configure_console
from qhlab.training.wandb_attempt import teardown_wandb

__all__ = ["fit_on_worker"]


def fit_on_worker(job: dict, populations: Any, ledger: Any) -> dict:
    """A Ray task: one broad cell's fit in this node's temporary directory; returns its files.

    Args:
        job: the cell (recipe, lane, threads, W&B group, the driver's population paths, a user
            arm's frozen source as bytes or None).
        populations: object-store reference to ``{"train"|"validation": {file name: bytes}}``.
        ledger: the ``TryLedger`` actor.

    Returns:
        ``{"attempt", "files": {relative path: bytes}, "sha256": {relative path: hex},
        "where", "try", "versions"}``.
    """
    import ray

    # On record first, before the slow imports: a try whose worker dies later is still listed.
    where = where_am_i()
    try:
        number = ray.get(ledger.start.remote(job["cell"], where), timeout=60)
    except Exception:  # noqa: BLE001 - a lost ledger loses the record, not the fit
        number = None
    with try_directory(job["cell"]) as root:
        # Lazy: keeps importing this module free of torch.
        from qhlab.finite_horizon.fit import FitRequest, fit_recipe

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
        result = fit_recipe(
            FitRequest(
                recipe=QhRecipe.model_validate(job["recipe"]),
                profile=job["profile"],
                output=root / "cells",
                train=local["train"],
                validation=local["validation"],
                cell=job["cell"],
                evaluate=True,
                max_allocated_bytes=job["max_allocated_bytes"],
                progress=False,
                torch_threads=job["torch_threads"],
                job_type="cell",
                group=job["group"],
                study=job["study"],
                # Receipts name the populations where the driver keeps them; the bytes are the same.
                recorded_populations={"train": Path(job["train_path"]), "validation": Path(job["validation_path"])},
                curve_updates=tuple(job.get("curve_updates", ())),
                expected_structure=job.get("expected_structure"),
            )
        )
        # wandb-core appends to the offline run file after finish(); stop it so the file is whole.
        teardown_wandb()
        attempt = Path(result.output_directory)
        files = {p.relative_to(attempt).as_posix(): p.read_bytes() for p in sorted(attempt.rglob("*")) if p.is_file()}
        return {
            "attempt": attempt.name,
            "files": files,
            "sha256": {k: sha256_bytes(v) for k, v in files.items()},
            "where": where,
            "try": number,
            "versions": runtime_versions(),
        }
