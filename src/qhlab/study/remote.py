"""Broad cells on a Ray cluster: ship each cell's fit to a worker, publish what comes back.

Owns: the driver side (``run_cells_on_ray``: one task per pending cell (``remote_worker``'s
``fit_on_worker``) with ``num_cpus`` = the study's torch threads and ``num_gpus=1`` on a CUDA
lane, a user arm's frozen source shipped with its task; the record of every try of a cell in a
``TryLedger``; every returned file re-authenticated against the worker's receipts in a staging
directory before the attempt is published write-once; the cell receipt written by
``cells.fit_cell``, which adopts the published attempt) and ``check_cells_feasible``. Does not
own: the fit (``qhlab.finite_horizon.fit``), the cell rules (``cells``), connecting to Ray, a
try's directory on its node or the try ledger (``qhlab.execution``, beside the job runner).

No filesystem is shared: a worker reads no driver path and writes only below its own
temporary directory. Only the driver publishes.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from collections.abc import Callable
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from qhlab.evidence import (
    RECEIPT_SUFFIX,
    EvidenceError,
    LockHeldError,
    QhError,
    exclusive_lock,
    input_error,
    publish_directory,
    read_receipt,
    safe_component,
    sha256_bytes,
)
from qhlab.evidence.envelope import Receipt
from qhlab.evidence.layout import CELL_RECEIPT, CELLS_DIR, EVALUATION_RECEIPT, cell_name
from qhlab.evidence.layout import POPULATION_RECEIPT as RECEIPT
from qhlab.execution import JobRunner, where_am_i
from qhlab.execution.ray_tries import TryLedger
from qhlab.finite_horizon.fit import default_logical_run_id
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.study.authentication import FrozenStudy, authenticate_attempt
from qhlab.study.cells import adoptable_attempt, cell_fit_job, fit_cell
from qhlab.study.family import family_bytes
from qhlab.study.populations import population_files
from qhlab.study.remote_worker import fit_on_worker
from qhlab.training.profiles import execution_profile
from qhlab.training.records import ColdInitializationReceipt, FitReceipt, SegmentCheckpointReceipt, WandbAttemptReceipt
from qhlab.training.wandb_attempt import writer_lock_path

__all__ = ["RAY_TASK_RETRIES", "check_cells_feasible", "run_cells_on_ray"]

# Ray reruns a cell whose worker process or node died this many times (a fit that raises is
# a result, never retried). Each try is a new attempt with its own directory and W&B run.
RAY_TASK_RETRIES = 2


def _publish_returned(
    frozen: FrozenStudy,
    cell: str,
    recipe: Any,
    cell_dir: Path,
    returned: dict,
    populations: dict[str, Path],
    validation_digest: str,
) -> Path:
    """Publish a returned attempt write-once, after re-authenticating every file in staging.

    Refused (nothing published) unless: every file name is a clean relative path (no ``.``,
    ``..``, empty or absolute parts, no name that is a folder of another or equal to another
    but for case) whose bytes match the digest sent with it; every receipt is one a fit writes
    (by name and kind) and authenticates with every file it binds, a relative binding inside
    the attempt and an absolute one only ``train_manifest`` -> the driver's TRAIN manifest or
    ``validation_manifest`` -> the sealed validation manifest (paths are checked before any
    bound file is read); every other file is the fit log or a W&B run file; the fit
    authenticates as this frozen cell's (``authenticate_attempt``: cell, arm, seed, lane,
    recipe, TRAIN, source package, budget) and the attempt's name is its recorded
    ``local_attempt_id``; the evaluation is of the sealed validation and of the final state;
    the worker ran the frozen package versions; and the fit receipt names the node, process
    and task the try reported. The last two compare what one worker says with what it wrote:
    they catch a misconfigured worker, not a forging one (receipts are not signed per worker).
    """
    call = "run_cells_on_ray"
    name = safe_component(returned["attempt"], field="attempt", call=call)
    files: dict[str, bytes] = returned["files"]
    if set(files) != set(returned["sha256"]):
        raise EvidenceError(
            f"{call}: attempt {name} returned files {sorted(files)} but digests for {sorted(returned['sha256'])}."
        )
    _check_names(call, name, list(files))
    _check_versions(call, frozen, returned)
    allowed_absolute = {
        "train_manifest": (populations["train"] / "manifest.json").as_posix(),
        "validation_manifest": (populations["validation"] / "manifest.json").as_posix(),
    }

    def _write(staging: Path) -> None:
        _stage_files(call, name, returned, staging)
        bound = _bound_files(call, name, files, staging, allowed_absolute)
        loose = sorted(r for r in files if r not in bound and r != "fit.log" and r.split("/")[0] != "wandb")
        if loose:
            raise EvidenceError(f"{call}: attempt {name} returned files no receipt binds: {loose}.")
        fit = authenticate_attempt(frozen, staging, cell=cell, recipe=recipe, step=call).body
        if fit.local_attempt_id != name:
            raise EvidenceError(
                f"{call}: attempt {name!r} holds the fit of local attempt "
                f"{fit.local_attempt_id!r}; an attempt directory is named by its fit."
            )
        _check_evaluation(call, name, files, staging, fit, validation_digest)
        _check_where(call, name, fit, returned)

    target = cell_dir / name
    cell_dir.mkdir(parents=True, exist_ok=True)
    publish_directory(target, _write)
    return target


def _check_versions(call: str, frozen: FrozenStudy, returned: dict) -> None:
    """Refuse an attempt whose worker ran other package versions than the frozen ones."""
    for package, version in frozen.body.versions.items():
        if (returned.get("versions") or {}).get(package) != version:
            raise input_error(
                call,
                f"versions.{package}",
                (returned.get("versions") or {}).get(package),
                f"{version!r}, the frozen version",
                f"the worker on {returned['where'].get('node_ip')} "
                "runs another environment; install the frozen versions on every node",
                error=EvidenceError,
            )


def _stage_files(call: str, name: str, returned: dict, staging: Path) -> None:
    """Write every returned file into ``staging``, each after its bytes match its digest."""
    for relative, data in returned["files"].items():
        if sha256_bytes(data) != returned["sha256"][relative]:
            raise EvidenceError(f"{call}: returned file {relative!r} of attempt {name} does not match its digest.")
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _bound_files(
    call: str, name: str, files: dict[str, bytes], staging: Path, allowed_absolute: dict[str, str]
) -> set[str]:
    """The staged files some receipt binds (the receipts included), each receipt authenticated."""
    bound: set[str] = set()
    for relative in sorted(r for r in files if r.endswith(RECEIPT_SUFFIX)):
        kind = _receipt_kind(relative)
        if kind is None:
            raise EvidenceError(f"{call}: attempt {name} returned {relative!r}, which is not a receipt a fit writes.")
        # Paths first, without reading what they name; then the receipt with every file it binds.
        document = read_receipt(staging / relative, kind, verify_files=False)
        bound.add(relative)
        bound |= _receipt_bindings(call, name, relative, document, allowed_absolute)
        read_receipt(staging / relative, kind)
    return bound


def _receipt_bindings(call: str, name: str, relative: str, document: Any, allowed_absolute: dict[str, str]) -> set[str]:
    """The attempt-relative names a returned receipt binds; refused if one is outside the attempt
    or an absolute path other than an allowed population manifest."""
    bound: set[str] = set()
    for section in ("inputs", "outputs"):
        for key, entry in getattr(document, section).items():
            path = entry.path
            if Path(path).is_absolute() or "\\" in path:
                if section != "inputs" or allowed_absolute.get(key) != path:
                    raise EvidenceError(
                        f"{call}: {relative} of attempt {name} binds {key}={path}; a returned "
                        f"receipt may bind by absolute path only {allowed_absolute}."
                    )
                continue
            inner = _clean_relative(path, relative)
            if inner is None:
                raise EvidenceError(f"{call}: {relative} of attempt {name} binds {path!r}, outside the attempt.")
            bound.add(inner)
    return bound


def _check_evaluation(
    call: str, name: str, files: dict[str, bytes], staging: Path, fit: Any, validation_digest: str
) -> None:
    """Refuse an attempt without an evaluation of the sealed validation and of its fit's final state."""
    if EVALUATION_RECEIPT not in files:
        raise EvidenceError(f"{call}: attempt {name} returned no {EVALUATION_RECEIPT}; a broad cell is evaluated.")
    evaluation = read_receipt(staging / EVALUATION_RECEIPT, EvaluationReceipt).body
    if (
        evaluation.population.get("digest") != validation_digest
        or evaluation.final_state_sha256 != fit.final_state_sha256
    ):
        raise EvidenceError(
            f"{call}: {EVALUATION_RECEIPT} of attempt {name} is not of the sealed validation "
            f"{validation_digest} and this attempt's final state."
        )


