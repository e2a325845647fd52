"""The seed of ``qhlab study run-fit``, followed call by call into the optimizer step.

The path is measured on a real run (``tests/value_path.py``): ``docs/ARCHITECTURE.md`` draws
exactly the files it passes through, the launcher never calls back into the fit (no stop in the
fit follows one in the launcher), and the path does not grow.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qhlab.evidence.layout import BENCHMARK_DIR, REPORT_DIR

ROOT = Path(__file__).resolve().parents[2]


def _drawn_files() -> list[str]:
    """The files docs/ARCHITECTURE.md's "The path of one value" block lists, in order."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = text.split("<!-- value-path -->", 2)[1]
    return re.findall(r"^\s*\d+\.\s+(\S+\.py)", block, flags=re.MULTILINE)


@pytest.mark.slow
def test_the_seed_of_run_fit_reaches_the_optimizer_step_through_few_files(study_copy, finished_study, capsys):
    from qhlab.cli import main
    from value_path import follow

    output = study_copy(REPORT_DIR, BENCHMARK_DIR, "cells/variant_deep-s1")
    argv = ["study", "run-fit", str(finished_study["config"]), "--output", str(output)]
    code, path = follow(lambda: main([*argv, "--variant", "variant_deep", "--seed", "1"]), seed=1)
    assert code == 0, capsys.readouterr().err
    shown = "\n".join(f"{file}: {function}" for file, function in path.stops)
    assert _drawn_files() == path.files, shown
    after_launcher = [b for a, b in zip(path.stops, path.stops[1:]) if a[0] == "training/launcher.py"]
    assert path.entries("training/launcher.py") <= 5 and "finite_horizon/fit.py" not in dict(after_launcher), shown
    # The cell's fit is one FitJob, as every fit job is: its builder and its runner are two stops
    # the path did not have before the job (59 then); nothing else may add one.
    assert path.entries("finite_horizon/fit.py") <= 4 and len(path.stops) <= 61, shown
    assert [f for f, _ in path.stops].count("finite_horizon/fit_job.py") == 1, shown
    assert path.files[0] == "cli/__init__.py" and ("finite_horizon/batches.py", "_epoch_permutation") in path.stops
