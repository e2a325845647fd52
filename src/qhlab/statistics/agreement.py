"""The agreement of two studies of one design on independent population pairs (``agreement_test``).

Owns: a pure function over the two studies' seed-pooled estimates, standard errors and degrees of
freedom, one per comparison (each difference scored against its Welch-Satterthwaite t, mapped to
a normal score, and the sum of squares read on chi-square with K degrees of freedom), and the
distribution of that sum when the comparisons are correlated (``agreement_distribution``). Does not
own: the estimates themselves (``replication.pooled_difference``) or reading two studies
(``qhlab.replication``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from qhlab.evidence.errors import input_error

__all__ = ["agreement_distribution", "agreement_test"]


def _agreement_arrays(
    call: str, estimates_a: Any, se_a: Any, estimates_b: Any, se_b: Any, dof_a: Any, dof_b: Any
) -> dict[str, np.ndarray]:
    """The two studies' checked arrays, the degrees of freedom filled with inf where None.

    Args:
        call: the refusing call.
        estimates_a, se_a, estimates_b, se_b, dof_a, dof_b: as ``agreement_test``'s.

    Returns:
        ``{"estimates_a", "se_a", "estimates_b", "se_b", "dof_a", "dof_b"}``, each float64 [K].
    """
    arrays = {}
    for name, value in (("estimates_a", estimates_a), ("se_a", se_a), ("estimates_b", estimates_b), ("se_b", se_b)):
        array = np.asarray(value, dtype=np.float64)
        if array.ndim != 1 or array.size < 1 or not np.isfinite(array).all():
            raise input_error(
                call,
                name,
                value,
                "a 1-D array of finite floats with at least one comparison",
                "pass each study's seed-pooled estimates and standard errors, one per comparison",
            )
        arrays[name] = array
    for name, value in (("dof_a", dof_a), ("dof_b", dof_b)):
        array = np.full(arrays["se_a"].shape, np.inf) if value is None else np.asarray(value, dtype=np.float64)
        if array.ndim != 1 or np.isnan(array).any() or (array <= 0).any():
            raise input_error(
                call, name, value, "a 1-D array of degrees of freedom > 0 (inf: a known variance)", "or None"
            )
        arrays[name] = array
    if len({a.size for a in arrays.values()}) != 1:
        raise input_error(
            call,
            "estimates_b",
            {k: int(a.size) for k, a in arrays.items()},
            "arrays of one length K (the same comparisons, in the same order)",
            "both studies must report the same comparisons",
        )
    for name in ("se_a", "se_b"):
        if (arrays[name] < 0).any():
            raise input_error(
                call, name, arrays[name].tolist(), "standard errors >= 0", "a standard error is never negative"
            )
    return arrays


def _agreement_z(call: str, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each comparison's z and the Welch-Satterthwaite degrees of freedom it is read on.

    Args:
        call: the refusing call.
        arrays: ``_agreement_arrays``'s checked float64 [K] arrays.

    Returns:
        ``(z, welch)``: float64 [K] each; welch is inf where z is normal (or exactly 0).
    """
    difference = arrays["estimates_a"] - arrays["estimates_b"]
    va, vb = arrays["se_a"] ** 2, arrays["se_b"] ** 2
    scale = np.sqrt(va + vb)
    exact = scale == 0
    if (exact & (difference != 0)).any():
        raise input_error(
            call,
            "se_a",
            arrays["se_a"].tolist(),
            "a standard error > 0 in one study wherever the two estimates differ",
            "two estimates without uncertainty that differ cannot be compared by z",
        )
    # Two estimates without uncertainty that are equal agree exactly: z = 0.
    z = np.where(exact, 0.0, difference / np.where(exact, 1.0, scale))
    with np.errstate(divide="ignore", invalid="ignore"):
        welch = (va + vb) ** 2 / (va**2 / arrays["dof_a"] + vb**2 / arrays["dof_b"])
    welch = np.where(exact | ~np.isfinite(welch), np.inf, welch)
    return z, welch


