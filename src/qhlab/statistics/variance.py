"""A pilot's fit-noise components of each comparison, as pure functions over per-scene arrays.

Owns: ``FitNoise`` (what a pilot measured of one comparison's or margin's fit-to-fit noise),
``fit_noise`` (its estimator, a nested analysis of variance over the pilot's fits),
``study_noise_terms`` (the part of a study estimate's variance that the fits add, for a study of
``n_seeds`` seeds on one fresh TRAIN draw, as terms with degrees of freedom) and
``pilot_components`` (every comparison's and margin's ``FitNoise`` of a pilot design) and
``variance_components`` (which part of a planned variance, the scenes', the seeds' or the TRAIN
draw's, dominates it). Each takes
plain arrays and returns plain numbers, so ``qhlab verify`` recomputes a pilot record from its
fits' values. Does not own: the interval that reads the terms (``qhlab.statistics.replication``)
or fitting (``qhlab.preparation.pilot``).

The model. A comparison's per-scene paired difference (or a retention margin's per-scene value),
from a fit with training seed s on TRAIN draw d, on scene i, is
``x[d, s, i] = delta + w_d + u_ds + v_i + e[d, s, i]``: the true difference, a TRAIN-draw effect
(variance omega^2: which TRAIN population a study happened to draw moves all its fits alike),
a seed effect within the draw (variance tau^2: initial weights and batch order), a scene effect
(the same scenes for every fit) and a fit-by-scene residual (variance sigma_e^2 per scene). The
comparison's own arms share the seed, so ``u`` is the seed effect of the difference, not of
either arm: arms that share structure share initial weights and cancel much of it.

A study fits its arms with S seeds on one TRAIN draw and scores them on n scenes. Its pooled
estimate's variance is ``Var(v + mean_s e)/n + tau^2/S + omega^2``; the study's own scenes give
the first term (its scene standard error, which already holds ``sigma_e^2/(S n)``), and the pilot
gives ``G = tau^2/S + omega^2``. The pilot fits every arm with several seeds on each of several
TRAIN draws, each seed on one draw only (nested). Its fits' scene means ``m[d, s]`` give two mean
squares: within draws, ``MS_w`` (expected ``tau^2 + sigma_e^2/n_p``), and between draws, ``MS_b``
(expected ``n0 omega^2 + tau^2 + sigma_e^2/n_p``, n0 the draws' effective size); the fits'
residual per scene ``r`` estimates ``sigma_e^2`` with thousands of degrees of freedom. So
``G = MS_b/n0 + MS_w (1/S - 1/n0) - r/(S n_p)``, a linear combination of mean squares, unbiased.
It is never clamped at zero: a clamped component only adds, and intervals that carry it then
cover more than they say for every comparison whose true component is zero (about a third of
the demo's). Its uncertainty reaches the interval through Satterthwaite's degrees of freedom
(``study_noise_terms`` gives each term's). An estimate below zero never narrows an interval: the
interval (``qhlab.statistics.replication``) floors the variance at the study's scene-only one and
keeps the degrees of freedom of every term, and the study's own seeds check the seed component.

The model's limits. With one TRAIN draw there is no between-draw mean square, so omega^2 is not
estimated and the interval covers the difference on the study's own draw only. G rests on MS_b's
D - 1 degrees of freedom wherever omega^2 dominates: at the smallest multi-draw pilot (two seeds on
each of three draws) on 2, where G is below zero for a fifth of simulated pilots of the demo's
comparisons, whose true G is positive (1-50% by comparison: the larger the fits' share, the rarer). The
components are those of the pilot's population: a study whose components differ (another TRAIN
size, another distribution) is outside the model.

Calibration, by simulation of whole pilot-and-study pairs with the demo pilot's components and
scene and residual distributions resampled from its fits (``tests/study/test_calibration.py``,
with ``tests/calibration_model.py``): at the demo's layout, 95% intervals cover the true difference
in 93-97.5% of pairs for every comparison and margin, those whose true seed or draw effect is zero
included; at the smallest layouts ``qhlab pilot`` admits, and with t3 (heavy-tailed) effects, 94-96%
on average over the comparisons and margins (the figures: docs/concepts/statistics.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from qhlab.evidence.errors import input_error

__all__ = [
    "VARIANCE_COMPONENTS",
    "FitNoise",
    "draw_variance_terms",
    "fit_noise",
    "floored_satterthwaite",
    "half_scene_floor",
    "pilot_components",
    "require_study_size",
    "study_noise_terms",
    "variance_components",
]

_CALL = "fit_noise"


@dataclass(frozen=True)
class FitNoise:
    """What a pilot measured of one comparison's (or margin's) fit-to-fit noise, in metric units.

    Attributes:
        fits: F, the (draw, seed) pairs this comparison was measured on: one per seed, each pair
            one fit of every arm the comparison pairs (so not the pilot's count of fits).
        draws: D, the TRAIN draws they were fitted on.
        n_scenes: n_p, the pilot's validation scenes.
        ms_within: the variance of a fit's scene-mean between fits of one draw (seed noise).
        dof_within: its degrees of freedom, F - D.
        ms_between: the draws' mean square (None with one draw).
        dof_between: D - 1.
        n0: the draws' effective number of fits (None with one draw).
        residual: the fit-by-scene residual mean square r, per scene (sigma_e^2).
        residual_dof: its degrees of freedom.
        scene_variance: the scene effect's variance sigma_v^2 (fit noise removed), for planning.
    """

    fits: int
    draws: int
    n_scenes: int
    ms_within: float
    dof_within: int
    ms_between: float | None
    dof_between: int
    n0: float | None
    residual: float
    residual_dof: int
    scene_variance: float

    @property
    def seed_variance(self) -> float:
        """tau^2 = MS_w - r / n_p, unbiased (it may be negative where tau is about 0)."""
        return self.ms_within - self.residual / self.n_scenes

    @property
    def draw_variance(self) -> float | None:
        """omega^2 = (MS_b - MS_w) / n0, unbiased (it may be negative); None with one draw."""
        if self.ms_between is None or self.n0 is None:
            return None
        return (self.ms_between - self.ms_within) / self.n0

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON-able numbers, with the derived tau and omega (clamped at 0, for reading)."""
        omega2 = self.draw_variance
        return {
            **asdict(self),
            "tau": math.sqrt(max(0.0, self.seed_variance)),
            "omega": None if omega2 is None else math.sqrt(max(0.0, omega2)),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> FitNoise:
        """The record back from ``as_dict`` (the derived fields are ignored)."""
        return cls(**{k: record[k] for k in cls.__dataclass_fields__})


def fit_noise(values: Any, draws: Sequence[int]) -> FitNoise:
    """A comparison's fit-noise components from a nested pilot (each seed fitted on one draw).

    Args:
        values: float [F, n_p], each fit's per-scene values (a paired difference or a margin),
            the same scenes for every fit.
        draws: [F], each fit's TRAIN draw; every draw has at least two fits.

    Returns:
        A ``FitNoise``.

    Raises:
        ValueError: another shape, non-finite values, or a draw with one fit.
    """
    x = np.asarray(values, dtype=np.float64)
    labels = list(draws)
    if x.ndim != 2 or x.shape[1] < 2 or x.shape[0] != len(labels):
        raise ValueError(
            f"{_CALL}: values.shape={tuple(x.shape)} with {len(labels)} draws is not allowed; allowed: "
            "[fits, n_scenes >= 2] with one draw per fit"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{_CALL}: values hold non-finite values; allowed: finite per-scene values")
    groups: dict[int, list[int]] = {}
    for row, draw in enumerate(labels):
        groups.setdefault(int(draw), []).append(row)
    if any(len(rows) < 2 for rows in groups.values()):
        raise ValueError(
            f"{_CALL}: draws {sorted(d for d, r in groups.items() if len(r) < 2)} have one fit; allowed: at least "
            "two seeds on every draw (a within-draw variance needs them)"
        )
    fits, n = x.shape
    d = len(groups)
    means = x.mean(axis=1)
    within = residual = scene = 0.0
    draw_means, sizes = [], []
    for rows in groups.values():
        table = x[rows]
        fit_means = table.mean(axis=1)
        scene_means = table.mean(axis=0)
        rest = table - fit_means[:, None] - scene_means[None, :] + table.mean()
        residual += float((rest**2).sum())
        within += float(((fit_means - fit_means.mean()) ** 2).sum())
        scene += float(scene_means.var(ddof=1))
        draw_means.append(float(fit_means.mean()))
        sizes.append(len(rows))
    residual_dof = sum((k - 1) * (n - 1) for k in sizes)
    r = residual / residual_dof
    # Each draw's scene means hold r / F_d of residual besides the scene effect.
    scene_variance = scene / d - r * float(np.mean([1.0 / k for k in sizes]))
    ms_between = n0 = None
    if d > 1:
        size = np.asarray(sizes, dtype=np.float64)
        ms_between = float((size * (np.asarray(draw_means) - means.mean()) ** 2).sum() / (d - 1))
        n0 = float((fits - (size**2).sum() / fits) / (d - 1))
    return FitNoise(
        fits=int(fits),
        draws=d,
        n_scenes=int(n),
        ms_within=within / (fits - d),
        dof_within=int(fits - d),
        ms_between=ms_between,
        dof_between=d - 1,
        n0=n0,
        residual=r,
        residual_dof=int(residual_dof),
        scene_variance=float(scene_variance),
    )


def study_noise_terms(noise: FitNoise, n_seeds: int) -> list[tuple[str, float, float]]:
    """The terms of ``G = tau^2 / S + omega^2`` for a study of ``n_seeds`` seeds on one fresh TRAIN draw.

    Their sum is unbiased for G (it may be negative where G is about 0; the study's scene part is
    added to it before any square root). Each term is a mean square times a coefficient, with the
    mean square's degrees of freedom, for the Satterthwaite approximation
    ``dof = (sum of terms)^2 / sum(term^2 / dof)``.

    Args:
        noise: the comparison's ``FitNoise``.
        n_seeds: S, the study's seeds (>= 1).

    Returns:
        ``[(name, value, dof)]``: with draws, the between-draws term ``MS_b / n0``, the within
        term ``MS_w (1/S - 1/n0)`` and the residual correction ``-r / (S n_p)``; with one draw,
        ``MS_w / S`` and the correction (the interval then does not carry the TRAIN draw).
    """
    if n_seeds < 1:
        raise ValueError(f"study_noise_terms: n_seeds={n_seeds!r} is not allowed; allowed: >= 1")
    correction = ("residual", -noise.residual / (n_seeds * noise.n_scenes), float(noise.residual_dof))
    if noise.ms_between is None or noise.n0 is None:
        return [("within draws", noise.ms_within / n_seeds, float(noise.dof_within)), correction]
    return [
        ("between draws", noise.ms_between / noise.n0, float(noise.dof_between)),
        ("within draws", noise.ms_within * (1.0 / n_seeds - 1.0 / noise.n0), float(noise.dof_within)),
        correction,
    ]


def draw_variance_terms(noise: FitNoise) -> list[tuple[float, float]]:
    """omega^2 = (MS_b - MS_w) / n0 as ``(value, dof)`` terms, for another recipe's one-draw noise
    (a tuning trial's) that measured no TRAIN draw: the draw effect taken as the recipe's, its
    uncertainty carried by Satterthwaite. Empty with one draw."""
    if noise.ms_between is None or noise.n0 is None:
        return []
    return [
        (noise.ms_between / noise.n0, float(noise.dof_between)),
        (-noise.ms_within / noise.n0, float(noise.dof_within)),
    ]


def pilot_components(
    values: Mapping[tuple[str, int, int], Mapping[str, Any]],
    *,
    arms: Sequence[str],
    comparisons: Sequence[tuple[str, str, str]],
    variants: Sequence[Mapping[str, str]],
    regret_fraction: float,
    mae_fraction: float,
    fits: Sequence[tuple[int, int]],
) -> dict:
    """Every comparison's and retention margin's ``FitNoise`` of each metric.

    Args:
        values: ``{(arm, draw, seed): {"regret": float [n_scenes], "mae": float [n_scenes]}}``,
            each fit's per-scene metric at H on the pilot's validation population.
        arms: every arm of the study (each must have a fit per (draw, seed) of ``fits``).
        comparisons: (arm, against, relation) of the report's paired comparisons.
        variants: ``[{"arm", "control", "matched"}]``: each variant's retention margins
            (D_reg against its structural control, D_mae against its matched control).
        regret_fraction, mae_fraction: the study's retention thresholds.
        fits: every (draw, seed) of the design, each seed on one draw.

    Returns:
        ``{"comparisons": [{"arm", "against", "relation", "noise": {metric: FitNoise.as_dict()}}],
        "margins": [{"variant", "noise": {"regret": D_reg's, "mae": D_mae's}}]}``.

    Raises:
        ValueError: a missing fit, a seed on two draws, or values ``fit_noise`` refuses.
    """
    missing = sorted({(a, d, s) for a in arms for d, s in fits} - set(values))
    if missing:
        raise ValueError(
            f"pilot_components: no fit for (arm, draw, seed) {missing[:3]}; allowed: a fit of every arm "
            "on every draw and seed of the design"
        )
    seeds = [s for _, s in fits]
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            "pilot_components: a seed is fitted on two draws; allowed: each seed on one draw (a nested "
            "design, so that a seed's own effect is not shared between draws)"
        )
    labels = [d for d, _ in fits]

    def metric(arm: str, name: str) -> np.ndarray:
        return np.stack([np.asarray(values[(arm, d, s)][name], dtype=np.float64) for d, s in fits])

    def noise(table: np.ndarray) -> dict:
        return fit_noise(table, labels).as_dict()

    rows = [
        {
            "arm": arm,
            "against": against,
            "relation": relation,
            "noise": {m: noise(metric(arm, m) - metric(against, m)) for m in ("regret", "mae")},
        }
        for arm, against, relation in comparisons
    ]
    margins = [
        {
            "variant": v["arm"],
            "noise": {
                "regret": noise(metric(v["arm"], "regret") - regret_fraction * metric(v["control"], "regret")),
                "mae": noise(metric(v["arm"], "mae") - mae_fraction * metric(v["matched"], "mae")),
            },
        }
        for v in variants
    ]
    return {"comparisons": rows, "margins": margins}


def floored_satterthwaite(terms: Sequence[tuple[float, float]], *, scene_terms: int) -> tuple[float, float]:
    """A sum of variance terms floored at its scene part, and its Satterthwaite degrees of freedom.

    The fit-noise terms are mean-square differences and may be negative; a sum below the scene
    part is a pilot that could not see the fits' noise, not a study whose fits add negative noise.
    So the variance is ``max(sum, scene part)``: never below the scene-only variance. Its degrees of
    freedom are Satterthwaite's, ``variance^2 / sum(term^2 / dof)`` over every term, the floored
    variance as numerator: on the floor the pilot's mean squares, whose chance made the sum
    negative, still count, so a negative estimate never buys the scene term's many degrees of
    freedom. They are bounded below by the smallest term's (a negative mean-square difference that
    cancels most of the sum drives Satterthwaite's towards 0, where the approximation has broken
    down) and above by the scene part's own, so that no interval is narrower than the scene-only
    one: a larger variance on fewer degrees of freedom.

    Args:
        terms: ``[(variance, dof)]``, the first ``scene_terms`` of them the scene part (>= 0).
        scene_terms: how many leading terms are the scene part.

    Returns:
        ``(variance, dof)``.
    """
    scene = terms[:scene_terms]
    floor = sum(v for v, _ in scene)
    variance = max(sum(v for v, _ in terms), floor)
    spread = sum(v**2 / k for v, k in terms if k > 0)
    scene_spread = sum(v**2 / k for v, k in scene if k > 0)
    scene_dof = floor**2 / scene_spread if scene_spread > 0 else float(scene[0][1])
    dof = variance**2 / spread if spread > 0 else scene_dof
    return variance, min(max(dof, min(k for _, k in terms)), scene_dof)


def half_scene_floor(terms: Sequence[tuple[float, float]], *, scene_terms: int) -> tuple[float, float]:
    """The floor of plans recorded before the scene-only one (``VARIANCE_FLOORS``' "half scene"): the
    sum floored at half its scene part, a floored variance on the scene part's degrees of freedom.
    It allowed intervals narrower than the scene-only one; kept only so that those records recompute.

    Args:
        terms, scene_terms: as ``floored_satterthwaite``'s.

    Returns:
        ``(variance, dof)``.
    """
    scene = terms[:scene_terms]
    total = sum(v for v, _ in terms)
    floor = sum(v for v, _ in scene) / 2.0
    variance, used = (total, terms) if total >= floor else (floor, scene)
    spread = sum(v**2 / k for v, k in used if k > 0)
    if variance == floor and total < floor:
        spread /= 4.0  # each scene term enters the floor halved
    dof = variance**2 / spread if spread > 0 else float(scene[0][1])
    return variance, max(dof, min(k for _, k in used))


VARIANCE_COMPONENTS = ("scene", "seed", "draw")
"""The parts of a study estimate's predicted variance (``variance_components``), in the order that
takes a tie: the validation scenes' term, the training seeds' (tau^2 / S) and the TRAIN draw's
(omega^2)."""


def _effective_dof(terms: Sequence[tuple[float, float]]) -> float:
    """Satterthwaite's degrees of freedom of a sum of ``(variance, dof)`` terms (0 where it is 0)."""
    spread = sum(v**2 / k for v, k in terms if k > 0)
    return sum(v for v, _ in terms) ** 2 / spread if spread > 0 else 0.0


def require_study_size(call: str, n_seeds: int, n_scenes: int) -> None:
    """Refuse a study size no interval exists for: fewer than one seed or two scenes.

    Raises:
        QhInputError: naming ``call``, both sizes and what is allowed.
    """
    if n_seeds < 1 or n_scenes < 2:
        raise input_error(
            call,
            "n_seeds/n_scenes",
            (n_seeds, n_scenes),
            "n_seeds >= 1 and n_scenes >= 2",
            "a study has seeds and scenes",
        )


def variance_components(
    noise: FitNoise, *, n_seeds: int, n_scenes: int, draw: FitNoise | None = None
) -> dict[str, Any]:
    """Which part of a study's predicted variance dominates it, with each part's share and dof.

    The variance ``planned_difference`` predicts for a study of S seeds on one fresh TRAIN draw and
    n fresh scenes, before its floor, is the sum of three parts:

    * ``scene``: ``(sigma_v^2 + r / S) / n``, the validation scenes' term (the only part more
      scenes shrink), on the study's n - 1 dof: the study estimates it from its own scenes, as
      its report reads it;
    * ``seed``: ``tau^2 / S = (MS_w - r / n_p) / S``, the training seeds' term (more seeds shrink
      it), on Satterthwaite's dof over the pilot's MS_w and residual;
    * ``draw``: ``omega^2 = (MS_b - MS_w) / n0``, the TRAIN draw's term, on Satterthwaite's dof
      over MS_b (the pilot's draws less one) and MS_w: the dof of a difference of mean squares,
      fewer than MS_b's own. A study fits one TRAIN draw whatever its seeds and scenes, so
      neither shrinks it; the pilot measured it at one TRAIN size, so what another size would do
      is unmeasured; more pilot draws give it more dof.

    A part estimated below zero (an unbiased estimate of a small part) has share 0: shares are of
    the non-negative parts, since a negative estimate never narrows the prediction (the floor keeps
    at least the scene part) and so explains none of it.

    Args:
        noise: the row's components: the pilot's, or a tuning trial's one-draw ones.
        n_seeds: S, the study's seeds (>= 1).
        n_scenes: n, the study's validation scenes (>= 2).
        draw: whose TRAIN-draw part the study carries where ``noise`` measured one draw (a tuning
            trial's recipe takes the pilot's); None: ``noise``'s own.

    Returns:
        ``{"parts": {name: {"variance", "share", "dof"} or None}, "dominant": name}`` over
        ``VARIANCE_COMPONENTS``: ``"draw"`` is None where no TRAIN draw was measured (a one-draw
        pilot: the prediction is of the study's own draw); ``dominant`` has the largest share.

    Raises:
        QhInputError: ``n_seeds`` below 1 or ``n_scenes`` below 2.
    """
    require_study_size("variance_components", n_seeds, n_scenes)
    pilot_residual = noise.residual / (n_seeds * noise.n_scenes)
    # The same scene part as planned_difference: the scene effect clamped, its residual over the study's scenes.
    terms: dict[str, list[tuple[float, float]] | None] = {
        "scene": [
            (max(0.0, noise.scene_variance) / n_scenes, float(n_scenes - 1)),
            (noise.residual / (n_seeds * n_scenes), float(noise.residual_dof)),
        ],
        "seed": [(noise.ms_within / n_seeds, float(noise.dof_within)), (-pilot_residual, float(noise.residual_dof))],
        "draw": draw_variance_terms(noise if draw is None else draw) or None,
    }
    values = {name: None if t is None else sum(v for v, _ in t) for name, t in terms.items()}
    kept = sum(max(0.0, v) for v in values.values() if v is not None)
    parts = {
        name: None
        if t is None
        else {
            "variance": float(values[name]),
            "share": max(0.0, values[name]) / kept if kept > 0 else 0.0,
            "dof": float(n_scenes - 1) if name == "scene" else float(_effective_dof(t)),
        }
        for name, t in terms.items()
    }
    # max keeps the first of equal shares: VARIANCE_COMPONENTS' order.
    dominant = max((n for n in VARIANCE_COMPONENTS if parts[n] is not None), key=lambda n: parts[n]["share"])
    return {"parts": parts, "dominant": dominant}
