"""The Ray executor on a real two-node ``ray.cluster_utils.Cluster`` (slow; run by CI).

One cluster per module: a head node and a second node, one CPU each, whose processes see a
HOME and TMPDIR of their own. The driver is this test process. Checks: a population labelled
on the cluster is byte-identical to a local one; the tiny study's cells run as Ray tasks on
both nodes with final states bit-identical to the local study's and ``qhlab verify`` passing;
a worker killed during a cell is retried by Ray and the cell receipt records the lost try;
workers write nothing outside their own temporary directories.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from qhlab.design.study_records import StudyCellReceipt
from qhlab.evidence import sha256_file
from qhlab.scenes.records import PopulationGenerationReceipt
from qhlab.scenes.seals import SEALS_DIR
from qhlab.training.records import FitReceipt

ray = pytest.importorskip("ray", reason="ray is installed by the test extra (make venv)")

pytestmark = pytest.mark.slow


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.exists() else set()


@pytest.fixture(scope="module")
def cluster():
    """A two-node local Ray cluster whose processes have their own HOME and TMPDIR."""
    import shutil
    import tempfile

    from ray.cluster_utils import Cluster

    # Short: Ray puts its session (with Unix sockets, at most 107 bytes a path) under TMPDIR.
    root = Path(tempfile.mkdtemp(prefix="qr", dir="/tmp"))
    worker_home, worker_tmp = root / "home", root / "tmp"
    worker_home.mkdir()
    worker_tmp.mkdir()
    saved = {k: os.environ.get(k) for k in ("HOME", "TMPDIR")}
    # Node processes (raylets and their workers) inherit the environment they start with.
    os.environ.update(HOME=str(worker_home), TMPDIR=str(worker_tmp))
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield {"address": cluster.address, "home": worker_home, "tmp": worker_tmp}
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(root, ignore_errors=True)


def _kill_first_cell_worker(worker_tmp: Path, stop: threading.Event, killed: list) -> None:
    """Wait for the first cell try to make its temporary directory (``qhlab-<cell>-*``: by then
    the try is on record), then SIGKILL the Ray worker running that cell (process title
    ``ray::qhlab-cell-<cell>``) while the directory still shows the try running."""
    while not stop.is_set() and not killed:
        made = sorted(p.name for p in worker_tmp.iterdir() if p.name.startswith("qhlab-"))
        for name in made:
            cell = name.removeprefix("qhlab-").rsplit("-", 1)[0]
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                except OSError:
                    continue
                if title.startswith(f"ray::qhlab-cell-{cell}"):
                    if not (worker_tmp / name).exists():
                        # The try finished while /proc was read (it removes its directory before it
                        # returns): a kill now could land after its result, so no try would be lost.
                        break
                    try:
                        os.kill(int(proc.name), signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    killed.append((int(proc.name), title, cell))
                    return
        time.sleep(0.05)


def test_population_labelled_on_the_cluster_is_byte_identical(cluster, tmp_path) -> None:
    from qhlab.evidence import read_receipt
    from qhlab.execution import ExecutorChoice
    from qhlab.scenes import generate_population

    local = generate_population("tiny", "train", 3, tmp_path / "local", workers=1)
    remote = generate_population(
        "tiny", "train", 3, tmp_path / "ray", executor=ExecutorChoice("ray", cluster["address"])
    )
    for name in ("scenes.parquet", "states.parquet", "candidates.parquet", "manifest.json", "population.receipt.json"):
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
    generation = read_receipt(remote / "generation.receipt.json", PopulationGenerationReceipt).record()
    body = generation["body"]
    assert body["executor"] == "ray" and body["ray_address"] == cluster["address"]
    assert body["cluster_cpus"] == 2
    assert sum(node["tasks"] for node in body["nodes"].values()) > 0
    assert not ray.is_initialized()  # the executor disconnected what it connected


def test_study_cells_on_the_cluster_match_local_and_survive_a_killed_worker(
    cluster, tmp_path, tiny_config, finished_study
) -> None:
    from qhlab.cli import main
    from qhlab.evidence import read_receipt

    cache = Path(
        json.loads((finished_study["output"] / "freeze.receipt.json").read_text())["body"]["train"]["path"]
    ).parent
    cache_before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    output = tmp_path / "study"
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first_cell_worker, args=(cluster["tmp"], stop, killed), daemon=True)
    killer.start()
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            code = main(
                [
                    "study",
                    "run",
                    str(tiny_config),
                    "--output",
                    str(output),
                    "--executor",
                    "ray",
                    "--ray-address",
                    cluster["address"],
                ]
            )
    finally:
        stop.set()
        killer.join()
    assert code == 0, buffer.getvalue()
    assert killed, "no cell worker was seen running, so none was killed"

    # Bit-identical to the local study, cell by cell; every receipt authenticates.
    def cell_names(study: Path) -> list[str]:
        return sorted(p.name for p in (study / "cells").iterdir() if p.is_dir() and not p.name.startswith("."))

    cells = cell_names(output)
    assert cells == cell_names(finished_study["output"]) and len(cells) == 10
    nodes, lost = set(), []
    for cell in cells:
        body = read_receipt(output / "cells" / cell / "cell.receipt.json", StudyCellReceipt).body_record()
        local = json.loads((finished_study["output"] / "cells" / cell / "cell.receipt.json").read_text())["body"]
        assert body["final_state_sha256"] == local["final_state_sha256"], cell
        assert body["evaluation"]["mae"] == local["evaluation"]["mae"], cell
        execution = body["execution"]
        assert execution["executor"] == "ray" and execution["ray_address"] == cluster["address"]
        returned = [t for t in execution["tries"] if t["outcome"] == "returned"]
        assert len(returned) == 1 and returned[0]["executor"] == "ray"
        lost += [(cell, t) for t in execution["tries"] if t["outcome"] != "returned"]
        fit = read_receipt(output / "cells" / cell / body["attempt"] / "fit.receipt.json", FitReceipt).body_record()
        # The lane was admitted on the node that ran the fit, and its evidence names that node.
        assert fit["execution"]["node_id"] == returned[0]["node_id"]
        assert fit["execution"]["pid"] == returned[0]["pid"]
        nodes.add(fit["execution"]["node_id"])
        # The tiny study's hard target: the Ray fit kept its successor values as a table, as the local one did.
        assert fit["target_values"]["cached"] and fit["target_values"]["table_builds"] >= 1
        # Exactly one attempt per cell reached the driver: the killed try wrote nothing there.
        assert [p.name for p in (output / "cells" / cell).iterdir() if p.is_dir()] == [body["attempt"]]
    assert len(nodes) == 2, f"cells ran on {len(nodes)} node(s); the cluster has two"
    assert len(lost) == 1, lost
    lost_cell, lost_try = lost[0]
    assert lost_try["pid"] == killed[0][0] and lost_try["try"] == 1, (lost, killed)
    assert killed[0][2] == lost_cell and killed[0][1].startswith(f"ray::qhlab-cell-{lost_cell}")
    assert main(["verify", str(output)]) == 0

    # Workers wrote nothing outside their own temporary directories: not the driver's
    # population cache, not their HOME; below their TMPDIR at most the killed try's directory
    # remains (a finished try removes its own; a later try on that node sweeps a dead one's).
    # The driver's development step adds one file there: this study's seal of its validation.
    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    added = sorted(set(after) - set(cache_before))
    freeze_sha = sha256_file(output / "freeze.receipt.json")
    assert [p.relative_to(cache).parts[0] for p in added] == [SEALS_DIR]
    assert [p.name for p in added] == [f"tiny-study-{freeze_sha[:16]}.json"]
    assert {p: after[p] for p in cache_before} == cache_before
    assert _files(cluster["home"]) == set()
    leftovers = [p.name for p in cluster["tmp"].iterdir() if p.name.startswith("qhlab-")]
    assert all(name.startswith(f"qhlab-{lost_cell}-") for name in leftovers), leftovers
    assert len(leftovers) <= 1

    # A second run verifies and reruns nothing, on any executor.
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["study", "run", str(tiny_config), "--output", str(output)]) == 0
    assert "nothing was run" in " ".join(buffer.getvalue().split())

    # A driver killed after publishing an attempt but before its cell receipt: the restarted
    # driver adopts the published attempt (no task, no new attempt) and says where it ran.
    restarted = tmp_path / "restarted"
    shutil.copytree(output, restarted)
    for part in ("report", "benchmarks"):
        shutil.rmtree(restarted / part)
    cell_dir = restarted / "cells" / "variant_deep-s1"
    before = read_receipt(cell_dir / "cell.receipt.json", StudyCellReceipt).body_record()
    (cell_dir / "cell.receipt.json").unlink()
    with contextlib.redirect_stdout(io.StringIO()):
        assert (
            main(
                [
                    "study",
                    "run",
                    str(tiny_config),
                    "--output",
                    str(restarted),
                    "--executor",
                    "ray",
                    "--ray-address",
                    cluster["address"],
                ]
            )
            == 0
        )
    after = read_receipt(cell_dir / "cell.receipt.json", StudyCellReceipt).body_record()
    assert after["attempt"] == before["attempt"] and after["final_state_sha256"] == before["final_state_sha256"]
    assert [p.name for p in cell_dir.iterdir() if p.is_dir()] == [before["attempt"]]
    assert after["execution"]["adopted_after_restart"] is True and after["execution"]["executor"] == "ray"
    assert after["execution"]["fit_ran_on"]["node_id"] in nodes


def test_user_arms_on_the_cluster_import_the_shipped_frozen_copy(
    cluster, tmp_path, byo_writer, population_cache
) -> None:
    """A byo study's cells on Ray match its cells fitted locally: each task carries the study's
    frozen copy of the user arm (no file is shared), and the user's own file is never read."""
    from qhlab.cli import main
    from qhlab.evidence import read_receipt

    config = byo_writer(tmp_path / "ray", population_cache)
    local_config = byo_writer(tmp_path / "local", population_cache)
    assert main(["study", "run", str(local_config), "--output", str(tmp_path / "local" / "study")]) == 0
    output = tmp_path / "ray" / "study"
    assert main(["study", "freeze", str(config), "--output", str(output)]) == 0
    (tmp_path / "ray" / "my_arms.py").write_text("raise ImportError('the user file is never imported')\n")
    assert (
        main(
            [
                "study",
                "run",
                str(config),
                "--output",
                str(output),
                "--executor",
                "ray",
                "--ray-address",
                cluster["address"],
            ]
        )
        == 0
    )
    for cell in ("control_maxpool_sets-s0", "variant_struck_mlp-s1"):
        ours = read_receipt(output / "cells" / cell / "cell.receipt.json", StudyCellReceipt).record()
        theirs = json.loads((tmp_path / "local" / "study" / "cells" / cell / "cell.receipt.json").read_text())
        assert ours["body"]["execution"]["executor"] == "ray"
        assert ours["body"]["final_state_sha256"] == theirs["body"]["final_state_sha256"], cell
    assert main(["verify", str(output)]) == 0


