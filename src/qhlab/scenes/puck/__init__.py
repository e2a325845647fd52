"""The puck world: a walled pymunk table, round pucks struck toward a goal, as one environment.

``make(options)`` is its factory (``"qhlab.scenes.puck:make"``); the built-in puck presets
(``qhlab/scenes/presets/``) name it. A scene is a JSON object of the table's pucks (radius, mass,
friction), its goal and the pucks' initial positions; a state is the pucks' positions at rest
(``[x0, y0, x1, y1, ...]``, metres); candidate i is the i-th strike of the candidate layout
(``strikes``); a step simulates one strike until every puck rests (``world``); the reward is the
decrease of the target's distance to the goal plus a bonus when it ends in the goal.

Owns: ``PuckEnvironment`` (the contract's members, and the optional ones that keep the puck
world's population files byte for byte what they have always been: its feature names and
units, its ``positions`` column, its scene ids and its generator record) and ``make``. Does not
own: the physics (``world``), the strikes, features and reward (``strikes``), drawing scenes
(``draw``) or anything generic (``qhlab.scenes``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qhlab.scenes.environment import sampling_record
from qhlab.scenes.puck.draw import GENERATOR_VERSION, PuckParameters, draw_scene, legacy_scene_id, scene_generator
from qhlab.scenes.puck.strikes import (
    CANDIDATE_FEATURES,
    GOAL_FEATURES,
    OBJECT_FEATURES,
    candidate_features,
    candidate_strikes,
    goal_features,
    object_features,
    reward,
)
from qhlab.scenes.puck.world import Scene, engine_identity, simulate_strike

__all__ = ["PuckEnvironment", "make"]

_REWARD_TEXT = "target-goal distance decrease (m) + goal_bonus if the target ends in the goal; no terminal state"


class PuckEnvironment:
    """The puck world under the environment contract (``qhlab.scenes.environment``).

    Attributes:
        parameters: the world's parameters (the preset's options).
        identity, object_features, goal_features, candidate_features, max_objects,
            max_candidates: the contract's members.
    """

    state_column = "positions"
    reference_candidate = "straight_strike"
    reward_unit = "m"
    feature_names = {"objects": OBJECT_FEATURES, "goal": GOAL_FEATURES, "candidates": CANDIDATE_FEATURES}

    def __init__(self, parameters: PuckParameters) -> None:
        self.parameters = parameters
        self.identity = {"name": "puck", "generator_version": str(GENERATOR_VERSION), **engine_identity()}
        self.object_features = len(OBJECT_FEATURES)
        self.goal_features = len(GOAL_FEATURES)
        self.candidate_features = len(CANDIDATE_FEATURES)
        self.max_objects = parameters.pucks[1]
        self.max_candidates = parameters.candidates.num_candidates
        self._scenes: dict[int, tuple[dict, Scene]] = {}
        self._strikes_of: tuple[Scene, bytes, list] | None = None

    # -- the contract ---------------------------------------------------------------------------

    def sample_scene(self, seed: int) -> dict:
        """The scene drawn from ``seed``: its pucks, goal and initial positions, as JSON."""
        scene, positions = draw_scene(scene_generator(seed), self.parameters)
        return {
            "num_pucks": scene.num_pucks,
            "radius": list(scene.radius),
            "mass": list(scene.mass),
            "friction": list(scene.friction),
            "goal_x": scene.goal[0],
            "goal_y": scene.goal[1],
            "goal_radius": scene.goal_radius,
            "initial_positions": [float(v) for v in positions.ravel()],
        }

    def initial_state(self, scene: dict) -> np.ndarray:
        """The pucks' initial positions ``[x0, y0, x1, y1, ...]``."""
        return np.asarray(scene["initial_positions"], dtype=np.float64).copy()

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        """K: every state offers the layout's strikes."""
        return self.parameters.candidates.num_candidates

    def step(self, scene: dict, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        """Strike ``action`` simulated to rest: the pucks' new positions and the reward."""
        table = self._scene(scene)
        before = state.reshape(-1, 2)
        strike = self._strikes(table, state)[action]
        after = simulate_strike(table, before, strike.puck, strike.direction, strike.speed).positions
        return after.ravel(), reward(table, before, after, self.parameters.candidates)

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-puck features, the goal's, each strike's features and the puck it strikes."""
        table = self._scene(scene)
        positions = state.reshape(-1, 2)
        strikes = self._strikes(table, state)
        struck = np.array([s.puck for s in strikes], dtype=np.int64)
        return object_features(table, positions), goal_features(table), candidate_features(strikes), struck

    # -- what keeps the puck populations' files as they have always been --------------------------

    def scene_id(self, scene: dict, *, split: str, seed: int, scene_index: int) -> int:
        """The puck world's scene id (its content in hex, with the generator version)."""
        return legacy_scene_id(self._scene(scene), self.initial_state(scene).reshape(-1, 2), split, seed, scene_index)

    def generator_record(self, preset: Any, *, split: str, seed: int) -> dict:
        """The manifest's generator record: the engine, the generator version and the preset's
        parameters, in the puck world's layout."""
        parameters = {
            "name": preset.name,
            "scenes": preset.scenes,
            "chains_per_scene": preset.chains_per_scene,
            "steps": preset.steps,
            "horizon": preset.horizon,
            "actor": {"kind": preset.actor.kind, "epsilon": preset.actor.epsilon},
            **self.parameters.record(),
        }
        return {
            **engine_identity(),
            "generator_version": GENERATOR_VERSION,
            "preset_parameters": parameters,
            **sampling_record(preset, split=split, seed=seed),
            "reward": _REWARD_TEXT,
        }

    # -- caches (a scene is rebuilt once per process, a state's strikes once per state) ----------

    def _scene(self, scene: dict) -> Scene:
        cached = self._scenes.get(id(scene))
        if cached is not None and cached[0] is scene:
            return cached[1]
        if len(self._scenes) > 4096:
            self._scenes.clear()
        table = Scene(
            radius=tuple(scene["radius"]),
            mass=tuple(scene["mass"]),
            friction=tuple(scene["friction"]),
            goal=(scene["goal_x"], scene["goal_y"]),
            goal_radius=scene["goal_radius"],
            physics=self.parameters.physics,
        )
        self._scenes[id(scene)] = (scene, table)
        return table

    def _strikes(self, table: Scene, state: np.ndarray) -> list:
        key = state.tobytes()
        if self._strikes_of is None or self._strikes_of[0] is not table or self._strikes_of[1] != key:
            self._strikes_of = (table, key, candidate_strikes(table, state.reshape(-1, 2), self.parameters.candidates))
        return self._strikes_of[2]


def make(options: dict) -> PuckEnvironment:
    """The puck world of a preset's ``[environment.options]`` (every other parameter at its default)."""
    return PuckEnvironment(PuckParameters.from_options(options))
