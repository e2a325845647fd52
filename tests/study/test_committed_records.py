"""The records committed in examples/preparation: each verifies, and the tiny gate's check says what its configs claim.

Every record directory that git tracks is verified as a user would verify it (`qhlab verify DIR`):
its receipt, the files it binds, and the record recomputed by its kind's check. The tiny studies'
E0 check is then read for what `examples/first-study.toml` claims of it. It checks that study's
gate, 9 of its 10 draws pass, and its draws are seeds that no other config or test draws.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from qhlab.cli import main

ROOT = Path(__file__).resolve().parents[2]
PREPARATION = ROOT / "examples" / "preparation"


def _tracked_records() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "examples/preparation"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted({Path(p).parent.name for p in listed if p.endswith(".receipt.json")})


def test_every_committed_record_is_tracked_whole() -> None:
    assert _tracked_records() == [
        "demo-e0",
        "demo-pilot",
        "demo-plan",
        "demo-tune",
        "hard-target-tune",
        "moonshot",
        "tiny-e0",
    ]


@pytest.mark.parametrize("name", _tracked_records())
def test_every_committed_record_verifies_and_recomputes(name: str, tmp_path) -> None:
    # The tracked files alone, as a clone holds them (a local `make prepare` leaves its fits beside them).
    listed = subprocess.run(
        ["git", "ls-files", f"examples/preparation/{name}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    copy = tmp_path / name
    for path in listed:
        target = copy / Path(path).relative_to(f"examples/preparation/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, target)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["verify", str(copy)]) == 0
    text = out.getvalue()
    assert re.search(r"^verified: 1 receipts", text, re.M), text
    # The record's own check ran: its kind's line follows the digests.
    assert re.search(r"^(tuning|pilot|e0 check|plan): ", text, re.M), text


def test_the_tiny_gate_check_is_of_the_first_studys_gate_on_draws_nothing_else_uses() -> None:
    from qhlab.design.e0_config import e0_design
    from qhlab.design.study_config import read_study_config

    record = json.loads((PREPARATION / "tiny-e0" / "e0.json").read_text())
    study, _, _ = read_study_config(ROOT / "examples" / "first-study.toml")
    assert record["design"] == e0_design(study)
    assert (record["passed"], record["draws"], record["meets_min_pass_share"]) == (9, 10, True)
    assert study.preparation is not None and Path(study.preparation.e0) == PREPARATION / "tiny-e0" / "e0.json"
    seeds = record["config"]["train_seeds"]
    assert seeds == list(range(70001, 70011))
    # No other config, and no test, draws a population from these seeds.
    configs = [p for p in (ROOT / "examples").glob("*.toml") if p.name != "tiny-e0.toml"]
    tests = [p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()]
    texts = [p.read_text() for p in (*configs, *tests)]
    drawn = {int(s) for text in texts for s in re.findall(r"\b(7000[1-9]|70010)\b", text)}
    assert drawn == set(), drawn


def test_a_renamed_record_receipt_is_refused_not_left_unrecomputed(tmp_path) -> None:
    # Renamed, the receipt still authenticates its files; its record must still be recomputed.
    copy = shutil.copytree(PREPARATION / "tiny-e0", tmp_path / "tiny-e0")
    (copy / "e0.receipt.json").rename(copy / "renamed.receipt.json")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(["verify", str(copy)]) == 2
    assert "is a receipt of kind e0_check, whose name is e0.receipt.json" in err.getvalue()
