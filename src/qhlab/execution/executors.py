"""The executor seam: where independent work (label chunks, study cells) runs.

Owns: ``ExecutorChoice`` (``local`` or ``ray`` and a Ray address), its validation and the
``--executor``/``--ray-address`` options every command that fans out work shares,
connecting to a Ray cluster (``--ray-address``, else ``RAY_ADDRESS``, else a Ray started for
this process), ``open_executor`` (a ``concurrent.futures.Executor`` over a local process pool
or over Ray tasks), and ``where_am_i`` (the node record a task puts in its evidence). Does
not own: what runs (``qhlab.scenes.labels``, the study's cells) or what is published: a task
only returns values; its caller publishes.

The executor is execution, not science: labels and final states do not depend on it (the
tests compare bytes), so it is never part of a study's decision inputs, and receipts only
record which executor ran a step and on which nodes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from qhlab.evidence import input_error
from qhlab.execution.reaper import driver_identity, start_reaper, unix_socket_fits, watch_driver

__all__ = [
    "EXECUTORS",
    "FIT_WORKER_IMPORTS",
    "ExecutorChoice",
    "RayExecutor",
    "add_executor_arguments",
    "executor_choice",
    "open_executor",
    "where_am_i",
]

EXECUTORS = ("local", "ray")
_HINT = (
    "start a cluster with `ray start --head` and pass the address it prints (HOST:6379), set RAY_ADDRESS, "
    "or omit --ray-address to start a Ray on this machine"
)
# Long enough for a cluster across a data centre, short enough that a typo fails at once
# (ray.init itself retries an unreachable GCS for minutes).
_CONNECT_TIMEOUT_S = 5.0
_GCS_PROBE_TIMEOUT_S = 20.0
# Run in a child process so that a hung GCS client can be killed; prints the cluster id.
_GCS_PROBE = (
    "import sys\nfrom ray._raylet import GcsClient\nclient = GcsClient(address=sys.argv[1])\n"
    "client.internal_kv_get(b'qhlab-probe', None)\nprint(client.cluster_id)\n"
)


@dataclasses.dataclass(frozen=True)
class ExecutorChoice:
    """Where independent tasks run.

    Attributes:
        kind: ``"local"`` (a process pool on this machine, the default) or ``"ray"``.
        ray_address: ``HOST:PORT`` of a running Ray cluster's GCS; None means ``RAY_ADDRESS``
            if set, else a Ray started for this process. Only with ``kind="ray"``.
    """

    kind: str = "local"
    ray_address: str | None = None

    def record(self) -> dict:
        """The choice as receipts record it (the resolved address, never a secret)."""
        return {"executor": self.kind, "ray_address": self.resolved_address()}

    def resolved_address(self) -> str | None:
        """The address Ray connects to: the explicit one, else ``RAY_ADDRESS``, else None."""
        if self.kind != "ray":
            return None
        return self.ray_address or os.environ.get("RAY_ADDRESS") or None


def add_executor_arguments(parser: argparse.ArgumentParser, *, what: str, default_help: str = "local") -> None:
    """Add ``--executor {local,ray}`` and ``--ray-address HOST:PORT`` to ``parser``.

    Args:
        parser: the command's parser.
        what: what runs on the executor (for the help text).
        default_help: what happens when ``--executor`` is not given.
    """
    parser.add_argument(
        "--executor",
        default=None,
        metavar="{" + ",".join(EXECUTORS) + "}",
        help=f"where {what} run (default: {default_help}); results do not depend on it",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="a running Ray cluster (`ray start --head` prints it); default RAY_ADDRESS, "
        "else a Ray started on this machine",
    )


def executor_choice(
    kind: str | None,
    ray_address: str | None,
    *,
    call: str,
    field: str = "--executor",
    address_field: str = "--ray-address",
) -> ExecutorChoice:
    """Validate an executor choice (form only; ``open_executor`` checks that the cluster answers).

    Args:
        kind: ``"local"``, ``"ray"`` or None (``"ray"`` when ``ray_address`` is given, else local).
        ray_address: ``HOST:PORT`` or None.
        call: the command refusing (e.g. ``"qhlab scenes generate"``).
        field, address_field: the names of the two settings in the caller's vocabulary (the
            CLI's options, or a config's fields).

    Raises:
        QhInputError: an unknown executor, an address without ``ray``, or a malformed address
            (``RAY_ADDRESS`` is checked when Ray is connected, not here).
    """
    if kind is None:
        kind = "ray" if ray_address is not None else "local"  # an address can only mean a Ray cluster
    if kind not in EXECUTORS:
        raise input_error(call, field, kind, " or ".join(EXECUTORS), "the local process pool is the default")
    if ray_address is not None:
        if kind != "ray":
            raise input_error(
                call, address_field, ray_address, f"only with {field} ray", f"set {field} ray, or drop {address_field}"
            )
        _split_address(ray_address, call, address_field)
    # RAY_ADDRESS is read, and checked, only when a Ray is actually connected (open_executor):
    # a config or a local run never depends on this process's environment.
    return ExecutorChoice(kind, ray_address)


def _split_address(address: Any, call: str, field: str = "--ray-address") -> tuple[str, int]:
    """``(host, port)`` of a ``HOST:PORT`` address, or one clear refusal."""
    allowed = "HOST:PORT of a running Ray cluster (e.g. 10.0.0.5:6379)"
    if not isinstance(address, str) or address.startswith("ray://"):
        raise input_error(
            call,
            field,
            address,
            allowed,
            "qhlab connects to the cluster's GCS as a driver; Ray Client (ray://) is not supported. " + _HINT,
        )
    host, sep, port = address.rpartition(":")
    # An IPv6 host must be bracketed ([::1]:6379): "fe80::1" would otherwise read as host
    # "fe80:" and port 1.
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host and not bracketed):
        raise input_error(call, field, address, allowed + "; an IPv6 host in brackets ([::1]:6379)", _HINT)
    return host[1:-1] if bracketed else host, int(port)


def _check_reachable(address: str, call: str, field: str) -> None:
    """Refuse an address where no Ray GCS answers, before ``ray.init`` waits minutes for it.

    Two bounded probes: a TCP connection (a closed port fails at once), then one GCS request
    from a child process that is killed after ``_GCS_PROBE_TIMEOUT_S`` (a server that answers
    TCP but is not a Ray GCS, e.g. the dashboard's port, never answers it).
    """
    host, port = _split_address(address, call, field)
    try:
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise input_error(
            call,
            field,
            address,
            "the address of a running Ray cluster",
            f"nothing answered there within {_CONNECT_TIMEOUT_S:.0f} s ({exc.strerror or exc}); " + _HINT,
        ) from None
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _GCS_PROBE, address],
            capture_output=True,
            text=True,
            timeout=_GCS_PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise input_error(
            call,
            field,
            address,
            "the address of a running Ray cluster's GCS",
            "a server answers there, but not as a Ray GCS (no cluster id within "
            f"{_GCS_PROBE_TIMEOUT_S:.0f} s); the GCS port is the one `ray start --head` prints "
            "(6379 by default), not the dashboard's (8265). " + _HINT,
        ) from None
    except OSError as exc:
        raise input_error(
            call,
            field,
            address,
            "an address this process can probe",
            f"the GCS probe could not start ({exc}); " + _HINT,
        ) from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise input_error(
            call,
            field,
            address,
            "the address of a running Ray cluster's GCS",
            f"the GCS request failed ({last}). " + _HINT,
        )


def where_am_i() -> dict:
    """The node and process running the caller: a Ray task's node id and IP, or this host.

    Returns:
        ``{"executor", "hostname", "pid"}`` plus ``"node_id"``, ``"node_ip"`` and ``"task_id"``
        inside a Ray worker.
    """
    record = {"executor": "local", "hostname": socket.gethostname(), "pid": os.getpid()}
    # A Ray worker has imported ray before it runs a task; a process that has not is no Ray
    # worker, and importing ray here would cost every local fit a third of a second.
    ray = sys.modules.get("ray")
    if ray is None:
        return record
    if ray.is_initialized():
        context = ray.get_runtime_context()
        if context.worker.mode == ray.WORKER_MODE:
            record.update(
                executor="ray",
                node_id=context.get_node_id(),
                node_ip=ray.util.get_node_ip_address(),
                task_id=context.get_task_id(),
            )
    return record


def _invoke(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[dict, Any]:
    """A Ray task: run ``fn`` and say where it ran."""
    return where_am_i(), fn(*args, **kwargs)


class RayExecutor(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` whose tasks are Ray tasks on a connected cluster.

    Arguments travel through Ray's object store (no driver path is read by a worker); a
    task's result comes back the same way. ``placements`` counts finished tasks per node.

    Args:
        cpus: the cluster's CPUs (sizes callers' chunks).
        owns_ray: shut Ray down on ``shutdown`` (it was started or connected for this executor).
    """

    def __init__(self, cpus: int, *, owns_ray: bool) -> None:
        import ray

        self._ray = ray
        self.cpus = max(1, cpus)
        self._owns_ray = owns_ray
        self._remote = ray.remote(_invoke)
        self._lock = threading.Lock()
        self.placements: Counter[str] = Counter()
        self.nodes: dict[str, dict] = {}
        self._pending: set[Any] = set()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Run ``fn(*args, **kwargs)`` as a Ray task needing one CPU (``submit_task`` sets resources)."""
        return self.submit_task(fn, args, kwargs)

    def submit_task(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        max_retries: int = 3,
        name: str | None = None,
    ) -> concurrent.futures.Future:
        """Run ``fn(*args, **kwargs)`` as a Ray task with these resources.

        Args:
            num_cpus, num_gpus: the task's Ray resource request.
            max_retries: times Ray reruns the task when its worker process or node dies (an
                exception raised by ``fn`` is never retried: it is a result).
            name: the task's name in Ray (its worker's process title is ``ray::<name>``).

        Returns:
            A future of ``fn``'s return value.
        """
        if self._shutdown:
            raise RuntimeError("RayExecutor: submit after shutdown")
        options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_retries": max_retries, "retry_exceptions": False}
        if name is not None:
            options["name"] = name
        ref = self._remote.options(**options).remote(fn, tuple(args), dict(kwargs or {}))
        with self._lock:
            self._pending.add(ref)
        outer: concurrent.futures.Future = concurrent.futures.Future()

        def _done(inner: concurrent.futures.Future) -> None:
            with self._lock:
                self._pending.discard(ref)
            try:
                where, value = inner.result()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
                outer.set_exception(exc)
                return
            with self._lock:
                node = where.get("node_id", where["hostname"])
                self.placements[node] += 1
                self.nodes.setdefault(node, {k: where.get(k) for k in ("node_ip", "hostname")})
            outer.set_result(value)

        ref.future().add_done_callback(_done)
        return outer

    def put(self, value: Any) -> Any:
        """Place ``value`` in the object store once; pass the reference to many tasks."""
        return self._ray.put(value)

    def record(self) -> dict:
        """Which nodes ran how many tasks: ``{"nodes": {node_id: {"node_ip", "hostname", "tasks"}}}``."""
        with self._lock:
            return {"nodes": {node: {**self.nodes[node], "tasks": n} for node, n in sorted(self.placements.items())}}

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new tasks; with ``cancel_futures`` cancel the unfinished ones (a caller that
        failed leaves no work running on a cluster it does not own); disconnect from (or stop)
        Ray if this executor connected it."""
        self._shutdown = True
        if cancel_futures and self._ray.is_initialized():
            with self._lock:
                pending = list(self._pending)
            for ref in pending:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()


