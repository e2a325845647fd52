"""A reward too large for a label is refused at the step that returned it, never after labelling.

A label sums up to H rewards and the scorer trains in float32: a finite reward of 1e308 would
overflow the labels (numpy warnings, then an infinite regret in the difficulty card). Each is
refused when the environment's ``step`` returns it, naming the environment, the step, the scene
and the reward: exit 2, one error line, no numpy warning, nothing written.
"""

from __future__ import annotations

import warnings

import pytest

from qhlab.cli import main
from qhlab.evidence import QhInputError
from qhlab.scenes import generate_population
from qhlab.scenes.environment import MAX_REWARD_MAGNITUDE
from user_environment import write_hopper


def _generate(preset, out) -> list[str]:
    return ["scenes", "generate", "--preset", str(preset), "--split", "train", "--seed", "0", "--out", str(out)]


@pytest.mark.parametrize(
    "fault, scene",
    # At once (the contract's probes, on the first scenes); only in a scene past the probed ones
    # (scene 4 of seed 0's five), found while its labels are searched.
    [("huge_reward", "of scene 0"), ("huge_reward_far", "of scene 4")],
)
def test_a_reward_that_would_overflow_a_label_is_refused_at_its_step(tmp_path, capfd, fault, scene) -> None:
    preset = write_hopper(tmp_path / "env", options=f'fault = "{fault}"')
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1", "--no-progress"]) == 2
    captured = capfd.readouterr()
    err = captured.out + captured.err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert f"environment 'hopper': step(scene, state, 0) {scene} returned reward 1e+308" in err, err
    assert f"allowed: a finite number of magnitude at most {MAX_REWARD_MAGNITUDE:g}" in err, err
    assert "HINT: declare the reward in a larger unit" in err, err
    assert "Warning" not in err and "overflow encountered" not in err and "canonical_json" not in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["env"]


def test_the_refusal_comes_before_any_numpy_overflow(tmp_path) -> None:
    preset = write_hopper(tmp_path / "env", options='fault = "huge_reward_far"')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy overflow warning would fail here, not pass by
        with pytest.raises(QhInputError, match=r"of scene 4 returned reward 1e\+308"):
            generate_population(preset, "train", 0, tmp_path / "pop", workers=1)
    assert not (tmp_path / "pop").exists()
