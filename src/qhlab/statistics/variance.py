"""The pilot's variance components as pure functions over per-scene arrays.

Owns: ``draw_effect_sd`` and ``draw_effect_dof`` (the TRAIN-draw component of a comparison, from
fits on several TRAIN draws, and its degrees of freedom) and ``pilot_components`` (every
comparison's and margin's seed effect tau and draw effect, and the maxima a study freezes). Both
take plain arrays and return plain numbers, so ``qhlab verify`` recomputes a pilot record from its
fits' values. Does not own: the seed-effect estimator
(``qhlab.statistics.replication.seed_effect_sd``, the same one the report's intervals use) or
fitting (``run``).

The model of one comparison's per-scene paired difference, fitted on TRAIN draw d with training
seed s, on scene i of the fixed tuning validation population, extends the report's:
``x[d, s, i] = delta + w_d + u_s + (wu)_ds + v_i + e[d, s, i]``. ``w_d`` is the TRAIN-draw effect
(variance omega^2): which TRAIN population a study happened to draw moves every seed's fit the
same way (Bouthillier et al. 2021 count it as a source of its own). A study fits one draw, so
its seeds cannot see omega; only fits on several draws can.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["draw_effect_dof", "draw_effect_sd", "pilot_components"]


def _draw_mean_squares(table: Any) -> tuple[float, float, int, int]:
    """(B, I, D, S): the variance of the draws' means, the draw-by-seed interaction mean square,
    the draws and the seeds, of a draws-by-seeds-by-scenes table's scene means."""
    x = np.asarray(table, dtype=np.float64)
    if x.ndim != 3 or x.shape[0] < 2 or x.shape[1] < 2 or x.shape[2] < 1:
        raise ValueError(
            f"draw_effect_sd: table.shape={tuple(x.shape)} is not allowed; allowed: "
            "[draws >= 2, seeds >= 2, scenes >= 1]"
        )
    if not np.isfinite(x).all():
        raise ValueError("draw_effect_sd: table holds non-finite values; allowed: finite per-scene values")
    means = x.mean(axis=2)
    d, s = means.shape
    residual = means - means.mean(axis=1, keepdims=True) - means.mean(axis=0, keepdims=True) + means.mean()
    interaction = float((residual**2).sum() / ((d - 1) * (s - 1)))
    return float(means.mean(axis=1).var(ddof=1)), interaction, d, s


def draw_effect_sd(table: Any) -> float:
    """The TRAIN-draw effect's standard deviation omega of a draws-by-seeds-by-scenes table.

    The pilot fits the same seeds on every draw, so a seed's own effect (its initial weights)
    is shared by the draws and cancels in the draws' means. A two-way analysis of the
    draw-by-seed scene means ``m[d, s] = w_d + u_s + (wu)_ds``: the draws' means vary by
    ``omega^2 + I / S``, where ``I``, the interaction mean square, holds what varies by draw and
    seed together. So ``omega^2 = max(0, Var_d(mean_s m) - I / S)``. Seeds that share nothing
    across draws leave this unbiased too (their effect is then part of the interaction).

    Args:
        table: float [D >= 2, S >= 2, n_scenes >= 1], per-scene values (a paired difference or a
            margin) of each draw and seed, the same scenes and seeds in every draw.

    Returns:
        omega, in the unit of ``table`` (metres), >= 0.

    Raises:
        ValueError: a table of another shape, or non-finite values.
    """
    between, interaction, _, s = _draw_mean_squares(table)
    return math.sqrt(max(0.0, between - interaction / s))


def draw_effect_dof(table: Any) -> float:
    """The Satterthwaite degrees of freedom of ``draw_effect_sd``'s omega^2, a difference of mean squares.

    ``(B - I / S)^2 / (B^2 / (D - 1) + (I / S)^2 / ((D - 1)(S - 1)))``, never more than D - 1,
    and floored at 1: a clamped or tiny omega^2 adds (almost) nothing to an interval's
    variance, so its degrees of freedom hardly move the interval.

    Args:
        table: as ``draw_effect_sd``'s.

    Returns:
        The degrees of freedom, in [1, D - 1] (1 when D = 2).
    """
    between, interaction, d, s = _draw_mean_squares(table)
    omega2 = max(0.0, between - interaction / s)
    terms = between**2 / (d - 1) + (interaction / s) ** 2 / ((d - 1) * (s - 1))
    dof = omega2**2 / terms if terms > 0 else float(d - 1)
    return float(min(d - 1, max(1.0, dof)))