def _normal_scores(z: np.ndarray, welch: np.ndarray) -> np.ndarray:
    """The normal score of each z's own tail probability (t with the Welch dof; normal where it is inf).

    Args:
        z: float64 [K].
        welch: float64 [K], degrees of freedom (inf: normal).

    Returns:
        float64 [K], with z's sign.
    """
    tail = np.where(
        np.isinf(welch), stats.norm.sf(np.abs(z)), stats.t.sf(np.abs(z), np.where(np.isinf(welch), 1, welch))
    )
    return np.sign(z) * stats.norm.isf(tail)


def agreement_test(
    estimates_a: Any,
    se_a: Any,
    estimates_b: Any,
    se_b: Any,
    *,
    dof_a: Any = None,
    dof_b: Any = None,
) -> dict[str, Any]:
    """Do two studies of one design, on independent population pairs, agree within their uncertainty?

    For comparison k, ``z_k = (a_k - b_k) / sqrt(se_a_k^2 + se_b_k^2)``. When both studies estimate
    the same difference with the stated standard errors (each carrying scenes, training seed and,
    with a pilot, TRAIN draw), z_k is Student's t with the Welch-Satterthwaite degrees of freedom
    of the two standard errors, ``(se_a^2 + se_b^2)^2 / (se_a^4 / dof_a + se_b^4 / dof_b)``: an
    se estimated from two seeds has one degree of freedom, and treating its z as normal would
    reject agreeing studies far too often. Each z_k is therefore mapped to the normal score of
    the same tail probability, ``u_k``, and ``sum_k u_k^2`` is tested against chi-square with K
    degrees of freedom (exact for independent comparisons). A study's comparisons share cells
    (every variant is compared with its controls and the baseline), and a comparison's regret and
    MAE are read from the same fits, so the p value is approximate; every z is given beside it.

    Args:
        estimates_a: float [K], study A's seed-pooled estimates (the reward's unit).
        se_a: float [K], their standard errors (>= 0; where both are 0 the estimates must be equal,
            and z is 0).
        estimates_b: float [K], study B's estimates of the same comparisons, in the same order.
        se_b: float [K], their standard errors (>= 0).
        dof_a, dof_b: float [K], the degrees of freedom of each standard error (> 0; inf: known
            exactly); None: inf for all (the normal reference).

    Returns:
        {"z": float [K], "dof_k": float [K] (each z's Welch-Satterthwaite degrees of freedom; None
        for a normal z), "normal_scores": float [K] (``u_k``), "statistic": sum of u^2, "dof": K,
        "p_value": the chi-square upper tail of the statistic}; arrays as lists.

    Raises:
        QhInputError: arrays of other shapes or lengths, fewer than one comparison, a non-finite
            value, a negative standard error, a degree of freedom that is not > 0, or two
            different estimates without uncertainty.
    """
    call = "agreement_test"
    arrays = _agreement_arrays(call, estimates_a, se_a, estimates_b, se_b, dof_a, dof_b)
    z, welch = _agreement_z(call, arrays)
    scores = _normal_scores(z, welch)
    statistic = float(np.sum(scores**2))
    dof = int(z.size)
    return {
        "z": [float(v) for v in z],
        "dof_k": [None if np.isinf(w) else float(w) for w in welch],
        "normal_scores": [float(v) for v in scores],
        "statistic": statistic,
        "dof": dof,
        "p_value": float(stats.chi2.sf(statistic, dof)),
    }


