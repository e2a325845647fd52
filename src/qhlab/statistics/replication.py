"""Seed-aware statistics: pooled paired differences whose intervals carry the training seed,
replication labels, the study's retention decision and minimum detectable effects.

Owns: pure functions over per-scene arrays of several training seeds (the arrays are checked
here; confidence, power and sidedness are taken as validated by the study config and the
report). Does not own: the agreement of two studies (``agreement``), the per-seed scene bootstrap
(``bootstrap``), choosing thresholds or
the seed-variance source (the frozen study config) or writing reports.

The model. For one comparison (arm minus control, or a retention margin), seed s and scene i,
the paired per-scene difference is ``d[s, i] = delta + u_s + v_i + e[s, i]``: the true
difference, a training-seed effect (variance tau^2), a scene effect shared by every seed
(the same validation scenes) and a seed-by-scene residual. The pooled estimate is the mean over
seeds and scenes; its variance is ``tau^2 / S + Var_scene / n``. A per-seed scene bootstrap
sees only the second term, so it describes one fit, not the arm: with seed effects as large as
arm effects, two seeds' intervals can exclude 0 on opposite sides.

Three sources for the fits' part (stated in every record, ``seed_sd_source``):

* ``pilot``: the comparison's own components from a pilot record (``qhlab.statistics.variance``:
  the seed effect and, where the pilot fitted several TRAIN draws, the TRAIN-draw effect, each
  estimated for this comparison from every pilot fit, never another row's), measured on the
  declared tuning population before the study (Colas et al. 2018) and frozen. The variance
  ``scene_se^2 + G`` is read on Student's t with Satterthwaite's degrees of freedom over the
  scene term and the pilot's mean squares, with two rules below: the scene-only floor and the
  study's check of its pilot.
* ``typed``: a seed-effect sd tau typed into the config with its seeds, read on Student's t
  with the Welch-Satterthwaite degrees of freedom of the scene and seed terms; no TRAIN draw.
* ``study``: estimated from the study's own seeds (``seed_effect_sd``); with S seeds it has
  S - 1 degrees of freedom, so the interval uses Student's t with S - 1 degrees of freedom
  (12.7 x the standard error at 95% with two seeds: honest, and wide: two seeds alone cannot
  decide).

The scene-only floor. G is unbiased and so negative for many pilots whose true G is small (a fifth
of simulated pilots of the demo's comparisons at two seeds on each of three draws). No interval is
narrower than the study's own scene-only one, ``t(n - 1) * scene_se``: the variance is
``max(scene_se^2 + G, scene_se^2)`` and its degrees of freedom are Satterthwaite's over every
term, the floored variance as numerator, at least the smallest term's and at most the scene
term's. A negative G therefore never narrows the interval, and the pilot's few degrees of freedom
still widen one that sits on the floor: with G below 0 the pilot has not shown that the fits add
nothing, only that it could not see them.

The study checks its pilot (``qhlab.statistics.seed_check.seed_spread_check``). The study's own S
seeds carry evidence on the seed component: their scene means ``m_s`` spread with ``E Var_s(m_s) =
tau^2 + sigma_e^2 / n`` (S - 1 degrees of freedom), which the pilot predicts as ``MS_w - r_p / n_p
+ r / n`` (its within-draw mean square less its residual part, plus the study's own residual part
r / n). Their ratio is an F statistic on (S - 1, Satterthwaite's dof of the prediction) degrees of
freedom; its upper tail is the p-value (a spread below the prediction is no risk to coverage).
Where p < ``SEED_CHECK_THRESHOLD`` (0.05) the study's seeds contradict the pilot, and the interval
takes the larger seed term, the study's own ``(Var_s(m_s) - r / n) / S`` on S - 1 degrees of
freedom, beside the pilot's TRAIN-draw term: as wide as two seeds make it, which is the honest
width when the pilot was wrong about this comparison. The check is per comparison: the rows of a
study share arms and seeds, so their spreads are correlated (on the demo pilot the 16 rows span at
most 8 independent directions, fewer than 3 by the rows' own correlations), and a chi-square
pooled over them as if independent would overstate the evidence; ``seed_check.family_seed_check``
states the family's result with Bonferroni's bound, valid under any dependence. The TRAIN-draw
component cannot be checked: a study fits one draw.

Calibration (``tests/study/test_calibration.py``), by simulation of whole pilot-and-study pairs
from the demo pilot's components and per-scene distributions, averaged over its 16 comparisons
and margins: the 95% interval covers 94-95.5% at the smallest pilots ``qhlab pilot`` admits (two
seeds on one draw, for the draw-conditional difference it states; two seeds on each of three
draws) and at the demo's five draws of three seeds, with normal or t3 (heavy-tailed) seed and
draw effects, and 96.7-97.5% where the true seed and draw effects vanish. Its limits: a one-draw
pilot's interval does not carry the TRAIN draw at all (it covers the difference on the study's
own draw, not over draws), and components that drift between the pilot's population and the
study's are seen only through the seed check: with both components twice the pilot's, coverage
falls to 90-91% at every layout, since the TRAIN-draw part of the drift is invisible to a study
of one draw.

The scene part is the standard error of the seed-averaged per-scene differences (scenes are
the statistical unit, seeds are averaged within a scene first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import special

from qhlab.evidence.errors import input_error
from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE
from qhlab.statistics.seed_check import (
    SEED_CHECK_THRESHOLD,
    SeedCheck,
    differences_table,
    seed_spread,
    seed_spread_check,
)
from qhlab.statistics.variance import (
    FitNoise,
    draw_variance_terms,
    floored_satterthwaite,
    half_scene_floor,
    require_study_size,
    study_noise_terms,
)

__all__ = [
    "REPLICATION_LABELS",
    "VARIANCE_FLOORS",
    "PooledDifference",
    "interval_side",
    "minimum_detectable_effect",
    "planned_difference",
    "pooled_difference",
    "replication_label",
    "retention_decision",
    "seed_effect_sd",
    "variance_shares",
]

REPLICATION_LABELS = ("replicated", "seed-dependent", "inconclusive")

VARIANCE_FLOORS = ("scene", "half scene")
"""``planned_difference``'s floors: "scene" (every interval at least the scene-only one), and "half
scene", the rule of plans recorded before it (half the scene part, whose floored variance took the
scene part's degrees of freedom), kept so that those records still recompute."""


