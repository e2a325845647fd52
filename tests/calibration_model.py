"""Whole pilot-and-study pairs simulated from a pilot record, to measure the intervals' coverage.

The known model is the one ``qhlab.statistics.variance`` states, with its parts taken from a
real pilot record's fits (the demo's): for each comparison and retention margin, the scene
effects are resampled from the pilot's fit-averaged per-scene values and the fit-by-scene
residuals from its within-draw residuals (so the heavy tails of per-scene regret are kept), and
the seed and TRAIN-draw effects are normal with the pilot's own estimates as their true sd
(scenario "pilot") or zero (scenario "zero": a comparison whose true seed and draw effects
vanish, where a clamped estimator would over-cover). Each simulated pilot has the record's
layout (its draws and their fit counts, each seed on one draw), its own scenes, and is analysed
by ``fit_noise``; each simulated study fits two seeds on one fresh draw and its own scenes and
reads its interval from ``pooled_difference``, exactly as a report does. Used by the calibration
test and ``bench/calibration.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from qhlab.statistics.replication import pooled_difference
from qhlab.statistics.variance import fit_noise


def contrasts(record: dict) -> Iterator[tuple[str, str, np.ndarray, list[int]]]:
    """Every comparison's and margin's (name, metric, per-fit per-scene table [F, n], draw of each fit)."""
    fits = sorted(record["fits"], key=lambda f: (f["draw"], f["seed"]))
    keys = sorted({(f["draw"], f["seed"]) for f in fits})
    values = {(f["arm"], f["draw"], f["seed"]): f for f in fits}
    draws = [d for d, _ in keys]
    design = record["design"]

    def table(arm: str, metric: str) -> np.ndarray:
        return np.stack([np.asarray(values[(arm, d, s)][metric], dtype=np.float64) for d, s in keys])

    for arm, against, _ in design["comparisons"]:
        for metric in ("regret", "mae"):
            yield f"{arm} - {against}", metric, table(arm, metric) - table(against, metric), draws
    for v in design["variants"]:
        yield (
            f"D_reg {v['arm']}",
            "regret",
            table(v["arm"], "regret") - design["regret_fraction"] * table(v["control"], "regret"),
            draws,
        )
        yield (
            f"D_mae {v['arm']}",
            "mae",
            table(v["arm"], "mae") - design["mae_fraction"] * table(v["matched"], "mae"),
            draws,
        )


def _pools(values: np.ndarray, draws: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Centered scene effects and within-draw residuals (rescaled to the residual's variance)."""
    residuals = []
    for draw in sorted(set(draws)):
        rows = [i for i, d in enumerate(draws) if d == draw]
        table = values[rows]
        rest = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()
        residuals.append((rest * math.sqrt(len(rows) / (len(rows) - 1))).ravel())
    scenes = values.mean(axis=0)
    return scenes - scenes.mean(), np.concatenate(residuals)


def coverage(
    values: np.ndarray,
    draws: list[int],
    *,
    scenario: str,
    reps: int,
    seed: int,
    study_seeds: int = 2,
    study_scenes: int | None = None,
    confidence: float = 0.95,
) -> dict:
    """The share of simulated pilot-and-study pairs whose interval covers the true difference.

    Args:
        values: float [F, n], the real pilot's per-fit per-scene values of one contrast.
        draws: [F], each fit's draw (the simulated pilots keep this layout).
        scenario: "pilot" (true seed and draw sd: the pilot's estimates, clamped at 0) or "zero".
        reps: simulated pairs.
        seed: the simulation's RNG seed.
        study_seeds, study_scenes: the simulated study's seeds and scenes (default: the pilot's n).

    Returns:
        ``{"coverage", "reps", "tau", "omega", "median_mde", "median_dof"}``.
    """
    rng = np.random.default_rng(seed)
    scene_pool, residual_pool = _pools(values, draws)
    estimated = fit_noise(values, draws)
    tau = math.sqrt(max(0.0, estimated.seed_variance)) if scenario == "pilot" else 0.0
    omega2 = estimated.draw_variance
    omega = math.sqrt(max(0.0, omega2 or 0.0)) if scenario == "pilot" else 0.0
    fits, n_pilot = values.shape
    n_study = study_scenes or n_pilot
    labels = sorted(set(draws))
    index = np.asarray([labels.index(d) for d in draws])
    delta = float(values.mean())
    covered, mdes, dofs = 0, [], []
    for _ in range(reps):
        pilot = (
            delta
            + rng.choice(scene_pool, n_pilot)[None, :]
            + rng.choice(residual_pool, (fits, n_pilot))
            + (rng.normal(0.0, tau, fits) + rng.normal(0.0, omega, len(labels))[index])[:, None]
        )
        study = (
            delta
            + rng.choice(scene_pool, n_study)[None, :]
            + rng.choice(residual_pool, (study_seeds, n_study))
            + (rng.normal(0.0, tau, study_seeds) + rng.normal(0.0, omega))[:, None]
        )
        pooled = pooled_difference(
            study, noise=fit_noise(pilot, draws), noise_source="simulation", confidence=confidence
        )
        covered += pooled.low <= delta <= pooled.high
        mdes.append(pooled.mde)
        dofs.append(pooled.dof)
    return {
        "coverage": covered / reps,
        "reps": reps,
        "tau": tau,
        "omega": omega,
        "median_mde": float(np.median(mdes)),
        "median_dof": float(np.median(dofs)),
    }