def agreement_distribution(
    statistic: float,
    se_a: Any,
    se_b: Any,
    correlation_a: Any,
    correlation_b: Any,
    *,
    draws: int = 200_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Where ``agreement_test``'s sum of squared scores lies when the K comparisons are correlated.

    A study's comparisons share cells (a variant against its control and against the baseline
    share the variant's fits) and a comparison's regret and MAE are read from the same fits, so
    the K scores are not independent and chi-square(K) misplaces the sum. Under agreement,
    ``z = (a - b) / s`` with ``cov(a) = R_a * se_a se_a^T`` and likewise for b, so
    ``cov(z) = (R_a * se_a se_a^T + R_b * se_b se_b^T) / (s s^T)`` and the sum of squares is
    ``sum_i lambda_i chi2_1`` over that matrix's eigenvalues, simulated here. Each study's R is the
    correlation its scenes give (every variance term is taken to correlate as the scene term
    does, a stated approximation: the pilot measures each comparison's seed and draw variance,
    not their cross-covariances).

    Args:
        statistic: the observed sum of squared normal scores (``agreement_test``'s).
        se_a, se_b: float [K], each study's standard errors (>= 0).
        correlation_a, correlation_b: float [K, K], each study's correlation of its K estimates
            (symmetric, unit diagonal, entries in [-1, 1]).
        draws: simulated sums (>= 1000).
        seed: the simulation's generator seed.

    Returns:
        {"percentile": the share of simulated sums at or below ``statistic``, "central_90":
        [5th, 95th percentile of the simulated sums], "inside_central_90": bool, "mean": the
        simulated mean (K when uncorrelated), "draws", "seed", "eigenvalues": float [K], largest
        first}.

    Raises:
        QhInputError: a non-finite statistic, standard errors of other lengths, a correlation that
            is not a symmetric [K, K] matrix with unit diagonal and entries in [-1, 1], or draws < 1000.
    """
    call = "agreement_distribution"
    a, b = np.asarray(se_a, dtype=np.float64), np.asarray(se_b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size < 1 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise input_error(call, "se_b", [a.shape, b.shape], "two finite float [K] arrays", "one se per comparison")
    if (a < 0).any() or (b < 0).any():
        raise input_error(call, "se_a", [a.tolist(), b.tolist()], "standard errors >= 0", "an se is never negative")
    if not np.isfinite(statistic) or statistic < 0:
        raise input_error(call, "statistic", statistic, "a finite sum of squares >= 0", "agreement_test's statistic")
    if draws < 1000:
        raise input_error(call, "draws", draws, "at least 1000", "a percentile needs many draws")
    matrices = []
    for name, value in (("correlation_a", correlation_a), ("correlation_b", correlation_b)):
        r = np.asarray(value, dtype=np.float64)
        if (
            r.shape != (a.size, a.size)
            or not np.isfinite(r).all()
            or not np.allclose(r, r.T)
            or not np.allclose(np.diag(r), 1.0)
            or (np.abs(r) > 1 + 1e-9).any()
        ):
            raise input_error(
                call,
                name,
                r.tolist() if r.size <= 16 else f"array of shape {r.shape}",
                f"a symmetric [{a.size}, {a.size}] correlation matrix (unit diagonal, entries in [-1, 1])",
                "the correlation of the study's comparisons, in the se's order",
            )
        matrices.append(r)
    scale = np.sqrt(a**2 + b**2)
    # A comparison both studies know exactly scores 0 whatever the other scores do.
    live = scale > 0
    covariance = matrices[0] * np.outer(a, a) + matrices[1] * np.outer(b, b)
    inverse = np.where(live, 1.0 / np.where(live, scale, 1.0), 0.0)
    covariance = covariance * np.outer(inverse, inverse)
    eigenvalues = np.clip(np.linalg.eigvalsh((covariance + covariance.T) / 2), 0.0, None)[::-1]
    rng = np.random.default_rng(seed)
    sums = rng.chisquare(1.0, size=(draws, a.size)) @ eigenvalues
    low, high = (float(q) for q in np.quantile(sums, [0.05, 0.95]))
    return {
        "percentile": float(np.mean(sums <= statistic)),
        "central_90": [low, high],
        "inside_central_90": bool(low <= statistic <= high),
        "mean": float(sums.mean()),
        "draws": int(draws),
        "seed": int(seed),
        "eigenvalues": [float(v) for v in eigenvalues],
    }
