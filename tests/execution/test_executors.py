"""The executor seam without a cluster: choices, refusals, the local pool and node records.

A Ray started for a test lives in the slow suite (tests/study/test_ray_cluster.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest

from qhlab.evidence import QhInputError
from qhlab.execution import ExecutorChoice, executor_choice, open_executor, where_am_i


def _square(x: int) -> int:
    return x * x


def test_default_choice_is_local_and_records_no_address(monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    choice = executor_choice(None, None, call="t")
    assert choice == ExecutorChoice("local", None)
    assert choice.record() == {"executor": "local", "ray_address": None}


def test_ray_address_alone_means_ray_and_env_is_the_fallback(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert executor_choice(None, "10.0.0.5:6379", call="t") == ExecutorChoice("ray", "10.0.0.5:6379")
    assert executor_choice("ray", None, call="t").resolved_address() is None
    monkeypatch.setenv("RAY_ADDRESS", "head.cluster:6380")
    assert executor_choice("ray", None, call="t").record() == {"executor": "ray", "ray_address": "head.cluster:6380"}
    assert executor_choice("ray", "[::1]:6379", call="t").resolved_address() == "[::1]:6379"


@pytest.mark.parametrize(
    ("kind", "address", "text"),
    [
        ("cluster", None, "t: --executor='cluster' is not allowed; allowed: local or ray."),
        (
            "local",
            "10.0.0.5:6379",
            "t: --ray-address='10.0.0.5:6379' is not allowed; allowed: only with --executor ray.",
        ),
        ("ray", "10.0.0.5", "t: --ray-address='10.0.0.5' is not allowed; allowed: HOST:PORT of a running Ray cluster"),
        ("ray", "10.0.0.5:0", "--ray-address='10.0.0.5:0' is not allowed"),
        ("ray", "10.0.0.5:http", "--ray-address='10.0.0.5:http' is not allowed"),
        ("ray", ":6379", "--ray-address=':6379' is not allowed"),
        ("ray", "ray://10.0.0.5:10001", "Ray Client (ray://) is not supported"),
        (
            "ray",
            "fe80::1",
            "--ray-address='fe80::1' is not allowed; allowed: HOST:PORT of a running Ray cluster (e.g. "
            "10.0.0.5:6379); an IPv6 host in brackets ([::1]:6379)",
        ),
        ("ray", "::1:6379", "--ray-address='::1:6379' is not allowed"),
    ],
)
def test_bad_choices_are_refused_naming_field_value_and_allowed(kind, address, text, monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(QhInputError) as caught:
        executor_choice(kind, address, call="t")
    assert text in str(caught.value) and "HINT:" in str(caught.value)


def test_ray_address_environment_is_read_only_when_ray_is_connected(monkeypatch) -> None:
    pytest.importorskip("ray", reason="ray is installed by the test extra")
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    # Choosing (a config, a local run) never depends on the environment ...
    assert executor_choice("ray", None, call="t") == ExecutorChoice("ray", None)
    assert executor_choice(None, None, call="t").kind == "local"
    # ... connecting does, and names the variable.
    with pytest.raises(QhInputError, match="t: RAY_ADDRESS='auto' is not allowed; allowed: HOST:PORT"):
        with open_executor(executor_choice("ray", None, call="t"), 1, call="t"):
            pytest.fail("a malformed RAY_ADDRESS was connected")


def test_setting_names_follow_the_callers_vocabulary() -> None:
    with pytest.raises(
        QhInputError,
        match="c: ray_address='h:1' is not allowed; allowed: only with executor ray. "
        "HINT: set executor ray, or drop ray_address",
    ):
        executor_choice("local", "h:1", call="c", field="executor", address_field="ray_address")


def test_unreachable_cluster_is_refused_at_once_without_connecting(monkeypatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is installed by the test extra")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = time.perf_counter()
    with pytest.raises(QhInputError) as caught:
        with open_executor(ExecutorChoice("ray", "127.0.0.1:1"), 2, call="qhlab scenes generate"):
            pytest.fail("an unreachable cluster was opened")
    assert time.perf_counter() - started < 10  # ray.init itself would retry for minutes
    assert (
        "qhlab scenes generate: --ray-address='127.0.0.1:1' is not allowed; allowed: the address of a "
        "running Ray cluster. HINT: nothing answered there" in str(caught.value)
    )
    assert not ray.is_initialized()


def test_local_pool_runs_tasks_in_other_processes_and_one_worker_means_in_process() -> None:
    with open_executor(ExecutorChoice(), 1, call="t") as none:
        assert none is None
    with open_executor(ExecutorChoice(), 2, call="t") as pool:
        assert isinstance(pool, concurrent.futures.ProcessPoolExecutor)
        assert [f.result() for f in [pool.submit(_square, i) for i in range(4)]] == [0, 1, 4, 9]
        assert pool.submit(os.getpid).result() != os.getpid()


_PROBE = """import os, sys


