"""Seed-aware statistics: calibration, replication labels and MDE, by simulation.

Synthetic studies follow the model of ``qhlab.statistics.replication``:
d[s, i] = delta + u_s + v_i + e[s, i] with known seed, scene and residual variances.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qhlab.evidence import QhInputError
from qhlab.statistics.replication import (
    minimum_detectable_effect,
    pooled_difference,
    replication_label,
    retention_decision,
    seed_effect_sd,
)

N_SCENES, N_SEEDS = 120, 2
SCENE_SD, RESIDUAL_SD, SEED_SD = 0.012, 0.010, 0.003  # metres, of the order of the default study's


def _study(rng: np.random.Generator, delta: float, seed_sd: float = SEED_SD, n_seeds: int = N_SEEDS) -> np.ndarray:
    """[n_seeds, N_SCENES] paired differences of one simulated study."""
    seed = rng.normal(0.0, seed_sd, size=(n_seeds, 1))
    scene = rng.normal(0.0, SCENE_SD, size=(1, N_SCENES))
    return delta + seed + scene + rng.normal(0.0, RESIDUAL_SD, size=(n_seeds, N_SCENES))


PILOT_SEEDS = 6  # as bench/seed_spread.py's default (seeds 2-7)


def _pilot(rng: np.random.Generator, seed_sd: float = SEED_SD) -> dict:
    """What a study config freezes: tau estimated on a simulated pilot of PILOT_SEEDS seeds
    (its own scenes), so the pilot's estimation noise is part of every calibration below."""
    tau = seed_effect_sd(_study(rng, 0.0, seed_sd, n_seeds=PILOT_SEEDS))
    return {"seed_sd": tau, "seed_sd_source": "simulated pilot", "seed_sd_dof": PILOT_SEEDS - 1}


def _scene_interval(row: np.ndarray) -> tuple[float, float]:
    """A seed's scene-only 95% interval (normal; the BCa bootstrap is close to it at n=120)."""
    half = 1.959964 * row.std(ddof=1) / math.sqrt(row.size)
    return float(row.mean() - half), float(row.mean() + half)


def test_seed_effect_sd_by_hand() -> None:
    # A pure seed shift (no residual): tau is the sd of the shifts ...
    d = np.array([[0.0, 1.0, 2.0], [0.5, 1.5, 2.5], [1.0, 2.0, 3.0]])
    assert seed_effect_sd(d) == pytest.approx(0.5)
    # ... and a pure seed-by-scene residual has no seed effect at all: the seed means' spread is
    # what the residual alone puts there (Var_s = sigma_e^2 / n, clamped at 0).
    assert seed_effect_sd(np.array([[1.0, -1.0], [-1.0, 1.0]])) == 0.0
    rng = np.random.default_rng(5)
    big = _study(rng, 0.0, 0.003, n_seeds=400)
    assert seed_effect_sd(big) == pytest.approx(0.003, rel=0.1)


def test_the_pooled_interval_covers_the_truth() -> None:
    rng = np.random.default_rng(20261201)
    delta = 0.002
    # The default-like design, one where the seed effect dominates (there, leaving the seed term
    # out of the interval would cover ~0.74; a normal quantile on a 6-seed pilot ~0.89) and one
    # with no seed effect at all (the regret spread of the default recipe is all seed-by-scene).
    for seed_sd in (SEED_SD, 0.02, 0.0):
        for source in ("pilot", "study"):
            covered = 0
            for _ in range(600):
                d = _study(rng, delta, seed_sd)
                pooled = pooled_difference(d, **_pilot(rng, seed_sd)) if source == "pilot" else pooled_difference(d)
                covered += pooled.low <= delta <= pooled.high
            assert covered / 600 >= 0.93, (seed_sd, source, covered / 600)
            if source == "pilot":
                assert covered / 600 <= 0.99, (seed_sd, covered / 600)


