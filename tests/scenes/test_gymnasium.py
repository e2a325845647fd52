"""Gymnasium tasks by id: a standard task becomes a population with no adapter of one's own.

Each case writes a preset naming ``factory = "qhlab.scenes.gymnasium:make"`` and an ``env_id``,
generates from it with ``qhlab scenes generate`` and reads back what qhlab wrote: the manifest's
identity (Gymnasium's version, the task's entry point), episode ends as absorbing terminal states,
the card's warnings, and one refusal (exit 2, nothing written) for each task it cannot take.
"""

from __future__ import annotations

import json

import gymnasium
import numpy as np
import pandas as pd
import pytest

from qhlab.cli import main
from qhlab.scenes import generate_population, read_manifest
from qhlab.scenes.environment import Environment, EnvironmentSpec
from qhlab.scenes.presets import load_preset

_PRESET = """name = "{name}"
scenes = {scenes}
chains_per_scene = 1
steps = 3
horizon = 3

[actor]
kind = "epsilon-greedy"
epsilon = 0.3

[environment]
factory = "qhlab.scenes.gymnasium:make"

[environment.options]
{options}
"""


def _preset(tmp_path, options: str, *, name: str = "task", scenes: int = 6):
    path = tmp_path / f"{name}.toml"
    path.write_text(_PRESET.format(name=name, scenes=scenes, options=options))
    return path


def _generate(preset, out, *extra: str) -> list[str]:
    return ["scenes", "generate", "--preset", str(preset), "--split", "train", "--seed", "0", "--out", str(out),
            "--no-progress", *extra]  # fmt: skip


@pytest.mark.parametrize(
    "env_id, options, entry_point, actions, state_width",
    [
        ("CartPole-v1", "reset = { low = -0.1, high = 0.1 }", "classic_control.cartpole:CartPoleEnv", 2, 4),
        ("Acrobot-v1", "", "classic_control.acrobot:AcrobotEnv", 3, 4),
        ("MountainCar-v0", "", "classic_control.mountain_car:MountainCarEnv", 3, 2),
        ("FrozenLake-v1", "kwargs = { is_slippery = false }", "toy_text.frozen_lake:FrozenLakeEnv", 4, 16),
    ],
)
def test_a_task_by_id_generates_and_binds_its_identity(
    tmp_path, capsys, env_id, options, entry_point, actions, state_width
) -> None:
    preset = _preset(tmp_path, f'env_id = "{env_id}"\n{options}')
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 0, capsys.readouterr().err
    manifest = read_manifest(out)
    environment = manifest["generator"]["environment"]
    assert environment["factory"] == "qhlab.scenes.gymnasium:make"
    assert environment["identity"]["name"] == env_id
    assert environment["identity"]["gymnasium"] == gymnasium.__version__
    assert environment["identity"]["entry_point"].endswith(entry_point)
    # Its own reward names no unit: nothing qhlab prints of it says metres.
    assert environment["reward_unit"] == ""
    assert manifest["K"] == actions
    assert [f["name"] for f in manifest["features"]["candidates"]] == [f"action_{i}" for i in range(actions)]
    assert len(manifest["features"]["objects"]) == state_width + 1  # the state's values, then the done flag


def test_cartpole_unshaped_has_nothing_to_learn_at_a_short_horizon_and_says_so(tmp_path, capsys) -> None:
    # +1 per step whatever the action: at H=3 from near upright every action survives.
    preset = _preset(tmp_path, 'env_id = "CartPole-v1"\nreset = { low = -0.05, high = 0.05 }')
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert any(w.startswith("nothing to learn") for w in printed["warnings"]), printed["warnings"]
    assert main(["scenes", "describe", str(out)]) == 0
    card = capsys.readouterr().out
    assert "WARNING: nothing to learn" in card
    assert "rewards and regret in the environment's own reward, which names no unit" in card
    assert " m;" not in card and "tie_band=0.001;" in card


def test_shaping_gives_a_short_horizon_something_to_tell_apart(tmp_path, capsys) -> None:
    preset = _preset(
        tmp_path,
        'env_id = "CartPole-v1"\nreset = { low = -0.1, high = 0.1 }\n'
        "shaping = { feature = 3, scale = -1.0, absolute = true }\n"
        'reward_unit = "steps"',
        scenes=10,
    )
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    assert read_manifest(out)["generator"]["environment"]["reward_unit"] == "steps"
    assert main(["scenes", "describe", str(out)]) == 0
    assert "tie_band=0.001 steps;" in capsys.readouterr().out


def test_an_episode_end_is_an_absorbing_terminal_state() -> None:
    # Started at the edge of CartPole's angle limit (0.2095 rad), some actions end the episode.
    spec = EnvironmentSpec("qhlab.scenes.gymnasium:make", {"env_id": "CartPole-v1", "reset": {"low": 0.2, "high": 0.2}})
    environment = Environment.make(spec)
    scene = environment.sample_scene(3)
    state = environment.initial_state(scene)
    for _ in range(10):  # pushing the cart away from the fall: the pole falls on within a few steps
        state, reward = environment.step(scene, state, 0)
        if state[-1] == 1.0:
            break
    ended = state
    assert ended[-1] == 1.0, "the pole should fall past the limit"
    assert environment.terminal(scene, ended)
    for action in (0, 1):
        again, reward = environment.step(scene, ended, action)
        assert again.tobytes() == ended.tobytes() and reward == 0.0


