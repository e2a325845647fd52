"""What runs inside a Ray worker for a study cell: the try ledger actor and the cell task.

Owns: ``TryLedger`` (a Ray actor each try of a cell reports to before it starts, so a try
whose worker died and that Ray retried is on record) and ``fit_on_worker`` (the populations
arrive through Ray's object store and are written into the task's own temporary directory
on its node, ``fit_recipe`` runs there, and every file of the attempt comes back with its
digest; the directory is removed). Does not own: submitting tasks or publishing what they
return (``remote``).

This module imports nothing heavy at module level, and a task's arguments are plain data (the
recipe as JSON): a worker unpickles them without importing Lightning, so nothing (such as
matplotlib's font cache, which importing Lightning writes) is written before the task has
moved third-party caches into its own directory.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from qhlab.evidence import sha256_bytes
from qhlab.evidence.source import runtime_versions
from qhlab.execution import where_am_i
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.study.family import provide_shipped
from qhlab.training.console import configure_console

__all__ = ["LIBRARY_DIRS", "OWNER_FILE", "TRY_PREFIX", "TryLedger", "fit_on_worker"]

# Each try works in ``<tmp>/qhlab-<cell>-<random>/``, holding ``OWNER_FILE`` (its worker's pid,
# flock-ed by the try while it lives).
TRY_PREFIX = "qhlab-"
OWNER_FILE = "owner.pid"

# Environment variables that move third-party caches and settings into a try's directory.
LIBRARY_DIRS = {
    "MPLCONFIGDIR": "matplotlib",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
}


def _sweep_dead_tries(base: Path) -> None:
    """Remove the directories of earlier tries on this node whose worker is gone.

    A try killed with its worker (SIGKILL, OOM) cannot remove its own directory, which holds a
    copy of TRAIN and validation; the next try on the node does. A try holds an ``flock`` on
    its owner file for its whole life and the kernel drops it when the process dies, so a
    directory is removed only when that lock can be taken: never a live try's (whatever pid
    namespace or host it runs in), never a directory without an owner file.
    """
    for directory in base.glob(f"{TRY_PREFIX}*"):
        if directory.is_symlink() or not directory.is_dir():
            continue
        try:
            fd = os.open(directory / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a try's directory, or one still being created
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its try is alive
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            os.close(fd)


def _own(root: Path) -> int:
    """Hold the lock that marks ``root`` as a live try's; returns the descriptor to close at the end.

    The owner file is locked under a temporary name and renamed into place, so a sweeper never
    sees an owner file that is not yet locked.
    """
    pending = root / f".{OWNER_FILE}.new"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    os.rename(pending, root / OWNER_FILE)
    return fd


class TryLedger:
    """A Ray actor (no CPU) holding every try of every cell: who started it, where, when."""

    def __init__(self) -> None:
        self._tries: dict[str, list[dict]] = {}

    def start(self, cell: str, where: dict) -> int:
        tries = self._tries.setdefault(cell, [])
        tries.append({"try": len(tries) + 1, **where, "started_unix": round(time.time(), 3)})
        return len(tries)

    def tries(self, cell: str) -> list[dict]:
        return list(self._tries.get(cell, []))


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
    _sweep_dead_tries(Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=f"{TRY_PREFIX}{job['cell']}-"))
    owner = _own(root)
    # Libraries' own caches and settings (matplotlib's font cache, W&B's directories) go into
    # this try's directory too: a worker writes nothing outside it.
    saved = {key: os.environ.get(key) for key in LIBRARY_DIRS}
    os.environ.update({key: str(root / "home" / sub) for key, sub in LIBRARY_DIRS.items()})
    try:
        import torch

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
        torch.set_num_threads(job["torch_threads"])

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
                job_type="cell",
                group=job["group"],
                study=job["study"],
                # Receipts name the populations where the driver keeps them; the bytes are the same.
                recorded_populations={"train": Path(job["train_path"]), "validation": Path(job["validation_path"])},
                curve_updates=tuple(job.get("curve_updates", ())),
                expected_structure=job.get("expected_structure"),
            )
        )
        import wandb

        # wandb-core appends to the offline run file after finish(); stop it so the file is whole.
        wandb.teardown()
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
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
        os.close(owner)