def test_a_cell_no_node_can_run_is_refused_before_anything_is_written(
    cluster, tmp_path, config_writer, population_cache, capsys
) -> None:
    from qhlab.cli import main

    # Each node of the cluster has one CPU; a cell with two torch threads could never start.
    config = config_writer(tmp_path / "cfg", population_cache, **{"workers = 1": "workers = 1\ntorch_threads = 2"})
    output = tmp_path / "study"
    assert main(["study", "run", str(config), "--output", str(output), "--ray-address", cluster["address"]]) == 2
    assert (
        "qhlab study run: torch_threads=2 is not allowed; allowed: at most 1, the most CPUs of one live node "
        "of the Ray cluster" in capsys.readouterr().err
    )
    assert not output.exists()
    assert not ray.is_initialized()


def test_a_cell_lost_on_every_try_is_one_clear_error_naming_its_tries(cluster) -> None:
    from qhlab.execution import where_am_i
    from qhlab.execution.ray_tries import TryLedger
    from qhlab.study.remote import RAY_TASK_RETRIES, _cause

    ray.init(address=cluster["address"], logging_level="ERROR", log_to_driver=False)
    try:
        ledger = ray.remote(num_cpus=0)(TryLedger).remote()
        for _ in range(RAY_TASK_RETRIES + 1):
            ray.get(ledger.start.remote("baseline-s0", {**where_am_i(), "node_ip": "10.1.2.3"}))
        error = _cause(ray.exceptions.WorkerCrashedError(), "baseline-s0", ledger)
    finally:
        ray.shutdown()
    from qhlab.evidence import QhError

    assert isinstance(error, QhError)
    assert str(error).startswith(
        f"run_cells_on_ray: cell baseline-s0 was lost: WorkerCrashedError (Ray allows "
        f"{RAY_TASK_RETRIES} retries; 3 tries on record: try 1 on node 10.1.2.3 pid "
        f"{os.getpid()}; try 2"
    )
    assert "HINT: nothing of it was published" in str(error)