# What a Ray session adds below its temporary directory: "/ray/session_<date>_<time>_<micros>_<pid>/
# sockets/plasma_store".
_RAY_SOCKET_SUFFIX = 72


def _connect_ray(choice: ExecutorChoice, workers: int | None, *, call: str, verbose: bool) -> bool:
    """Connect this process to Ray; returns whether this call did (False: it was connected)."""
    try:
        import ray
    except ImportError:
        raise input_error(
            call,
            "--executor",
            "ray",
            "local (ray is not installed)",
            "pip install -c constraints.txt 'qhlab[ray]' (make venv installs it)",
        ) from None
    if ray.is_initialized():
        return False
    address = choice.resolved_address()
    field = "--ray-address" if choice.ray_address else "RAY_ADDRESS"
    if address is not None:
        _check_reachable(address, call, field)  # also refuses a malformed RAY_ADDRESS
    level = logging.INFO if verbose else logging.ERROR
    options: dict[str, Any] = {"logging_level": level, "log_to_driver": verbose}
    if address is None:
        # "local": a new Ray for this process, never one that `ray start` left on this machine.
        address = "local"
        options.update(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False)
        if not unix_socket_fits(reserve=_RAY_SOCKET_SUFFIX):
            # Ray's session sockets live under the temporary directory, and a long TMPDIR leaves
            # their paths too long to bind: this Ray's session goes under /tmp instead.
            options["_temp_dir"] = f"/tmp/qhlab-ray-{os.getuid()}"
    # ray.init replaces the SIGTERM handler with sys.exit; the caller's (the CLI unwinds a
    # terminated command through it) is put back.
    sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        ray.init(address=address, **options)
    except Exception as exc:  # noqa: BLE001 - whatever ray.init raises is one refusal
        with contextlib.suppress(Exception):
            ray.shutdown()  # a half-started local Ray is stopped, not left to atexit
        if address == "local":
            raise input_error(
                call,
                "--executor",
                "ray",
                "local (a Ray could not start on this machine)",
                f"ray.init failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
            ) from None
        raise input_error(
            call,
            field,
            address,
            "the address of a running Ray cluster",
            f"ray.init failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); " + _HINT,
        ) from None
    finally:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    if address == "local":
        # The Ray started here must die with this process, however it dies (``reaper``).
        node = ray._private.worker._global_node
        start_reaper(
            os.getpid(),
            [info.process.pid for infos in node.all_processes.values() for info in infos if info.process is not None],
        )
    return True


