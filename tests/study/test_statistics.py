"""Scene bootstrap intervals, retention margins and seed agreement (study statistics)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from qhlab.design.study_config import BootstrapConfig
from qhlab.evidence.errors import QhInputError
from qhlab.statistics.bootstrap import (
    DECISIONS,
    MIN_SCENES_TO_DECIDE,
    paired_scene_bootstrap,
    pooled_seed_values,
    probability_of_improvement,
    retention_margins,
    scene_mean_interval,
    seed_disagreement,
)


def _scipy_interval(data, statistic, seed, n_resamples, **kwargs):
    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        method="BCa",
        rng=np.random.default_rng(seed),
        vectorized=True,
        **kwargs,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def test_scene_mean_interval_equals_scipy_bca_and_is_skewed_like_the_data():
    values = np.random.default_rng(0).exponential(scale=1.0, size=40)  # true mean 1.0
    interval = scene_mean_interval(values, rng_seed=7, n_resamples=5000)
    low, high = _scipy_interval((values,), np.mean, 7, 5000)
    assert (interval.low, interval.high) == (low, high)
    assert interval.method == "BCa" and interval.note is None
    assert interval.estimate == pytest.approx(values.mean())
    assert interval.low < 1.0 < interval.high
    # Right-skewed data: the upper arm of a BCa interval is longer than the lower arm.
    assert interval.high - interval.estimate > interval.estimate - interval.low
    assert interval.n_scenes == 40 and interval.rng_seed == 7
    json.dumps(interval.as_dict(), allow_nan=False)


def test_paired_bootstrap_equals_scipy_paired_call_and_the_one_sample_on_differences():
    rng = np.random.default_rng(3)
    control = rng.gamma(2.0, size=25)
    variant = control - 0.2 + rng.normal(0.0, 0.1, size=25)
    interval = paired_scene_bootstrap(variant, control, rng_seed=11, n_resamples=4000)
    expected = _scipy_interval((variant, control), lambda x, y, axis: np.mean(x - y, axis=axis), 11, 4000, paired=True)
    assert (interval.low, interval.high) == expected
    on_differences = paired_scene_bootstrap(variant - control, rng_seed=11, n_resamples=4000)
    assert on_differences.low == pytest.approx(interval.low)
    assert on_differences.high == pytest.approx(interval.high)
    assert interval.statistic == "mean difference"
    assert interval.low < interval.estimate < interval.high < 0.0


def test_one_sided_bounds_match_scipy_and_leave_the_open_side_none():
    values = np.random.default_rng(5).normal(0.3, 1.0, size=30)
    upper = scene_mean_interval(values, rng_seed=2, n_resamples=3000, alternative="less")
    _, high = _scipy_interval((values,), np.mean, 2, 3000, alternative="less")
    assert upper.low is None and upper.high == high
    assert "one-sided upper bound" in upper.note
    lower = scene_mean_interval(values, rng_seed=2, n_resamples=3000, alternative="greater")
    low, _ = _scipy_interval((values,), np.mean, 2, 3000, alternative="greater")
    assert lower.high is None and lower.low == low


def test_all_equal_values_fall_back_to_the_point_interval_and_say_so():
    interval = scene_mean_interval([0.3] * 6, rng_seed=0, n_resamples=1000)
    assert interval.method == "point" and interval.requested_method == "BCa"
    assert interval.low == interval.high == interval.estimate == pytest.approx(0.3)
    assert "zero spread" in interval.note
    paired = paired_scene_bootstrap([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], rng_seed=0)
    assert paired.method == "point" and (paired.low, paired.high) == (0.5, 0.5)
    single = scene_mean_interval([4.0], rng_seed=0)
    assert single.method == "point" and "one scene" in single.note
    json.dumps(interval.as_dict(), allow_nan=False)


def test_undefined_bca_with_spread_falls_back_to_percentile_and_says_so():
    # 30 zeros and one 1 with 3 resamples: every resample contains the 1 for this seed, so the
    # BCa bias correction is infinite; scipy warns and returns NaN.
    values = np.array([0.0] * 30 + [1.0])
    interval = scene_mean_interval(values, rng_seed=11, n_resamples=3)
    assert interval.method == "percentile"
    assert "BCa undefined" in interval.note and "percentile" in interval.note
    expected = stats.bootstrap(
        (values,), np.mean, n_resamples=3, method="percentile", rng=np.random.default_rng(11)
    ).confidence_interval
    assert (interval.low, interval.high) == (float(expected.low), float(expected.high))
    json.dumps(interval.as_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: scene_mean_interval([1.0, np.nan], rng_seed=0), "x='non-finite values'"),
        (lambda: scene_mean_interval([], rng_seed=0), "x.shape=(0,)"),
        (lambda: paired_scene_bootstrap([1.0, 2.0], [1.0], rng_seed=0), "y.shape=(1,)"),
        (lambda: paired_scene_bootstrap([1.0, 2.0], [1.0, 3.0], statistic="mean", rng_seed=0), "y='an array'"),
        (lambda: paired_scene_bootstrap([1.0, 2.0], statistic="median", rng_seed=0), "statistic='median'"),
    ],
)
def test_bad_inputs_are_refused_with_the_field_named(call, message):
    with pytest.raises(QhInputError) as info:
        call()
    assert message in str(info.value) and "HINT" in str(info.value)


@pytest.mark.parametrize(
    "settings, field", [({"seed": -1}, "seed"), ({"confidence": 1.0}, "confidence"), ({"resamples": 0}, "resamples")]
)
def test_bootstrap_settings_are_refused_at_the_boundary(settings, field):
    # The statistics take their settings from the study config's BootstrapConfig, which is
    # where a negative seed or a confidence outside (0.5, 1) is refused, naming the field.
    with pytest.raises(ValidationError) as info:
        BootstrapConfig(**settings)
    assert info.value.errors()[0]["loc"] == (field,)


def test_retention_margins_by_hand_retained_by_the_point_but_undecided():
    # D_reg per scene: 1-.9*2, 2-.9*4, 3-.9*4, 4-.9*6 = -.8, -1.6, -.6, -1.4 -> mean -1.1.
    # D_mae per scene: .3-.6, .8-.6, .3-.6, .8-.6 = -.3, .2, -.3, .2 -> mean -.05.
    decision = retention_margins(
        [1.0, 2.0, 3.0, 4.0],
        [2.0, 4.0, 4.0, 6.0],
        [0.3, 0.8, 0.3, 0.8],
        [1.0] * 4,
        regret_fraction=0.9,
        mae_fraction=0.6,
        rng_seed=1,
        n_resamples=4000,
    )
    assert decision.d_reg.estimate == pytest.approx(-1.1)
    np.testing.assert_allclose(decision.d_reg.per_scene, [-0.8, -1.6, -0.6, -1.4])
    assert decision.d_mae.estimate == pytest.approx(-0.05)
    np.testing.assert_allclose(decision.d_mae.per_scene, [-0.3, 0.2, -0.3, 0.2])
    assert decision.retained is True
    # The bounds are the ends of the two-sided 95% interval: scipy's one-sided BCa bounds at 97.5%.
    options = dict(alternative="less", confidence_level=0.975)
    _, reg_high = _scipy_interval((np.array(decision.d_reg.per_scene),), np.mean, 1, 4000, **options)
    _, mae_high = _scipy_interval((np.array(decision.d_mae.per_scene),), np.mean, 1, 4000, **options)
    assert decision.d_reg.upper.high == reg_high < 0.0
    assert decision.d_mae.upper.high == mae_high > 0.0
    assert decision.d_reg.confirmed and not decision.d_mae.confirmed
    assert decision.decision == "undecided" and decision.n_scenes == 4
    # Two reasons: only 4 scenes, and D_mae's interval includes 0.
    assert decision.reason.startswith("fewer than 30 validation scenes (n_scenes=4)")
    assert "the interval of D_mae includes 0" in decision.reason
    json.dumps(decision.as_dict(), allow_nan=False)


def test_retention_margins_retain_and_reject_clear_cases():
    rng = np.random.default_rng(9)
    control = rng.uniform(1.0, 2.0, size=30)
    good = retention_margins(
        0.5 * control,
        control,
        0.5 * control,
        control,
        regret_fraction=0.9,
        mae_fraction=1.1,
        rng_seed=4,
        n_resamples=3000,
    )
    assert good.retained and good.decision == "retained" and good.decision in DECISIONS
    assert good.d_reg.upper.high <= 0.0 and good.d_mae.upper.high <= 0.0
    bad = retention_margins(
        2.0 * control,
        control,
        2.0 * control,
        control,
        regret_fraction=0.9,
        mae_fraction=1.1,
        rng_seed=4,
        n_resamples=3000,
    )
    assert not bad.retained and bad.decision == "not retained"
    assert bad.d_reg.lower.low > 0.0 and bad.d_mae.lower.low > 0.0
    # Regret clearly worse but MAE clearly better: not retained, and both signs confirmed.
    mixed = retention_margins(
        2.0 * control,
        control,
        0.5 * control,
        control,
        regret_fraction=0.9,
        mae_fraction=1.1,
        rng_seed=4,
        n_resamples=3000,
    )
    assert not mixed.retained and mixed.decision == "not retained"
    assert mixed.reason == "the interval of D_reg lies above 0"


def test_retention_margins_with_constant_margins_use_the_point_and_say_so():
    decision = retention_margins(
        [1.0, 2.0, 3.0] * 10,
        [2.0, 4.0, 6.0] * 10,
        [1.0] * 30,
        [2.0] * 30,
        regret_fraction=0.5,
        mae_fraction=0.5,
        rng_seed=0,
        n_resamples=500,
    )
    # Both per-scene margins are exactly 0 everywhere: retained (<= 0), bound = 0 <= 0.
    assert decision.d_reg.per_scene == [0.0] * 30
    assert decision.retained and decision.decision == "retained"
    assert decision.d_mae.upper.method == "point" and "zero spread" in decision.d_mae.upper.note


def test_one_margin_above_zero_is_not_retained_whatever_the_passing_one():
    # 40 scenes, control regret 1 and matched MAE 1 everywhere.
    # D_reg per scene: 1.5 - .9*1 = .6 and 1.7 - .9*1 = .8 alternating -> mean .7 > 0: fails.
    #   Every per-scene value is >= .6, so every bootstrap mean (and any BCa bound, a quantile
    #   of the bootstrap means) is >= .6: the one-sided lower bound is > 0.
    # D_mae per scene: 0 - 1.1*1 = -1.1 and 2.1 - 1.1*1 = 1.0 alternating -> mean -.05 <= 0:
    #   passes, but its spread (sd ~1.05, se ~.17) puts the one-sided upper bound above 0.
    n = 40
    variant_regret = np.tile([1.5, 1.7], n // 2)
    variant_mae = np.tile([0.0, 2.1], n // 2)
    decision = retention_margins(
        variant_regret,
        np.ones(n),
        variant_mae,
        np.ones(n),
        regret_fraction=0.9,
        mae_fraction=1.1,
        rng_seed=3,
        n_resamples=4000,
    )
    assert decision.d_reg.estimate == pytest.approx(0.7)
    np.testing.assert_allclose(decision.d_reg.per_scene, np.tile([0.6, 0.8], n // 2))
    assert decision.d_mae.estimate == pytest.approx(-0.05)
    np.testing.assert_allclose(decision.d_mae.per_scene, np.tile([-1.1, 1.0], n // 2))
    assert not decision.d_reg.passes and decision.d_mae.passes
    assert decision.retained is False
    reg_low, _ = _scipy_interval(
        (np.array(decision.d_reg.per_scene),), np.mean, 3, 4000, alternative="greater", confidence_level=0.975
    )
    _, mae_high = _scipy_interval(
        (np.array(decision.d_mae.per_scene),), np.mean, 3, 4000, alternative="less", confidence_level=0.975
    )
    assert decision.d_reg.lower.low == reg_low and reg_low >= 0.6
    assert decision.d_mae.upper.high == mae_high > 0.0
    # The passing margin's open upper bound does not matter: one margin above 0 decides.
    assert decision.decision == "not retained" and decision.n_scenes == n
    assert decision.reason == "the interval of D_reg lies above 0"
    assert "not retained iff a margin's interval lies above 0" in decision.rule
    json.dumps(decision.as_dict(), allow_nan=False)


def test_a_failing_margin_whose_interval_includes_zero_is_undecided():
    # D_reg per scene: 0 - .9 = -.9 and 2 - .9 = 1.1 alternating -> mean .1 > 0: fails, but
    #   with sd 1.0 over 40 scenes (se ~.16) the one-sided lower bound is below 0.
    # D_mae per scene: .5 - 1.1 = -.6 everywhere except .4 - 1.1 = -.7: clearly passes.
    n = 40
    variant_mae = np.full(n, 0.5)
    variant_mae[0] = 0.4
    decision = retention_margins(
        np.tile([0.0, 2.0], n // 2),
        np.ones(n),
        variant_mae,
        np.ones(n),
        regret_fraction=0.9,
        mae_fraction=1.1,
        rng_seed=3,
        n_resamples=4000,
    )
    assert decision.d_reg.estimate == pytest.approx(0.1)
    assert decision.d_mae.estimate == pytest.approx(-0.6 - 0.1 / n)
    assert decision.retained is False
    assert decision.d_reg.lower.low < 0.0 and not decision.d_reg.confirmed
    assert decision.d_mae.upper.high <= 0.0 and decision.d_mae.confirmed
    assert decision.decision == "undecided"
    assert decision.reason == "the interval of D_reg includes 0"


@pytest.mark.parametrize("n_scenes, decides", [(20, False), (40, True)])
def test_fewer_than_30_scenes_never_decide(n_scenes, decides):
    assert MIN_SCENES_TO_DECIDE == 30
    rng = np.random.default_rng(2)
    control = rng.uniform(1.0, 2.0, size=n_scenes)
    # Very clear margins either way: the variant halves (retained) or doubles (rejected) both.
    for scale, retained in ((0.5, True), (2.0, False)):
        decision = retention_margins(
            scale * control,
            control,
            scale * control,
            control,
            regret_fraction=0.9,
            mae_fraction=1.1,
            rng_seed=4,
            n_resamples=2000,
        )
        assert decision.retained is retained and decision.n_scenes == n_scenes
        # The bounds themselves are clear whatever n is; only the decision is withheld.
        assert decision.d_reg.confirmed and decision.d_mae.confirmed
        assert decision.decision == (("retained" if retained else "not retained") if decides else "undecided")
        if n_scenes < MIN_SCENES_TO_DECIDE:
            assert decision.reason.startswith(f"fewer than 30 validation scenes (n_scenes={n_scenes}): undecided")
        else:
            assert "fewer than" not in decision.reason


def test_retention_margins_refuse_mismatched_scenes_and_bad_fractions():
    with pytest.raises(QhInputError, match="n_scenes="):
        retention_margins([1.0, 2.0], [1.0, 2.0], [1.0], [1.0, 2.0], regret_fraction=1.0, mae_fraction=1.0, rng_seed=0)
    with pytest.raises(QhInputError, match="regret_fraction=-0.5"):
        retention_margins(
            [1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0], regret_fraction=-0.5, mae_fraction=1.0, rng_seed=0
        )


def test_seed_disagreement():
    assert seed_disagreement({0: True, 1: False}) is True
    assert seed_disagreement({0: True, 1: True}) is False
    assert seed_disagreement({0: False, 1: False}) is False
    with pytest.raises(QhInputError, match="decisions_by_seed={}"):
        seed_disagreement({})
    with pytest.raises(QhInputError, match=r"decisions_by_seed\[1\]='yes'"):
        seed_disagreement({0: True, 1: "yes"})


def test_pooled_seed_values_average_seeds_within_scene():
    pooled = pooled_seed_values({1: [1.0, 2.0, 4.0], 0: [3.0, 2.0, 0.0]})
    np.testing.assert_allclose(pooled, [2.0, 2.0, 2.0])
    with pytest.raises(QhInputError, match=r"n_scenes=\[2, 3\]"):
        pooled_seed_values({0: [1.0, 2.0], 1: [1.0, 2.0, 3.0]})


def test_the_probability_of_improvement_counts_scenes_won_and_ties_as_half():
    # Seed-averaged differences: -1, 0 (a tie), +1, -2 per scene, 25 times: 1 + 0.5 + 0 + 1 of 4.
    table = np.tile([[-1.0, 0.5, 1.0, -3.0], [-1.0, -0.5, 1.0, -1.0]], (1, 25))
    found = probability_of_improvement(table, rng_seed=0, n_resamples=2000)
    assert found.estimate == pytest.approx(2.5 / 4)
    assert found.low < 0.625 < found.high and 0.0 <= found.low and found.high <= 1.0
    assert found.statistic == "mean"
    with pytest.raises(QhInputError, match="differences.shape"):
        probability_of_improvement(np.zeros(5), rng_seed=0)
