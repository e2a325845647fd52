"""Crash: SIGKILL ``qhlab fit`` and every ``qhlab study`` step at seeded, recorded points.

Owns: the assertions over the two kill campaigns (``_reliability_crash_campaigns.py``; run once
per session by the ``crash_campaigns`` fixture, whose finished study the tampering and
concurrency tests reuse). Does not own: the schedules or the code under test.
"""

from __future__ import annotations

import json

import pytest
from _reliability_crash_campaigns import FIT_CHECKPOINT_EVERY, FIT_UPDATES, SEED

pytestmark = pytest.mark.reliability

MIN_KILL_POINTS = 20


def _raise(campaign) -> None:
    if campaign.error is not None:
        raise campaign.error


def test_fit_survives_sigkill_at_every_point_and_resumes(crash_campaigns):
    fit = crash_campaigns["fit"]
    _raise(fit)
    result = crash_campaigns["results"]["fit campaign"]
    assert len(fit.killed) >= 6, [p.as_dict() for p in fit.points]
    assert all(p.returncode == -9 for p in fit.killed)
    assert result["start_updates"] % FIT_CHECKPOINT_EVERY == 0 and 0 < result["start_updates"] < FIT_UPDATES
    assert len(result["finished_attempts"]) >= 2  # the resumed segment and the fresh attempt


def test_every_study_step_survives_sigkill_and_study_run_completes(crash_campaigns):
    study = crash_campaigns["study"]
    _raise(study)
    result = crash_campaigns["results"]["study campaign"]
    steps = {p.label.split(":")[0].split()[0] for p in study.killed}
    assert {"freeze", "admit-canaries", "prepare-development", "run-fit", "run", "benchmark", "report"} <= steps, steps
    assert result["e0_passed"] is True
    # The killed attempts of baseline-s0 are kept and recorded; a finished fit was adopted or rerun once.
    assert len(result["baseline_s0_previous_attempts"]) >= 2, result
    assert result["baseline_s0_attempt"] not in result["baseline_s0_previous_attempts"]


def test_kill_points_are_seeded_recorded_and_enough(crash_campaigns):
    record = json.loads(crash_campaigns["record"].read_text())
    assert record["seed"] == SEED
    killed = [p for c in record["campaigns"].values() for p in c["points"] if p["killed"]]
    assert len(killed) >= MIN_KILL_POINTS, len(killed)
    assert all(p["trigger"] and p["argv"] for p in killed)