def pilot_components(
    values: Mapping[tuple[str, int, int], Mapping[str, Any]],
    *,
    arms: Sequence[str],
    comparisons: Sequence[tuple[str, str, str]],
    variants: Sequence[Mapping[str, str]],
    regret_fraction: float,
    mae_fraction: float,
    main_draw: int,
    seeds: Sequence[int],
    draws: Sequence[int],
    draw_seeds: Sequence[int],
) -> dict:
    """Every comparison's and retention margin's variance components, and their maxima.

    Args:
        values: ``{(arm, draw, seed): {"regret": float [n_scenes], "mae": float [n_scenes]}}``,
            each fit's per-scene metric at H on the tuning validation population.
        arms: every arm of the study (each must have a fit per (draw, seed) below).
        comparisons: (arm, against, relation) of the report's paired comparisons.
        variants: ``[{"arm", "control", "matched"}]``: each variant's retention margins
            (D_reg against its structural control, D_mae against its matched control).
        regret_fraction, mae_fraction: the study's retention thresholds.
        main_draw: the TRAIN seed every arm is fitted on with every one of ``seeds``.
        seeds: the pilot's training seeds (>= 2).
        draws: every TRAIN draw of the draw component, ``main_draw`` first (empty: none).
        draw_seeds: the seeds fitted on each draw (>= 2, a subset of ``seeds``).

    Returns:
        ``{"comparisons": [{"arm", "against", "relation", "tau": {metric: float}, "draw_sd":
        {metric: float} | None, "draw_dof": {metric: float} | None}], "margins": [{"variant",
        "tau": {"regret": D_reg's, "mae": D_mae's}, "draw_sd": ..., "draw_dof": ...}],
        "seed_variance": {"regret", "mae", "seeds"}: the largest tau of each metric,
        "train_draw": {"regret", "mae": the largest omega of each metric, "regret_dof",
        "mae_dof": its degrees of freedom, "draws", "seeds_per_draw"}, or None without draws}``.
    """
    # Lazy: keeps importing this module free of scipy (the estimator's module needs it).
    from qhlab.statistics.replication import seed_effect_sd

    def metric(arm: str, draw: int, seed: int, name: str) -> np.ndarray:
        return np.asarray(values[(arm, draw, seed)][name], dtype=np.float64)

    def components(per_scene) -> dict:
        tau = seed_effect_sd(np.stack([per_scene(main_draw, s) for s in seeds]))
        if not draws:
            return {"tau": tau, "draw_sd": None, "draw_dof": None}
        table = np.stack([np.stack([per_scene(d, s) for s in draw_seeds]) for d in draws])
        return {"tau": tau, "draw_sd": draw_effect_sd(table), "draw_dof": draw_effect_dof(table)}

    missing = sorted(
        {(a, d, s) for a in arms for d, ss in ((main_draw, seeds), *((d, draw_seeds) for d in draws)) for s in ss}
        - set(values)
    )
    if missing:
        raise ValueError(
            f"pilot_components: no fit for (arm, draw, seed) {missing[:3]}; allowed: a fit of every arm "
            "on every draw and seed of the design"
        )
    rows, margins = [], []
    for arm, against, relation in comparisons:
        parts = {
            # components() calls each lambda before the loop moves on.
            m: components(lambda d, s, m=m: metric(arm, d, s, m) - metric(against, d, s, m))  # noqa: B023
            for m in ("regret", "mae")
        }
        rows.append(
            {
                "arm": arm,
                "against": against,
                "relation": relation,
                "tau": {m: p["tau"] for m, p in parts.items()},
                "draw_sd": None if not draws else {m: p["draw_sd"] for m, p in parts.items()},
                "draw_dof": None if not draws else {m: p["draw_dof"] for m, p in parts.items()},
            }
        )
    for variant in variants:
        arm, control, matched = variant["arm"], variant["control"], variant["matched"]
        parts = {  # components() calls each lambda before the loop moves on
            "regret": components(
                lambda d, s: metric(arm, d, s, "regret") - regret_fraction * metric(control, d, s, "regret")  # noqa: B023
            ),
            "mae": components(
                lambda d, s: metric(arm, d, s, "mae") - mae_fraction * metric(matched, d, s, "mae")  # noqa: B023
            ),
        }
        margins.append(
            {
                "variant": arm,
                "tau": {m: p["tau"] for m, p in parts.items()},
                "draw_sd": None if not draws else {m: p["draw_sd"] for m, p in parts.items()},
                "draw_dof": None if not draws else {m: p["draw_dof"] for m, p in parts.items()},
            }
        )
    every = rows + margins
    seed_variance = {m: max(r["tau"][m] for r in every) for m in ("regret", "mae")}
    seed_variance["seeds"] = len(seeds)
    train_draw = None
    if draws:
        # The largest omega of each metric, with its own comparison's degrees of freedom.
        largest = {m: max(every, key=lambda r, m=m: r["draw_sd"][m]) for m in ("regret", "mae")}
        train_draw = {m: largest[m]["draw_sd"][m] for m in ("regret", "mae")}
        train_draw.update({f"{m}_dof": largest[m]["draw_dof"][m] for m in ("regret", "mae")})
        train_draw.update(draws=len(draws), seeds_per_draw=len(draw_seeds))
    return {"comparisons": rows, "margins": margins, "seed_variance": seed_variance, "train_draw": train_draw}
