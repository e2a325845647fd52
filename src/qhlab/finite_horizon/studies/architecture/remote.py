"""Broad cells on a Ray cluster: ship each cell's fit to a worker, publish what comes back.

Owns: the worker side (``_fit_on_worker``: the populations arrive through Ray's object store
and are written into the task's own temporary directory on its node, ``fit_recipe`` runs
there, and every file of the attempt comes back with its digest; the directory is removed),
the record of every try of a cell (``_TryLedger``, a Ray actor each try reports to before it
starts, so a try whose worker died and that Ray retried is on record), and the driver side
(``run_cells_on_ray``: one task per pending cell with ``num_cpus`` = the study's torch threads
and ``num_gpus=1`` on a CUDA lane; every returned file re-authenticated against the worker's
receipts in a staging directory before the attempt is published write-once; the cell receipt
written by ``cells.fit_cell``, which adopts the published attempt). Does not own: the fit
(``qhlab.finite_horizon.fit``), the cell rules (``cells``) or connecting to Ray
(``qhlab.execution``).

No filesystem is shared: a worker reads no driver path and writes only below its own
temporary directory. Only the driver publishes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from qhlab.evidence import EvidenceError, RECEIPT_SUFFIX, publish_directory, read_receipt, sha256_bytes
from qhlab.execution import ExecutorChoice, open_executor, where_am_i
from qhlab.finite_horizon.studies.architecture.authentication import FrozenStudy
from qhlab.finite_horizon.studies.architecture.cells import adoptable_attempt, fit_cell
from qhlab.finite_horizon.studies.architecture.layout import CELLS_DIR, cell_name
from qhlab.finite_horizon.studies.architecture.populations import population_files

__all__ = ["RAY_TASK_RETRIES", "run_cells_on_ray"]

# Ray reruns a cell whose worker process or node died this many times (a fit that raises is
# a result, never retried). Each try is a new attempt with its own directory and W&B run.
RAY_TASK_RETRIES = 2
# Files of an attempt that no receipt binds: W&B's own run files and the fit's log. Every
# other returned file must be bound, with the returned bytes, by a receipt of the attempt.
_UNBOUND_ALLOWED = ("wandb/", "fit.log")
# Environment variables that move third-party caches and settings into a try's directory.
_LIBRARY_DIRS = {"MPLCONFIGDIR": "matplotlib", "WANDB_CACHE_DIR": "wandb-cache", "WANDB_CONFIG_DIR": "wandb-config",
                 "WANDB_DATA_DIR": "wandb-data"}


class _TryLedger:
    """A Ray actor (no CPU) holding every try of every cell: who started it, where, when."""

    def __init__(self) -> None:
        self._tries: dict[str, list[dict]] = {}

    def start(self, cell: str, where: dict) -> int:
        tries = self._tries.setdefault(cell, [])
        tries.append({"try": len(tries) + 1, **where, "started_unix": round(time.time(), 3)})
        return len(tries)

    def tries(self, cell: str) -> list[dict]:
        return list(self._tries.get(cell, []))


def _fit_on_worker(job: dict, populations: Any, ledger: Any) -> dict:
    """A Ray task: one broad cell's fit in this node's temporary directory; returns its files.

    Args:
        job: the cell (recipe, lane, threads, W&B group, the driver's population paths).
        populations: object-store reference to ``{"train"|"validation": {file name: bytes}}``.
        ledger: the ``_TryLedger`` actor.

    Returns:
        ``{"attempt", "files": {relative path: bytes}, "sha256": {relative path: hex},
        "where", "try"}``.
    """
    import ray

    # On record first, before the slow imports: a try whose worker dies later is still listed.
    where = where_am_i()
    number = ray.get(ledger.start.remote(job["cell"], where))
    root = Path(tempfile.mkdtemp(prefix=f"qhlab-{job['cell']}-"))
    # Libraries' own caches and settings (matplotlib's font cache, W&B's directories) go into
    # this try's directory too: a worker writes nothing outside it.
    saved = {key: os.environ.get(key) for key in _LIBRARY_DIRS}
    os.environ.update({key: str(root / "home" / sub) for key, sub in _LIBRARY_DIRS.items()})
    try:
        import torch

        from qhlab.finite_horizon.fit import FitRequest, fit_recipe
        from qhlab.training.console import configure_console

        configure_console(job["verbose"])
        local = {}
        for role, files in ray.get(populations).items():
            directory = root / "populations" / role
            directory.mkdir(parents=True)
            for name, data in files.items():
                (directory / name).write_bytes(data)
            local[role] = directory
        torch.set_num_threads(job["torch_threads"])
        result = fit_recipe(FitRequest(
            recipe=job["recipe"], profile=job["profile"], output=root / CELLS_DIR, train=local["train"],
            validation=local["validation"], cell=job["cell"], evaluate=True,
            max_allocated_bytes=job["max_allocated_bytes"], progress=False, job_type="cell", group=job["group"],
            # Receipts name the populations where the driver keeps them; the bytes are the same.
            recorded_populations={"train": Path(job["train_path"]), "validation": Path(job["validation_path"])},
        ))
        import wandb

        # wandb-core appends to the offline run file after finish(); stop it so the file is whole.
        wandb.teardown()
        attempt = Path(result.output_directory)
        files = {p.relative_to(attempt).as_posix(): p.read_bytes()
                 for p in sorted(attempt.rglob("*")) if p.is_file()}
        return {"attempt": attempt.name, "files": files, "sha256": {k: sha256_bytes(v) for k, v in files.items()},
                "where": where, "try": number}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


def _publish_returned(cell_dir: Path, returned: dict) -> Path:
    """Publish a returned attempt write-once, after re-authenticating every file in staging.

    Each file's bytes must match the digest the worker sent, every receipt must authenticate
    with every file it binds (the populations at the driver's paths, the attempt's own files
    in staging), and every file but W&B's run files and the fit log must be bound by a
    receipt of the attempt.
    """
    from qhlab.evidence import safe_component

    name = safe_component(returned["attempt"], field="attempt", call="run_cells_on_ray")
    files: dict[str, bytes] = returned["files"]
    if set(files) != set(returned["sha256"]):
        raise EvidenceError(f"run_cells_on_ray: attempt {name} returned files {sorted(files)} but digests for "
                            f"{sorted(returned['sha256'])}.")

    def _write(staging: Path) -> None:
        for relative, data in files.items():
            target = (staging / relative).resolve()
            if not target.is_relative_to(staging.resolve()) or sha256_bytes(data) != returned["sha256"][relative]:
                raise EvidenceError(f"run_cells_on_ray: returned file {relative!r} of attempt {name} is outside "
                                    "the attempt or does not match its digest.")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        bound: set[str] = set()
        for receipt in sorted(staging.rglob(f"*{RECEIPT_SUFFIX}")):
            document = read_receipt(receipt, kind=None, schema_version=None)
            bound.add(receipt.relative_to(staging).as_posix())
            for section in ("inputs", "outputs"):
                for entry in document[section].values():
                    if not Path(entry["path"]).is_absolute():
                        bound.add((receipt.parent / entry["path"]).relative_to(staging).as_posix())
        loose = sorted(r for r in files if r not in bound and not r.startswith(_UNBOUND_ALLOWED))
        if loose:
            raise EvidenceError(f"run_cells_on_ray: attempt {name} returned files no receipt binds: {loose}.")

    target = cell_dir / name
    cell_dir.mkdir(parents=True, exist_ok=True)
    publish_directory(target, _write)
    return target


def _population_bytes(path: Path) -> dict[str, bytes]:
    """Every file a worker needs to authenticate the population: receipt, manifest, Parquet files."""
    from qhlab.scenes.population import RECEIPT

    files = {**population_files(path), RECEIPT: path / RECEIPT}
    return {name: file.read_bytes() for name, file in files.items()}


def run_cells_on_ray(frozen: FrozenStudy, pending: list[tuple[str, int]], choice: ExecutorChoice, *,
                     validation: Path, verbose: bool, on_result: Callable[[dict], None],
                     on_error: Callable[[str, int, Exception], None]) -> list[Exception]:
    """Run the pending broad cells as Ray tasks; publish each returned attempt and its cell receipt.

    A cell that already has a finished, unrecorded attempt (a driver killed after publishing
    it) is adopted here without a task.

    Args:
        frozen: the authenticated freeze.
        pending: the (arm, seed) cells without a cell receipt.
        choice: the Ray executor (address or a Ray started here).
        validation: the sealed validation population (the development receipt's path).
        verbose: let Ray and the workers print (``--verbose``).
        on_result: called with each cell receipt body as it is published.
        on_error: called with (arm, seed, exception) for a cell that failed.

    Returns:
        The exceptions of failed cells (the other cells still finish).
    """
    import ray

    config = frozen.config
    output = frozen.output
    gpus = 1 if _device_type(config.profile) == "cuda" else 0
    errors: list[Exception] = []

    def _record(arm: str, seed: int, execution: dict | None) -> None:
        body = fit_cell(frozen.config_path, output, variant=arm, seed=seed, progress=False, execution=execution)
        on_result(body)

    with open_executor(choice, config.workers, call="qhlab study run", verbose=verbose) as pool:
        ledger = ray.remote(num_cpus=0)(_TryLedger).remote()
        populations = pool.put({"train": _population_bytes(frozen.train_path),
                                "validation": _population_bytes(validation)})
        futures = {}
        for arm, seed in pending:
            cell = cell_name(arm, seed)
            if adoptable_attempt(output / CELLS_DIR / cell, evaluate=True) is not None:
                _record(arm, seed, None)
                continue
            job = {
                "cell": cell, "recipe": frozen.recipe(arm, seed, config.broad_updates), "profile": config.profile,
                "torch_threads": config.torch_threads, "max_allocated_bytes": config.max_allocated_bytes,
                "group": config.name, "train_path": str(frozen.train_path), "validation_path": str(validation),
                "verbose": verbose,
            }
            future = pool.submit_task(_fit_on_worker, (job, populations, ledger), num_cpus=config.torch_threads,
                                      num_gpus=gpus, max_retries=RAY_TASK_RETRIES, name=f"qhlab-cell-{cell}")
            futures[future] = (arm, seed)
        for future in as_completed(futures):
            arm, seed = futures[future]
            cell = cell_name(arm, seed)
            try:
                returned = future.result()
                tries = ray.get(ledger.tries.remote(cell))
                for entry in tries:
                    entry["outcome"] = ("returned" if entry["try"] == returned["try"]
                                        else "lost: its worker died; Ray ran the task again")
                attempt = _publish_returned(output / CELLS_DIR / cell, returned)
                execution = {**choice.record(), "attempt": attempt.name, "task_retries_allowed": RAY_TASK_RETRIES,
                             "tries": tries, "driver": {k: where_am_i()[k] for k in ("hostname", "pid")}}
                _record(arm, seed, execution)
            except Exception as exc:  # noqa: BLE001 - reported after every other cell finished
                # A worker's exception arrives wrapped with its remote traceback; report the cause.
                cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None else exc
                errors.append(cause)
                on_error(arm, seed, cause)
    return errors


def _device_type(profile: str) -> str:
    from qhlab.training.profiles import execution_profile

    return execution_profile(profile).device_type
