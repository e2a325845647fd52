"""``scripts/readme-excerpt``: the README's result block is read from a real report, never typed (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "readme-excerpt"
START, END = "<!-- result-excerpt:start -->", "<!-- result-excerpt:end -->"

pytestmark = pytest.mark.slow


def _excerpt(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_the_excerpt_is_the_reports_numbers(tmp_path, finished_study):
    report_path = finished_study["output"] / "report" / "report.json"
    report = json.loads(report_path.read_text())
    readme = tmp_path / "README.md"
    readme.write_text(f"# front\n\n{START}\nstale text\n{END}\n\ntail\n")
    done = _excerpt(report_path, "--readme", readme, "--command", "qhlab study run tiny-study.toml")
    assert done.returncode == 0, done.stderr
    text = readme.read_text()
    assert text.startswith("# front\n\n" + START) and text.endswith(END + "\n\ntail\n")
    assert "stale text" not in text
    regret, mae = report["summary"]["regret_primary"], report["summary"]["mae_primary"]
    for arm in report["arms"]:
        cells = [f"{arm['arm']}-s{seed}" for seed in report["seeds"]]
        row = (
            f"| {arm['arm']} | {arm['role']} | {' / '.join(f'{regret[c]:.4f}' for c in cells)} | "
            f"{' / '.join(f'{mae[c]:.4f}' for c in cells)} |"
        )
        assert row in text.splitlines(), row
    assert report["summary"]["headline"] in text
    # The block leads with each variant's answer, before any table.
    block = text.split(START)[1].split(END)[0].strip().splitlines()
    answers = [f"- {q['answer']['text']}" for q in report["question"]]
    assert block[2 : 2 + len(answers)] == answers, block
    assert "from `qhlab study run tiny-study.toml`" in text
    assert (
        _excerpt(report_path, "--readme", readme, "--check", "--command", "qhlab study run tiny-study.toml").returncode
        == 0
    )
    # A typed number is caught: --check compares the block with what the report renders.
    readme.write_text(text.replace(f"{regret[cells[0]]:.4f}", "0.0001", 1))
    assert (
        _excerpt(report_path, "--readme", readme, "--check", "--command", "qhlab study run tiny-study.toml").returncode
        == 1
    )


def test_bad_input_is_refused_and_writes_nothing(tmp_path, finished_study):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    done = _excerpt(finished_study["output"] / "report" / "report.json", "--readme", readme)
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: readme-excerpt: --readme=")
        and "one <!-- result-excerpt:start -->" in done.stderr
    )
    assert readme.read_text() == "# no markers\n"
    readme.write_text(f"{START}\n{END}\n")
    broken = tmp_path / "report.json"
    broken.write_text(json.dumps({"schema_version": 1, "study": "x"}))
    done = _excerpt(broken, "--readme", readme)
    assert done.returncode == 2 and "error: readme-excerpt: report=" in done.stderr
    assert readme.read_text() == f"{START}\n{END}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "report.json"]