def test_a_server_that_is_not_a_ray_gcs_is_refused_in_bounded_time(tmp_path) -> None:
    import socket

    from qhlab.evidence import QhInputError
    from qhlab.execution import ExecutorChoice, open_executor

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()) for _ in range(8)], daemon=True).start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    started = time.perf_counter()
    try:
        with pytest.raises(
            QhInputError,
            match=f"t: --ray-address='{address}' is not allowed; allowed: the address of "
            "a running Ray cluster's GCS. HINT: a server answers there, but not",
        ):
            with open_executor(ExecutorChoice("ray", address), 1, call="t"):
                pytest.fail("a server that is not Ray was connected")
    finally:
        listener.close()
    assert accepted and time.perf_counter() - started < 40
    assert not ray.is_initialized()


def test_ray_without_an_address_starts_its_own_ray_not_a_running_cluster(cluster, tmp_path, monkeypatch) -> None:
    from qhlab.evidence import read_receipt
    from qhlab.execution import ExecutorChoice
    from qhlab.scenes import generate_population

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = generate_population("tiny", "train", 4, tmp_path / "own", workers=1, executor=ExecutorChoice("ray"))
    body = read_receipt(out / "generation.receipt.json", PopulationGenerationReceipt).body_record()
    ray.init(address=cluster["address"], logging_level="ERROR", log_to_driver=False)
    try:
        cluster_nodes = {n["NodeID"] for n in ray.nodes()}
    finally:
        ray.shutdown()
    assert body["ray_address"] is None and body["cluster_cpus"] == 1
    assert len(body["nodes"]) == 1 and not set(body["nodes"]) & cluster_nodes


