"""A study of a Gymnasium task, end to end: CartPole by id, no adapter of one's own.

The preset names ``factory = "qhlab.scenes.gymnasium:make"``; the study freezes, fits, reports in
the task's own reward unit (never metres) and verifies, the verify naming Gymnasium's version.
With CartPole's native reward (+1 a step; its Euler step moves the pole by the old velocity, so
no first step's reward depends on the action) no state's candidates differ at h=1, the E0 gate
cannot pass, and the freeze says so before any fit.
"""

from __future__ import annotations

import json

import gymnasium
import pytest

from qhlab.cli import main
from qhlab.evidence.layout import DEVELOPMENT_RECEIPT, E0_RECEIPT

_PRESET = """name = "cartpole-shaped"
scenes = 60
chains_per_scene = 1
steps = 3
horizon = 3

[actor]
kind = "epsilon-greedy"
epsilon = 0.3

[environment]
factory = "qhlab.scenes.gymnasium:make"

[environment.options]
env_id = "CartPole-v1"
reset = { low = -0.1, high = 0.1 }
# +1 per step tells no actions apart at H=3; the pole's angular speed as a potential does.
shaping = { feature = 3, scale = -1.0, absolute = true }
reward_unit = "steps"
"""

_STUDY = """name = "cartpole-study"
profile = "cpu-fp32"
seeds = [0, 1]
canary_updates = 800
canary_gap_multiple = 20
broad_updates = 60
tie_band = 0.001
regret_fraction = 0.9
mae_fraction = 1.1
workers = 2
population_cache = "pops"

[train]
preset = "cartpole.toml"
seed = 7

[validation]
preset = "cartpole.toml"
seed = 8

[bootstrap]
resamples = 199
seed = 0

[experiment.recipe]
name = "cartpole"
horizon = 3
batch_size = 16
huber_delta = 1.0
architecture = { arm = "baseline", encoder = { depth = 1, width = 16, heads = 2 } }
optimizer = { lr = 3e-3 }
target_update = { kind = "hard", interval = 10 }

[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "variant_cross_attention"
role = "variant"
control = "control_global_readout"
"""


