"""The tuning objective as pure functions: a trial's score from its fits, the pruner, and the winner rule.

Owns: ``trial_score`` (mean and seed spread of the metric over a trial's fits), ``planned_mde``
(an "mde" trial's score: the largest planned MDE of the study's margins, from its fits),
``running_means`` (a trial's intermediate values at the pruner's rungs), ``prune_at`` (the
declared Optuna pruner's decision at one rung, from the complete trials of earlier batches) and
``pick_winner`` (the rule the config declares, applied mechanically). Each is a function of
plain numbers, torch-free, so ``qhlab verify`` recomputes them from a record. Does not own:
fitting (``run``) or the record (``record``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["pick_winner", "planned_mde", "prune_at", "running_means", "trial_score"]


def trial_score(values: Sequence[float]) -> dict[str, float | None]:
    """The score of one trial from its fits' metric values.

    Args:
        values: float [S], the metric at H of each fit seed, in the objective's seed order.

    Returns:
        ``{"mean": the mean over the S fits, "seed_sd": the sample standard deviation
        (ddof 1; None when S = 1)}``. Sums run in seed order, so the result is bit-exact
        wherever it is recomputed.
    """
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"trial_score: values={values!r}; allowed: at least one finite number")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return {"mean": mean, "seed_sd": None}
    return {"mean": mean, "seed_sd": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))}


def planned_mde(fits: Sequence[Mapping], design: Mapping) -> dict:
    """An "mde" trial's score: the largest planned MDE over the study's retention margins.

    Each margin's per-scene values (D_reg: the variant's regret minus ``regret_fraction`` x its
    structural control's; D_mae: its MAE minus ``mae_fraction`` x its matched control's) from the
    trial's fits of the same seed give the margin's fit noise on one TRAIN draw
    (``qhlab.statistics.variance.fit_noise``), and ``qhlab.statistics.replication.planned_difference``
    the MDE a study of the design's seeds and validation scenes would read: the paired seed effect
    the study's intervals carry, never the TRAIN-draw effect (one draw measures none).

    Args:
        fits: the trial's fits, ``[{"arm", "seed", "scenes": {"regret": float [n], "mae": float [n]}}]``,
            every arm of the design once per seed.
        design: ``tuning_config.power_design``'s.

    Returns:
        ``{"mean": the largest planned MDE (the reward's unit), "seed_sd": None, "margins": [{"variant",
        "D_reg": {"mde", "se", "dof", "tau"}, "D_mae": ...}]}``.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy and scipy.
    import numpy as np

    # Lazy: as numpy, scipy (the planned MDE's quantiles).
    from qhlab.statistics.replication import planned_difference
    from qhlab.statistics.variance import fit_noise

    seeds = sorted({int(f["seed"]) for f in fits})
    values = {(f["arm"], int(f["seed"])): f["scenes"] for f in fits}

    def table(arm: str, metric: str) -> np.ndarray:
        return np.stack([np.asarray(values[(arm, s)][metric], dtype=np.float64) for s in seeds])

    margins = []
    for variant in design["variants"]:
        entry: dict = {"variant": variant["arm"]}
        for name, metric, against, fraction in (
            ("D_reg", "regret", variant["control"], design["regret_fraction"]),
            ("D_mae", "mae", variant["matched"], design["mae_fraction"]),
        ):
            noise = fit_noise(table(variant["arm"], metric) - fraction * table(against, metric), [0] * len(seeds))
            planned = planned_difference(
                noise,
                n_seeds=int(design["study_seeds"]),
                n_scenes=int(design["validation_scenes"]),
                confidence=float(design["confidence"]),
            )
            entry[name] = {k: planned[k] for k in ("mde", "se", "dof")} | {"tau": noise.as_dict()["tau"]}
        margins.append(entry)
    worst = max(m[name]["mde"] for m in margins for name in ("D_reg", "D_mae"))
    return {"mean": worst, "seed_sd": None, "margins": margins}


