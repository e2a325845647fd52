"""The tutorial's commands, run as written in docs/tutorial.md, on a fresh home (slow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def test_the_tutorial_runs_as_written(tmp_path):
    block = re.search(r"```bash\n(.*?)```", TUTORIAL.read_text(encoding="utf-8"), re.S)
    assert block, f"no ```bash block in {TUTORIAL}"
    commands = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert [c.split()[1:3] for c in commands] == [
        ["study", "run"],
        ["study", "status"],
        ["verify", "/tmp/first-study"],
        ["study", "run"],
    ]
    home = tmp_path / "home"  # the config's population cache is under ~: keep it out of the user's
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    outputs = []
    for command in commands:
        command = command.replace("/tmp/", f"{tmp_path}/").replace(".venv/bin/", f"{VENV_BIN}/")
        done = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        outputs.append(" ".join(done.stdout.split()))
    study = tmp_path / "first-study"
    run, status, verify, again = outputs
    # What the tutorial says each command shows.
    assert "ran freeze, admit-canaries, prepare-development, run-fit, benchmark, report" in run
    # Each variant's answer, as the report words it; on 3 scenes every decision is undecided.
    for variant in ("variant_cross_attention", "variant_deep"):
        assert f"`{variant}` against `baseline`: regret_2" in run
    assert run.count("By the pre-registered rule: undecided: fewer than 30 validation scenes (n_scenes=3)") == 2, run
    assert (study / "report" / "report.md").read_text().startswith("# Architecture study `first-study`")
    assert (
        len(
            re.findall(
                r"^\S+-s[01] +authenticated +1 +30 ",
                "\n".join(
                    subprocess.run(
                        [f"{VENV_BIN}/qhlab", "study", "status", str(study)],
                        capture_output=True,
                        text=True,
                        env=env,
                        check=True,
                    ).stdout.splitlines()
                ),
                re.M,
            )
        )
        == 10
    )
    assert "E0 gate authenticated" in status
    assert re.search(r"^verified: 119 receipts", verify), verify[:200]
    assert "is complete: every receipt authenticated" in again and "nothing was run" in again
    assert list(home.glob(".cache/qhlab/populations/tiny-*-seed[78]-*"))
