"""The study's check of its pilot: its own seeds against the pilot's seed component of each row.

Owns: ``seed_spread_check`` (one comparison's or margin's F test of the study's seed spread
against the pilot's prediction, a ``SeedCheck``), ``family_seed_check`` (the family's reading,
Bonferroni over rows that share arms and seeds), ``seed_spread`` (the spread and residual mean
square of a seeds-by-scenes table) and ``differences_table`` (the checked table every seed-aware
statistic reads). Pure functions over arrays. Does not own: the interval that widens where the
check contradicts the pilot (``qhlab.statistics.replication.pooled_difference``) or the pilot's
components (``qhlab.statistics.variance``).

The study's own S seeds carry evidence on the seed component: their scene means ``m_s`` spread
with ``E Var_s(m_s) = tau^2 + sigma_e^2 / n`` (S - 1 degrees of freedom), which the pilot
predicts as ``MS_w - r_p / n_p + r / n``. Their ratio is an F statistic; its upper tail is the
p-value (a spread below the prediction puts no interval at risk). The TRAIN-draw component cannot
be checked: a study fits one draw.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import special

from qhlab.evidence.errors import input_error
from qhlab.statistics.bootstrap import finite_values
from qhlab.statistics.variance import FitNoise, floored_satterthwaite

__all__ = [
    "SEED_CHECK_THRESHOLD",
    "SeedCheck",
    "differences_table",
    "family_seed_check",
    "seed_spread",
    "seed_spread_check",
]

SEED_CHECK_THRESHOLD = 0.05
"""The p-value below which a study's own seeds contradict its pilot's seed component (``seed_spread_check``)."""


@dataclass(frozen=True)
class SeedCheck:
    """The study's own seeds against its pilot's seed component, for one comparison (``seed_spread_check``).

    Attributes:
        observed: the variance of the study's seed means, ``Var_s(mean_i d[s, i])`` (S - 1 dof).
        predicted: what the pilot predicts of it, ``MS_w - r_p / n_p + r / n``, at least ``r / n``.
        statistic: F = observed / predicted.
        dof_observed: S - 1.
        dof_predicted: Satterthwaite's degrees of freedom of ``predicted``.
        p_value: the upper tail of F(dof_observed, dof_predicted) at ``statistic``.
        threshold: the p-value below which the seeds contradict the pilot.
        contradicts: p_value < threshold.
        pilot_seed_variance: the pilot's tau^2 (unbiased, may be negative).
        study_seed_variance: the study's own tau^2, ``observed - r / n`` (may be negative).
        verdict: "consistent with the pilot" or "contradicts the pilot".
    """

    observed: float
    predicted: float
    statistic: float
    dof_observed: int
    dof_predicted: float
    p_value: float
    threshold: float
    contradicts: bool
    pilot_seed_variance: float
    study_seed_variance: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        """The check as a JSON-able dict."""
        return asdict(self)


def differences_table(call: str, differences: Any) -> np.ndarray:
    """``differences`` as a checked float64 [n_seeds >= 1, n_scenes >= 2] table of finite values.

    Raises:
        QhInputError: another shape, or a value that is not finite (named by ``call``).
    """
    array = np.asarray(differences, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 2:
        raise input_error(
            call,
            "differences.shape",
            tuple(array.shape),
            "[n_seeds >= 1, n_scenes >= 2]",
            "one row of per-scene paired differences per training seed, same scenes",
        )
    return finite_values(call, "differences", array, "finite per-scene differences")


def seed_spread(d: np.ndarray) -> tuple[float, float]:
    """The spread of a seeds-by-scenes table's seed means, and its residual mean square.

    Args:
        d: float64 [n_seeds >= 2, n_scenes >= 2], checked (``differences_table``).

    Returns:
        ``(Var_s(mean_i d[s, i]), residual mean square of the two-way table)``.
    """
    n_seeds, n_scenes = d.shape
    seed_means = d.mean(axis=1)
    residual = d - seed_means[:, None] - d.mean(axis=0)[None, :] + d.mean()
    return float(seed_means.var(ddof=1)), float((residual**2).sum() / ((n_seeds - 1) * (n_scenes - 1)))


def seed_spread_check(
    differences: Any, noise: FitNoise, *, threshold: float = SEED_CHECK_THRESHOLD
) -> SeedCheck | None:
    """Test a pilot's seed component of one comparison against the study's own seeds.

    The study's seed means spread with ``E Var_s(m_s) = tau^2 + sigma_e^2 / n`` on S - 1 degrees
    of freedom; the pilot predicts ``MS_w - r_p / n_p + r / n`` (its tau^2 plus the study's own
    residual part, at least ``r / n``: a spread below what the residual alone puts there is no
    seed variance), on Satterthwaite's degrees of freedom (``qhlab.statistics.variance.floored_satterthwaite``). The two
    are independent (other fits, other scenes), so their ratio is F-distributed where the pilot is
    right; the p-value is its upper tail (a study whose seeds spread less than predicted puts no
    interval at risk).

    Args:
        differences: float [n_seeds, n_scenes], the study's per-scene paired differences (or a
            margin's per-scene values) for each training seed, same scenes.
        noise: this comparison's pilot components (``qhlab.statistics.variance.fit_noise``).
        threshold: the p-value below which the study's seeds contradict the pilot, in (0, 1).

    Returns:
        A ``SeedCheck``, or None with one seed (no spread to test).
    """
    call = "seed_spread_check"
    d = differences_table(call, differences)
    if not isinstance(noise, FitNoise):
        raise input_error(call, "noise", type(noise).__name__, "a FitNoise", "build it with fit_noise")
    if not 0 < threshold < 1:
        raise input_error(call, "threshold", threshold, "a p-value in (0, 1)", "e.g. SEED_CHECK_THRESHOLD")
    n_seeds, n_scenes = d.shape
    if n_seeds < 2:
        return None
    observed, residual = seed_spread(d)
    # The study's residual part first: it is the floor (tau^2 >= 0), and the other terms the pilot's.
    terms = [
        (residual / n_scenes, float((n_seeds - 1) * (n_scenes - 1))),
        (noise.ms_within, float(noise.dof_within)),
        (-noise.residual / noise.n_scenes, float(noise.residual_dof)),
    ]
    predicted, dof = floored_satterthwaite(terms, scene_terms=1)
    statistic = observed / predicted if predicted > 0 else (math.inf if observed > 0 else 1.0)
    p_value = float(special.fdtrc(n_seeds - 1, dof, statistic)) if math.isfinite(statistic) else 0.0
    contradicts = p_value < threshold
    return SeedCheck(
        observed=observed,
        predicted=predicted,
        statistic=float(statistic),
        dof_observed=n_seeds - 1,
        dof_predicted=float(dof),
        p_value=p_value,
        threshold=float(threshold),
        contradicts=bool(contradicts),
        pilot_seed_variance=float(noise.seed_variance),
        study_seed_variance=observed - residual / n_scenes,
        verdict="contradicts the pilot" if contradicts else "consistent with the pilot",
    )


def family_seed_check(p_values: Any, *, threshold: float = SEED_CHECK_THRESHOLD) -> dict[str, Any]:
    """The family's reading of its rows' seed checks (``seed_spread_check``), valid whatever their dependence.

    A study's comparisons and margins share arms and seeds, so their seed spreads are correlated
    and a statistic pooled over them as if independent would overstate the evidence. Bonferroni's
    bound needs no independence: the family's p-value is ``min(1, C * min p)`` over its C rows.

    Args:
        p_values: float [C], each row's ``SeedCheck.p_value`` (C >= 1).
        threshold: as ``seed_spread_check``'s.

    Returns:
        ``{"rows": C, "contradicted": rows with p < threshold, "smallest_p", "family_p",
        "threshold", "verdict"}``; verdict "consistent with the pilot" or "contradicts the pilot"
        (family_p < threshold).
    """
    p = np.asarray(p_values, dtype=np.float64).ravel()
    if p.size < 1 or not np.all((p >= 0) & (p <= 1)):
        raise input_error(
            "family_seed_check", "p_values", p.tolist()[:4], "one p-value in [0, 1] per row", "the rows' seed checks"
        )
    family = min(1.0, float(p.size * p.min()))
    return {
        "rows": int(p.size),
        "contradicted": int((p < threshold).sum()),
        "smallest_p": float(p.min()),
        "family_p": family,
        "threshold": float(threshold),
        "verdict": "contradicts the pilot" if family < threshold else "consistent with the pilot",
    }