@dataclass(frozen=True)
class PooledDifference:
    """The seed-pooled estimate of one paired comparison, with a seed-aware interval.

    ``low``/``high`` follow ``alternative`` as in ``statistics.BootstrapInterval`` (None: an
    open side). ``se`` is the estimate's standard error: the scene part ``scene_se`` and the fits'
    part (``seed_sd``, and ``draw_sd`` where a pilot measured the TRAIN draw; None: no TRAIN-draw
    term; both shown clamped at 0, the variance uses the unbiased estimates); ``sources`` names
    the variance sources carried. ``quantile`` multiplies it: Student's t with ``dof`` degrees of
    freedom (Satterthwaite's for a pilot or typed source, n_seeds - 1 for the study's own
    estimate; ``distribution`` says the same in words). ``mde`` is the
    smallest true difference this design detects with ``power`` at this level and alternative
    (``minimum_detectable_effect``). ``floored``: the pilot's fit-noise estimate was below 0, so
    the variance is the scene-only one (its degrees of freedom still the pilot's). ``seed_check``:
    a pilot source's ``SeedCheck.as_dict()`` (None for the other sources); where it contradicts the
    pilot, ``seed_sd`` is the study's own and ``dof`` reads it. ``variance_shares``: each of
    ``VARIANCE_COMPONENTS``' share of the interval's variance (``variance_shares``; "draw" None
    without a TRAIN-draw term).
    """

    estimate: float
    low: float | None
    high: float | None
    alternative: str
    confidence: float
    n_seeds: int
    n_scenes: int
    scene_se: float
    seed_sd: float
    seed_sd_source: str
    draw_sd: float | None
    sources: tuple[str, ...]
    se: float
    dof: float
    distribution: str
    quantile: float
    power: float
    mde: float
    note: str
    floored: bool = False
    seed_check: dict[str, Any] | None = None
    variance_shares: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict (``sources`` a list, as JSON reads it back)."""
        return {**asdict(self), "sources": list(self.sources)}


def _quantile(distribution: str, dof: float, probability: float) -> float:
    # scipy.stats' norm.ppf and t.ppf are these functions (the same values), without their per-call overhead.
    return float(special.ndtri(probability) if distribution == "normal" else special.stdtrit(dof, probability))


def variance_shares(scene: float, seed: float, draw: float | None) -> dict[str, float | None]:
    """Each part's share of an interval's variance (``VARIANCE_COMPONENTS``: scene, seed, draw).

    A part estimated below zero has share 0, since a negative estimate never narrows the interval
    (the floor keeps the scene part); shares are of the non-negative parts, as ``variance_components``'.

    Args:
        scene: the scene part's variance (``scene_se^2``).
        seed: the training seeds' part (``tau^2 / S``; may be negative).
        draw: the TRAIN draw's part (``omega^2``; may be negative); None: not carried.

    Returns:
        ``{"scene", "seed", "draw"}``: shares summing to 1 ("draw" None where not carried).
    """
    parts = {"scene": scene, "seed": seed, "draw": draw}
    kept = sum(max(0.0, v) for v in parts.values() if v is not None)
    return {n: None if v is None else (max(0.0, v) / kept if kept > 0 else 0.0) for n, v in parts.items()}


def seed_effect_sd(differences: Any) -> float:
    """The training-seed effect's standard deviation tau of a seeds-by-scenes table.

    ``tau^2 = max(0, Var_s(mean_i d[s, i]) - sigma_e^2 / n)``, where ``sigma_e^2`` is the
    residual mean square of the two-way (seed, scene) table: the seed means' spread less what
    the seed-by-scene residual alone puts there. It has n_seeds - 1 degrees of freedom.

    Args:
        differences: float [n_seeds >= 2, n_scenes >= 2], per-scene paired differences (or a
            metric) for each training seed, same scenes.

    Returns:
        tau, in the unit of ``differences`` (the reward's unit), >= 0.
    """
    d = differences_table("seed_effect_sd", differences)
    n_seeds, n_scenes = d.shape
    if n_seeds < 2:
        raise input_error(
            "seed_effect_sd",
            "differences.shape",
            tuple(d.shape),
            "n_seeds >= 2",
            "one seed says nothing about the seed variance",
        )
    seed_means = d.mean(axis=1)
    residual = d - seed_means[:, None] - d.mean(axis=0)[None, :] + d.mean()
    sigma_e2 = float((residual**2).sum() / ((n_seeds - 1) * (n_scenes - 1)))
    return math.sqrt(max(0.0, float(seed_means.var(ddof=1)) - sigma_e2 / n_scenes))


def minimum_detectable_effect(
    se: float,
    *,
    confidence: float = 0.95,
    power: float = 0.8,
    alternative: str = "two-sided",
    distribution: str = "normal",
    dof: float | None = None,
) -> float:
    """The smallest true difference detected with probability ``power`` (Colas et al. 2018).

    A test that rejects 0 when the interval excludes it detects a true difference m with
    probability ~Phi(m / se - q) (one side); setting that to ``power`` gives
    ``m = (q_level + q_power) * se``, where q_level is the interval's quantile (1 - alpha/2
    two-sided, ``confidence`` one-sided).

    Args:
        se: standard error of the estimate (>= 0).
        confidence: the interval's level.
        power: the detection probability, in (0, 1).
        alternative: "two-sided", "less" or "greater" (one-sided bounds).
        distribution: "normal" or "t" (with ``dof`` degrees of freedom, not necessarily whole).

    Returns:
        The MDE in the estimate's unit (the reward's unit), >= 0.
    """
    level = (1 + confidence) / 2 if alternative == "two-sided" else confidence
    return (_quantile(distribution, dof or 1, level) + _quantile(distribution, dof or 1, power)) * float(se)


def _pilot_part(
    call: str,
    d: np.ndarray,
    noise: Any,
    noise_source: str | None,
    seed_sd: float | None,
    *,
    scene_se: float,
    threshold: float,
) -> tuple[float, float, float | None, float, str, str, bool, SeedCheck | None, dict]:
    """The fits' part from a pilot's components of this comparison (source "pilot").

    The variance ``scene_se^2 + G`` (G from the pilot's mean squares) at least ``scene_se^2``, and
    where the study's own seeds contradict the pilot's seed component (``seed_spread_check``),
    the study's own seed term in place of the pilot's (the larger of the two).

    Args:
        call: the refusing call.
        d: float64 [n_seeds, n_scenes], the checked differences.
        noise, noise_source, seed_sd: as ``pooled_difference``'s (``seed_sd`` must be None).
        scene_se: the standard error of the seed-averaged per-scene differences.
        threshold: the seed check's p-value threshold.

    Returns:
        ``(se, dof, draw_sd, tau, source, note, floored, check, shares)``; ``draw_sd`` None without
        a TRAIN-draw term, ``check`` None with one seed, ``shares`` as ``variance_shares``.
    """
    if seed_sd is not None:
        raise input_error(
            call, "seed_sd", seed_sd, "None with noise", "a pilot's components already carry the seed variance"
        )
    if not isinstance(noise, FitNoise):
        raise input_error(call, "noise", type(noise).__name__, "a FitNoise", "build it with fit_noise")
    if not noise_source:
        raise input_error(
            call, "noise_source", noise_source, "a non-empty description", "say which pilot measured the noise"
        )
    n_seeds, n_scenes = d.shape
    scene = [(scene_se**2, float(n_scenes - 1))]
    check = seed_spread_check(d, noise, threshold=threshold)
    widened = check is not None and check.contradicts and check.study_seed_variance > check.pilot_seed_variance
    if widened:
        # The study's own seed term, (Var_s(m_s) - r / n) / S on S - 1 dof, beside the pilot's TRAIN-draw term.
        observed, residual = seed_spread(d)
        fits = [(v, float(k)) for v, k in draw_variance_terms(noise)] + [
            (observed / n_seeds, float(n_seeds - 1)),
            (-residual / (n_seeds * n_scenes), float((n_seeds - 1) * (n_scenes - 1))),
        ]
        tau = math.sqrt(max(0.0, check.study_seed_variance))
    else:
        fits = [(v, k) for _, v, k in study_noise_terms(noise, n_seeds)]
        tau = math.sqrt(max(0.0, noise.seed_variance))
    variance, dof = floored_satterthwaite(scene + fits, scene_terms=1)
    floored = sum(v for v, _ in scene + fits) < scene[0][0]
    omega2 = noise.draw_variance
    draw_sd = None if omega2 is None else math.sqrt(max(0.0, omega2))
    source = f"pilot: {noise_source}"
    note = _pilot_note(noise, draw_sd, dof, floored=floored, check=check, widened=widened, fits=fits)
    seed_part = sum(v for v, _ in fits[-2:]) if widened else noise.seed_variance / n_seeds
    # On the floor the interval's variance is the scene part's alone.
    shares = variance_shares(
        scene_se**2, 0.0 if floored else seed_part, None if omega2 is None else 0.0 if floored else omega2
    )
    return math.sqrt(variance), dof, draw_sd, tau, source, note, floored, check, shares


def _pilot_note(
    noise: FitNoise,
    draw_sd: float | None,
    dof: float,
    *,
    floored: bool,
    check: SeedCheck | None,
    widened: bool,
    fits: list[tuple[float, float]],
) -> str:
    """What a pilot-source interval carries, in words: its source, the floor and the seed check where they acted."""
    carried = "scenes, training seed" + (", TRAIN draw" if draw_sd is not None else "")
    note = (
        f"this comparison's seed{' and TRAIN-draw' if draw_sd is not None else ''} variance from the pilot "
        f"({noise.fits} seeds on {noise.draws} TRAIN draw{'s' if noise.draws != 1 else ''}, each seed one fit of "
        "every arm it pairs), frozen before the study; "
    )
    if floored:
        note += (
            f"its estimate of the fits' variance is below 0 ({sum(v for v, _ in fits):.3g}), so the interval keeps "
            f"the scene-only variance and carries the {carried.removeprefix('scenes, ')} only through its "
            "degrees of freedom (never narrower than the scene-only interval)"
        )
    else:
        note += f"the interval carries {carried}"
    note += f"; Student's t with {dof:.1f} Satterthwaite dof"
    if check is not None:
        note += (
            f"; the study's own seeds {check.verdict} (F {check.statistic:.3g} on {check.dof_observed} and "
            f"{check.dof_predicted:.1f} dof, p {check.p_value:.3g})"
        )
        if widened:
            note += ": the interval carries the study's own seed term instead of the pilot's"
    return note


def _typed_part(
    call: str,
    seed_sd: Any,
    seed_sd_source: str | None,
    seed_sd_dof: Any,
    *,
    scene_se: float,
    n_seeds: int,
    n_scenes: int,
) -> tuple[float, float, float, str, str]:
    """The fits' part from a seed-effect sd typed into the config (source "typed").

    Args:
        call: the refusing call.
        seed_sd, seed_sd_source, seed_sd_dof: as ``pooled_difference``'s (``seed_sd`` not None).
        scene_se: the standard error of the seed-averaged per-scene differences.
        n_seeds, n_scenes: the study's table's shape.

    Returns:
        ``(se, dof, tau, source, note)``.
    """
    if not isinstance(seed_sd, (int, float)) or isinstance(seed_sd, bool) or not math.isfinite(seed_sd) or seed_sd < 0:
        raise input_error(
            call,
            "seed_sd",
            seed_sd,
            "a finite number >= 0 (the reward's unit) or None",
            "the pilot's standard deviation of a seed's mean paired difference",
        )
    if not seed_sd_source:
        raise input_error(
            call,
            "seed_sd_source",
            seed_sd_source,
            "a non-empty description",
            "say which pilot (population, seeds) measured seed_sd",
        )
    if isinstance(seed_sd_dof, bool) or not isinstance(seed_sd_dof, int) or seed_sd_dof < 1:
        raise input_error(
            call,
            "seed_sd_dof",
            seed_sd_dof,
            "an integer >= 1 (the pilot's seeds - 1)",
            "an estimated tau carries its own uncertainty into the interval",
        )
    tau = float(seed_sd)
    # Welch-Satterthwaite: the scene part has n_scenes - 1 dof, the typed seed part seed_sd_dof.
    parts = [(scene_se**2, n_scenes - 1), (tau**2 / n_seeds, seed_sd_dof)]
    terms_sum = sum(v**2 / k for v, k in parts)
    dof = sum(v for v, _ in parts) ** 2 / terms_sum if terms_sum > 0 else float(n_scenes - 1)
    source = f"typed: {seed_sd_source}"
    note = (
        f"seed variance typed into the config ({seed_sd_dof + 1} seeds), frozen before the study; the "
        f"interval carries scenes, training seed; Student's t with {dof:.1f} Welch-Satterthwaite dof"
    )
    return math.sqrt(scene_se**2 + tau**2 / n_seeds), dof, tau, source, note


def _study_part(call: str, d: np.ndarray, *, scene_se: float) -> tuple[float, float, float, str, str]:
    """The fits' part estimated from the study's own seeds (source "study").

    Args:
        call: the refusing call.
        d: float64 [n_seeds, n_scenes], the checked differences (n_seeds >= 2 or a refusal).
        scene_se: the standard error of the seed-averaged per-scene differences.

    Returns:
        ``(se, dof, tau, source, note)``.
    """
    n_seeds = d.shape[0]
    if n_seeds < 2:
        raise input_error(
            call,
            "differences.shape",
            tuple(d.shape),
            "n_seeds >= 2 without noise or seed_sd",
            "one seed says nothing about the seed variance; give a pilot's components",
        )
    tau, dof = seed_effect_sd(d), float(n_seeds - 1)
    source = f"study: its own {n_seeds} seeds ({n_seeds - 1} degree(s) of freedom)"
    note = (
        f"seed variance estimated from the study's {n_seeds} seeds; Student's t with {n_seeds - 1} dof, "
        "so the interval is wide by design; the MDE is approximate there (the standard error is itself "
        "estimated: about 0.73 power at the MDE with two seeds, by simulation)"
    )
    return math.sqrt(scene_se**2 + tau**2 / n_seeds), dof, tau, source, note


def _t_interval(
    estimate: float, se: float, dof: float, *, confidence: float, alternative: str
) -> tuple[float, float | None, float | None]:
    """Student's t interval around ``estimate``, open (None) on the side ``alternative`` leaves out.

    Args:
        estimate: the pooled estimate.
        se: its standard error.
        dof: the t distribution's degrees of freedom.
        confidence: the interval's level.
        alternative: "two-sided", "less" or "greater".

    Returns:
        ``(quantile, low, high)``.
    """
    level = (1 + confidence) / 2 if alternative == "two-sided" else confidence
    q = _quantile("t", dof, level)
    low = None if alternative == "less" else estimate - q * se
    high = None if alternative == "greater" else estimate + q * se
    return q, low, high


def pooled_difference(
    differences: Any,
    *,
    noise: FitNoise | None = None,
    noise_source: str | None = None,
    seed_sd: float | None = None,
    seed_sd_source: str | None = None,
    seed_sd_dof: int | None = None,
    confidence: float = 0.95,
    power: float = 0.8,
    alternative: str = "two-sided",
    seed_check_threshold: float = SEED_CHECK_THRESHOLD,
) -> PooledDifference:
    """Mean over seeds and scenes of paired per-scene differences, with an interval that carries
    the fits' own noise (see the module docstring).

    Args:
        differences: float [n_seeds, n_scenes], per-scene paired differences (arm minus
            control, or a margin's per-scene values) for each training seed, same scenes.
        noise: this comparison's pilot components (``qhlab.statistics.variance.fit_noise``): the
            interval carries the training seed and, when the pilot fitted several TRAIN draws,
            the TRAIN draw, each estimated for this comparison alone.
        noise_source: which pilot measured ``noise`` (recorded); required with ``noise``.
        seed_sd: a typed seed-effect sd tau (``seed_effect_sd`` on some pilot's table), instead
            of ``noise``; Student's t with the Welch-Satterthwaite dof of the scene and seed terms.
        seed_sd_source: where ``seed_sd`` came from (recorded); required with ``seed_sd``.
        seed_sd_dof: that estimate's degrees of freedom (its seeds - 1); required with ``seed_sd``.
        confidence: the interval's level, in (0, 1).
        power: for ``mde``.
        alternative: "two-sided", "less" (upper bound only) or "greater" (lower bound only).
        seed_check_threshold: with ``noise``, the p-value below which the study's own seeds
            contradict the pilot's seed component (``seed_spread_check``) and the interval takes
            the study's own seed term instead.

    With ``noise`` the interval is never narrower than the scene-only one (``floored``), and it
    records the seed check (``seed_check``). Without ``noise`` or ``seed_sd`` the seed variance is
    estimated from ``differences`` itself (needs n_seeds >= 2; Student's t with n_seeds - 1 dof).

    Returns:
        A ``PooledDifference``.
    """
    call = "pooled_difference"
    d = differences_table(call, differences)
    n_seeds, n_scenes = d.shape
    pooled_scenes = d.mean(axis=0)
    estimate = float(d.mean())
    scene_se = float(pooled_scenes.std(ddof=1) / math.sqrt(n_scenes))
    table = dict(scene_se=scene_se, n_seeds=n_seeds, n_scenes=n_scenes)
    draw_sd, floored, check = None, False, None
    if noise is not None:
        se, dof, draw_sd, tau, source, note, floored, check, shares = _pilot_part(
            call, d, noise, noise_source, seed_sd, scene_se=scene_se, threshold=seed_check_threshold
        )
    else:
        if seed_sd is not None:
            se, dof, tau, source, note = _typed_part(call, seed_sd, seed_sd_source, seed_sd_dof, **table)
        else:
            se, dof, tau, source, note = _study_part(call, d, scene_se=scene_se)
        shares = variance_shares(scene_se**2, tau**2 / n_seeds, None)
    q, low, high = _t_interval(estimate, se, dof, confidence=confidence, alternative=alternative)
    mde = minimum_detectable_effect(
        se, confidence=confidence, power=power, alternative=alternative, distribution="t", dof=dof
    )
    return PooledDifference(
        estimate=estimate,
        low=low,
        high=high,
        alternative=alternative,
        confidence=float(confidence),
        n_seeds=int(n_seeds),
        n_scenes=int(n_scenes),
        scene_se=scene_se,
        seed_sd=tau,
        seed_sd_source=source,
        draw_sd=draw_sd,
        sources=("scenes", "training seed") + (("TRAIN draw",) if draw_sd is not None else ()),
        se=se,
        dof=float(dof),
        distribution=f"t({dof:.3g})",
        quantile=q,
        power=float(power),
        mde=mde,
        note=note,
        floored=floored,
        seed_check=None if check is None else check.as_dict(),
        variance_shares=shares,
    )


def planned_difference(
    noise: FitNoise,
    *,
    n_seeds: int,
    n_scenes: int,
    confidence: float = 0.95,
    power: float = 0.8,
    extra: Sequence[tuple[float, float]] = (),
    variance_floor: str = "scene",
) -> dict[str, float]:
    """What a study of ``n_seeds`` seeds on one fresh TRAIN draw and ``n_scenes`` fresh scenes will
    read for one comparison, predicted from a pilot's components before any of its fits.

    The study's variance ``(sigma_v^2 + r / S) / n + G`` (``qhlab.statistics.variance``): the scene
    part from the pilot's scene variance and residual, now over the study's own n scenes, and the
    fits' part G from its mean squares; Student's t with Satterthwaite's degrees of freedom (the
    scene part counted with the study's n - 1, as its report will read it), and the MDE of a
    two-sided ``confidence`` interval at ``power``. The same floor as the study's interval
    (``pooled_difference``): a negative G leaves the scene part's variance, on the degrees of
    freedom of every term, so a plan never promises an MDE below the scene-only one.

    Args:
        noise: the comparison's pilot components.
        n_seeds: S, the study's seeds.
        n_scenes: n, the study's validation scenes.
        confidence, power: the report's level and power.
        extra: further variance terms ``(value, dof)`` of the fits' part, e.g. a TRAIN-draw
            component measured by another pilot than ``noise``'s one-draw fits.
        variance_floor: one of ``VARIANCE_FLOORS``: "scene", or "half scene" to recompute a plan
            recorded under that rule.

    Returns:
        ``{"se", "dof", "mde", "scene_part", "fit_part"}`` (variances for the two parts).
    """
    require_study_size("planned_difference", n_seeds, n_scenes)
    if variance_floor not in VARIANCE_FLOORS:
        raise input_error(
            "planned_difference", "variance_floor", variance_floor, f"one of {VARIANCE_FLOORS}", "the plan's floor"
        )
    scene = max(0.0, noise.scene_variance) / n_scenes
    residual = noise.residual / (n_seeds * n_scenes)
    fits = [(v, k) for _, v, k in study_noise_terms(noise, n_seeds)] + [(float(v), float(k)) for v, k in extra]
    terms = [(scene, float(n_scenes - 1)), (residual, float(noise.residual_dof)), *fits]
    floored = floored_satterthwaite if variance_floor == "scene" else half_scene_floor
    variance, dof = floored(terms, scene_terms=2)
    se = math.sqrt(variance)
    mde = minimum_detectable_effect(
        se, confidence=confidence, power=power, alternative="two-sided", distribution="t", dof=dof
    )
    return {
        "se": se,
        "dof": float(dof),
        "mde": float(mde),
        "scene_part": scene + residual,
        "fit_part": sum(v for v, _ in fits),
    }


def interval_side(low: float | None, high: float | None) -> int:
    """+1 when an interval lies above 0 (low > 0), -1 below (high < 0), else 0."""
    if low is not None and low > 0:
        return 1
    if high is not None and high < 0:
        return -1
    return 0


def replication_label(per_seed: list[tuple[float | None, float | None]], pooled: PooledDifference) -> str:
    """The replication label of one paired comparison.

    * "seed-dependent": two seeds' intervals exclude 0 on opposite sides;
    * "replicated": every seed's interval excludes 0 on the same side, and so does the
      seed-aware pooled interval (the seeds' scene-only intervals alone would call a pure seed
      effect replicated about half the time: they ignore the seed variance);
    * "inconclusive": anything else.

    Args:
        per_seed: (low, high) of each seed's scene interval (None: an open side).
        pooled: the comparison's ``pooled_difference`` (two-sided).
    """
    if len(per_seed) < 2 or pooled.alternative != "two-sided":
        raise input_error(
            "replication_label",
            "per_seed/pooled",
            (len(per_seed), pooled.alternative),
            "two or more seeds' intervals and a two-sided pooled interval",
            "replication needs seeds to replicate across",
        )
    sides = {interval_side(low, high) for low, high in per_seed}
    if {1, -1} <= sides:
        return "seed-dependent"
    if len(sides) == 1 and 0 not in sides and interval_side(pooled.low, pooled.high) in sides:
        return "replicated"
    return "inconclusive"


def retention_decision(d_reg: PooledDifference, d_mae: PooledDifference) -> tuple[str, str]:
    """The study's decision on one variant, from its seed-pooled retention margins.

    The same words and the same rule as a seed's reading (``qhlab.statistics.bootstrap.DECISIONS``),
    on intervals that carry the fits' noise: "retained" iff both margins' two-sided intervals lie
    at or below 0, "not retained" iff a margin's lies above 0, else "undecided". Each side of an
    interval is a one-sided test at (1 - confidence) / 2, so a retention (both margins below 0)
    is an intersection-union test at that level and a rejection (either margin above 0) at most
    1 - confidence; the MDE beside each margin is that of the same two-sided interval. On fewer
    than ``MIN_SCENES_TO_DECIDE`` scenes the decision is "undecided", as a seed's is.

    Args:
        d_reg, d_mae: the pooled margins (``pooled_difference``, two-sided).

    Returns:
        (decision, reason in words).
    """
    margins = {"D_reg": d_reg, "D_mae": d_mae}
    if any(m.alternative != "two-sided" for m in margins.values()):
        raise input_error(
            "retention_decision",
            "alternative",
            {k: m.alternative for k, m in margins.items()},
            "two-sided pooled margins",
            "the decision reads both ends of each margin's interval",
        )
    above = [k for k, m in margins.items() if m.low is not None and m.low > 0]
    open_ = [k for k, m in margins.items() if m.high is None or m.high > 0]
    if d_reg.n_scenes < MIN_SCENES_TO_DECIDE:
        return "undecided", f"fewer than {MIN_SCENES_TO_DECIDE} validation scenes (n_scenes={d_reg.n_scenes})"
    if above:
        return "not retained", f"the interval of {' and '.join(above)} lies above 0: the gain is below the margin"
    if not open_:
        return "retained", "both margins' intervals lie at or below 0"
    return "undecided", f"the interval of {' and '.join(open_)} includes 0"
