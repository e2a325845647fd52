"""The tuning's two figures in a study's report: the optimization history and the parameter importances.

Owns: rebuilding an in-memory Optuna study from a tuning summary's finished trials (their
parameters and objective means, under the space's distributions) and drawing it with
``optuna.visualization.matplotlib``. Does not own: the record (``record``), the report's
other figures or where they are written (``qhlab.report.render``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from qhlab.design.tuning_config import Domain, optuna_distributions, quiet_optuna
from qhlab.report.figures import save_figure

__all__ = ["TUNING_FIGURES", "tuning_figures"]

TUNING_FIGURES = ("tuning_history.png", "tuning_importances.png")
# fANOVA fits a random forest: a fixed seed makes the importances, and so the figure, repeatable.
_IMPORTANCE_SEED = 0


def _study(tuning: dict[str, Any]):
    """An in-memory study holding the summary's complete trials, in trial order."""
    import optuna

    quiet_optuna()
    distributions = optuna_distributions({k: Domain.model_validate(v) for k, v in tuning["space"].items()})
    study = optuna.create_study(study_name=tuning["name"], direction="minimize")
    for trial in tuning["trials"]:
        if trial["state"] == "complete":
            study.add_trial(
                optuna.trial.create_trial(params=trial["params"], distributions=distributions, value=trial["mean"])
            )
    return study


def number_trials_from_one(ax: Any) -> None:
    """Label an Optuna history's x axis (trial numbers from 0) from 1, as the console and report count."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{round(x) + 1}"))
    ax.set_xlabel("Trial")


def tuning_figures(tuning: dict[str, Any] | None) -> dict[str, Any]:
    """{figure name: writer(path)} for the tuning's two figures; empty without a tuning or with
    fewer than two complete trials (a history of one point and importances of none say nothing)."""
    if tuning is None or sum(t["state"] == "complete" for t in tuning["trials"]) < 2:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    objective = tuning["objective"]["metric"]
    metric = (
        "largest planned MDE (reward unit)"
        if objective == "mde"
        else f"mean {objective}_H over fit seeds (reward unit)"
    )

    def save(path: Path, draw) -> None:
        with warnings.catch_warnings():
            # Optuna marks its matplotlib backend experimental on every call.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ax = draw(_study(tuning))
        if draw is optuna_plots.plot_optimization_history:
            ax.set_ylabel(metric)
            number_trials_from_one(ax)
        fig = ax.figure
        fig.set_size_inches(7, 4)
        save_figure(fig, path)

    def importances(study):
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=_IMPORTANCE_SEED)
        return optuna_plots.plot_param_importances(study, evaluator=evaluator)

    return {
        TUNING_FIGURES[0]: lambda path: save(path, optuna_plots.plot_optimization_history),
        TUNING_FIGURES[1]: lambda path: save(path, importances),
    }
