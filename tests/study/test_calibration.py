"""The intervals' calibration, by simulation of whole pilot-and-study pairs from the demo pilot.

Every comparison and retention margin of the demo, two scenarios each: its true seed and
TRAIN-draw effects as the demo pilot estimated them, and both zero (where a clamped estimator
over-covers). Each simulated pilot is analysed by ``fit_noise`` and each simulated study's
interval read by ``pooled_difference``, as a real report does (``tests/calibration_model.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration_model import contrasts, coverage

DEMO_PILOT = Path(__file__).resolve().parents[2] / "examples" / "preparation" / "demo-pilot" / "pilot.json"
# 2000 pairs a case: a coverage of 95% is read within 0.5 percentage points (one standard error).
REPS = 2000
LOW, HIGH = 0.93, 0.975


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
