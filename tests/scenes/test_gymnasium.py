"""Gymnasium tasks by id: a standard task becomes a population with no adapter of one's own.

Each case writes a preset naming ``factory = "qhlab.scenes.gymnasium:make"`` and an ``env_id``,
generates from it with ``qhlab scenes generate`` and reads back what qhlab wrote: the manifest's
identity (Gymnasium's version, the task's entry point), episode ends as absorbing terminal states,
the card's warnings, and one refusal (exit 2, nothing written) for each task it cannot take.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import gymnasium
import numpy as np
import pandas as pd
import pytest

from qhlab.cli import main
from qhlab.evidence import QhInputError
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
        # Randomness, detected exactly: a transition table row with more than one outcome, at any
        # probability, and a step whose draw changes it (the fickle passenger's coin is drawn at reset).
        (
            'env_id = "FrozenLake-v1"\nkwargs = { is_slippery = true }',
            "env_id='FrozenLake-v1' (kwargs",
            "a task whose step is deterministic",
        ),
        (
            'env_id = "FrozenLake-v1"\nkwargs = { is_slippery = true, success_rate = 0.995 }',
            "probabilities: 0.0025, 0.995, 0.0025",
            "kwargs = { is_slippery = false } makes it deterministic",
        ),
        (
            'env_id = "Taxi-v4"\nkwargs = { is_rainy = true, rainy_probability = 0.999 }',
            "env_id='Taxi-v4'",
            "kwargs = { is_rainy = false } makes it deterministic",
        ),
        (
            'env_id = "Taxi-v4"\nkwargs = { fickle_passenger = true, fickle_probability = 0.001 }',
            "draws from its random generator (np_random.choice",
            "kwargs = { fickle_passenger = false } makes it deterministic",
        ),
        # Options that cannot serve a study.
        ('env_id = "CartPole-v1"\nkwargs = { render_mode = "human" }', "kwargs.render_mode='human'", "no render mode"),
        (
            'env_id = "CartPole-v1"\nkwargs = { max_episode_steps = 2 }',
            "kwargs.max_episode_steps=2",
            "the task's own keyword arguments only",
        ),
        (
            'env_id = "minigrid:MiniGrid-Empty-5x5-v0"\nkwargs = { max_steps = 2 }',
            "horizon=3",
            "episode limit (2 steps)",
        ),
        (
            'env_id = "CliffWalking-v1"\nshaping = { feature = 0 }',
            "shaping={'feature': 0}",
            "shaping on a state with coordinates",
        ),
        (
            'env_id = "CartPole-v1"\nshaping = { feature = 0, scale = 1e308 }',
            "shaping=",
            "a finite number of magnitude at most 1e+09",
        ),
        ('env_id = "FrozenLake-v1"\nkwargs = { map_name = "9x9" }', "kwargs.map_name='9x9'", "(it raised KeyError"),
        # A keyword of another type than its default's would be taken without a word.
        (
            'env_id = "FrozenLake-v1"\nkwargs = { is_slippery = "no" }',
            "kwargs.is_slippery='no'",
            "allowed: true or false, as FrozenLake-v1's default True is",
        ),
        ('env_id = "Taxi-v4"\nkwargs = { rainy_probability = "0.5" }', "kwargs.rainy_probability='0.5'", "a number"),
        # A package's task named without its package: a fresh process would not know the id.
        ('env_id = "MiniGrid-Empty-5x5-v0"', "env_id='MiniGrid-Empty-5x5-v0'", "'minigrid:MiniGrid-Empty-5x5-v0'"),
        ('env_id = "nosuchpackage:Task-v0"', "env_id='nosuchpackage:Task-v0'", "a module that registers the task"),
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


def _set_forgetting(env, values):  # the whole vector, but not the episode-end memory beside it
    env.state = np.array(values)


def _set_position_only(env, values):
    state = np.array(env.state, dtype=np.float64)
    state[0] = values[0]
    env.state = state
    env.steps_beyond_terminated = None


def make(options):
    options = dict(options)
    partial, forget = options.pop("partial", False), options.pop("forget", False)
    setter = _set_position_only if partial else _set_forgetting if forget else _set_all
    return make_with_state(options, get_state=_get, set_state=setter)
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


def test_a_pair_that_leaves_out_the_episode_end_memory_is_refused_at_generation(tmp_path, capsys) -> None:
    # Two steps from a start within 0.1 of upright never reach an episode's end, where CartPole's
    # steps_beyond_terminated turns the next step's reward from 1.0 to 0.0: the probes' rollouts do.
    preset = _own_pair_preset(tmp_path, 'env_id = "CartPole-v1"\nreset = { low = -0.1, high = 0.1 }\nforget = true')
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "step(scene, state, " in err and "neither read nor set" in err, err
    assert not (tmp_path / "pop").exists()


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None, reason="Box2D is installed here")
def test_a_missing_extra_is_named_as_the_missing_extra(tmp_path, capsys) -> None:
    preset = _preset(tmp_path, 'env_id = "LunarLander-v3"\nkwargs = { continuous = false }')
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "env_id='LunarLander-v3'" in line and "a task whose dependencies are installed" in line, line
    assert "Box2D is not installed" in line and "continuous" not in line, line


_MINIGRID = 'env_id = "minigrid:MiniGrid-Empty-Random-5x5-v0"\nreward_unit = "points"'


def test_a_third_party_task_by_id_comes_in_whole_with_its_package_bound(tmp_path, capsys) -> None:
    preset = _preset(tmp_path, _MINIGRID, name="grid")
    assert main(["env", "check", str(preset), "--scenes", "2"]) == 0, capsys.readouterr().err
    checked = capsys.readouterr().out
    assert "repeated each action to the episode's end" in checked and "starts:" in checked, checked
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 0, capsys.readouterr().err
    environment = read_manifest(out)["generator"]["environment"]
    version = importlib.metadata.version("minigrid")
    assert environment["identity"]["package"] == f"minigrid {version}"
    assert environment["identity"]["state"] == "whole-state snapshot"
    assert environment["identity"]["entry_point"] == "minigrid.envs:EmptyEnv"
    assert environment["source"] is None  # an installed package is bound by version, never copied
    # The features are the task's own observation (7x7x3 view, 4 directions one-hot), then the done flag.
    assert len(read_manifest(out)["features"]["objects"]) == 147 + 4 + 1
    states = pd.read_parquet(out / "states.parquet")
    assert len({bytes(np.asarray(s).tobytes()) for s in states["state"]}) > 1
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0, capsys.readouterr().err
    assert f"package minigrid {version}" in capsys.readouterr().out


def test_another_installed_version_of_the_package_is_named(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "pop"
    assert main([*_generate(_preset(tmp_path, _MINIGRID, name="grid"), out), "--workers", "1"]) == 0
    capsys.readouterr()
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9" if name == "minigrid" else real(name))
    assert main(["scenes", "audit", str(out)]) == 2
    err = capsys.readouterr().err
    here = real("minigrid")
    assert f"environment.identity.package: recorded 'minigrid {here}', here 'minigrid 9.9.9'" in err, err


_OWN_TASK = """
import random

