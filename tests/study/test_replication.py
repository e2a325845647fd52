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
    markdown = (report_dir / "report.md").read_text()
    assert "## Seed-pooled paired differences" in markdown and "## The rule's decision" in markdown
    for word in ("verdict", "robust", "rejected", "not replicated"):
        assert word not in markdown.split("## How this study was prepared")[0], word
    assert report["summary"]["decisions"].keys() == {e["variant"] for e in report["retention"]}


def test_satterthwaite_dof_survive_a_cancelling_fit_term_and_a_floor() -> None:
    from qhlab.statistics.replication import _floored_satterthwaite

    # A sum that a negative mean-square difference nearly cancels: Satterthwaite alone would give
    # 3e-6 degrees of freedom (an interval a million standard errors wide); bounded by the
    # smallest term's.
    variance, dof = _floored_satterthwaite([(1e-4, 479.0), (1.0, 5.0), (-0.9995, 4.0)], scene_terms=1)
    assert variance == pytest.approx(6e-4) and dof == 4.0
    # Floored at half the scene part: a scene quantity with the scene part's dof, whatever the fits'.
    variance, dof = _floored_satterthwaite([(1.0, 479.0), (0.2, 20.0), (-0.9, 5.0)], scene_terms=2)
    assert variance == pytest.approx(0.6) and dof == pytest.approx(1.2**2 / (1 / 479 + 0.04 / 20))
    # Every term positive: the textbook value, above the smallest term's.
    variance, dof = _floored_satterthwaite([(1.0, 10.0), (1.0, 10.0)], scene_terms=1)
    assert (variance, dof) == (2.0, 20.0)
