"""``qhlab env check PRESET``: an environment tried on a few scenes, nothing published.

Each case runs the command on a preset of the researcher's own environment
(``user_environment.HOPPER``) or a built-in one, and reads what it prints: the probes it ran, the
step time, the card and its suggested settings; a hidden-state fault is one refusal (exit 2).
"""

from __future__ import annotations

import json

import pytest

from qhlab.cli import main
from user_environment import write_hopper


def test_env_check_runs_the_probes_times_the_step_and_prints_the_card(tmp_path, monkeypatch, capsys) -> None:
    preset = write_hopper(tmp_path / "env")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["env", "check", str(preset), "--scenes", "4"]) == 0
    printed = capsys.readouterr().out
    assert "environment hopper: the contract holds on 3 scenes;" in printed
    assert "once more in a fresh interpreter" in printed
    assert "step time: median" in printed and "over " in printed
    assert "optional members: state_column" in printed and "reward_unit" in printed.split("declared;")[1]
    assert "hopper-train-seed0 (train): 4 scenes" in printed and "suggested for a study on it: tie_band" in printed
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written where it ran


def test_env_check_json_names_the_identity_and_suggestions(capsys) -> None:
    assert main(["env", "check", "tanks-tiny", "--scenes", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["environment"] == "tanks" and result["identity"]["numpy"]
    assert result["reward_unit"] == "m" and result["contract"]["fresh_process"] is False
    assert result["step_seconds"]["steps"] >= 3 and result["step_seconds"]["median"] > 0
    assert set(result["suggested"]) == {"spread_H", "tie_band", "huber_delta", "canary_gap_multiple_at_most", "clamped"}
    assert result["card"]["scenes"] == 3
    assert result["optional"] == {
        "declared": ["feature_names", "state_column", "reward_unit", "reference_candidate"],
        "defaults": ["terminal", "scene_id", "generator_record"],
    }


@pytest.mark.parametrize("fault, cause", [("remembers_scene", "hidden state"), ("process_hash", "fresh interpreter")])
def test_env_check_refuses_hidden_state(tmp_path, capsys, fault, cause) -> None:
    preset = write_hopper(tmp_path / "env", options=f'fault = "{fault}"')
    assert main(["env", "check", str(preset)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and cause in err, err


def test_env_check_refuses_a_bad_scene_count(capsys) -> None:
    assert main(["env", "check", "tiny", "--scenes", "0"]) == 2
    assert "qhlab env check: --scenes=0 is not allowed; allowed: an integer in 1..200" in capsys.readouterr().err
