"""The tuning figures of a study's report, drawn from the demo's committed tuning record."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from qhlab.report.tuning_figures import TUNING_FIGURES, _study, number_trials_from_one, tuning_figures

ROOT = Path(__file__).resolve().parents[2]


def _demo_tuning() -> dict:
    record = json.loads((ROOT / "examples" / "preparation" / "demo-tune" / "tuning.json").read_text())
    return {**record, "space": record["config"]["space"]}


def test_the_tuning_history_numbers_trials_from_one_as_the_console_and_report_do(tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    tuning = _demo_tuning()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = optuna_plots.plot_optimization_history(_study(tuning))
    number_trials_from_one(ax)
    ax.figure.canvas.draw()
    low, high = ax.get_xlim()
    shown = [t.get_text() for t, x in zip(ax.get_xticklabels(), ax.get_xticks(), strict=True) if low <= x <= high]
    # The record's trials are numbered 0-3 in Optuna; the console says "trial 1/4" .. "trial 4/4". The
    # history draws the complete ones (the fourth was pruned by its cost).
    assert [t["number"] for t in tuning["trials"]] == [0, 1, 2, 3]
    complete = [t["number"] + 1 for t in tuning["trials"] if t["state"] == "complete"]
    assert complete == [1, 2, 3]
    assert shown == ["1", "2", "3"] and ax.get_xlabel() == "Trial"
    # and the report's writer draws it
    writers = tuning_figures(tuning)
    writers[TUNING_FIGURES[0]](tmp_path / TUNING_FIGURES[0])
    assert (tmp_path / TUNING_FIGURES[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