def pick_winner(trials: Sequence[Mapping], *, band: float, max_seed_sd: float | None) -> dict:
    """The winning trial by the declared rule.

    Admissible trials are complete (``state == "complete"``) with a ``seed_sd`` within
    ``max_seed_sd`` (when set). Among them the best is the lowest ``mean``; every trial within
    ``band`` of it is tied, and the tie goes to the lowest ``cost``, then the lowest mean, then
    the lowest trial number.

    Args:
        trials: ``[{"number", "state", "mean", "seed_sd", "cost"}]`` (others are ignored).
        band: metres of the tie band (>= 0).
        max_seed_sd: the spread limit, or None.

    Returns:
        ``{"number": the winner's trial number, or None when no trial is admissible,
        "admissible": [numbers], "tied": [numbers within the band, by rule order],
        "margin": the runner-up's mean minus the winner's (None with fewer than two admissible)}``.
    """
    admissible = [
        t
        for t in trials
        if t["state"] == "complete"
        and (max_seed_sd is None or (t["seed_sd"] is not None and t["seed_sd"] <= max_seed_sd))
    ]
    if not admissible:
        return {"number": None, "admissible": [], "tied": [], "margin": None}
    best = min(t["mean"] for t in admissible)
    order = sorted(
        (t for t in admissible if t["mean"] <= best + band), key=lambda t: (t["cost"], t["mean"], t["number"])
    )
    winner = order[0]
    others = [t["mean"] for t in admissible if t["number"] != winner["number"]]
    return {
        "number": int(winner["number"]),
        "admissible": sorted(int(t["number"]) for t in admissible),
        "tied": [int(t["number"]) for t in order],
        "margin": None if not others else min(others) - winner["mean"],
    }


def running_means(values: Sequence[float], rungs: Sequence[int]) -> dict[str, float]:
    """A trial's intermediate values: the mean of its first ``r`` fits' metric, for each rung ``r``
    it reached.

    Args:
        values: float [F], the metric of the fits made so far, in seed order.
        rungs: the pruner's fit counts.

    Returns:
        ``{str(r): trial_score(values[:r])["mean"]}`` for every ``r`` in ``rungs`` with ``r <= F``.
    """
    return {str(r): trial_score(values[:r])["mean"] for r in rungs if r <= len(values)}


def prune_at(pruner: Mapping, earlier: Sequence[Mapping], running: Mapping[str, float], rung: int) -> bool:
    """Whether the declared pruner stops a trial after ``rung`` fits (direction: minimize).

    Optuna's pruner (``MedianPruner``, or ``PercentilePruner`` at ``percentile``) with
    ``n_startup_trials = startup_trials``, no warm-up steps, and every rung a step decides, in an
    in-memory study holding only the complete trials of earlier batches.

    Args:
        pruner: the config's ``pruner`` table (``kind``, ``percentile``, ``startup_trials``).
        earlier: the complete trials of earlier batches, each ``{"mean", "intermediate": {str(r): value}}``.
        running: this trial's intermediate values so far (``running_means``), ``rung`` included.
        rung: the fit count decided at.

    Returns:
        True when the trial is pruned at ``rung``.
    """
    import optuna

    common = {"n_startup_trials": int(pruner["startup_trials"]), "n_warmup_steps": 0, "interval_steps": 1}
    chosen = (
        optuna.pruners.MedianPruner(**common)
        if pruner["kind"] == "median"
        else optuna.pruners.PercentilePruner(float(pruner["percentile"]), **common)
    )
    study = optuna.create_study(direction="minimize", pruner=chosen)
    for trial in earlier:
        study.add_trial(
            optuna.trial.create_trial(
                value=float(trial["mean"]),
                state=optuna.trial.TrialState.COMPLETE,
                intermediate_values={int(r): float(v) for r, v in trial["intermediate"].items()},
            )
        )
    current = study.ask()
    for r in sorted(int(k) for k in running if int(k) <= rung):
        current.report(float(running[str(r)]), r)
    return bool(current.should_prune())