def test_scene_only_intervals_alone_would_call_seed_effects_replicated() -> None:
    # Why the label needs the pooled interval: with no true difference, both seeds' scene-only
    # intervals exclude 0 on the same side far more often than 5% of studies ...
    rng = np.random.default_rng(7)
    naive = labelled = 0
    for _ in range(1000):
        d = _study(rng, 0.0)
        per_seed = [_scene_interval(row) for row in d]
        sides = {1 if lo > 0 else -1 if hi < 0 else 0 for lo, hi in per_seed}
        naive += len(sides) == 1 and 0 not in sides
        labelled += replication_label(per_seed, pooled_difference(d, **_pilot(rng))) == "replicated"
    assert naive / 1000 > 0.08
    # ... and the label says "replicated" in at most 5% of them.
    assert labelled / 1000 <= 0.05, labelled / 1000


def test_the_mde_is_detected_with_80_percent_power() -> None:
    rng = np.random.default_rng(11)
    se = math.sqrt(SEED_SD**2 / N_SEEDS + (SCENE_SD**2 + RESIDUAL_SD**2 / N_SEEDS) / N_SCENES)
    assert minimum_detectable_effect(se) == pytest.approx((1.959964 + 0.841621) * se, rel=1e-5)
    # The design's MDE as the report states it: Student's t on the Welch-Satterthwaite dof of a
    # 6-seed pilot (wider than the normal one: the pilot's tau is itself an estimate).
    mde = float(np.median([pooled_difference(_study(rng, 0.0), **_pilot(rng)).mde for _ in range(300)]))
    assert mde > minimum_detectable_effect(se)
    detected = 0
    for _ in range(600):
        detected += pooled_difference(_study(rng, mde), **_pilot(rng)).low > 0
    assert 0.75 <= detected / 600 <= 0.86, detected / 600


def test_study_source_uses_student_t_with_one_degree_of_freedom() -> None:
    d = _study(np.random.default_rng(3), 0.0)
    pooled = pooled_difference(d)
    assert pooled.distribution == "t(1)" and pooled.quantile == pytest.approx(12.7062, abs=1e-3)
    assert pooled.seed_sd_source.startswith("study: its own 2 seeds")
    assert pooled.high - pooled.low == pytest.approx(2 * 12.7062 * pooled.se, rel=1e-4)


def test_labels_by_hand() -> None:
    pooled_above = pooled_difference(
        np.array([[0.01, 0.012, 0.011], [0.011, 0.013, 0.012]]), seed_sd=0.0001, seed_sd_source="hand", seed_sd_dof=5
    )
    assert pooled_above.low > 0
    assert replication_label([(0.001, 0.02), (0.002, 0.03)], pooled_above) == "replicated"
    assert replication_label([(0.001, 0.02), (-0.03, -0.002)], pooled_above) == "seed-dependent"
    assert replication_label([(0.001, 0.02), (-0.01, 0.03)], pooled_above) == "inconclusive"
    wide = pooled_difference(
        np.array([[0.01, 0.012, 0.011], [0.011, 0.013, 0.012]]), seed_sd=1.0, seed_sd_source="hand", seed_sd_dof=5
    )
    assert replication_label([(0.001, 0.02), (0.002, 0.03)], wide) == "inconclusive"


