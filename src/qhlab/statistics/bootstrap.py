"""Scene-level statistics for the architecture study: bootstrap intervals and retention margins.

Owns: pure functions over per-scene arrays (the scene is the statistical unit): BCa scene
bootstrap intervals through ``scipy.stats.bootstrap`` (paired when two arms are compared), with
an explicit, recorded fallback where BCa is undefined; the retention margins D_reg and D_mae
with the bounds of their two-sided intervals and the decision they give, in the one vocabulary
of every decision in qhlab (``DECISIONS``: never "retained" or "not retained" on fewer than
``MIN_SCENES_TO_DECIDE`` scenes); seed agreement.

Does not own: computing per-scene MAE or regret (``qhlab.finite_horizon.evaluation``, whose
``scene_means`` aggregates states into scenes), choosing thresholds (the frozen study config),
or writing reports. Every result is a frozen dataclass of plain floats/ints/strings with an
``as_dict()`` that is JSON-able: no NaN or infinity ever leaves this module (an undefined or
open bound is ``None`` and the record's ``note`` says why). The per-scene values are checked
here; the bootstrap settings (confidence, resamples, seed) are validated once, at the
boundary (the study config's ``BootstrapConfig``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from qhlab.evidence.errors import input_error, require_number

__all__ = [
    "DECISIONS",
    "MIN_SCENES_TO_DECIDE",
    "BootstrapInterval",
    "Margin",
    "RetentionDecision",
    "finite_values",
    "paired_scene_bootstrap",
    "pooled_seed_values",
    "probability_of_improvement",
    "retention_margins",
    "scene_mean_interval",
    "seed_disagreement",
]

_STATISTICS = ("mean difference", "mean")
_ALTERNATIVES = ("two-sided", "less", "greater")
DEFAULT_RESAMPLES = 9999
# Below this many scenes a scene-bootstrap bound is too unstable to back a claim (the bootstrap
# distribution of a mean over a handful of scenes is lumpy and BCa's corrections are noise), so
# a retention on fewer scenes is reported but always "undecided".
MIN_SCENES_TO_DECIDE = 30
DECISIONS = ("retained", "not retained", "undecided")
"""The retention rule's words, the same wherever a decision is read (a seed, the study, a replica):
"retained": both margins' intervals lie at or below 0; "not retained": a margin's interval lies
above 0 (the gain is below the margin); "undecided": anything else (below what the data detect)."""


class _Record:
    """A frozen result record (the dataclasses below)."""

    def as_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict."""
        return asdict(self)


@dataclass(frozen=True)
class BootstrapInterval(_Record):
    """A scene-bootstrap interval for a mean (or a paired mean difference).

    ``alternative`` follows scipy: "two-sided" gives [low, high]; "less" gives the one-sided
    upper bound ``high`` (``low`` is None: -infinity); "greater" gives the one-sided lower bound
    ``low`` (``high`` is None). ``method`` is the method actually used: "BCa", "percentile"
    (BCa was undefined) or "point" (zero spread or one scene: the interval is the estimate);
    ``note`` explains any fallback or open side, else None.
    """

    statistic: str
    estimate: float
    low: float | None
    high: float | None
    confidence: float
    alternative: str
    method: str
    requested_method: str
    n_scenes: int
    n_resamples: int
    rng_seed: int
    note: str | None


@dataclass(frozen=True)
class Margin(_Record):
    """One retention margin: mean over scenes of ``variant_s - fraction * reference_s``.

    ``passes`` is the point reading (estimate <= 0). ``upper`` is the one-sided upper bound
    (alternative "less"), ``lower`` the one-sided lower bound (alternative "greater"), each at
    (1 + c) / 2 for a two-sided level c: together the two ends of the margin's interval.
    ``confirmed`` is True when the bound on the side of this margin's own sign agrees with it:
    ``upper.high <= 0`` when it passes, ``lower.low > 0`` when it fails. How the two margins
    combine into the decision is ``retention_margins``'s rule.
    """

    name: str
    fraction: float
    estimate: float
    per_scene: list[float]
    passes: bool
    confirmed: bool
    upper: BootstrapInterval
    lower: BootstrapInterval