_DRIVER = """
import json, os, sys, time
from qhlab.execution import executor_choice
from qhlab.execution.executors import open_executor
from qhlab.execution.reaper import process_tree
with open_executor(executor_choice("ray", sys.argv[1] or None, call="test"), 1, call="test") as pool:
    worker = pool.submit(os.getpid).result()
    print(json.dumps({"worker": worker, "tree": sorted(process_tree([os.getpid()]))}), flush=True)
    time.sleep(600)
"""


def _killed_driver(address: str, tmp_path: Path) -> dict:
    """Start a driver on ``address`` ('' for a Ray of its own), SIGKILL it once it ran a task."""
    import subprocess
    import sys

    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, address], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not log.read_text().strip().startswith("{"):
        assert driver.poll() is None, log.read_text()
        time.sleep(0.2)
    record = json.loads(log.read_text().strip().splitlines()[0])
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its whole process group
    driver.wait()
    return record


def _alive(pids) -> list[int]:
    from qhlab.execution.reaper import process_tree

    return sorted(process_tree(pids))


def _wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


def test_a_killed_driver_leaves_no_process_of_the_ray_it_started(tmp_path) -> None:
    record = _killed_driver("", tmp_path)
    assert len(record["tree"]) >= 6  # the GCS, the raylet, its agents, the worker, the reaper...
    assert record["worker"] in record["tree"]
    assert _wait_gone(record["tree"], 15) == [], "Ray processes outlived their driver"


def test_a_killed_driver_of_a_cluster_leaves_no_worker_of_its_job(cluster, tmp_path) -> None:
    record = _killed_driver(cluster["address"], tmp_path)
    assert _wait_gone([record["worker"]], 30) == [], "the dead driver's worker still runs on the cluster"
    # The cluster's own processes are the cluster's: they stay, and take new drivers.
    (tmp_path / "again").mkdir()
    again = _killed_driver(cluster["address"], tmp_path / "again")
    assert _wait_gone([again["worker"]], 30) == []


