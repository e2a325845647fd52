"""Whole pilot-and-study pairs simulated from a pilot record, to measure the intervals' coverage.

The known model is the one ``qhlab.statistics.variance`` states, with its parts taken from a
real pilot record's fits (the demo's): for each comparison and retention margin, the scene
effects are resampled from the pilot's fit-averaged per-scene values and the fit-by-scene
residuals from its within-draw residuals (so the heavy tails of per-scene regret are kept), and
the seed and TRAIN-draw effects have the pilot's own estimates as their true sd (scenario
"pilot") or zero (scenario "zero": a comparison whose true seed and draw effects vanish, where a
clamped estimator would over-cover). Outside the model: the effects may be t3 (heavy-tailed,
scaled to the same sd) and the study's components may drift from the pilot's (each variance
multiplied by a factor). Each simulated pilot has a layout (by default the record's: its draws
and their fit counts, each seed on one draw), its own scenes, and is analysed by ``fit_noise``;
each simulated study fits two seeds on one fresh draw and its own scenes and reads its interval
from ``pooled_difference``, exactly as a report does (the floor and the study's seed check
included). Used by the calibration test and ``bench/calibration.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from scipy import stats

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


def _effects(rng: np.random.Generator, sd: float, size: tuple[int, ...] | int, kind: str) -> np.ndarray:
    """Seed or draw effects of standard deviation ``sd``: normal, or t3 scaled to the same sd."""
    if kind == "t3":
        return rng.standard_t(3, size) * (sd / math.sqrt(3.0))
    return rng.normal(0.0, 1.0, size) * sd


def simulate(
    values: np.ndarray,
    draws: list[int],
    *,
    reps: int,
    seed: int,
    scenario: str = "pilot",
    layout: tuple[int, int] | None = None,
    effects: str = "normal",
    drift: tuple[float, float] = (1.0, 1.0),
    study_seeds: int = 2,
    study_scenes: int | None = None,
    confidence: float = 0.95,
) -> dict:
    """Simulated pilot-and-study pairs of one contrast, each study's interval read as a report reads it.

    Args:
        values: float [F, n], the real pilot's per-fit per-scene values of one contrast.
        draws: [F], each fit's draw.
        reps: simulated pairs.
        seed: the simulation's RNG seed.
        scenario: "pilot" (true seed and draw sd: the pilot's estimates, clamped at 0) or "zero".
        layout: (TRAIN draws, seeds per draw) of each simulated pilot; None: the record's layout.
        effects: "normal" or "t3" seed and TRAIN-draw effects (both in pilot and study).
        drift: (seed, draw) factors of the study's seed and draw variances over the pilot's.
        study_seeds, study_scenes: the simulated study's seeds and scenes (default: the pilot's n).
        confidence: the intervals' level.

    Returns:
        ``{"covered": bool [reps] (the difference over TRAIN draws, delta), "covered_on_draw": bool
        [reps] (delta plus the study's own draw effect: what a one-draw pilot's interval states),
        "below", "below_on_draw": bool [reps] (the interval lies wholly below that truth: were the
        truth a retention margin's 0, the margin would read as retained, a wrong retention),
        "width_ratio": float [reps] (the interval's width over the study's scene-only one's, t(n - 1)
        times the scene standard error), "floored": bool [reps], "contradicted": bool [reps] (the
        seed check), "mde", "dof": float [reps], "tau", "omega"}``.
    """
    rng = np.random.default_rng(seed)
    scene_pool, residual_pool = _pools(values, draws)
    estimated = fit_noise(values, draws)
    tau = math.sqrt(max(0.0, estimated.seed_variance)) if scenario == "pilot" else 0.0
    omega = math.sqrt(max(0.0, estimated.draw_variance or 0.0)) if scenario == "pilot" else 0.0
    if layout is None:
        labels = draws
    else:
        labels = [d for d in range(layout[0]) for _ in range(layout[1])]
    draw_ids = sorted(set(labels))
    index = np.asarray([draw_ids.index(d) for d in labels])
    fits, n_pilot = len(labels), values.shape[1]
    n_study = study_scenes or n_pilot
    delta = float(values.mean())
    pilots = (
        delta
        + rng.choice(scene_pool, (reps, 1, n_pilot))
        + rng.choice(residual_pool, (reps, fits, n_pilot))
        + (_effects(rng, tau, (reps, fits), effects) + _effects(rng, omega, (reps, len(draw_ids)), effects)[:, index])[
            :, :, None
        ]
    )
    study_draw = _effects(rng, omega * math.sqrt(drift[1]), reps, effects)
    studies = (
        delta
        + rng.choice(scene_pool, (reps, 1, n_study))
        + rng.choice(residual_pool, (reps, study_seeds, n_study))
        + (_effects(rng, tau * math.sqrt(drift[0]), (reps, study_seeds), effects) + study_draw[:, None])[:, :, None]
    )
    scene_only = stats.t.ppf((1 + confidence) / 2, n_study - 1)
    flags = ("covered", "covered_on_draw", "below", "below_on_draw", "floored", "contradicted")
    out = {k: np.zeros(reps, dtype=bool) for k in flags}
    out |= {k: np.zeros(reps) for k in ("width_ratio", "mde", "dof")}
    for r in range(reps):
        pooled = pooled_difference(
            studies[r], noise=fit_noise(pilots[r], labels), noise_source="simulation", confidence=confidence
        )
        out["covered"][r] = pooled.low <= delta <= pooled.high
        out["covered_on_draw"][r] = pooled.low <= delta + study_draw[r] <= pooled.high
        # The whole interval below the truth: with the truth at a retention margin's 0, a wrong retention.
        out["below"][r] = pooled.high < delta
        out["below_on_draw"][r] = pooled.high < delta + study_draw[r]
        out["width_ratio"][r] = (pooled.high - pooled.low) / (2 * scene_only * pooled.scene_se)
        out["floored"][r] = pooled.floored
        out["contradicted"][r] = pooled.seed_check is not None and pooled.seed_check["contradicts"]
        out["mde"][r], out["dof"][r] = pooled.mde, pooled.dof
    return {**out, "tau": tau, "omega": omega}


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
    """The share of simulated pilot-and-study pairs (the record's layout) whose interval covers the true difference.

    Args:
        values: float [F, n], the real pilot's per-fit per-scene values of one contrast.
        draws: [F], each fit's draw (the simulated pilots keep this layout).
        scenario: "pilot" (true seed and draw sd: the pilot's estimates, clamped at 0) or "zero".
        reps: simulated pairs.
        seed: the simulation's RNG seed.
        study_seeds, study_scenes: the simulated study's seeds and scenes (default: the pilot's n).

    Returns:
        ``{"coverage", "reps", "tau", "omega", "median_mde", "median_dof", "floored",
        "narrowest"}`` (the share on the scene-only floor, the smallest width over the scene-only one's).
    """
    found = simulate(
        values,
        draws,
        reps=reps,
        seed=seed,
        scenario=scenario,
        study_seeds=study_seeds,
        study_scenes=study_scenes,
        confidence=confidence,
    )
    return {
        "coverage": float(found["covered"].mean()),
        "reps": reps,
        "tau": found["tau"],
        "omega": found["omega"],
        "median_mde": float(np.median(found["mde"])),
        "median_dof": float(np.median(found["dof"])),
        "floored": float(found["floored"].mean()),
        "narrowest": float(found["width_ratio"].min()),
    }


def planned_power(
    values: np.ndarray,
    draws: list[int],
    *,
    reps: int,
    seed: int,
    study_seeds: int = 2,
    study_scenes: int | None = None,
    confidence: float = 0.95,
    power: float = 0.8,
) -> dict:
    """The plan's MDE across independent pilots, and the power a study has at the MDE its pilot planned.

    Each replicate draws a fresh pilot of the record's layout from the same truth (the record's
    scene and residual pools, its estimated seed and TRAIN-draw sd), plans the study's MDE from it
    alone (``planned_difference``, as ``qhlab plan`` does), then simulates a study whose true
    difference is that planned MDE and asks whether its interval excludes 0. So the plan is judged
    against studies it did not see, never against the pilot it came from.

    Args:
        values: float [F, n], the real pilot's per-fit per-scene values of one contrast.
        draws: [F], each fit's draw (each simulated pilot keeps this layout).
        reps: simulated pilot-and-study pairs.
        seed: the simulation's RNG seed.
        study_seeds, study_scenes: the study's seeds and scenes (default: the pilot's n).
        confidence, power: the plan's level and power.

    Returns:
        ``{"power": share of studies that detected the planned MDE, "mde": [5th, 50th, 95th]
        percentiles of the planned MDE, "spread": 95th over 5th, "reps"}``.
    """
    from qhlab.statistics.replication import planned_difference

    rng = np.random.default_rng(seed)
    scene_pool, residual_pool = _pools(values, draws)
    estimated = fit_noise(values, draws)
    tau = math.sqrt(max(0.0, estimated.seed_variance))
    omega = math.sqrt(max(0.0, estimated.draw_variance or 0.0))
    draw_ids = sorted(set(draws))
    index = np.asarray([draw_ids.index(d) for d in draws])
    fits, n_pilot = len(draws), values.shape[1]
    n_study = study_scenes or n_pilot
    mdes, detected = np.zeros(reps), np.zeros(reps, dtype=bool)
    for r in range(reps):
        effects = _effects(rng, tau, fits, "normal") + _effects(rng, omega, len(draw_ids), "normal")[index]
        pilot = rng.choice(scene_pool, (1, n_pilot)) + rng.choice(residual_pool, (fits, n_pilot)) + effects[:, None]
        noise = fit_noise(pilot, draws)
        mde = planned_difference(noise, n_seeds=study_seeds, n_scenes=n_study, confidence=confidence, power=power)[
            "mde"
        ]
        study_effects = _effects(rng, tau, study_seeds, "normal") + _effects(rng, omega, 1, "normal")
        study = (
            mde
            + rng.choice(scene_pool, (1, n_study))
            + rng.choice(residual_pool, (study_seeds, n_study))
            + study_effects[:, None]
        )
        read = pooled_difference(study, noise=noise, noise_source="simulation", confidence=confidence)
        mdes[r], detected[r] = mde, read.low > 0 or read.high < 0
    low, middle, high = (float(np.percentile(mdes, q)) for q in (5, 50, 95))
    return {"power": float(detected.mean()), "mde": [low, middle, high], "spread": high / low, "reps": reps}


def _arm_rows(record: dict) -> list[tuple[str, str, str, str, float]]:
    """Every comparison and margin as (name, metric, arm, against, fraction): ``arm - fraction x against``."""
    design = record["design"]
    rows = [
        (f"{arm} - {against}", metric, arm, against, 1.0)
        for arm, against, _ in design["comparisons"]
        for metric in ("regret", "mae")
    ]
    for v in design["variants"]:
        rows.append((f"D_reg {v['arm']}", "regret", v["arm"], v["control"], design["regret_fraction"]))
        rows.append((f"D_mae {v['arm']}", "mae", v["arm"], v["matched"], design["mae_fraction"]))
    return rows


def simulate_arms(
    record: dict,
    *,
    reps: int,
    seed: int,
    layout: tuple[int, int] | None = None,
    effects: str = "normal",
    scales: dict[str, float] | None = None,
    shared_draw: float = 0.5,
    study_seeds: int = 2,
    confidence: float = 0.95,
) -> dict:
    """Pilot-and-study pairs simulated arm by arm: each arm has its own seed and TRAIN-draw effects.

    ``simulate`` draws each contrast's seed effect whole; here every arm's fit carries its own
    seed effect, of the arm's own sd (the record's estimate on that arm's fits, times its
    ``scales``), and its own TRAIN-draw effect, correlated across arms by ``shared_draw`` (arms
    fitted on one draw share that part of it). Scenes are resampled jointly, so the arms keep their
    per-scene means and their scene correlation; residuals are each arm's own. Every comparison and
    margin is then formed from the arms' tables (``arm - fraction x against``), as a report forms
    it, so rows that share an arm share its effects; each row's pilot is analysed by ``fit_noise``
    and its study read by ``pooled_difference``.

    Args:
        record: a pilot record (its design and fits).
        reps: simulated pairs.
        seed: the simulation's RNG seed.
        layout: (TRAIN draws, seeds per draw) of each simulated pilot; None: the record's.
        effects: "normal" or "t3" seed and draw effects.
        scales: ``{arm: factor}`` on that arm's seed and draw sd (default 1).
        shared_draw: the correlation of two arms' standardized effects of one TRAIN draw, in [0, 1].
        study_seeds: the study's seeds (one fresh draw, as many scenes as the record's).
        confidence: the intervals' level.

    Returns:
        ``{"rows": [R names], "covered": bool [reps, R], "below": bool [reps, R] (on the study's own
        draw where the pilot has one draw, as such an interval states), "tau": {arm: {metric: sd}}}``.
    """
    rng = np.random.default_rng(seed)
    keys = sorted({(f["draw"], f["seed"]) for f in record["fits"]})
    values = {(f["arm"], f["draw"], f["seed"]): f for f in record["fits"]}
    draws = [d for d, _ in keys]
    arms, metrics = record["design"]["arms"], ("regret", "mae")
    truth = {}
    for arm in arms:
        for metric in metrics:
            table = np.stack([np.asarray(values[(arm, d, s)][metric], dtype=np.float64) for d, s in keys])
            noise = fit_noise(table, draws)
            factor = (scales or {}).get(arm, 1.0)
            truth[(arm, metric)] = (
                table.mean(axis=0),
                _pools(table, draws)[1],
                factor * math.sqrt(max(0.0, noise.seed_variance)),
                factor * math.sqrt(max(0.0, noise.draw_variance or 0.0)),
            )
    labels = draws if layout is None else [d for d in range(layout[0]) for _ in range(layout[1])]
    draw_ids = sorted(set(labels))
    index = np.asarray([draw_ids.index(d) for d in labels])
    n = next(iter(truth.values()))[0].size
    rows = _arm_rows(record)
    covered = np.zeros((reps, len(rows)), dtype=bool)
    below = np.zeros((reps, len(rows)), dtype=bool)

    def tables(n_fits: int, draw_of: np.ndarray, n_draws: int) -> tuple[dict, dict]:
        # One draw's standardized effect: a part every arm shares and a part of its own.
        common = _effects(rng, 1.0, n_draws, effects)
        scenes = rng.integers(0, n, n)
        out, on_draw = {}, {}
        for arm in arms:
            own = _effects(rng, 1.0, n_draws, effects)
            z = math.sqrt(shared_draw) * common + math.sqrt(1.0 - shared_draw) * own
            for metric in metrics:
                mu, pool, tau, omega = truth[(arm, metric)]
                fit_effects = _effects(rng, tau, n_fits, effects) + omega * z[draw_of]
                out[(arm, metric)] = mu[scenes] + rng.choice(pool, (n_fits, n)) + fit_effects[:, None]
                on_draw[(arm, metric)] = omega * z[0]
        return out, on_draw

    for r in range(reps):
        pilot, _ = tables(len(labels), index, len(draw_ids))
        study, study_draw = tables(study_seeds, np.zeros(study_seeds, dtype=int), 1)
        for j, (_, metric, arm, against, fraction) in enumerate(rows):
            delta = float((truth[(arm, metric)][0] - fraction * truth[(against, metric)][0]).mean())
            if len(draw_ids) == 1:
                delta += study_draw[(arm, metric)] - fraction * study_draw[(against, metric)]
            pooled = pooled_difference(
                study[(arm, metric)] - fraction * study[(against, metric)],
                noise=fit_noise(pilot[(arm, metric)] - fraction * pilot[(against, metric)], labels),
                noise_source="simulation",
                confidence=confidence,
            )
            covered[r, j] = pooled.low <= delta <= pooled.high
            below[r, j] = pooled.high < delta
    tau = {arm: {m: truth[(arm, m)][2] for m in metrics} for arm in arms}
    return {"rows": [row[0] for row in rows], "covered": covered, "below": below, "tau": tau}