def test_the_study_decides_by_both_ends_of_the_pooled_margins() -> None:
    rows = np.tile([0.010, 0.012, 0.011], (2, 12))
    hand = dict(seed_sd=0.0001, seed_sd_source="hand", seed_sd_dof=5)
    below = pooled_difference(-rows, **hand)
    above = pooled_difference(rows, **hand)
    around = pooled_difference(rows - 0.011, seed_sd=0.01, seed_sd_source="hand", seed_sd_dof=5)
    assert below.high < 0 < above.low and around.low < 0 < around.high
    assert retention_decision(below, below) == ("retained", "both margins' intervals lie at or below 0")
    assert retention_decision(above, below)[0] == "not retained"
    assert retention_decision(below, above)[1].startswith("the interval of D_mae lies above 0")
    assert retention_decision(below, around) == ("undecided", "the interval of D_mae includes 0")
    assert retention_decision(around, around) == ("undecided", "the interval of D_reg and D_mae includes 0")
    # A margin above 0 decides even where the other includes 0.
    assert retention_decision(around, above)[0] == "not retained"
    # Fewer than 30 scenes never decide, as a seed's reading does not.
    few = pooled_difference(-rows[:, :20], **hand)
    assert retention_decision(few, few)[0] == "undecided"
    with pytest.raises(QhInputError, match="two-sided pooled margins"):
        retention_decision(pooled_difference(-rows, **hand, alternative="less"), below)


def test_bad_input_is_refused() -> None:
    with pytest.raises(QhInputError, match=r"pooled_difference: differences.shape=\(3,\) is not allowed"):
        pooled_difference(np.zeros(3))
    with pytest.raises(QhInputError, match=r"n_seeds >= 2 without noise or seed_sd"):
        pooled_difference(np.zeros((1, 5)))
    with pytest.raises(QhInputError, match=r"seed_sd_source=None is not allowed"):
        pooled_difference(np.zeros((2, 5)), seed_sd=0.1)
    with pytest.raises(QhInputError, match=r"seed_sd_dof=None is not allowed; allowed: an integer >= 1"):
        pooled_difference(np.zeros((2, 5)), seed_sd=0.1, seed_sd_source="hand")
    with pytest.raises(QhInputError, match=r"seed_effect_sd: differences.shape=\(1, 5\) is not allowed"):
        seed_effect_sd(np.zeros((1, 5)))


@pytest.mark.slow
def test_the_report_carries_replication_labels_decisions_and_mdes(finished_study) -> None:
    import json

    from scipy import stats

    from qhlab.statistics.bootstrap import DECISIONS
    from qhlab.statistics.replication import REPLICATION_LABELS

    report_dir = finished_study["output"] / "report"
    report = json.loads((report_dir / "report.json").read_text())
    # Every paired comparison and metric has one pooled row.
    assert len(report["replication"]) == len(report["paired"]) // len(report["seeds"])
    for row in report["replication"]:
        assert row["label"] in REPLICATION_LABELS and row["pooled"]["mde"] > 0
        sides = {(i["low"] > 0) - (i["high"] < 0) for i in row["per_seed"].values()}
        # Significant on both seeds with opposite signs is never anything but seed-dependent.
        assert ({1, -1} <= sides) == (row["label"] == "seed-dependent"), row
        assert row["pooled"]["seed_sd_source"].startswith("study: its own 2 seeds")  # the tiny config has no pilot
    for entry in report["retention"]:
        # One vocabulary: the study's decision and every seed's reading.
        assert entry["decision"] in DECISIONS
        assert {d["decision"] for d in entry["per_seed"].values()} <= set(DECISIONS)
        assert entry["seeds_agree"] == (len({d["decision"] for d in entry["per_seed"].values()}) == 1)
        margins = entry["pooled_margins"]
        expected = (
            "not retained"
            if any(m["low"] > 0 for m in margins.values())
            else "retained"
            if all(m["high"] <= 0 for m in margins.values())
            else "undecided"
        )
        assert entry["decision"] == (expected if report["n_scenes"] >= 30 else "undecided")
        summary = report["summary"]["retention"][entry["variant"]]["decision"]
        assert summary == {s: d["decision"] for s, d in entry["per_seed"].items()}
        assert "could not be detected" in entry["sensitivity"] and "two-sided 95%" in entry["sensitivity"]
        # One MDE definition for the report: a margin's is that of its two-sided 95% interval.
        for margin in margins.values():
            q = [stats.t.ppf(p, margin["dof"]) for p in (0.975, 0.8)]
            assert margin["mde"] == pytest.approx(sum(q) * margin["se"], rel=1e-9)
            assert margin["alternative"] == "two-sided"
    question = {q["variant"]: q for q in report["question"]}
    for entry in report["retention"]:
        q = question[entry["variant"]]
        assert q["decision"] == q["answer"]["decision"] == entry["decision"]
        assert q["per_seed"] == {s: d["decision"] for s, d in entry["per_seed"].items()}
        # Each margin's dominant part is the largest share of its own interval's variance, and the
        # answer says it with the MDE: without a pilot, scenes and training seed only.
        for name in ("D_reg", "D_mae"):
            margin = entry["pooled_margins"][name]
            shares = margin["variance_shares"]
            assert shares["draw"] is None and shares["scene"] + shares["seed"] == pytest.approx(1.0)
            scene = margin["scene_se"] ** 2
            assert shares["scene"] == pytest.approx(scene / margin["se"] ** 2)
            assert q["dominant"][name] == max(("scene", "seed"), key=lambda n: shares[n])
            words = {"scene": "scenes", "seed": "training seed"}[q["dominant"][name]]
            assert (
                f"{name} {margin['mde']:.4f} m, mostly {words} ({shares[q['dominant'][name]]:.0%})"
                in q["answer"]["text"]
            )
    markdown = (report_dir / "report.md").read_text()
    assert "## Seed-pooled paired differences" in markdown and "## The rule's decision" in markdown
    for word in ("verdict", "robust", "rejected", "not replicated"):
        assert word not in markdown.split("## How this study was prepared")[0], word
    assert report["summary"]["decisions"].keys() == {e["variant"] for e in report["retention"]}