_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _preparation_configs(directory: Path, cache: Path, config_writer) -> dict[str, Path]:
    """A tiny tuning (two trials of two fits), a tiny pilot (three arms, two seeds, no draws) and a
    tiny E0 check (three draws, 200-update canaries: whether a canary passes is not the question
    here, only that both executors record the same gates)."""
    directory.mkdir(parents=True, exist_ok=True)
    tune = (
        (_EXAMPLES / "tiny-tune.toml")
        .read_text()
        .replace('recipe = "tiny-recipe.toml"', f'recipe = "{_EXAMPLES / "tiny-recipe.toml"}"')
        .replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{cache}"')
        .replace("trials = 4 ", "trials = 2 ")
    )
    (directory / "tune.toml").write_text(tune)
    study = config_writer(directory, cache, **{"canary_updates = 1500": "canary_updates = 200"})
    text = study.read_text()
    study.write_text(
        text[: text.index("[[experiment.arms]]")] + '[[experiment.arms]]\narm = "control_global_readout"\n'
        'role = "control"\n\n[[experiment.arms]]\narm = "variant_cross_attention"\nrole = "variant"\n'
        'control = "control_global_readout"\n'
        # The pilot's layout, fixed by the study before the pilot runs.
        "\n[preparation.pilot_layout]\ndraws = [7]\nseeds = [[2, 3]]\n"
    )
    (directory / "pilot.toml").write_text(
        f'name = "ray-pilot"\nstudy = "{study}"\nseeds = [2, 3]\npopulation_cache = "{cache}"\n\n'
        '[train]\npreset = "tiny"\nseed = 7\n\n[validation]\npreset = "tiny"\nseed = 9\n'
    )
    (directory / "e0.toml").write_text(
        f'name = "ray-e0"\nstudy = "{study}"\ntrain_seeds = [21, 22, 23]\n'
        f'min_pass_share = 0.3\npopulation_cache = "{cache}"\n'
    )
    return {"tune": directory / "tune.toml", "pilot": directory / "pilot.toml", "e0-check": directory / "e0.toml"}


def test_tune_pilot_and_e0_check_on_the_cluster_give_the_local_records(
    cluster, tmp_path, population_cache, config_writer
) -> None:
    from qhlab.cli import main
    from qhlab.scenes import cached_population

    cache = tmp_path / "cache"
    shutil.copytree(population_cache, cache)
    for split, seed in (("validation", 9), ("train", 21), ("train", 22), ("train", 23)):
        cached_population("tiny", split, seed, cache, workers=1)
    configs = _preparation_configs(tmp_path / "c", cache, config_writer)
    records = {"tune": "tuning.json", "pilot": "pilot.json", "e0-check": "e0.json"}

    def same(command: str, record: dict) -> object:
        """What must not depend on the executor: every value but paths and wall times."""
        if command == "tune":
            return [
                (
                    t["params"],
                    t["state"],
                    t["mean"],
                    [(f["seed"], f["regret"], f["final_state_sha256"]) for f in t["fits"]],
                )
                for t in record["trials"]
            ]
        if command == "pilot":
            return (
                [(f["arm"], f["seed"], f["regret"], f["final_state_sha256"]) for f in record["fits"]],
                record["comparisons"],
            )
        return [(o["train_seed"], o["passed"], o["selected"], o["canaries"]) for o in record["outcomes"]]

    buffer = io.StringIO()
    for command, config in configs.items():
        local, remote = tmp_path / f"{command}-local", tmp_path / f"{command}-ray"
        with contextlib.redirect_stdout(buffer):
            assert main([command, str(config), "--output", str(local), "--workers", "1"]) == 0, buffer.getvalue()
            assert (
                main(
                    [
                        command,
                        str(config),
                        "--output",
                        str(remote),
                        "--executor",
                        "ray",
                        "--ray-address",
                        cluster["address"],
                    ]
                )
                == 0
            ), buffer.getvalue()
        ours, theirs = (json.loads((d / records[command]).read_text()) for d in (local, remote))
        assert same(command, ours) == same(command, theirs), command
        if command == "tune":
            assert (local / "recipe.toml").read_bytes() == (remote / "recipe.toml").read_bytes()
        with contextlib.redirect_stdout(buffer):
            assert main(["verify", str(remote)]) == 0


def test_a_ray_started_here_keeps_the_callers_sigterm_handler(monkeypatch) -> None:
    # ray.init installs a SIGTERM handler of its own (sys.exit): the CLI's, which unwinds a
    # terminated command and stops its workers, must survive the connection.
    from qhlab.execution import ExecutorChoice
    from qhlab.execution.executors import open_executor
    from qhlab.execution.signals import handling

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def ours(signum, frame) -> None:
        raise AssertionError("not delivered in this test")

    with handling(signal.SIGTERM, ours):
        with open_executor(ExecutorChoice("ray"), 1, call="test") as pool:
            assert pool.submit(os.getpid).result() != os.getpid()
            assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGTERM) is ours
