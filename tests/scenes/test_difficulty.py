"""Difficulty card, candidate layout and blockers: what makes the benchmark discriminate."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from puck_world import draw, puck_parameters
from qhlab.cli import main
from qhlab.evidence import DigestMismatchError, QhInputError
from qhlab.scenes import load_preset, read_manifest
from qhlab.scenes.describe import describe_population
from qhlab.scenes.difficulty import CARD_TIE_BAND, difficulty_card
from qhlab.scenes.puck.strikes import CANDIDATE_FEATURES, candidate_features, candidate_strikes


def _chain_labels(path):
    """Chain states' labels {state_id: [K][H]} and their scene ids, read straight from Parquet."""
    states = [r for r in pq.read_table(path / "states.parquet").to_pylist() if r["step"] >= 0]
    q: dict[int, dict[int, list[float]]] = {}
    for row in pq.read_table(path / "candidates.parquet").to_pylist():
        q.setdefault(row["state_id"], {})[row["candidate"]] = row["q"]
    return [(s["scene_id"], [q[s["state_id"]][a] for a in sorted(q[s["state_id"]])]) for s in states]


def _brute_force_card(states, tie_band: float) -> dict:
    """The card's definitions, one state at a time, with plain Python loops."""
    by_scene: dict[int, list[dict]] = {}
    loses = 0
    counts = None
    for scene_id, labels in states:
        k, h = len(labels), len(labels[0])
        final = [labels[a][h - 1] for a in range(k)]
        first = [labels[a][0] for a in range(k)]
        best = max(final)
        myopic = [a for a in range(k) if first[a] >= max(first) - tie_band]
        myopic_regret = best - sum(final[a] for a in myopic) / len(myopic)
        loses += myopic_regret > tie_band
        optimal = [a for a in range(k) if final[a] >= best - tie_band]
        counts = counts or [0.0] * k
        for a in optimal:
            counts[a] += 1.0 / len(optimal)
        by_scene.setdefault(scene_id, []).append(
            {
                "uniform": best - sum(final) / k,
                "fixed": [best - final[a] for a in range(k)],
                "myopic": myopic_regret,
            }
        )

    def weighted(get):
        return sum(sum(get(s) for s in rows) / len(rows) for rows in by_scene.values()) / len(by_scene)

    k = len(states[0][1])
    distribution = [c / len(states) for c in counts]
    return {
        "uniform": weighted(lambda s: s["uniform"]),
        "fixed": [weighted(lambda s, a=a: s["fixed"][a]) for a in range(k)],
        "myopic": weighted(lambda s: s["myopic"]),
        "loses": loses / len(states),
        "distribution": distribution,
        "entropy": -sum(p * math.log2(p) for p in distribution if p > 0),
    }


@pytest.mark.parametrize("tie_band", [CARD_TIE_BAND, 0.05])
def test_card_equals_a_brute_force_computation_on_a_tiny_population(tiny_train, tie_band) -> None:
    card = describe_population(tiny_train, tie_band=tie_band)["card"]
    brute = _brute_force_card(_chain_labels(tiny_train), tie_band)
    regret = card["regret_H"]
    assert regret["uniform"] == pytest.approx(brute["uniform"], abs=1e-12)
    assert regret["fixed_index"] == pytest.approx(brute["fixed"], abs=1e-12)
    assert regret["straight_strike"] == pytest.approx(brute["fixed"][0], abs=1e-12)
    assert regret["best_fixed_index"]["index"] == int(np.argmin(brute["fixed"]))
    assert regret["myopic_oracle"] == pytest.approx(brute["myopic"], abs=1e-12)
    assert card["myopic_loses_share"] == pytest.approx(brute["loses"], abs=1e-12)
    assert card["optimal_index"]["distribution"] == pytest.approx(brute["distribution"], abs=1e-12)
    assert card["optimal_index"]["entropy_bits"] == pytest.approx(brute["entropy"], abs=1e-12)
    assert card["chain_states"] == load_preset("tiny").scenes * load_preset("tiny").steps


def test_manifest_card_is_reproduced_exactly_by_describe(tiny_train) -> None:
    manifest = read_manifest(tiny_train)
    assert manifest["difficulty"]["tie_band"] == CARD_TIE_BAND
    assert describe_population(tiny_train)["card"] == manifest["difficulty"]


def test_card_on_hand_made_labels() -> None:
    # Two scenes; scene 0 has two states. H=2, K=2.
    q = np.array(
        [
            [[1.0, 1.0], [0.0, 2.0]],  # myopic picks 0 (Q1=1), optimal at H is 1: regret 1
            [[0.0, 0.5], [0.2, 0.1]],  # myopic picks 1, optimal 0: regret 0.4
            [[0.3, 0.3], [0.3, 0.3]],  # all tie: regret 0, optimal split 0.5/0.5
        ]
    )
    card = difficulty_card(q, np.array([0, 0, 1]), tie_band=0.0)
    r = card["regret_H"]
    # uniform per state: 0.5, 0.2, 0 -> scene means 0.35, 0 -> 0.175
    assert r["uniform"] == pytest.approx(0.175)
    # fixed 0: 1, 0 -> 0.5 ; 0 -> 0.25. fixed 1: 0, 0.4 -> 0.2; 0 -> 0.1
    assert r["fixed_index"] == pytest.approx([0.25, 0.1])
    assert r["best_fixed_index"] == {"index": 1, "regret": pytest.approx(0.1)}
    assert r["myopic_oracle"] == pytest.approx((0.7 + 0.0) / 2)
    assert card["myopic_loses_share"] == pytest.approx(2 / 3)
    assert card["optimal_index"]["distribution"] == pytest.approx([(0 + 1 + 0.5) / 3, (1 + 0 + 0.5) / 3])
    assert card["optimal_index"]["entropy_over_log2K"] == pytest.approx(1.0)


