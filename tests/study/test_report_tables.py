"""Every table of ``report.md`` names a header for each of its cells, with and without a bound plan.

A bound plan adds the planned MDE to the seed-pooled comparisons and to the rule's decision; both
tables must then carry its column in the header as in every row. The finished tiny study gives the
report without a plan; the same report with each comparison's and margin's planned MDE filled in,
as a study with a bound plan records them, gives the other case (the plan's own section is checked
end to end in test_plan.py).
"""

from __future__ import annotations

import json

import pytest

from markdown_tables import markdown_tables, table_mismatches


def test_the_checker_sees_a_row_with_a_cell_its_header_lacks():
    good = "| a | b |\n|---|---|\n| 1 | `x | y` |\n| 2 | 3 \\| 4 |\n"
    assert table_mismatches(good) == []
    assert len(markdown_tables(good)) == 1
    bad = "text\n\n| a | b |\n|---|---|\n| 1 | 2 | 3 |\n\n```\n| not | a table |\n```\n"
    (problem,) = table_mismatches(bad)
    assert "3 cells" in problem and "2 headers" in problem
    assert table_mismatches("| a | b |\n| 1 | 2 |\n")[0].endswith("no separator line under its header")


def _with_a_plan(report: dict) -> dict:
    """``report`` as a study with a bound plan records it: each comparison's and margin's planned MDE."""
    planned = json.loads(json.dumps(report))
    for number, row in enumerate(planned["replication"]):
        row["planned_mde"] = 0.01 * (number + 1)
    for entry in planned["retention"]:
        for margin in ("D_reg", "D_mae"):
            entry["pooled_margins"][margin]["planned_mde"] = 0.02
    return planned


@pytest.mark.slow
def test_every_report_table_has_a_header_for_each_cell(finished_study):
    from qhlab.report.build import SECTIONS
    from qhlab.report.render import render_markdown

    report_dir = finished_study["output"] / "report"
    written = (report_dir / "report.md").read_text()
    report = json.loads((report_dir / "report.json").read_text())
    # Without a plan: the published report.md, which is the rendering of its report.json.
    assert written == render_markdown(report, SECTIONS)
    assert len(markdown_tables(written)) >= 5 and table_mismatches(written) == []
    assert "planned MDE" not in written
    # With a plan: both tables grow the column in the header and in every row.
    planned = render_markdown(_with_a_plan(report), SECTIONS)
    assert table_mismatches(planned) == [], "\n".join(table_mismatches(planned))
    tables = markdown_tables(planned)
    (decision,) = [rows for rows in tables if rows[0][:2] == ["variant", "decision"]]
    assert decision[0][-1] == "planned MDE (D_reg / D_mae)"
    assert [row[-1] for row in decision[2:]] == ["0.0200 / 0.0200"] * len(report["retention"])
    (pooled,) = [rows for rows in tables if rows[0][:3] == ["arm", "against", "metric"]]
    assert pooled[0][-2:] == ["MDE", "planned MDE"]
    assert [float(row[-1]) for row in pooled[2:]] == [
        pytest.approx(0.01 * (n + 1)) for n in range(len(report["replication"]))
    ]


@pytest.mark.slow
def test_verify_says_when_another_qhlab_renders_report_md_otherwise(study_copy, capsys, monkeypatch):
    import qhlab.report.records as records
    from qhlab.cli import main
    from qhlab.evidence.layout import REPORT_DIR
    from record_forgery import reseal

    study = study_copy()
    markdown = study / REPORT_DIR / "report.md"
    markdown.chmod(0o644)
    # As an older qhlab laid a table out: one header fewer than its rows' cells.
    markdown.write_text(markdown.read_text().replace("| MDE D_reg | MDE D_mae |", "| MDE D_reg |", 1))
    reseal(study / REPORT_DIR / "report.receipt.json")
    assert main(["verify", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "is not the rendering of its report.json. HINT: report.md is a function" in err
    # Run by other qhlab source than the study was frozen with: the message says so and where to verify it.
    other = {**records.source_package_digest(), "sha256": "0" * 64}
    monkeypatch.setattr(records, "source_package_digest", lambda: other)
    assert main(["verify", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1, err
    assert "is not this qhlab's rendering of its report.json, and the study was frozen with other qhlab source" in err
    assert "HINT: verify it with the qhlab source it was frozen with." in err