@pytest.mark.slow
def test_a_cartpole_study_runs_reports_in_its_own_unit_and_verifies(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "cartpole.toml").write_text(_PRESET)
    (tmp_path / "study.toml").write_text(_STUDY)
    monkeypatch.chdir(tmp_path)
    assert main(["study", "run", "study.toml", "--output", "out"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert report["unit"] == "steps"
    markdown = (tmp_path / "out" / "report" / "report.md").read_text()
    assert "Rewards, labels, MAE and regret are in steps." in markdown
    assert " m [" not in markdown and " m," not in markdown and "metres" not in markdown
    assert report["question"][0]["decision"] in ("retained", "not retained", "undecided")
    assert main(["verify", "out"]) == 0
    printed = capsys.readouterr().out
    entry = "entry_point gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    assert f"CartPole-v1: {entry}, gymnasium {gymnasium.__version__}" in printed
    assert printed.count("every label obeys the Bellman rule exactly") == 2
    # An edited preset file is noticed, never silently ignored: the study keeps what it froze.
    (tmp_path / "cartpole.toml").write_text(_PRESET.replace("epsilon = 0.3", "epsilon = 0.5"))
    assert main(["study", "status", "out"]) == 0
    status = capsys.readouterr().out
    assert f"train preset file {tmp_path / 'cartpole.toml'} changed since freeze" in status
    assert f"validation preset file {tmp_path / 'cartpole.toml'} changed since freeze" in status
    assert main(["study", "run", "study.toml", "--output", "out"]) == 0
    rerun = capsys.readouterr().out
    assert "note: train preset file" in rerun and "the study keeps the preset it froze" in rerun
    assert "is complete: every receipt authenticated" in rerun


def test_cartpole_with_its_native_reward_is_refused_at_freeze_before_any_fit(tmp_path, monkeypatch, capsys) -> None:
    native = _PRESET.replace("shaping = { feature = 3, scale = -1.0, absolute = true }\n", "")
    native = native.replace("reset = { low = -0.1, high = 0.1 }", "reset = { low = -0.2, high = 0.2 }")
    assert "shaping" not in native.split("[environment.options]")[1].replace("# ", "#").split("#")[0]
    (tmp_path / "cartpole.toml").write_text(native)
    (tmp_path / "study.toml").write_text(_STUDY)
    monkeypatch.chdir(tmp_path)
    assert main(["scenes", "generate", "--preset", "cartpole.toml", "--split", "train", "--seed", "7",
                 "--out", "look", "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["study", "run", "study.toml", "--output", "out"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "freeze_study: train=" in err and "at every horizon" in err, err
    assert not (tmp_path / "out").exists(), sorted(p.name for p in (tmp_path / "out").rglob("*"))


_CLIFF = _PRESET.replace("cartpole-shaped", "cliff").split("[environment.options]")[0] + (
    '[environment.options]\nenv_id = "CliffWalking-v1"\n'
)


def test_a_validation_that_repeats_trains_starts_is_refused_at_freeze_before_any_label(
    tmp_path, monkeypatch, capsys
) -> None:
    # CliffWalking starts every episode in one cell: its validation scenes would be TRAIN's.
    (tmp_path / "cartpole.toml").write_text(_CLIFF.replace("scenes = 60", "scenes = 12"))
    (tmp_path / "study.toml").write_text(_STUDY)
    monkeypatch.chdir(tmp_path)
    assert main(["study", "run", "study.toml", "--output", "out"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "freeze_study: validation=" in err, err
    assert "12 scene(s) repeat a start (validation scene 0 starts where TRAIN scene" in err, err
    assert not (tmp_path / "out").exists()
    assert not [p for p in (tmp_path / "pops").iterdir() if "validation" in p.name]


# A MiniGrid task by id, its whole state snapshotted: TRAIN's 24 scenes (seed 7) and validation's 6
# (seed 295) start in 23 distinct states of the 32 this grid has, none shared.
_GRID = _PRESET.split("[environment.options]")[0] + (
    '[environment.options]\nenv_id = "minigrid:MiniGrid-Empty-Random-5x5-v0"\nreward_unit = "points"\n'
)


def _grid(name: str, scenes: int) -> str:
    return _GRID.replace('name = "cartpole-shaped"', f'name = "{name}"').replace("scenes = 60", f"scenes = {scenes}")


@pytest.mark.slow
def test_a_minigrid_study_by_id_runs_and_verifies_with_no_state_pair(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "grid.toml").write_text(_grid("grid", 24))
    (tmp_path / "grid-validation.toml").write_text(_grid("grid-validation", 6))
    study = _STUDY.replace('preset = "cartpole.toml"\nseed = 7', 'preset = "grid.toml"\nseed = 7')
    study = study.replace('preset = "cartpole.toml"\nseed = 8', 'preset = "grid-validation.toml"\nseed = 295')
    # MiniGrid's reward falls by 0.9 / max_steps = 0.009 a step: the E0 gap must be below that.
    (tmp_path / "study.toml").write_text(study.replace("canary_gap_multiple = 20", "canary_gap_multiple = 5"))
    monkeypatch.chdir(tmp_path)
    assert main(["study", "run", "study.toml", "--output", "out"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert report["unit"] == "points"
    assert main(["verify", "out"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("package minigrid 3.2.0, spec_version 0, state whole-state snapshot") == 2, printed


@pytest.mark.slow
def test_a_validation_named_by_path_that_repeats_trains_starts_is_refused_at_development(
    tmp_path, monkeypatch, capsys
) -> None:
    # Named by path, the validation is not drawn by the study: its starts are read at development.
    (tmp_path / "grid.toml").write_text(_grid("grid", 24))
    (tmp_path / "grid-validation.toml").write_text(_grid("grid-validation", 6))
    monkeypatch.chdir(tmp_path)
    assert main(["scenes", "generate", "--preset", "grid-validation.toml", "--split", "validation", "--seed", "6",
                 "--out", "repeating", "--no-progress"]) == 0  # fmt: skip
    study = _STUDY.replace('preset = "cartpole.toml"\nseed = 7', 'preset = "grid.toml"\nseed = 7')
    study = study.replace('preset = "cartpole.toml"\nseed = 8', 'path = "repeating"')
    (tmp_path / "study.toml").write_text(study.replace("canary_gap_multiple = 20", "canary_gap_multiple = 5"))
    capsys.readouterr()
    assert main(["study", "run", "study.toml", "--output", "out"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "prepare_development: validation=" in err, err
    assert "2 scene(s) that repeat a start: validation scene" in err and "starts where TRAIN scene" in err, err
    assert list((tmp_path / "out").rglob(E0_RECEIPT)), "the E0 gate passed before development"
    assert not list((tmp_path / "out").rglob(DEVELOPMENT_RECEIPT)), "development must not be sealed"