def test_satterthwaite_dof_survive_a_cancelling_fit_term_and_a_floor() -> None:
    from qhlab.statistics.variance import floored_satterthwaite

    # A sum that a negative mean-square difference nearly cancels: Satterthwaite alone would give
    # 3e-6 degrees of freedom (an interval a million standard errors wide); bounded by the
    # smallest term's.
    variance, dof = floored_satterthwaite([(1e-4, 479.0), (1.0, 5.0), (-0.9995, 4.0)], scene_terms=1)
    assert variance == pytest.approx(6e-4) and dof == 4.0
    # Floored at the scene part (never below the scene-only variance), on the degrees of freedom of
    # every term: the fits' mean squares whose chance made the sum negative still count.
    variance, dof = floored_satterthwaite([(1.0, 479.0), (0.2, 20.0), (-0.9, 5.0)], scene_terms=2)
    assert variance == pytest.approx(1.2) and dof == pytest.approx(1.2**2 / (1 / 479 + 0.04 / 20 + 0.81 / 5))
    # Every term positive: the textbook value, above the smallest term's ...
    variance, dof = floored_satterthwaite([(1.0, 479.0), (1.0, 5.0)], scene_terms=1)
    assert (variance, dof) == (2.0, pytest.approx(4 / (1 / 479 + 1 / 5)))
    # ... and never above the scene part's own, so no interval is narrower than the scene-only one.
    variance, dof = floored_satterthwaite([(1.0, 10.0), (1.0, 10.0)], scene_terms=1)
    assert (variance, dof) == (2.0, 10.0)


# ----------------------------------------------------------------- a pilot's interval: the floor and the seed check


def _nested_pilot(rng: np.random.Generator, draws: int, seeds: int, tau: float, omega: float, n: int = N_SCENES):
    """A nested pilot's [draws * seeds, n] values (its own scenes) and each fit's draw."""
    w = np.repeat(rng.normal(0.0, omega, draws), seeds)
    u = rng.normal(0.0, tau, draws * seeds)
    values = (w + u)[:, None] + rng.normal(0.0, SCENE_SD, n)[None, :] + rng.normal(0.0, RESIDUAL_SD, (w.size, n))
    return values, [d for d in range(draws) for _ in range(seeds)]