def _check_where(call: str, name: str, fit: Any, returned: dict) -> None:
    """Refuse an attempt whose fit receipt names another node, process or task than its try reported."""
    ran = fit.execution
    said = returned["where"]
    keys = ("node_id", "pid", "task_id")
    if [ran.get(k) for k in keys] != [said.get(k) for k in keys]:
        raise EvidenceError(
            f"{call}: the fit receipt of attempt {name} says it ran as "
            f"{ {k: ran.get(k) for k in keys} }; its try reported { {k: said.get(k) for k in keys} }."
        )


def _check_names(call: str, attempt: str, names: list[str]) -> None:
    """Refuse a returned file name that is not a clean relative path inside the attempt."""
    if attempt == CELL_RECEIPT or attempt.startswith("."):
        raise EvidenceError(f"{call}: attempt name {attempt!r} is reserved in a cell directory.")
    seen: dict[str, str] = {}
    folders: set[str] = set()
    for relative in names:
        parts = relative.split("/")
        if not relative or any(part in ("", ".", "..") or "\\" in part or "\0" in part for part in parts):
            raise EvidenceError(
                f"{call}: returned file name {relative!r} of attempt {attempt} is not a clean relative "
                "path inside the attempt."
            )
        folded = unicodedata.normalize("NFC", relative).casefold()
        if folded in seen:
            raise EvidenceError(
                f"{call}: returned files {seen[folded]!r} and {relative!r} of attempt {attempt} "
                "differ only by case or normalisation."
            )
        seen[folded] = relative
        folders.update("/".join(parts[:i]).casefold() for i in range(1, len(parts)))
    clash = sorted(n for n in seen if n in folders)
    if clash:
        raise EvidenceError(
            f"{call}: returned file names {clash} of attempt {attempt} are also folders of other files."
        )


