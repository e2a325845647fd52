"""``qhlab study export``: tidy tables of a finished study, loaded by pandas and DuckDB as the how-to does (slow).

The page's code runs as written, on what the tiny study really wrote, and every value is compared
with report.json and with the cell receipts.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from qhlab.cli import main

pd = pytest.importorskip("pandas", reason="the test extra installs pandas for the export how-to")
duckdb = pytest.importorskip("duckdb", reason="the test extra installs duckdb for the export how-to")

pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "export-results.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def _qhlab(*argv: str | Path) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, finished_study) -> dict:
    """The page's three commands, run in a directory of their own on the finished tiny study."""
    where = tmp_path_factory.mktemp("export")
    study = where / "runs" / "demo-study"
    shutil.copytree(finished_study["output"], study.parent / study.name)
    (bash,) = _blocks("bash")
    for line in bash.strip().splitlines():
        argv = line.split("#")[0].split()
        assert argv[:3] == ["qhlab", "study", "export"], line
        argv = [str(where / a) if a.endswith((".parquet", ".csv")) or a.startswith("runs/") else a for a in argv[1:]]
        code, _, err = _qhlab(*argv)
        assert code == 0, err
    return {"where": where, "study": study, "report": json.loads((study / "report" / "report.json").read_text())}


def test_the_cells_table_holds_the_reports_values(exported) -> None:
    report, where = exported["report"], exported["where"]
    cells = pd.read_parquet(where / "results.parquet")
    assert list(cells.columns) == [
        "study",
        "arm",
        "role",
        "seed",
        "horizon",
        "metric",
        "unit",
        "value",
        "low",
        "high",
        "confidence",
        "observed_updates",
    ]
    h = report["horizon"]
    assert len(cells) == len(report["cells"]) * h * 2
    # Every row says what its values measure, as the report does: a table read away from its study too.
    assert set(cells["unit"]) == {report["unit"]} and report["unit"]
    for cell in report["cells"]:
        for metric in ("mae", "regret"):
            rows = cells[(cells.arm == cell["arm"]) & (cells.seed == cell["seed"]) & (cells.metric == metric)]
            assert rows.sort_values("horizon")["value"].tolist() == cell[metric]
            assert rows.sort_values("horizon")["low"].tolist() == [i["low"] for i in cell[f"{metric}_intervals"]]
    # CSV carries the same rows.
    csv = pd.read_csv(where / "results.csv")
    assert csv["value"].tolist() == pytest.approx(cells["value"].tolist(), rel=1e-15)
    assert (
        csv[["arm", "seed", "horizon", "metric"]].values.tolist()
        == cells[["arm", "seed", "horizon", "metric"]].values.tolist()
    )


def test_the_pages_pandas_and_duckdb_code_runs_and_agrees(exported, monkeypatch, capsys) -> None:
    report, where = exported["report"], exported["where"]
    monkeypatch.chdir(where)
    first, second = _blocks("python")
    namespace: dict = {}
    exec(first, namespace)
    regret = namespace["regret"]
    h = report["horizon"]
    by_cell = {(c["arm"], c["seed"]): c["regret"][h - 1] for c in report["cells"]}
    for seed in report["seeds"]:
        for arm in regret.columns:
            assert regret.loc[seed, arm] == by_cell[(arm, seed)]
    exec(second, namespace)
    paired = namespace["paired"]
    # The per-scene mean difference is the difference of the cells' own means (scenes weigh the same).
    for seed in report["seeds"]:
        assert paired.loc[seed] == pytest.approx(
            by_cell[("variant_deep", seed)] - by_cell[("baseline", seed)], abs=1e-12
        )
    capsys.readouterr()

    by_h, means = (duckdb.sql(q).fetchall() for q in _blocks("sql"))
    assert by_h == sorted((arm, seed, value) for (arm, seed), value in by_cell.items())
    for arm, seed, horizon, metric, value in means:
        cell = next(c for c in report["cells"] if c["arm"] == arm and c["seed"] == seed)
        assert value == pytest.approx(cell[metric][horizon - 1], abs=1e-12)
    assert len(means) == len(report["cells"]) * h * 2


def test_export_refuses_bad_input_and_writes_nothing(exported, tmp_path) -> None:
    study = exported["study"]
    cases = [
        ((study, "--output", tmp_path / "x.txt"), "a file ending in .parquet or .csv, or --format"),
        ((study, "--output", exported["where"] / "results.parquet"), "allowed: a new file"),
        ((study, "--output", tmp_path / "no" / "x.parquet"), "a file in an existing directory"),
        ((tmp_path, "--output", tmp_path / "x.parquet"), "a finished study directory"),
    ]
    for args, message in cases:
        code, _, err = _qhlab("study", "export", *args)
        assert code == 2 and err.count("error:") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # A cell receipt edited after the report is refused, not exported.
    copy = tmp_path / "copy"
    shutil.copytree(study, copy)
    receipt = copy / "cells" / "baseline-s0" / "cell.receipt.json"
    receipt.chmod(0o644)
    document = json.loads(receipt.read_text())
    document["body"]["evaluation"]["mae"][-1] += 0.01
    receipt.write_text(json.dumps(document))
    code, _, err = _qhlab("study", "export", copy, "--output", tmp_path / "y.parquet")
    assert code == 2 and "cell.receipt.json" in err, err
    assert not (tmp_path / "y.parquet").exists()


def test_report_json_has_its_documented_layout_and_the_published_schema_is_current(exported) -> None:
    from qhlab.report.document import REPORT_JSON_SCHEMA, StudyReportDocument

    report = exported["report"]
    document = StudyReportDocument.model_validate(report)
    assert [q.answer.decision for q in document.question] == [q["answer"]["decision"] for q in report["question"]]
    assert all(len(c.mae) == len(c.mae_intervals) == document.horizon for c in document.cells)
    # A field that the layout does not describe, or a number that is text, is refused.
    with pytest.raises(ValueError, match="unexpected"):
        StudyReportDocument.model_validate({**report, "unexpected": 1})
    bad = json.loads(json.dumps(report))
    bad["cells"][0]["mae"][0] = "0.1"
    with pytest.raises(ValueError, match="cells.0.mae.0"):
        StudyReportDocument.model_validate(bad)
    published = Path(__file__).resolve().parents[2] / "docs" / "reference" / "report.schema.json"
    assert json.loads(published.read_text()) == REPORT_JSON_SCHEMA, (
        "docs/reference/report.schema.json is stale: regenerate it from REPORT_JSON_SCHEMA"
    )