import gymnasium
import numpy as np
from gymnasium import spaces


class Corridor(gymnasium.Env):
    def __init__(self, length=12):
        self.length = length
        self.observation_space = spaces.Box(0.0, float(length), shape=(1,), dtype=np.float64)
        self.action_space = spaces.Discrete(2)
        self.state = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.array([float(self.np_random.integers(0, self.length - 1))])
        return self.state.copy(), {}

    def step(self, action):
        position = float(np.clip(self.state[0] + (1.0 if action == 1 else -1.0), 0, self.length - 1))
        self.state = np.array([position])
        done = position == self.length - 1
        return self.state.copy(), float(done), done, False, {}


class DrawingCorridor(Corridor):
    def step(self, action):
        self.np_random.random()  # drawn and never used: qhlab cannot tell it from a draw that matters
        return super().step(action)


class GlobalCorridor(Corridor):
    def step(self, action):
        observation, reward, done, truncated, info = super().step(action)
        return observation, reward + 0.01 * np.random.random(), done, truncated, info


class StdlibCorridor(Corridor):
    def step(self, action):
        observation, reward, done, truncated, info = super().step(action)
        return observation, reward + 0.01 * random.random(), done, truncated, info


gymnasium.register(id="Corridor-v0", entry_point="my_tasks:Corridor", max_episode_steps=50)
gymnasium.register(id="DrawingCorridor-v0", entry_point="my_tasks:DrawingCorridor", max_episode_steps=50)
gymnasium.register(id="GlobalCorridor-v0", entry_point="my_tasks:GlobalCorridor", max_episode_steps=50)
gymnasium.register(id="StdlibCorridor-v0", entry_point="my_tasks:StdlibCorridor", max_episode_steps=50)
"""


def test_a_task_registered_in_ones_own_module_is_frozen_and_bound(tmp_path, capsys) -> None:
    (tmp_path / "my_tasks.py").write_text(_OWN_TASK)
    preset = _preset(tmp_path, 'env_id = "my_tasks:Corridor-v0"', name="corridor")
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1"]) == 0, capsys.readouterr().err
    environment = read_manifest(out)["generator"]["environment"]
    assert environment["source"]["module"] == "my_tasks"
    assert (out / "environment" / "my_tasks.py").read_text() == _OWN_TASK
    assert environment["identity"]["registration"] == environment["source"]["sha256"]
    assert environment["identity"]["entry_point"] == "my_tasks:Corridor"
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0, capsys.readouterr().err
    assert main(["scenes", "audit", str(out)]) == 0
    assert "imported from the frozen copy inside the population" in capsys.readouterr().out
    # The user's file edited: a new generation binds the new bytes, under another digest.
    (tmp_path / "my_tasks.py").write_text(_OWN_TASK.replace("length=12", "length=10"))
    again = tmp_path / "again"
    assert main([*_generate(preset, again), "--workers", "1"]) == 0
    assert read_manifest(again)["generator"]["environment"]["source"]["sha256"] != environment["source"]["sha256"]
    # The frozen copy edited: verify names the file.
    copy = out / "environment" / "my_tasks.py"
    copy.chmod(0o644)
    copy.write_text(_OWN_TASK + "# edited\n")
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    assert "environment/my_tasks.py" in capsys.readouterr().err


def test_env_check_names_a_task_that_starts_the_same_everywhere(tmp_path, capsys) -> None:
    preset = _preset(tmp_path, 'env_id = "CliffWalking-v1"', name="cliff")
    assert main(["env", "check", str(preset), "--scenes", "2"]) == 0
    out = capsys.readouterr().out
    assert "warning: starts: every one of the 6 scenes drawn starts in the same state" in out, out


def test_a_step_that_draws_is_refused_even_where_the_draw_changes_nothing(tmp_path, capsys) -> None:
    (tmp_path / "my_tasks.py").write_text(_OWN_TASK)
    preset = _preset(tmp_path, 'env_id = "my_tasks:DrawingCorridor-v0"', name="drawing")
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "env_id='my_tasks:DrawingCorridor-v0' is not allowed; allowed: a task whose step is deterministic" in line
    assert "draws from its random generator (np_random.random)" in line and "one outcome" in line, line
    assert not (tmp_path / "pop").exists()


@pytest.mark.parametrize(
    ("task", "generator"),
    [("GlobalCorridor", "numpy's global generator (np.random)"), ("StdlibCorridor", "Python's random module")],
)
def test_a_step_that_draws_behind_the_tasks_own_generator_is_refused(tmp_path, capsys, task, generator) -> None:
    (tmp_path / "my_tasks.py").write_text(_OWN_TASK)
    preset = _preset(tmp_path, f'env_id = "my_tasks:{task}-v0"', name=task.lower())
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"env_id='my_tasks:{task}-v0' is not allowed; allowed: a task whose step is deterministic" in line
    assert f"draws from {generator}, which no seed of the task fixes" in line, line
    assert not (tmp_path / "pop").exists()


def test_a_forged_snapshot_in_a_state_runs_no_code(tmp_path) -> None:
    # verify and audit step stored states again: a state's snapshot is read naming only the task's
    # own classes, containers, numbers and arrays, never a function of the forger's choosing.
    import os
    import pickle

    environment = Environment.make(
        EnvironmentSpec("qhlab.scenes.gymnasium:make", {"env_id": "minigrid:MiniGrid-Empty-Random-5x5-v0"})
    )
    scene = environment.sample_scene(0)
    state = environment.initial_state(scene)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    task = environment.env
    forged = state.copy()
    forged[task.features : -1] = task._snapshots.pack(pickle.dumps({"agent_dir": Payload()}, protocol=4))
    with pytest.raises(QhInputError, match="a snapshot names posix.system, which is neither a class of the task"):
        environment.step(scene, forged, 0)
    assert not marker.exists()
    assert "minigrid" in task._snapshots.packages and "typing" not in task._snapshots.packages
    environment.step(scene, state, 0)  # the real state still steps