def probe(name):
    return {"preloaded": name in sys.modules, "parent": os.getppid(),
            "environment": [os.environ.get("QHLAB_PROBE_SET"), os.environ.get("QHLAB_PROBE_GONE")]}
"""
# In a fresh interpreter, because a process has one forkserver and its preload is fixed when it
# starts: a pool opened earlier in this test process could have started it with other modules.
_POOLS = """import json, os
from probe import probe
from qhlab.execution import ExecutorChoice, open_executor
seen = {"driver": os.getpid()}
os.environ["QHLAB_PROBE_GONE"] = "first"
for name, warm in (("bare", ()), ("warm", ("colorsys",)), ("warm again", ("colorsys",))):
    if name == "warm again":  # the forkserver started with the first warm pool's environment
        os.environ["QHLAB_PROBE_SET"] = "later"
        del os.environ["QHLAB_PROBE_GONE"]
    with open_executor(ExecutorChoice("local"), 2, call="t", warm_imports=warm) as pool:
        seen[name] = pool.submit(probe, "colorsys").result()
print(json.dumps(seen))
"""


def test_a_pool_with_warm_imports_forks_workers_that_already_hold_them(tmp_path) -> None:
    """Bare workers are the driver's spawned children and import what a task needs themselves;
    with ``warm_imports`` they are forked, holding those modules, from one forkserver that
    serves every such pool of the process, and each holds its driver's environment of the time
    its pool opened, as a spawned worker would."""
    import json

    from qhlab.execution.reaper import unix_socket_fits

    if not unix_socket_fits():
        pytest.skip("TMPDIR is too long for a forkserver's socket: the pools spawn (the test below)")
    (tmp_path / "probe.py").write_text(_PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", _POOLS], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["bare"] == {"preloaded": False, "parent": seen["driver"], "environment": [None, "first"]}
    assert seen["warm"] == {"preloaded": True, "parent": seen["warm"]["parent"], "environment": [None, "first"]}
    assert seen["warm"]["parent"] != seen["driver"]
    # The same server forked the later pool's worker, which sees the driver's changed environment.
    assert seen["warm again"] == {**seen["warm"], "environment": ["later", None]}


def test_under_a_temporary_directory_too_long_for_a_socket_the_pools_spawn(tmp_path) -> None:
    """A forkserver's socket lives under TMPDIR, and a path over about 100 characters cannot be
    bound: then a warm pool spawns its workers instead, and a progress channel still opens."""
    import json

    (tmp_path / "probe.py").write_text(_PROBE)
    long = tmp_path / ("t" * 60) / ("u" * 60)
    long.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(long), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    script = _POOLS.replace(
        "print(json.dumps(seen))",
        "from qhlab.execution.progress import ProgressRelay\n"
        "channel = ProgressRelay()\nchannel.close()\nprint(json.dumps(seen))",
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["warm"] == {"preloaded": False, "parent": seen["driver"], "environment": [None, "first"]}


def test_where_am_i_outside_ray_names_this_host_and_process() -> None:
    record = where_am_i()
    assert record["executor"] == "local" and record["pid"] == os.getpid() and record["hostname"]
    assert "node_id" not in record


def test_bad_ray_address_on_the_command_line_exits_2_and_writes_nothing(tmp_path) -> None:
    pytest.importorskip("ray", reason="ray is installed by the test extra")
    out = tmp_path / "population"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "qhlab.cli",
            "scenes",
            "generate",
            "--preset",
            "tiny",
            "--split",
            "train",
            "--seed",
            "0",
            "--out",
            str(out),
            "--executor",
            "ray",
            "--ray-address",
            "127.0.0.1:1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: generate_population: --ray-address='127.0.0.1:1'")
    assert not out.exists() and list(tmp_path.iterdir()) == []