def test_terminal_states_are_absorbing_in_the_population_qhlab_writes(tmp_path) -> None:
    preset = _preset(tmp_path, 'env_id = "CartPole-v1"\nreset = { low = 0.18, high = 0.2 }', scenes=6)
    out = generate_population(load_preset(preset), "train", 0, tmp_path / "pop", workers=1)
    states = pd.read_parquet(out / "states.parquet")
    done = np.array([s[-1] for s in states["state"]])
    assert done.max() == 1.0 and done.min() == 0.0, "the population should hold both live and ended states"
    # No label of an ended state exceeds 0: every candidate leads back to it, reward 0.
    candidates = pd.read_parquet(out / "candidates.parquet")
    ended = set(states.loc[done == 1.0, "state_id"])
    labels = np.stack(candidates.loc[candidates["state_id"].isin(ended), "q"].to_numpy())
    assert labels.size and np.all(labels == 0.0)


@pytest.mark.parametrize(
    "options, field, allowed",
    [
        ('env_id = "FrozenLake-v1"\nkwargs = { is_slippery = true }', "step(scene, state, ", "not deterministic"),
        ('env_id = "Pendulum-v1"', "env_id='Pendulum-v1'", "allowed: a task with discrete actions"),
        ('env_id = "CartPole-v1"\ncolour = "red"', "options=['colour']", "allowed: only env_id, kwargs, reset"),
        ('env_id = "NoSuchTask-v9"', "env_id='NoSuchTask-v9'", "allowed: a registered Gymnasium id"),
        ('env_id = "CartPole-v1"\nshaping = { feature = 9 }', "shaping=", "an index of the state (0..3)"),
        ('env_id = "CartPole-v1"\nreward_unit = 3', "reward_unit=3", "a string"),
        # A reset key the task never reads (CartPole reads low and high) would be silently ignored.
        (
            'env_id = "CartPole-v1"\nreset = { lo = -0.1, high = 0.1 }',
            "reset={'lo': -0.1, 'high': 0.1}",
            "allowed: keys CartPole-v1's reset reads (it never read 'lo')",
        ),
    ],
)
def test_a_task_qhlab_cannot_take_is_one_refusal_and_writes_nothing(tmp_path, capsys, options, field, allowed) -> None:
    preset = _preset(tmp_path, options)
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and field in err and allowed in err, err
    assert "Traceback" not in err and not out.exists()


def test_the_same_task_gives_byte_identical_files_whatever_the_workers(tmp_path) -> None:
    preset = load_preset(_preset(tmp_path, 'env_id = "Acrobot-v1"', scenes=8))
    one = generate_population(preset, "train", 4, tmp_path / "one", workers=1)
    two = generate_population(preset, "train", 4, tmp_path / "two", workers=2)
    for name in ("scenes.parquet", "states.parquet", "candidates.parquet", "manifest.json"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


_OWN_PAIR = """
import numpy as np

from qhlab.scenes.gymnasium import make_with_state


def _get(env):
    return np.asarray(env.state, dtype=np.float64)


def _set_all(env, values):
    env.state = np.array(values)
    env.steps_beyond_terminated = None


def _set_position_only(env, values):
    state = np.array(env.state, dtype=np.float64)
    state[0] = values[0]
    env.state = state
    env.steps_beyond_terminated = None


def make(options):
    options = dict(options)
    partial = options.pop("partial", False)
    return make_with_state(options, get_state=_get, set_state=_set_position_only if partial else _set_all)
"""


def _own_pair_preset(tmp_path, options: str):
    (tmp_path / "task.py").write_text(_OWN_PAIR)
    path = _preset(tmp_path, options, name="own")
    path.write_text(path.read_text().replace('"qhlab.scenes.gymnasium:make"', '"task.py:make"'))
    return path


def test_a_pair_of_ones_own_reads_and_sets_the_state_and_labels_as_the_builtin_does(tmp_path, capsys) -> None:
    options = 'env_id = "CartPole-v1"\nreset = { low = -0.1, high = 0.1 }\nshaping = { feature = 2, scale = -1.0 }'
    own = tmp_path / "own"
    own.mkdir()
    assert main([*_generate(_own_pair_preset(own, options), own / "pop"), "--workers", "1"]) == 0, capsys.readouterr()
    builtin = generate_population(load_preset(_preset(tmp_path, options)), "train", 0, tmp_path / "pop", workers=1)
    identity = read_manifest(own / "pop")["generator"]["environment"]["identity"]
    assert identity["state"] == "get_state/set_state" and identity["name"] == "CartPole-v1"
    assert read_manifest(builtin)["generator"]["environment"]["identity"]["state"] == "unwrapped.state"
    for name, column in (("states.parquet", "state"), ("candidates.parquet", "q")):
        mine, theirs = pd.read_parquet(own / "pop" / name), pd.read_parquet(builtin / name)
        assert len(mine) == len(theirs) > 0
        assert all(np.array_equal(a, b) for a, b in zip(mine[column], theirs[column], strict=True)), column


def test_a_pair_that_sets_part_of_the_state_is_refused_as_hidden_state(tmp_path, capsys) -> None:
    preset = _own_pair_preset(tmp_path, 'env_id = "CartPole-v1"\npartial = true')
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "step(scene, state, " in err and "not deterministic" in err, err
    assert not (tmp_path / "pop").exists()


def test_a_typo_in_the_options_of_ones_own_pair_is_qhlabs_refusal_not_an_error_in_ones_code(tmp_path, capsys) -> None:
    preset = _own_pair_preset(tmp_path, 'env_id = "CartPole-v1"\npul = 0.6')
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: qhlab.scenes.gymnasium: options=['pul'] is not allowed; allowed: only env_id"), line
    assert line.count("HINT") == 1 and "own code" not in line
    assert not (tmp_path / "pop").exists()