@dataclass(frozen=True)
class RetentionDecision(_Record):
    """The retention rule's outcome for one variant on one seed's fits.

    ``retained`` is the point estimates' reading: both margins <= 0. ``decision`` is one of
    ``DECISIONS`` by the two-sided ``confidence`` intervals of the margins (``retention_margins``);
    ``reason`` says in words why; ``n_scenes`` is the number of scenes the margins were computed on.
    """

    retained: bool
    decision: str
    reason: str
    n_scenes: int
    rule: str
    confidence: float
    d_reg: Margin
    d_mae: Margin


# ---------------------------------------------------------------------------------------------
# Validation (private).


def _scene_array(call: str, field: str, value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim != 1 or array.size == 0:
        raise input_error(
            call,
            f"{field}.shape",
            tuple(array.shape),
            "a non-empty 1-D array [n_scenes]",
            "pass one value per scene (evaluation per-scene arrays, one horizon)",
        )
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise input_error(call, f"{field}.dtype", str(array.dtype), "real numbers", "pass per-scene metric values")
    return finite_values(call, field, array.astype(np.float64))


_NAN_HINT = "a NaN metric means an upstream evaluation failed; fix it there"


def finite_values(call: str, field: str, array: np.ndarray, allowed: str = "finite per-scene values") -> np.ndarray:
    """``array`` when every value is finite; else the refusal that points upstream.

    Args:
        call, field: the refusing call and its argument. array: float64 [*] values.
        allowed: what the refusal says is allowed.

    Returns:
        ``array`` itself.
    """
    if not np.isfinite(array).all():
        raise input_error(call, field, "non-finite values", allowed, _NAN_HINT)
    return array


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# Bootstrap intervals.


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _run_scipy(
    data: tuple[np.ndarray, ...], *, method: str, confidence: float, alternative: str, n_resamples: int, rng_seed: int
) -> tuple[float, float, list[str]]:
    statistic = _mean_difference if len(data) == 2 else _mean
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = stats.bootstrap(
            data,
            statistic,
            n_resamples=int(n_resamples),
            vectorized=True,
            paired=len(data) == 2,
            confidence_level=float(confidence),
            alternative=alternative,
            method=method,
            rng=np.random.default_rng(int(rng_seed)),
        )
    messages = sorted({str(w.message).split(".")[0] for w in caught})
    return float(result.confidence_interval.low), float(result.confidence_interval.high), messages


def _expected_sides_finite(low: float, high: float, alternative: str) -> bool:
    if alternative == "two-sided":
        return math.isfinite(low) and math.isfinite(high)
    if alternative == "less":
        return math.isfinite(high) and not math.isnan(low)
    return math.isfinite(low) and not math.isnan(high)


def _point_bounds(estimate: float, alternative: str) -> tuple[float | None, float | None]:
    low = None if alternative == "less" else estimate
    high = None if alternative == "greater" else estimate
    return low, high


def _check_choices(call: str, statistic: str, alternative: str) -> None:
    """Refuse a statistic or an alternative outside the ones this module computes.

    Args:
        call: the refusing call.
        statistic: one of ``_STATISTICS``.
        alternative: one of ``_ALTERNATIVES``.
    """
    if statistic not in _STATISTICS:
        raise input_error(
            call,
            "statistic",
            statistic,
            " | ".join(_STATISTICS),
            "paired arms use 'mean difference'; one arm uses 'mean'",
        )
    if alternative not in _ALTERNATIVES:
        raise input_error(
            call,
            "alternative",
            alternative,
            " | ".join(_ALTERNATIVES),
            "'less' gives a one-sided upper bound, 'greater' a lower bound",
        )


def _bootstrap_data(call: str, x: Any, y: Any | None, statistic: str) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The arms scipy resamples and the per-scene values the estimate is the mean of.

    Args:
        call: the refusing call.
        x: float [n_scenes], the first arm (or differences already paired).
        y: float [n_scenes] or None, the second arm on the same scenes in the same order.
        statistic: "mean difference" or "mean" (already checked).

    Returns:
        ``(data, values)``: a tuple of one or two float64 [n_scenes] arrays, and float64
        [n_scenes] (``x``, or ``x - y``).
    """
    first = _scene_array(call, "x", x)
    if y is None:
        return (first,), first
    if statistic == "mean":
        raise input_error(
            call,
            "y",
            "an array",
            "None with statistic 'mean'",
            "use statistic='mean difference' to compare two arms",
        )
    second = _scene_array(call, "y", y)
    if second.shape != first.shape:
        raise input_error(
            call,
            "y.shape",
            tuple(second.shape),
            f"x's shape {tuple(first.shape)}",
            "both arms must be evaluated on the same scenes, in the same order",
        )
    return (first, second), first - second


def _point_interval(n: int, estimate: float, alternative: str) -> tuple[float | None, float | None, str, list[str]]:
    """The point interval [estimate, estimate] where the bootstrap distribution is a point.

    Args:
        n: the number of scenes.
        estimate: the mean of the per-scene values.
        alternative: "two-sided", "less" or "greater".

    Returns:
        ``(low, high, method, notes)``, method "point".
    """
    reason = "one scene" if n < 2 else "all per-scene values are equal (zero spread)"
    note = (
        f"{reason}: the bootstrap distribution is a point and BCa is undefined; "
        "reporting the point interval [estimate, estimate]"
    )
    low, high = _point_bounds(estimate, alternative)
    return low, high, "point", [note]


def _resampled_interval(
    data: tuple[np.ndarray, ...],
    estimate: float,
    *,
    confidence: float,
    alternative: str,
    n_resamples: int,
    rng_seed: int,
) -> tuple[float | None, float | None, str, list[str]]:
    """BCa, else the percentile interval from the same seed, else the point interval.

    Args:
        data: one or two float64 [n_scenes] arms, with some spread over at least two scenes.
        estimate: the mean of the per-scene values.
        confidence, alternative, n_resamples, rng_seed: as ``paired_scene_bootstrap``'s.

    Returns:
        ``(low, high, method, notes)``; the open side of a one-sided interval is None.
    """
    notes: list[str] = []
    method = "BCa"
    common = dict(confidence=confidence, alternative=alternative, n_resamples=n_resamples, rng_seed=rng_seed)
    raw_low, raw_high, messages = _run_scipy(data, method="BCa", **common)
    if not _expected_sides_finite(raw_low, raw_high, alternative):
        detail = "; ".join(messages) if messages else "non-finite bounds"
        notes.append(f"BCa undefined for these values ({detail}); using the percentile interval from the same seed")
        method = "percentile"
        raw_low, raw_high, _ = _run_scipy(data, method="percentile", **common)
        if not _expected_sides_finite(raw_low, raw_high, alternative):
            notes.append(
                "the percentile interval is not finite either; reporting the point interval [estimate, estimate]"
            )
            method = "point"
            raw_low, raw_high = estimate, estimate
    low, high = _finite_or_none(raw_low), _finite_or_none(raw_high)
    # scipy reports the open side as an infinity; the record says None (no infinity leaves here).
    if alternative == "less":
        low = None
    elif alternative == "greater":
        high = None
    return low, high, method, notes


def paired_scene_bootstrap(
    x: Any,
    y: Any | None = None,
    *,
    statistic: str = "mean difference",
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    rng_seed: int,
    alternative: str = "two-sided",
) -> BootstrapInterval:
    """BCa scene-bootstrap interval for a mean or a paired mean difference.

    Scenes are resampled with replacement (the same scenes for both arms when ``y`` is given:
    ``scipy.stats.bootstrap(..., paired=True, method="BCa", rng=default_rng(rng_seed))``).
    Where BCa is undefined the fallback is recorded in ``method`` and ``note``: zero spread of
    the per-scene values (or a single scene) gives the point interval [estimate, estimate]; a
    BCa result that is not finite is replaced by the percentile interval from the same seed.

    Args:
        x: float [n_scenes], the first arm's per-scene values (or, with ``y`` None and
            statistic "mean difference", per-scene differences already paired).
        y: float [n_scenes] or None, the second arm's values for the same scenes in the same
            order.
        statistic: "mean difference" (mean over scenes of x - y; of x when y is None) or
            "mean" (mean of x; y must be None).
        confidence: confidence level in (0, 1).
        n_resamples: bootstrap resamples.
        rng_seed: seed of ``numpy.random.default_rng``.
        alternative: "two-sided", "less" (one-sided upper bound) or "greater" (one-sided lower
            bound), as in scipy.

    Returns:
        A ``BootstrapInterval`` (JSON-able via ``as_dict()``).
    """
    call = "paired_scene_bootstrap"
    _check_choices(call, statistic, alternative)
    data, values = _bootstrap_data(call, x, y, statistic)
    estimate = float(values.mean())
    n = int(values.size)
    low: float | None
    high: float | None
    if n < 2 or float(np.ptp(values)) == 0.0:
        low, high, method, notes = _point_interval(n, estimate, alternative)
    else:
        low, high, method, notes = _resampled_interval(
            data, estimate, confidence=confidence, alternative=alternative, n_resamples=n_resamples, rng_seed=rng_seed
        )
    if alternative == "less":
        notes.append("one-sided upper bound: low is -infinity (reported as None)")
    elif alternative == "greater":
        notes.append("one-sided lower bound: high is +infinity (reported as None)")
    return BootstrapInterval(
        statistic=statistic,
        estimate=estimate,
        low=low,
        high=high,
        confidence=float(confidence),
        alternative=alternative,
        method=method,
        requested_method="BCa",
        n_scenes=n,
        n_resamples=int(n_resamples),
        rng_seed=int(rng_seed),
        note="; ".join(notes) if notes else None,
    )


def scene_mean_interval(
    values: Any,
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    rng_seed: int,
    alternative: str = "two-sided",
) -> BootstrapInterval:
    """BCa scene-bootstrap interval for one arm's scene mean (e.g. MAE_H of one cell).

    Args:
        values: float [n_scenes], per-scene values of one arm.
        confidence: confidence level in (0, 1).
        n_resamples: bootstrap resamples.
        rng_seed: seed of ``numpy.random.default_rng``.
        alternative: "two-sided", "less" or "greater".

    Returns:
        A ``BootstrapInterval`` with statistic "mean".
    """
    return paired_scene_bootstrap(
        values,
        None,
        statistic="mean",
        confidence=confidence,
        n_resamples=n_resamples,
        rng_seed=rng_seed,
        alternative=alternative,
    )


def _by_seed(call: str, field: str, value: Any, values: str, hint: str) -> None:
    """Refuse anything but a non-empty dict seed -> ``values``."""
    if not isinstance(value, dict) or not value:
        raise input_error(call, field, value, f"a non-empty dict seed -> {values}", hint)


def pooled_seed_values(per_scene_by_seed: dict[int, Any]) -> np.ndarray:
    """Pool replication seeds per scene: the mean over seeds of each scene's value.

    The scene stays the statistical unit: seeds are averaged within a scene before any
    bootstrap over scenes, so a pooled interval never treats seeds as extra scenes.

    Args:
        per_scene_by_seed: seed -> float [n_scenes], every seed on the same scenes in the same
            order (e.g. one arm's per-scene regret_H for each seed).

    Returns:
        float64 [n_scenes].
    """
    call = "pooled_seed_values"
    _by_seed(call, "per_scene_by_seed", per_scene_by_seed, "[n_scenes] values", "one entry per declared seed")
    arrays = [
        _scene_array(call, f"per_scene_by_seed[{seed}]", values) for seed, values in sorted(per_scene_by_seed.items())
    ]
    sizes = sorted({a.size for a in arrays})
    if len(sizes) != 1:
        raise input_error(
            call,
            "n_scenes",
            sizes,
            "the same number of scenes for every seed",
            "evaluate every seed on the same validation scenes",
        )
    return np.mean(np.stack(arrays), axis=0)


def probability_of_improvement(
    differences: Any,
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    rng_seed: int,
) -> BootstrapInterval:
    """The share of scenes on which a variant beats its comparator, with a scene-bootstrap interval.

    Each scene scores 1 when the seed-averaged paired difference (variant minus comparator, lower
    better) is below 0, 0.5 on a tie, 0 above; the estimate is the mean score, its interval the
    BCa scene bootstrap of that mean. It says how often the variant wins a scene, not by how much,
    and like every per-scene interval it does not see the seed variance.

    It is paired, unlike rliable's probability of improvement (Agarwal et al. 2021), which per task
    compares every run of one algorithm with every run of the other, unpaired (a Mann-Whitney
    ``P(X > Y)``), then averages over tasks. Both arms here are scored on the same scenes, so each
    arm is averaged over its seeds within a scene and the scene's two values compared: read
    unpaired, one scene's value would be set against another's, and the spread of scene
    difficulty, far larger than most arm differences, would pull the share towards one half.

    Args:
        differences: float [n_seeds, n_scenes], per-scene paired differences for each seed.
        confidence: two-sided level in (0, 1).
        n_resamples: bootstrap resamples.
        rng_seed: seed of ``numpy.random.default_rng``.

    Returns:
        A ``BootstrapInterval`` of statistic "mean" over the scenes' scores (0 to 1).
    """
    call = "probability_of_improvement"
    array = np.asarray(differences, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise input_error(
            call, "differences.shape", tuple(array.shape), "[n_seeds >= 1, n_scenes >= 1]", "one row per seed"
        )
    pooled = finite_values(call, "differences", array).mean(axis=0)
    scores = np.where(pooled < 0, 1.0, np.where(pooled == 0, 0.5, 0.0))
    return scene_mean_interval(scores, confidence=confidence, n_resamples=n_resamples, rng_seed=rng_seed)


# ---------------------------------------------------------------------------------------------
# Retention margins.


def _check_fraction(call: str, field: str, value: Any) -> float:
    return require_number(call, field, value, minimum=0, hint="use the fraction declared in the frozen study config")


def _margin(
    name: str,
    variant: np.ndarray,
    reference: np.ndarray,
    fraction: float,
    *,
    confidence: float,
    n_resamples: int,
    rng_seed: int,
) -> Margin:
    per_scene = variant - fraction * reference
    options = dict(statistic="mean difference", confidence=confidence, n_resamples=n_resamples, rng_seed=rng_seed)
    upper = paired_scene_bootstrap(per_scene, alternative="less", **options)
    lower = paired_scene_bootstrap(per_scene, alternative="greater", **options)
    estimate = float(per_scene.mean())
    passes = estimate <= 0.0
    confirmed = (
        (upper.high is not None and upper.high <= 0.0) if passes else (lower.low is not None and lower.low > 0.0)
    )
    return Margin(
        name=name,
        fraction=fraction,
        estimate=estimate,
        per_scene=[float(v) for v in per_scene],
        passes=passes,
        confirmed=bool(confirmed),
        upper=upper,
        lower=lower,
    )


def retention_margins(
    variant_regret: Any,
    control_regret: Any,
    variant_mae: Any,
    matched_mae: Any,
    *,
    regret_fraction: float,
    mae_fraction: float,
    rng_seed: int,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> RetentionDecision:
    """The retention rule as two margins over scenes, and the decision their intervals give.

    D_reg = mean_s(r_v,s - regret_fraction * r_c,s) against the structural control;
    D_mae = mean_s(m_v,s - mae_fraction * m_m,s) against the matched control. The rule retains
    the variant iff D_reg <= 0 and D_mae <= 0. Each margin gets the two ends of its two-sided
    ``confidence`` interval (each a one-sided bound at (1 + confidence) / 2, BCa scene bootstrap
    of its per-scene values, seeded), and the decision is one of ``DECISIONS``:

    * "retained": both margins' upper bounds are <= 0;
    * "not retained": a margin's lower bound is > 0 (one confirmed failing margin suffices);
    * "undecided": anything else, and always on fewer than ``MIN_SCENES_TO_DECIDE`` scenes.
      ``reason`` says which case applied.

    These are the same words and the same sidedness as the study-level decision on the
    seed-pooled margins (``qhlab.statistics.replication.retention_decision``), but a seed's scene
    bootstrap does not see the seed variance: it reads that seed's fits, not the arm.

    Args:
        variant_regret: float [n_scenes], per-scene regret_H of the variant.
        control_regret: float [n_scenes], per-scene regret_H of its structural control.
        variant_mae: float [n_scenes], per-scene MAE_H of the variant.
        matched_mae: float [n_scenes], per-scene MAE_H of the matched control.
        regret_fraction: finite >= 0.
        mae_fraction: finite >= 0.
        rng_seed: seed for both bootstraps.
        n_resamples: bootstrap resamples.
        confidence: the two-sided intervals' level in (0, 1).

    Returns:
        A ``RetentionDecision`` (JSON-able via ``as_dict()``).
    """
    call = "retention_margins"
    arrays = {
        "variant_regret": _scene_array(call, "variant_regret", variant_regret),
        "control_regret": _scene_array(call, "control_regret", control_regret),
        "variant_mae": _scene_array(call, "variant_mae", variant_mae),
        "matched_mae": _scene_array(call, "matched_mae", matched_mae),
    }
    sizes = {name: int(a.size) for name, a in arrays.items()}
    if len(set(sizes.values())) != 1:
        raise input_error(
            call,
            "n_scenes",
            sizes,
            "the same number of scenes for all four arrays",
            "evaluate every arm on the same validation scenes, in the same order",
        )
    reg_fraction = _check_fraction(call, "regret_fraction", regret_fraction)
    mae_frac = _check_fraction(call, "mae_fraction", mae_fraction)
    side = (1.0 + float(confidence)) / 2.0
    options = dict(confidence=side, n_resamples=int(n_resamples), rng_seed=int(rng_seed))
    d_reg = _margin("D_reg", arrays["variant_regret"], arrays["control_regret"], reg_fraction, **options)
    d_mae = _margin("D_mae", arrays["variant_mae"], arrays["matched_mae"], mae_frac, **options)
    n_scenes = sizes["variant_regret"]
    margins = (d_reg, d_mae)
    above = [m.name for m in margins if m.lower.low is not None and m.lower.low > 0.0]
    open_margins = [m.name for m in margins if m.upper.high is None or m.upper.high > 0.0]
    if above:
        decision, reason = "not retained", f"the interval of {' and '.join(above)} lies above 0"
    elif not open_margins:
        decision, reason = "retained", "both margins' intervals lie at or below 0"
    else:
        decision, reason = "undecided", f"the interval of {' and '.join(open_margins)} includes 0"
    if n_scenes < MIN_SCENES_TO_DECIDE:
        # The bounds are still computed and reported; they are just not trusted to decide.
        decision = "undecided"
        reason = f"fewer than {MIN_SCENES_TO_DECIDE} validation scenes (n_scenes={n_scenes}): undecided ({reason})"
    rule = (
        "the rule retains iff D_reg <= 0 and D_mae <= 0; retained iff both margins' two-sided "
        f"{confidence:.0%} intervals lie at or below 0, not retained iff a margin's interval lies above 0, "
        f"otherwise undecided (always on fewer than {MIN_SCENES_TO_DECIDE} scenes)"
    )
    return RetentionDecision(
        retained=bool(d_reg.passes and d_mae.passes),
        decision=decision,
        reason=reason,
        n_scenes=int(n_scenes),
        rule=rule,
        confidence=float(confidence),
        d_reg=d_reg,
        d_mae=d_mae,
    )


def seed_disagreement(decisions_by_seed: dict[int, bool]) -> bool:
    """Whether the replication seeds reached different retention decisions.

    Args:
        decisions_by_seed: seed -> retained (bool), one entry per declared seed.

    Returns:
        True iff at least two seeds disagree.
    """
    call = "seed_disagreement"
    _by_seed(call, "decisions_by_seed", decisions_by_seed, "bool", "pass one decision per declared seed")
    for seed, decision in decisions_by_seed.items():
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise input_error(call, "seed", seed, "an integer seed", "keys are the declared seeds")
        if not isinstance(decision, (bool, np.bool_)):
            raise input_error(
                call, f"decisions_by_seed[{seed}]", decision, "True or False", "pass RetentionDecision.retained"
            )
    return len({bool(v) for v in decisions_by_seed.values()}) > 1
