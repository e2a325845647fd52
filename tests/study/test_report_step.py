"""The pipeline is handed its report step: a ``Study`` opened without one refuses the report by name."""

from __future__ import annotations

import pytest

from qhlab.evidence import QhInputError


def test_a_study_without_its_report_step_refuses_run_and_report_before_writing(tmp_path, tiny_config):
    from qhlab.report import REPORTER, open_study
    from qhlab.study.study import Study

    output = tmp_path / "study"
    bare = Study.open(tiny_config, output)
    for step, call in ((bare.run, "qhlab study run"), (bare.report, "report_study")):
        with pytest.raises(QhInputError, match=rf"^{call}: reporter=None is not allowed; .*HINT: open it with qhlab\."):
            step()
    assert not output.exists()
    assert open_study(tiny_config, output).reporter is REPORTER
