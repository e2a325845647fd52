"""The intervals' calibration, by simulation of whole pilot-and-study pairs from the demo pilot.

Every comparison and retention margin of the demo, at the demo pilot's layout (five TRAIN draws of
three seeds), two scenarios each: its true seed and TRAIN-draw effects as the demo pilot estimated
them, and both zero (where a clamped estimator over-covers). Then the pilots ``qhlab pilot`` admits
at its smallest (``qhlab.design.pilot_config``: two seeds on one draw; two seeds on each of three
draws), t3 (heavy-tailed) seed and draw effects, and a study whose components drift from its
pilot's. Each simulated pilot is analysed by ``fit_noise`` and each simulated study's interval read
by ``pooled_difference``, as a real report does, the scene-only floor and the study's seed check
included (``tests/calibration_model.py``).

Measured (16 comparisons and margins, 1000 pairs each, mean coverage of the 95% interval; the
lowest row in brackets): two seeds on one draw 94.8% [92.5%] of the difference on the study's own
draw, which is what a one-draw interval states (92.2% over draws: it does not carry the draw),
t3 effects 95.4%; two seeds on three draws 94.4% [91.8%], t3 95.0%; the demo's layout 95.1%
[94.0%], t3 95.0%; true components zero 97.5% (smallest pilots) and 96.7% (the demo's). Study
components twice the pilot's: 89.9-91.2% (the TRAIN-draw part of the drift is invisible to a study
of one draw; the seed part alone: 91.6-92.6%). A variant exactly at its retention margin is retained
2.7% (1x2), 2.5% (3x2) and 2.3% (5x3) of the time, mean over the demo's four margins. With
arm-specific seed and TRAIN-draw effects (``simulate_arms``), the rows formed from the arms' own
tables, the figures are recorded by ``bench/calibration.py`` (its ``arms`` cases).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration_model import contrasts, coverage, simulate, simulate_arms

DEMO_PILOT = Path(__file__).resolve().parents[2] / "examples" / "preparation" / "demo-pilot" / "pilot.json"
# 2000 pairs a case: a coverage of 95% is read within 0.5 percentage points (one standard error).
REPS = 2000
LOW, HIGH = 0.93, 0.975


def _rows() -> list:
    return list(contrasts(json.loads(DEMO_PILOT.read_text())))


@pytest.mark.slow
def test_95_percent_intervals_cover_93_to_97_5_percent_of_simulated_studies():
    record = json.loads(DEMO_PILOT.read_text())
    results = []
    for index, (name, metric, values, draws) in enumerate(contrasts(record)):
        for scenario in ("pilot", "zero"):
            found = coverage(values, draws, scenario=scenario, reps=REPS, seed=1000 * index + len(scenario))
            results.append((name, metric, scenario, found))
    assert len(results) == 2 * (2 * len(record["design"]["comparisons"]) + 2 * len(record["design"]["variants"]))
    outside = [(n, m, s, f["coverage"]) for n, m, s, f in results if not LOW <= f["coverage"] <= HIGH]
    assert not outside, outside
    # Some true components of the demo are large: their intervals are not the scene-only ones.
    assert any(f["tau"] > 0.001 for _, _, s, f in results if s == "pilot")
    # No interval is narrower than the study's own scene-only one.
    assert min(f["narrowest"] for *_, f in results) >= 1 - 1e-12


def _family(reps: int, seed: int, **case) -> dict:
    """Every row of the demo simulated under ``case`` (``simulate``'s keywords): the mean over rows."""
    found = [
        simulate(values, draws, reps=reps, seed=seed + i, **case) for i, (_, _, values, draws) in enumerate(_rows())
    ]
    return {
        key: float(np.mean([f[key].mean() for f in found]))
        for key in ("covered", "covered_on_draw", "below", "below_on_draw", "floored", "contradicted")
    } | {"narrowest": float(min(f["width_ratio"].min() for f in found))}


# (name, simulate's keywords, what the interval states it covers, the coverage band). A one-draw
# pilot's interval does not carry the TRAIN draw: it states the difference on the study's own draw.
ADMITTED = [
    ("one draw of two seeds", {"layout": (1, 2)}, "covered_on_draw", (LOW, HIGH)),
    ("one draw of two seeds, t3 effects", {"layout": (1, 2), "effects": "t3"}, "covered_on_draw", (LOW, HIGH)),
    ("three draws of two seeds", {"layout": (3, 2)}, "covered", (LOW, HIGH)),
    ("three draws of two seeds, t3 effects", {"layout": (3, 2), "effects": "t3"}, "covered", (LOW, HIGH)),
    ("the demo's five draws of three seeds, t3 effects", {"effects": "t3"}, "covered", (LOW, HIGH)),
    # Where the true seed and draw effects vanish, the smallest pilots over-cover a little: an
    # estimate below 0 leaves the scene-only variance on the pilot's few degrees of freedom.
    ("one draw of two seeds, no fit noise", {"layout": (1, 2), "scenario": "zero"}, "covered", (LOW, 0.985)),
    ("three draws of two seeds, no fit noise", {"layout": (3, 2), "scenario": "zero"}, "covered", (LOW, 0.985)),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, case, target, band", ADMITTED, ids=[c[0] for c in ADMITTED])
def test_the_smallest_admitted_pilots_and_heavy_tails_stay_calibrated(name, case, target, band):
    found = _family(400, seed=7000 + 100 * ADMITTED.index((name, case, target, band)), **case)
    assert band[0] <= found[target] <= band[1], (name, found)
    assert found["narrowest"] >= 1 - 1e-12, (name, found)


@pytest.mark.slow
def test_drift_between_pilot_and_study_is_a_stated_limit_and_the_seed_check_sees_its_seed_part():
    # The study's seed and draw variances twice the pilot's: the TRAIN-draw part is invisible to a
    # study of one draw, so coverage falls below 93% at every layout (docs/concepts/statistics.md
    # states the figures); the seed check flags the seed part about twice as often as by chance.
    steady = _family(400, seed=9100, layout=(3, 2))
    drift = _family(400, seed=9200, layout=(3, 2), drift=(2.0, 2.0))
    assert 0.88 <= drift["covered"] < steady["covered"], (drift, steady)
    assert drift["contradicted"] > 1.5 * steady["contradicted"], (drift, steady)
    assert drift["narrowest"] >= 1 - 1e-12


# Each admitted layout's retention margins, and what its intervals state they cover (on the study's
# own draw for a one-draw pilot).
MARGIN_LAYOUTS = [((1, 2), "below_on_draw"), ((3, 2), "below"), (None, "below")]


@pytest.mark.slow
@pytest.mark.parametrize("layout, target", MARGIN_LAYOUTS, ids=["1x2", "3x2", "the demo's 5x3"])
def test_a_variant_at_the_retention_margin_is_retained_at_most_2_5_percent_of_the_time(layout, target):
    # A retention needs both margins' intervals at or below 0. With D_reg's truth at 0 (the variant
    # exactly at the margin), it is retained as often as D_reg's interval lies wholly below its
    # truth; D_mae's truth is taken far below 0, where its interval always is. Intervals shift with
    # the truth, so each margin is simulated at its pilot's estimate and read against it. 1500 pairs
    # per margin, 6000 per layout: a rate of 2.5% is read within 0.2 percentage points, so 2.9% is
    # two standard errors above the target (measured: 2.7%, 2.5% and 2.3% respectively).
    margins = [(i, row) for i, row in enumerate(_rows()) if row[0].startswith("D_")]
    assert len(margins) == 4
    case = {} if layout is None else {"layout": layout}
    rates = [
        float(simulate(values, draws, reps=1500, seed=31 + i, **case)[target].mean())
        for i, (_, _, values, draws) in margins
    ]
    assert float(np.mean(rates)) <= 0.029, rates
    assert max(rates) <= 0.045, rates  # no single margin far off


ARM_CASES = [
    ("arms 1x2", {"layout": (1, 2)}),
    ("arms 3x2 t3, baseline 3x", {"layout": (3, 2), "effects": "t3", "scales": {"baseline": 3.0}}),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, case", ARM_CASES, ids=[c[0] for c in ARM_CASES])
def test_arm_specific_seed_and_draw_effects_stay_calibrated(name, case):
    # Every arm's fits carry the arm's own seed and TRAIN-draw effects, and the rows are formed from
    # the arms' tables, so rows sharing an arm share its effects; "baseline 3x" gives the arm in most
    # rows three times the record's effects, heavy-tailed. 600 pairs: 9600 row reads, 2400 at the
    # four margins, where 2.5% is read within 0.32 points (one standard error), so 3.2% is two above.
    found = simulate_arms(json.loads(DEMO_PILOT.read_text()), reps=600, seed=4100, **case)
    rows = found["covered"].mean(axis=0)
    margins = [j for j, row in enumerate(found["rows"]) if row.startswith("D_")]
    assert len(rows) == 16 and len(margins) == 4
    assert LOW <= float(rows.mean()) <= HIGH, (name, rows)
    assert float(found["below"][:, margins].mean()) <= 0.032, name


def test_no_simulated_interval_is_narrower_than_the_scene_only_one():
    # Fast: the smallest multi-draw pilot, where a negative fit-noise estimate is common.
    rows = _rows()
    floored = 0.0
    for index in (0, 8, 10, 14):
        _, _, values, draws = rows[index]
        found = simulate(values, draws, reps=150, seed=500 + index, layout=(3, 2))
        assert found["width_ratio"].min() >= 1 - 1e-12
        floored += found["floored"].mean()
    assert floored > 0.2  # the floor was met, not just passed