def test_a_negative_fit_noise_estimate_never_narrows_the_interval() -> None:
    from scipy import stats

    from qhlab.statistics.variance import fit_noise

    rng = np.random.default_rng(31)
    found = 0
    for _ in range(200):
        noise = fit_noise(*_nested_pilot(rng, 3, 2, 0.0, 0.0))
        pooled = pooled_difference(_study(rng, 0.0, 0.0), noise=noise, noise_source="p")
        scene_only = stats.t.ppf(0.975, N_SCENES - 1) * pooled.scene_se
        assert pooled.high - pooled.low >= 2 * scene_only * (1 - 1e-12)
        assert pooled.se >= pooled.scene_se and pooled.dof <= N_SCENES - 1
        if pooled.floored:
            found += 1
            # On the floor: the scene-only variance, on fewer degrees of freedom than the scene term's
            # 119 (the pilot's mean squares still count), and the note says what the interval carries.
            assert pooled.se == pytest.approx(pooled.scene_se) and pooled.dof < N_SCENES - 2
            assert "below 0" in pooled.note and "never narrower than the scene-only interval" in pooled.note
    assert found > 20


def test_an_intervals_variance_shares_name_what_it_carries() -> None:
    from qhlab.statistics.replication import variance_shares
    from qhlab.statistics.variance import FitNoise

    # By hand: a negative part has share 0 and the rest are shares of the non-negative parts.
    assert variance_shares(1.0, 3.0, None) == {"scene": 0.25, "seed": 0.75, "draw": None}
    assert variance_shares(1.0, -0.5, 1.0) == {"scene": 0.5, "seed": 0.0, "draw": 0.5}
    noise = FitNoise(
        fits=15, draws=5, n_scenes=100, ms_within=4e-6, dof_within=10, ms_between=1e-5, dof_between=4, n0=3.0,
        residual=1e-4, residual_dof=1485, scene_variance=1e-4,
    )  # fmt: skip
    scenes = np.linspace(-0.01, 0.01, 100)
    d = np.stack([scenes, scenes + 0.001])
    pooled = pooled_difference(d, noise=noise, noise_source="p")
    # The pilot's parts at S = 2: tau^2 / 2 and omega^2, beside the study's own scene part; they make the interval.
    parts = {"scene": pooled.scene_se**2, "seed": (4e-6 - 1e-6) / 2, "draw": (1e-5 - 4e-6) / 3}
    assert pooled.variance_shares == pytest.approx({n: v / sum(parts.values()) for n, v in parts.items()})
    assert sum(parts.values()) == pytest.approx(pooled.se**2)
    # Where the study's own seeds contradict the pilot, the seed share is the study's seed term's.
    wide = np.stack([scenes, scenes + 0.05])
    pooled = pooled_difference(wide, noise=noise, noise_source="p")
    assert pooled.seed_check["contradicts"] and pooled.variance_shares["seed"] > 0.9
    # On the floor, the interval is the scene part's alone.
    quiet = FitNoise(**{**noise.__dict__, "ms_between": 1e-7, "ms_within": 1e-7})
    pooled = pooled_difference(np.stack([scenes, scenes]), noise=quiet, noise_source="p")
    assert pooled.floored and pooled.variance_shares == {"scene": 1.0, "seed": 0.0, "draw": 0.0}


