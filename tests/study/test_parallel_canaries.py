"""`qhlab study run` fits the two E0 canaries side by side on its pool: the same fits as in-process.

The session's finished tiny study (workers = 1) fitted its canaries in the driver. Here a fresh
freeze of the same config has its canaries fitted by ``run.fit_canaries`` on two forked
workers of the run's job runner; the final states, the canary records and the E0 decision must
be identical, the receipts must show that another process ran them, and the pool must hand the
same worker processes to what runs next.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
from rich.console import Console

from qhlab.cli import main
from qhlab.execution import FIT_WORKER_IMPORTS, JobRunner
from qhlab.study import run
from qhlab.study.admission import decide_e0
from qhlab.study.study import Study

pytestmark = pytest.mark.slow


def _canaries(output) -> dict:
    cells = {}
    for receipt in sorted((output / "canaries").glob("*/cell.receipt.json")):
        body = json.loads(receipt.read_text())["body"]
        cells[receipt.parent.name] = body
    return cells


def test_pool_canaries_match_in_process_ones(tmp_path, finished_study):
    output = tmp_path / "study"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["study", "freeze", str(finished_study["config"]), "--output", str(output)]) == 0, out.getvalue()
    with (
        Study.open(finished_study["config"], output).authenticated("test") as frozen,
        JobRunner(frozen.config.executor_choice(), 2, call="test", warm_imports=FIT_WORKER_IMPORTS) as runner,
    ):
        # The run's one runner: the canaries' workers are the ones later steps get.
        run.fit_canaries(Console(file=io.StringIO()), frozen, runner)
        pooled = _canaries(output)
        assert sorted(pooled) == ["e0-baseline-s0", "e0-baseline-s1"]
        e0 = decide_e0(frozen)
        assert runner.executor() is runner.executor()
        canary_pids = {body["execution"]["process"]["pid"] for body in pooled.values()}
        later = {runner.executor().submit(os.getpid).result() for _ in range(4)}
        assert later <= canary_pids and os.getpid() not in canary_pids, (later, canary_pids)
    driver = _canaries(finished_study["output"])
    assert sorted(driver) == sorted(pooled)
    for cell, body in pooled.items():
        assert body["execution"]["process"]["pid"] != os.getpid(), cell
        assert body["final_state_sha256"] == driver[cell]["final_state_sha256"], cell
        assert body["canary"] == driver[cell]["canary"], cell
    before = json.loads((finished_study["output"] / "canaries" / "e0.receipt.json").read_text())["body"]
    assert e0["passed"] == before["passed"] and e0["canaries"] == before["canaries"]