def _clean_relative(path: str, receipt: str) -> str | None:
    """The attempt-relative name a receipt's relative binding points at; None if it leaves the attempt."""
    parts: list[str] = receipt.split("/")[:-1]
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts) or None


_RECEIPT_KINDS: dict[str, type[Receipt]] = {
    "fit.receipt.json": FitReceipt,
    "evaluation.receipt.json": EvaluationReceipt,
    "cold_init.receipt.json": ColdInitializationReceipt,
    "wandb_attempt.receipt.json": WandbAttemptReceipt,
}


def _receipt_kind(relative: str) -> type[Receipt] | None:
    """The kind a fit's receipt of this name has; None for any other name (or a sub-directory)."""
    if relative in _RECEIPT_KINDS:
        return _RECEIPT_KINDS[relative]
    return SegmentCheckpointReceipt if re.fullmatch(r"segment_checkpoint_u\d{8}\.receipt\.json", relative) else None


def _population_bytes(path: Path) -> dict[str, bytes]:
    """Every file a worker needs to authenticate the population: receipt, manifest, Parquet files."""
    files = {**population_files(path), RECEIPT: path / RECEIPT}
    return {name: file.read_bytes() for name, file in files.items()}


def run_cells_on_ray(
    frozen: FrozenStudy,
    pending: list[tuple[str, int]],
    runner: JobRunner,
    *,
    validation: Path,
    validation_digest: str,
    verbose: bool,
    on_result: Callable[[dict], None],
    on_error: Callable[[str, int, Exception], None],
) -> list[Exception]:
    """Run the pending broad cells as Ray tasks; publish each returned attempt and its cell receipt.

    A cell that already has a finished, unrecorded attempt (a driver killed after publishing
    it) is adopted here without a task.

    Args:
        frozen: the authenticated freeze.
        pending: the (arm, seed) cells without a cell receipt.
        runner: the study run's job runner (a Ray runner: its cluster is connected once).
        validation: the sealed validation population (the development receipt's path).
        validation_digest: its manifest digest (the development receipt's).
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
    locks: dict[str, contextlib.ExitStack] = {}

    def _record(arm: str, seed: int, execution: dict | None) -> None:
        body = fit_cell(frozen, variant=arm, seed=seed, progress=False, execution=execution)
        on_result(body)

    pool = runner.ray()
    with contextlib.ExitStack() as held:
        held.callback(lambda: [stack.close() for stack in locks.values()])
        check_cells_feasible(config)
        ledger = _start_ledger(ray)
        populations = _put_populations(pool, frozen.train_path, validation)
        futures = {}
        for arm, seed in pending:
            cell = cell_name(arm, seed)
            if adoptable_attempt(output / CELLS_DIR / cell, evaluate=True) is not None:
                try:  # published by a driver that was killed before its cell receipt
                    _record(arm, seed, None)
                except Exception as exc:  # noqa: BLE001 - reported like any failed cell
                    errors.append(exc)
                    on_error(arm, seed, exc)
                continue
            job = _cell_job(frozen, arm, seed, cell, validation=validation, verbose=verbose)
            try:
                stack = _writer_lock(output, cell)
            except LockHeldError as exc:  # another writer has this cell; the other cells still run
                errors.append(exc)
                on_error(arm, seed, exc)
                continue
            locks[cell] = stack
            futures[_submit_cell(pool, cell, job, populations, ledger, config.torch_threads, gpus)] = (arm, seed)
        for future in as_completed(futures):
            arm, seed = futures[future]
            cell = cell_name(arm, seed)
            try:
                returned = future.result()
                execution = _published_execution(
                    frozen, runner, ledger, cell, arm, seed, returned, validation, validation_digest
                )
                _record(arm, seed, execution)
            except Exception as exc:  # noqa: BLE001 - reported after every other cell finished
                cause = _cause(exc, cell, ledger)
                errors.append(cause)
                on_error(arm, seed, cause)
            finally:
                locks.pop(cell).close()
    return errors


def _start_ledger(ray: Any) -> Any:
    """A new ``TryLedger`` actor's handle, on the driver's node (``ray``: the module, imported by the caller)."""
    # On the driver's node: the ledger outlives any worker node that dies.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return (
        ray.remote(num_cpus=0)(TryLedger)
        .options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        )
        .remote()
    )


def _cell_job(frozen: FrozenStudy, arm: str, seed: int, cell: str, *, validation: Path, verbose: bool) -> dict:
    """The task ``fit_on_worker`` runs for one cell: its fit job, and what the worker needs besides
    the populations (which travel through the object store)."""
    return {
        "fit": cell_fit_job(
            frozen,
            frozen.recipe(arm, seed, frozen.config.broad_updates),
            frozen.output / CELLS_DIR / cell,
            validation=validation,
        ),
        "verbose": verbose,
        # A user arm's frozen source travels with its task (the worker shares no files).
        "arm_source": family_bytes(frozen.body, frozen.output, arm),
    }


def _put_populations(pool: Any, train: Path, validation: Path) -> Any:
    """The object-store reference of the TRAIN and validation populations' files (each worker authenticates them)."""
    return pool.put({"train": _population_bytes(train), "validation": _population_bytes(validation)})