def test_the_seed_check_by_hand() -> None:
    from scipy import stats

    from qhlab.statistics.seed_check import seed_spread_check
    from qhlab.statistics.variance import FitNoise

    noise = FitNoise(
        fits=6, draws=3, n_scenes=100, ms_within=4e-6, dof_within=3, ms_between=9e-6, dof_between=2, n0=2.0,
        residual=1e-4, residual_dof=297, scene_variance=1e-4,
    )  # fmt: skip
    # Two seeds whose means differ by 0.012 over a pure seed shift (no residual): Var_s = 7.2e-5.
    scenes = np.linspace(-0.01, 0.01, 100)
    d = np.stack([scenes, scenes + 0.012])
    check = seed_spread_check(d, noise)
    predicted = 4e-6 - 1e-4 / 100  # the pilot's tau^2 plus the study's residual part (0 here)
    assert check.observed == pytest.approx(7.2e-5) and check.predicted == pytest.approx(predicted)
    # Satterthwaite's dof of the prediction, bounded below by its smallest term's (the pilot's 3).
    dof = max(predicted**2 / (4e-6**2 / 3 + (1e-4 / 100) ** 2 / 297), 3.0)
    assert check.dof_predicted == pytest.approx(dof) == 3.0 and check.dof_observed == 1
    assert check.statistic == pytest.approx(7.2e-5 / predicted)
    assert check.p_value == pytest.approx(stats.f.sf(7.2e-5 / predicted, 1, dof)) and check.p_value < 0.05
    assert check.contradicts == (check.p_value < 0.05) and check.verdict == "contradicts the pilot"
    assert check.study_seed_variance == pytest.approx(7.2e-5) and check.pilot_seed_variance == pytest.approx(3e-6)
    # One seed: nothing to check.
    assert seed_spread_check(d[:1], noise) is None


def test_the_seed_check_holds_its_level_and_widens_what_it_contradicts() -> None:
    from qhlab.statistics.variance import fit_noise

    rng = np.random.default_rng(37)
    rejected = 0
    for _ in range(400):
        noise = fit_noise(*_nested_pilot(rng, 3, 2, SEED_SD, 0.002))
        rejected += pooled_difference(_study(rng, 0.0), noise=noise, noise_source="p").seed_check["contradicts"]
    # Where the pilot is right, the study's seeds contradict it in about 5% of studies.
    assert 0.02 <= rejected / 400 <= 0.09, rejected / 400
    # A study whose seed effect is far larger than the pilot's: the check says so, and the interval
    # carries the study's own seed term (two seeds: about one degree of freedom), far wider.
    widened = 0
    for _ in range(200):
        noise = fit_noise(*_nested_pilot(rng, 3, 2, SEED_SD, 0.002))
        study = _study(rng, 0.0, seed_sd=8 * SEED_SD)
        pooled = pooled_difference(study, noise=noise, noise_source="p")
        if pooled.seed_check["contradicts"]:
            widened += 1
            assert pooled.seed_sd == pytest.approx(seed_effect_sd(study))
            assert pooled.dof < 3 and "the study's own seed term instead" in pooled.note
            assert pooled.seed_check["verdict"] == "contradicts the pilot"
    assert widened / 200 > 0.3


def test_the_familys_check_is_bonferronis() -> None:
    from qhlab.statistics.seed_check import family_seed_check

    family = family_seed_check([0.5, 0.004, 0.3, 0.04])
    assert family == {
        "rows": 4,
        "contradicted": 2,
        "smallest_p": 0.004,
        "family_p": pytest.approx(0.016),
        "threshold": 0.05,
        "verdict": "contradicts the pilot",
    }
    assert family_seed_check([0.02] * 16)["verdict"] == "consistent with the pilot"
    with pytest.raises(QhInputError, match="family_seed_check"):
        family_seed_check([])


