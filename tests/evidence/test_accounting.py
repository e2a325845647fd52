"""What a file no receipt binds is, and where a study refuses one (``qhlab.evidence.accounting``).

Pure functions over relative paths; the end-to-end cases on a real study are in
tests/study/test_every_file_accounted.py.
"""

from __future__ import annotations

import pytest

from qhlab.evidence import EvidenceError
from qhlab.evidence.accounting import account_for_unbound, unbound_lines

RUN = "wandb/offline-run-20261206_160625-baseline-s0-20261206T160625-6aee"
ATTEMPT = "cells/baseline-s0/baseline-s0-20261206T160625-6aee"
STUDY = ["freeze.receipt.json", "report/report.receipt.json", "report/report.json", "report/report.md"]


def _kinds(unbound: list[str], files: list[str] | None = None) -> dict[str, str]:
    every = (files if files is not None else STUDY) + unbound
    return {e["path"]: e["kind"] for e in account_for_unbound("verify", "/s", unbound, every)}


def test_each_file_a_study_step_writes_unbound_has_its_kind():
    unbound = [
        ".study-run.lock",
        "cells/.baseline-s0.lock",
        "cells/.locks/baseline-s0.lock",
        f"{ATTEMPT}/fit.log",
        f"{ATTEMPT}/{RUN}/logs/debug.log",
        f"{ATTEMPT}/{RUN}/run-baseline-s0.wandb",
        f"wandb-report/20261206T160630-39b3/{RUN}/files/requirements.txt",
        "model.sig",
    ]
    assert _kinds(unbound) == {
        ".study-run.lock": "lock file",
        "cells/.baseline-s0.lock": "lock file",
        "cells/.locks/baseline-s0.lock": "lock file",
        f"{ATTEMPT}/fit.log": "fit log",
        f"{ATTEMPT}/{RUN}/logs/debug.log": "W&B run file",
        f"{ATTEMPT}/{RUN}/run-baseline-s0.wandb": "W&B run file",
        f"wandb-report/20261206T160630-39b3/{RUN}/files/requirements.txt": "W&B run file",
        "model.sig": "signature",
    }


@pytest.mark.parametrize(
    "planted",
    [
        "report/answer.md",
        "answer.md",
        "lock.lock",  # not a lock's name: locks are hidden or in .locks/
        f"report/{RUN}/run.wandb",  # a W&B run's shape, where no run is ever written
        "report/fit.log",
        "benchmarks/.x.lock",
        f"{ATTEMPT}/wandb/not-a-run/debug.log",
        "preparation/pilot/notes.txt",
    ],
)
def test_a_study_refuses_what_none_of_its_steps_writes_there(planted):
    with pytest.raises(EvidenceError, match=rf"{planted} \("):
        _kinds([planted])


def test_a_report_folder_without_its_receipt_is_refused_whole():
    files = ["freeze.receipt.json", "report/report.json", "report/report.md"]
    with pytest.raises(EvidenceError, match=r"/s/report/ holds report\.json, report\.md but no report\.receipt\.json"):
        _kinds(["report/report.json", "report/report.md"], files=["freeze.receipt.json"])
    # The same folder with its receipt: its files are bound, so nothing is unbound there.
    assert _kinds([], files=[*files, "report/report.receipt.json"]) == {}


def test_only_studies_are_closed_and_the_innermost_study_judges():
    files = ["replication.receipt.json", "study/freeze.receipt.json", "study/report/report.receipt.json"]
    # Outside every study: listed with its kind, never refused.
    outside = {"notes.md": "unknown file", "wandb/x.log": "unknown file"}
    assert _kinds(list(outside), files=files) == outside
    refused = r"study/report/answer\.md \(unknown file\) lie\(s\) in the study /s/study "
    with pytest.raises(EvidenceError, match=refused):
        _kinds(["study/report/answer.md"], files=files)


def test_unbound_lines_name_every_file_by_its_folder_and_name():
    unbound = [".study-run.lock", f"{ATTEMPT}/fit.log", f"{ATTEMPT}/{RUN}/logs/debug.log", f"{ATTEMPT}/{RUN}/run.wandb"]
    entries = account_for_unbound("verify", "/s", unbound, STUDY + unbound)
    assert unbound_lines(entries) == [
        "lock file: .study-run.lock",
        f"fit log: {ATTEMPT}/ (fit.log)",
        f"W&B run file: {ATTEMPT}/{RUN}/ (logs/debug.log, run.wandb)",
    ]


def test_a_steps_output_that_a_kill_left_before_its_receipt_is_named_not_refused():
    # A fit killed between publishing its final state (or a checkpoint) and binding it.
    unbound = [f"{ATTEMPT}/final_state.safetensors", f"{ATTEMPT}/segment_checkpoint_u00000007.safetensors"]
    assert set(_kinds(unbound).values()) == {"unfinished step output"}
    # The admission killed between publishing the row selection and its E0 receipt.
    assert _kinds(["canaries/selection.json"]) == {"canaries/selection.json": "unfinished step output"}


@pytest.mark.parametrize(
    ("planted", "files"),
    [
        # Once the E0 receipt is written it binds the selection: an unbound one is not the step's.
        ("canaries/selection.json", [*STUDY, "canaries/e0.receipt.json"]),
        # A fit's output only in its own attempt directory.
        ("report/final_state.safetensors", STUDY),
        ("cells/final_state.safetensors", STUDY),
    ],
)
def test_a_steps_output_elsewhere_or_after_its_receipt_is_refused(planted, files):
    with pytest.raises(EvidenceError, match=rf"{planted} \(unfinished step output\)"):
        _kinds([planted], files=files)