def _submit_cell(pool: Any, cell: str, job: dict, populations: Any, ledger: Any, threads: int, gpus: int) -> Any:
    """The future of the cell's Ray task: ``fit_on_worker`` on ``threads`` CPUs (and ``gpus`` GPUs)."""
    return pool.submit_task(
        fit_on_worker,
        (job, populations, ledger),
        num_cpus=threads,
        num_gpus=gpus,
        max_retries=RAY_TASK_RETRIES,
        name=f"qhlab-cell-{cell}",
    )


def _writer_lock(output: Path, cell: str) -> contextlib.ExitStack:
    """A stack holding the cell's logical-run writer lock; ``LockHeldError`` if another writer holds it."""
    # The driver holds it while the cell's task runs: `qhlab study status` shows the cell running,
    # and a local fit of the same cell is refused meanwhile.
    stack = contextlib.ExitStack()
    stack.enter_context(exclusive_lock(writer_lock_path(output / CELLS_DIR, default_logical_run_id(cell))))
    return stack


def _published_execution(
    frozen: FrozenStudy,
    runner: JobRunner,
    ledger: Any,
    cell: str,
    arm: str,
    seed: int,
    returned: dict,
    validation: Path,
    validation_digest: str,
) -> dict:
    """Publish a cell's returned attempt; the execution record its cell receipt carries."""
    tries = _tries(ledger, cell, returned)
    attempt = _publish_returned(
        frozen,
        cell,
        frozen.recipe(arm, seed, frozen.config.broad_updates),
        frozen.output / CELLS_DIR / cell,
        returned,
        {"train": frozen.train_path, "validation": validation},
        validation_digest,
    )
    return {
        **runner.choice.record(),
        "attempt": attempt.name,
        "task_retries_allowed": RAY_TASK_RETRIES,
        "tries": tries,
        "driver": {k: where_am_i()[k] for k in ("hostname", "pid")},
    }


