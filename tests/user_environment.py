"""A researcher's own environment, written outside the repository by the tests that need one.

``hopper.py``: a frog hops between 2..4 stones on a line toward a goal. Candidate 0 waits (it acts
on no stone: ``candidate_object`` -1); candidate i hops a share ``pull`` of the way to stone i-1.
The ``fault`` option breaks one part of the contract at a time, so each refusal at generation
can be shown on the same file.
"""

from __future__ import annotations

from pathlib import Path

HOPPER = '''"""A frog hops between stones on a line toward a goal: an environment of one's own."""

import json
import os
import pathlib

import numpy as np

# Proof that a command imported this file: it leaves a mark where the test says.
if os.environ.get("HOPPER_IMPORT_MARK"):
    pathlib.Path(os.environ["HOPPER_IMPORT_MARK"]).write_text("imported")

_CALLS = [0]


class Hopper:
    identity = {"name": "hopper", "version": "1"}
    object_features = 2
    goal_features = 1
    candidate_features = 2
    max_objects = 4
    max_candidates = 5
    state_column = "position"
    reference_candidate = "wait"

    def __init__(self, options):
        unknown = sorted(set(options) - {"pull", "fault", "fixed_level"})
        if unknown:
            raise ValueError(f"hopper: options {unknown} are not allowed; allowed: pull, fault, fixed_level")
        self.pull = float(options.get("pull", 0.6))
        self.fault = options.get("fault")
        self.fixed_level = bool(options.get("fixed_level", False))
        # A configuration idiom that hides a dependence from the freeze: the surroundings' word wins.
        if os.environ.get("HOPPER_PULL"):
            self.pull = float(os.environ["HOPPER_PULL"])

    def sample_scene(self, seed):
        rng = np.random.default_rng(0 if self.fixed_level else seed)
        n = int(rng.integers(2, 5))
        stones = np.sort(rng.uniform(0.0, 10.0, n))
        goal, start = float(rng.uniform(0, 10)), float(rng.uniform(0, 10))
        scene = {"stones": [float(s) for s in stones], "goal": goal, "start": start}
        if self.fault == "nondeterministic_scene":
            _CALLS[0] += 1
            scene["start"] += _CALLS[0]
        if self.fault == "scene_not_json":
            scene["start"] = {1, 2}
        if self.fault == "raises":
            raise RuntimeError("the stones are wet")
        return scene

    def initial_state(self, scene):
        # What a simulator with a reset() remembers: the scene it was last reset to.
        self._last_goal = scene["goal"]
        return np.array([scene["start"]], dtype=np.float64)

    def candidates(self, scene, state):
        if self.fault == "too_many_candidates":
            return self.max_candidates + 1
        return 1 + len(scene["stones"])

    def step(self, scene, state, action):
        x = float(state[0])
        new = x if action == 0 else x + self.pull * (scene["stones"][action - 1] - x)
        if self.fault == "nondeterministic_step":
            _CALLS[0] += 1
            new += 1e-9 * _CALLS[0]
        if self.fault == "nondeterministic_second_step" and x != scene["start"]:
            _CALLS[0] += 1
            new += 1e-9 * _CALLS[0]
        if self.fault == "process_hash":
            new += 1e-9 * (hash("hopper") % 1000003)
        goal = self._last_goal if self.fault == "remembers_scene" else scene["goal"]
        reward = abs(x - goal) - abs(new - goal)
        if self.fault == "nan_reward":
            reward = float("nan")
        # Finite, but H of them overflow a label: at once, or only in scenes past the probed ones.
        if self.fault == "huge_reward" or (self.fault == "huge_reward_far" and scene["goal"] > 8.5):
            reward = 1e308
        if self.fault == "infinite_state":
            new = float("inf")
        return np.array([new], dtype=np.float64), reward

    def observe(self, scene, state):
        x = float(state[0])
        stones = scene["stones"]
        objects = np.array([[s - x, s - scene["goal"]] for s in stones], dtype=np.float64)
        goal = np.array([scene["goal"] - x], dtype=np.float64)
        features = np.array([[0.0, 0.0]] + [[1.0, s - x] for s in stones], dtype=np.float64)
        acts_on = np.array([-1] + list(range(len(stones))), dtype=np.int64)
        if self.fault == "float32_objects":
            objects = objects.astype(np.float32)
        if self.fault == "short_features":
            features = features[:, :1]
        return objects, goal, features, acts_on


def make(options):
    return Hopper(options)
'''

PRESET = """name = "hopper"
scenes = {scenes}
chains_per_scene = 1
steps = 3
horizon = 3

[actor]
kind = "epsilon-greedy"
epsilon = 0.3

[environment]
factory = "{factory}"

[environment.options]
pull = 0.6
{options}
"""


def write_hopper(directory: Path, *, scenes: int = 5, factory: str = "hopper.py:make", options: str = "") -> Path:
    """Write ``hopper.py`` and ``hopper.toml`` (its preset) into ``directory``; return the preset."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hopper.py").write_text(HOPPER)
    preset = directory / "hopper.toml"
    preset.write_text(PRESET.format(scenes=scenes, factory=factory, options=options))
    return preset