def test_card_refuses_bad_input() -> None:
    with pytest.raises(QhInputError, match=r"q.shape=\(2, 3\)"):
        difficulty_card(np.zeros((2, 3)), np.zeros(2, dtype=int))
    with pytest.raises(QhInputError, match="non-finite"):
        difficulty_card(np.full((1, 2, 2), np.nan), np.zeros(1, dtype=int))
    with pytest.raises(QhInputError, match="tie_band=-1"):
        difficulty_card(np.zeros((1, 2, 2)), np.zeros(1, dtype=int), tie_band=-1)


def test_describe_cli_prints_the_card_and_refuses_a_tampered_population(tiny_train, tmp_path, capsys) -> None:
    assert main(["scenes", "describe", str(tiny_train)]) == 0
    out = capsys.readouterr().out
    assert "straight strike (0)" in out and "myopic oracle" in out and "entropy" in out
    assert main(["scenes", "describe", str(tiny_train), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["card"] == read_manifest(tiny_train)["difficulty"]
    copy = tmp_path / "copy"
    shutil.copytree(tiny_train, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["difficulty"]["regret_H"]["uniform"] = 1.0
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DigestMismatchError):
        describe_population(copy)
    assert main(["scenes", "describe", str(copy)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_candidate_zero_is_the_straight_strike_and_features_are_honest() -> None:
    preset = puck_parameters("demo-validation")
    layout = preset.candidates
    assert [name for name, _ in CANDIDATE_FEATURES] == ["cos_direction", "sin_direction", "speed", "strikes_target"]
    for index in range(10):
        scene, positions = draw(preset, "validation", 7, index)
        strikes = candidate_strikes(scene, positions, layout)
        assert len(strikes) == layout.num_candidates == 8
        to_goal = math.atan2(scene.goal[1] - positions[0, 1], scene.goal[0] - positions[0, 0])
        assert strikes[0].puck == 0 and strikes[0].direction == to_goal and strikes[0].speed == min(layout.speeds)
        assert {s.speed for s in strikes} == set(layout.speeds)  # at least two speeds are offered
        assert any(s.puck != 0 for s in strikes)  # other pucks are struck too
        features = candidate_features(strikes)
        # The direction is in the table frame: nothing relative to the goal is a feature.
        assert features[0, 0] == pytest.approx(math.cos(to_goal)) and features[0, 1] == pytest.approx(math.sin(to_goal))


def test_bank_shots_aim_at_the_goal_mirrored_in_a_wall() -> None:
    preset = puck_parameters("demo-validation")
    scene, positions = draw(preset, "validation", 7, 0)
    # The bank direction points at the goal mirrored in a wall's turning line.
    strikes = candidate_strikes(scene, positions, preset.candidates)
    banks = strikes[len(preset.candidates.speeds) + len(preset.candidates.offsets) :][: preset.candidates.bank_shots]
    r0 = scene.radius[0]
    w, h = scene.physics.table_width, scene.physics.table_height
    gx, gy = scene.goal
    tx, ty = positions[0]
    mirrors = [(2 * r0 - gx, gy), (2 * (w - r0) - gx, gy), (gx, 2 * r0 - gy), (gx, 2 * (h - r0) - gy)]
    aims = {round(math.atan2(my - ty, mx - tx), 12) for mx, my in mirrors}
    assert all(round(b.direction, 12) in aims for b in banks) and len(banks) == 2


def test_blockers_sit_on_the_target_line_when_the_preset_asks() -> None:
    always = puck_parameters("tiny", blocker_probability=1.0, blocker_lateral=0.5)
    never = puck_parameters("tiny", blocker_probability=0.0)
    on_line = 0
    for index in range(40):
        scene, positions = draw(always, "train", 3, index)
        target, blocker, goal = positions[0], positions[1], np.array(scene.goal)
        seg = goal - target
        t = float(np.dot(blocker - target, seg) / np.dot(seg, seg))
        off = abs(float(seg[0] * (blocker - target)[1] - seg[1] * (blocker - target)[0])) / float(np.linalg.norm(seg))
        on_line += 0.3 <= t <= 0.75 and off <= 0.5 * (scene.radius[0] + scene.radius[1]) + 1e-12
        # Same stream position for the other pucks: with and without blockers puck 0 is the same.
        assert draw(never, "train", 3, index)[1][0].tolist() == target.tolist()
    # A blocker that would overlap the target falls back to a uniform placement; most fit.
    assert on_line >= 30
    with pytest.raises(QhInputError, match="blocker_probability"):
        puck_parameters("tiny", blocker_probability=1.5)


def test_a_clamped_tie_band_suggests_the_canary_multiple_at_the_clamped_band() -> None:
    from qhlab.scenes.difficulty import _suggestion_lines, suggested_settings

    # Two candidates 2000 points apart in every state: a hundredth of the spread (20) is above what a
    # study accepts (10), and the gap's multiple is of the band a study can take (1000 / 10).
    q = np.zeros((4, 2, 1))
    q[:, 1, 0] = 2000.0
    suggested = suggested_settings(q, np.ones((4, 2), dtype=bool))
    assert suggested["tie_band"] == 10.0 and suggested["canary_gap_multiple_at_most"] == 100
    assert suggested["clamped"] == ["tie_band", "huber_delta"]
    (line,) = _suggestion_lines(suggested, "points")
    assert "tie_band 10 points (clamped to what a study accepts: a hundredth of the median spread" in line
    assert "2000 points, is 20 points)" in line and "at most 100 at that tie_band" in line