def test_a_plan_floors_as_the_study_does_and_an_older_plan_recomputes_by_its_own_rule() -> None:
    import json
    from pathlib import Path

    from qhlab.design.plan_record import recomputed
    from qhlab.design.preparation_record import close_values
    from qhlab.statistics.replication import planned_difference
    from qhlab.statistics.variance import FitNoise

    # G below 0 (MS_w under its residual part): the plan predicts the scene-only variance, no less.
    noise = FitNoise(
        fits=6, draws=3, n_scenes=480, ms_within=1e-6, dof_within=3, ms_between=0.5e-6, dof_between=2, n0=2.0,
        residual=1e-3, residual_dof=1437, scene_variance=2e-4,
    )  # fmt: skip
    planned = planned_difference(noise, n_seeds=2, n_scenes=480)
    assert planned["fit_part"] < 0 and planned["se"] ** 2 == pytest.approx(planned["scene_part"])
    assert planned["dof"] < 479
    # The rule of plans recorded before it floored at half the scene part: a narrower, promised MDE.
    older = planned_difference(noise, n_seeds=2, n_scenes=480, variance_floor="half scene")
    assert older["mde"] < planned["mde"]
    with pytest.raises(QhInputError, match="variance_floor"):
        planned_difference(noise, n_seeds=2, n_scenes=480, variance_floor="none")
    # The committed demo plan names the scene floor and recomputes by it. The same record without the
    # field is one made before the floor: it recomputes by its own rule, half the scene part, which
    # differs only where G is below 0 (variant_deep against the baseline, and its D_reg).
    record = json.loads((Path(__file__).resolve().parents[2] / "examples/preparation/demo-plan/plan.json").read_text())
    assert record["variance_floor"] == "scene" and close_values(recomputed(record)["designs"], record["designs"])
    older = recomputed({k: v for k, v in record.items() if k != "variance_floor"})
    assert older["variance_floor"] == "half scene"
    changed = {
        k
        for new, old in zip(record["designs"], older["designs"])
        for k in new["rows"]
        if not close_values(new["rows"][k], old["rows"][k])
    }
    assert changed == {"variant_deep - baseline (regret)", "D_reg variant_deep"}


def test_the_report_says_in_one_sentence_where_the_studys_seeds_contradict_the_pilot() -> None:
    from qhlab.report import answer, preparation_section, seed_aware

    def check(p: float) -> dict:
        return {
            "statistic": 30.0 if p < 0.05 else 1.0, "dof_observed": 1, "dof_predicted": 10.0, "p_value": p,
            "threshold": 0.05, "contradicts": p < 0.05, "verdict": "contradicts the pilot" if p < 0.05 else "x",
        }  # fmt: skip

    report = {
        "primary_horizon": 3,
        "replication": [
            {"arm": "v", "against": "b", "metric": "regret", "pooled": {"seed_check": check(0.004)}},
            {"arm": "v", "against": "b", "metric": "mae", "pooled": {"seed_check": check(0.6)}},
            {"arm": "c", "against": "b", "metric": "regret", "pooled": {"seed_check": check(0.001)}},
        ],
        "retention": [
            {"variant": "v", "pooled_margins": {"D_reg": {"seed_check": check(0.02)}, "D_mae": {"seed_check": None}}}
        ],
    }
    sentence = answer._seed_check_sentence(report, report["retention"][0], "b")
    # One sentence, naming this variant's intervals only (not c's), with each test's result.
    assert sentence.count(". ") == 0 and sentence.endswith("instead of the pilot's.")
    assert (
        "D_reg (F 30 on 1 and 10.0 dof, p 0.02) and regret_3 against `b` (F 30 on 1 and 10.0 dof, p 0.004)" in sentence
    )
    assert "those intervals carry the study's own seed term" in sentence
    quiet = {**report, "replication": report["replication"][1:2]}
    assert answer._seed_check_sentence(quiet, {"variant": "v", "pooled_margins": {"D_reg": {}, "D_mae": {}}}, "b") == ""
    family = seed_aware._family_check(report)
    assert (family["rows"], family["contradicted"], family["smallest_p"]) == (4, 3, 0.001)
    assert family["family_p"] == pytest.approx(0.004) and family["verdict"] == "contradicts the pilot"
    assert [r["row"] for r in family["contradicted_rows"]] == ["v - b (regret)", "c - b (regret)", "D_reg v"]
    (blank, line) = preparation_section._seed_check_line(family)
    assert blank == "" and line.startswith("The study's own seeds checked the pilot's seed component of each of its 4")
    assert "v - b (regret) (F 30 on 1 and 10.0 dof, p 0.004)" in line and "family p 0.004" in line
    assert preparation_section._seed_check_line(None) == []