# What a worker that fits imports before its first task: about 3.9 s of the 2-core host's CPU,
# against 0.3 s for qhlab's own modules on top of them (measured in a fresh process).
FIT_WORKER_IMPORTS = ("torch", "lightning.pytorch", "wandb")


def _pool_context(warm_imports: tuple[str, ...]) -> multiprocessing.context.BaseContext:
    """``forkserver`` preloading ``warm_imports`` where the platform has it, they are given and its socket
    fits under the temporary directory (``unix_socket_fits``), else ``spawn``.

    Neither forks a parent that may have run torch (its OpenMP threads do not survive a fork):
    a forkserver is a fresh interpreter that only imports. It serves every such pool of this
    process, and its preload is fixed when it starts, so a later pool whose modules it lacks
    imports them in each worker, as a spawned one would.
    """
    if warm_imports and "forkserver" in multiprocessing.get_all_start_methods() and unix_socket_fits():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(warm_imports))
        return context
    return multiprocessing.get_context("spawn")


def _worker_start(
    driver: tuple[int, int | None],
    environ: dict[str, str] | None,
    initializer: Callable[..., None] | None,
    initargs: tuple,
) -> None:
    """A pool worker's start: it watches its driver, takes the driver's environment (a forked worker:
    as when its pool opened), then runs ``initializer``."""
    watch_driver(*driver)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if initializer is not None:
        initializer(*initargs)


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: kill every worker. The ``pool.shutdown(wait=True, cancel_futures=True)``
    that follows then fails or cancels every job that had not finished. A killed worker's fit
    leaves a crashed attempt, as any kill does, which the next run resumes from its last
    checkpoint. A gentler SIGTERM is not enough: Lightning turns it into an exception inside a
    fit, which the pool's worker loop catches as the job's result before taking the next job.

    Args:
        pool: an open process pool (its workers still registered: not shut down yet).
    """
    # Private but stable since Python 3.2; 3.14's public ``terminate_workers`` reads the same map.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.kill()
    for process in processes:
        process.join()


@contextmanager
def open_executor(
    choice: ExecutorChoice,
    workers: int,
    *,
    call: str,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
    verbose: bool = False,
    warm_imports: tuple[str, ...] = (),
) -> Iterator[concurrent.futures.Executor | None]:
    """An executor for independent tasks; None when ``local`` and ``workers == 1`` (run in-process).

    Args:
        choice: local or Ray.
        workers: local processes, or the CPUs of a Ray started here (ignored for a cluster).
        call: the command named in refusals.
        initializer, initargs: run in each local worker process (e.g. the console mode).
        verbose: let Ray log and forward worker output (``--verbose``).
        warm_imports: modules a local worker needs before its first task (e.g. the fit's, which
            import torch, Lightning and W&B, about 3.9 s on the 2-core host). With them the
            workers are forked from a ``forkserver`` that imported them once, instead of bare
            spawned interpreters that each import them again (``bench/worker_startup.py``).

    Yields:
        A ``ProcessPoolExecutor`` (``spawn`` or ``forkserver``, so a parent that ran torch is
        safe), a ``RayExecutor``, or None.

    Raises:
        QhInputError: Ray is not installed or its cluster does not answer (nothing written).
    """
    if choice.kind == "local":
        if workers <= 1:
            yield None
            return
        context = _pool_context(tuple(warm_imports))
        # A forked worker's environment is the forkserver's, which the first such pool of this
        # process fixed; a spawned worker's is its driver's now. Make them the same.
        environ = dict(os.environ) if context.get_start_method() == "forkserver" else None
        initializer, initargs = _worker_start, (driver_identity(), environ, initializer, initargs)
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=initializer, initargs=initargs
        )
        try:
            yield pool
        except BaseException:
            # Interrupted or terminated (the CLI turns SIGTERM into an exception): no worker may
            # outlive the command and go on writing into its directories.
            _stop_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    owns = _connect_ray(choice, workers, call=call, verbose=verbose)
    import ray

    executor = None
    try:
        executor = RayExecutor(int(ray.cluster_resources().get("CPU", 1)), owns_ray=owns)
        yield executor
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
        elif owns:
            ray.shutdown()