def _tries(ledger: Any, cell: str, returned: dict) -> list[dict]:
    """Every try of ``cell`` with its outcome; the returned try alone if the ledger is lost."""
    import ray

    try:
        tries = ray.get(ledger.tries.remote(cell), timeout=30)
    except Exception:  # noqa: BLE001 - a lost ledger loses the record of lost tries, not the fit
        tries = []
    if not any(t["try"] == returned["try"] for t in tries):
        tries.append({"try": returned["try"], **returned["where"], "ledger": "unavailable"})
    for entry in tries:
        entry["outcome"] = (
            "returned" if entry["try"] == returned["try"] else "lost: its worker died; Ray ran the task again"
        )
    return tries


def _cause(exc: Exception, cell: str, ledger: Any) -> Exception:
    """What to report for a failed cell: a fit's own exception (unwrapped from Ray's remote
    traceback), or one clear error when every try of the cell lost its worker."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError):
        return exc.cause if exc.cause is not None else exc
    if isinstance(exc, ray.exceptions.RayError):
        try:
            tries = ray.get(ledger.tries.remote(cell), timeout=30)
        except Exception:  # noqa: BLE001 - the ledger's node may be what died
            tries = []
        where = (
            "; ".join(f"try {t['try']} on node {t.get('node_ip')} pid {t.get('pid')}" for t in tries)
            or "no try on record"
        )
        return QhError(
            f"run_cells_on_ray: cell {cell} was lost: {type(exc).__name__} (Ray allows {RAY_TASK_RETRIES} retries; "
            f"{len(tries)} tr{'y' if len(tries) == 1 else 'ies'} on record: {where}). HINT: nothing of it was "
            "published; check the cluster's nodes, then rerun `qhlab study run` "
            "(finished cells are not rerun)."
        )
    return exc


def check_cells_feasible(config: Any, call: str = "qhlab study run") -> None:
    """Refuse when no live node of the connected Ray cluster can ever run a cell of ``config``
    (Ray would wait forever): fewer CPUs than ``torch_threads``, or no GPU for a CUDA lane.

    Raises:
        QhInputError: naming ``torch_threads`` or ``profile``.
    """
    import ray

    threads, profile = config.torch_threads, config.profile
    gpus = 1 if _device_type(profile) == "cuda" else 0
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        raise QhError(f"{call}: the Ray cluster has no live node. HINT: check `ray status` on the head node.")
    lane_nodes = [n for n in nodes if n.get("GPU", 0) >= gpus]
    if not lane_nodes:
        raise input_error(
            call,
            "profile",
            profile,
            "a lane the cluster can run (no live node has a GPU)",
            "add a GPU node (`ray start --num-gpus 1 ...`) or run the study where its lane exists",
        )
    most_cpus = max(n.get("CPU", 0) for n in lane_nodes)
    if most_cpus < threads:
        where = " with a GPU" if gpus else ""
        raise input_error(
            call,
            "torch_threads",
            threads,
            f"at most {most_cpus:g}, the most CPUs of one live node{where} of the Ray cluster",
            "a cell is one Ray task that needs torch_threads CPUs on one node; add a node with "
            "that many CPUs (torch_threads is frozen: it sets the bits of every fit)",
        )


def _device_type(profile: str) -> str:
    return execution_profile(profile).device_type
