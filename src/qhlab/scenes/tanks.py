"""The tank network: water levels in connected tanks, brought to a target level by valves and pumps.

A second built-in environment that shares nothing with the puck world: no geometry, no pymunk,
a different number of objects, features and candidates, and a number of candidates that changes
from state to state. ``make(options)`` is its factory (``"qhlab.scenes.tanks:make"``); the
``tanks-*`` presets name it.

The problem. A scene holds 3..5 cylindrical tanks (cross-section ``area`` m², height
``capacity`` m) and 2..4 pipes between pairs of them. Tank 0 is the goal tank; the goal is a
target level in it. A state is the tanks' water levels (m). The candidates of a state, in order:

0. ``wait``: nothing moves (acts on no tank: ``candidate_object`` -1); always offered;
1. for each pipe whose two levels differ: open its valve for ``valve_seconds``; water flows from
   the higher tank to the lower one by Torricelli's law, ``q = conductance * sqrt(2 g dh)``
   (m³/s), integrated over ``substeps`` explicit steps, never past equal levels;
2. for each pipe whose ``pipe_from`` tank holds water and whose ``pipe_to`` tank has room:
   pump ``pump_volume`` m³ from ``pipe_from`` to ``pipe_to`` (or as much as fits), at an energy
   cost of ``pump_cost`` per m³.

The reward of a step is the decrease of the goal tank's distance to the target level (m), plus
``goal_bonus`` when the step ends within ``goal_tolerance`` of it, minus the pump's energy cost.
Gravity flows only downhill, so reaching a target above what the valves can deliver needs pumps,
which cost; a short-sighted policy that opens the best valve now can lose to one that first fills
an intermediate tank. That is what a horizon of 2..4 steps can see.

Owns: ``TankNetwork`` (the contract's members) and ``make``. Does not own: anything generic
(``qhlab.scenes``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from qhlab.evidence import QhInputError
from qhlab.scenes.environment import dataclass_options

__all__ = ["TankNetwork", "TankParameters", "make"]

GENERATOR_VERSION = 1
"""Bumped whenever a change to the tank network's scenes, candidates, dynamics or rewards changes
any output."""

GRAVITY = 9.81
_OBJECT_FEATURES = (("level", "m"), ("area", "m2"), ("capacity", "m"), ("is_goal_tank", "1"))
_GOAL_FEATURES = (("target_level", "m"), ("goal_tank_capacity", "m"))
_CANDIDATE_FEATURES = (
    ("wait", "1"),
    ("valve", "1"),
    ("pump", "1"),
    ("head", "m"),  # the level of the tank water leaves minus the level of the tank it enters
    ("volume_share", "1"),  # the volume moved as a share of the goal tank's volume at capacity
    ("touches_goal_tank", "1"),
)


@dataclass(frozen=True)
class TankParameters:
    """Everything that shapes a tank preset's scenes (its ``[environment.options]``).

    Attributes:
        tanks: inclusive range of the tank count.
        pipes: inclusive range of the pipe count (capped by the tank pairs there are).
        area: range of tank cross-sections, m².
        capacity: range of tank heights, m.
        conductance: range of pipe conductances, m² (effective valve area).
        valve_seconds: how long a valve candidate holds its valve open, s.
        pump_volume: volume a pump candidate moves, m³.
        pump_cost: reward cost per m³ pumped.
        goal_bonus: reward for ending a step within ``goal_tolerance`` of the target level.
        goal_tolerance: m.
        substeps: explicit integration steps of a valve's flow.
    """

    tanks: tuple[int, int] = (3, 5)
    pipes: tuple[int, int] = (2, 4)
    area: tuple[float, float] = (0.5, 1.5)
    capacity: tuple[float, float] = (1.0, 2.0)
    conductance: tuple[float, float] = (0.01, 0.03)
    valve_seconds: float = 4.0
    pump_volume: float = 0.3
    pump_cost: float = 0.05
    goal_bonus: float = 0.5
    goal_tolerance: float = 0.05
    substeps: int = 40

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TankParameters:
        """The parameters a preset's options declare (every other one at its default).

        Raises:
            QhInputError: an unknown option, or a value outside what the network allows.
        """
        parameters = dataclass_options(
            cls, options, what="tank network", example="qhlab/scenes/presets/tanks-tiny.toml"
        )
        ranges_ok = all(
            len(getattr(parameters, name)) == 2 and 0 < getattr(parameters, name)[0] <= getattr(parameters, name)[1]
            for name in ("tanks", "pipes", "area", "capacity", "conductance")
        )
        if not ranges_ok or not (
            2 <= parameters.tanks[0]
            and parameters.tanks[1] <= 8
            and parameters.pipes[1] <= 8
            and parameters.valve_seconds > 0
            and parameters.pump_volume > 0
            and parameters.pump_cost >= 0
            and parameters.goal_tolerance > 0
            and 1 <= parameters.substeps <= 1000
        ):
            raise QhInputError(
                f"tank network: options {options!r} are not allowed; allowed: ranges [low, high] with 0 < low <= "
                "high, 2..8 tanks, at most 8 pipes, positive valve_seconds, pump_volume and goal_tolerance, "
                "pump_cost >= 0, substeps in 1..1000."
            )
        return parameters

    def record(self) -> dict:
        """The parameters as plain JSON types."""
        return asdict(self)


class TankNetwork:
    """The tank network under the environment contract (``qhlab.scenes.environment``).

    Attributes:
        parameters: the network's parameters (the preset's options).
        identity, object_features, goal_features, candidate_features, max_objects,
            max_candidates: the contract's members.
    """

    state_column = "levels"
    reference_candidate = "wait"
    reward_unit = "m"
    feature_names = {"objects": _OBJECT_FEATURES, "goal": _GOAL_FEATURES, "candidates": _CANDIDATE_FEATURES}

    def __init__(self, parameters: TankParameters) -> None:
        self.parameters = parameters
        self.identity = {"name": "tanks", "version": str(GENERATOR_VERSION), "numpy": np.__version__}
        self.object_features = len(_OBJECT_FEATURES)
        self.goal_features = len(_GOAL_FEATURES)
        self.candidate_features = len(_CANDIDATE_FEATURES)
        self.max_objects = parameters.tanks[1]
        self.max_candidates = 1 + 2 * min(parameters.pipes[1], parameters.tanks[1] * (parameters.tanks[1] - 1) // 2)

    # -- the contract ---------------------------------------------------------------------------

    def sample_scene(self, seed: int) -> dict:
        """The tanks, pipes, initial levels and target level drawn from ``seed``."""
        p = self.parameters
        rng = np.random.default_rng(seed)
        n = int(rng.integers(p.tanks[0], p.tanks[1] + 1))
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
        count = min(int(rng.integers(p.pipes[0], p.pipes[1] + 1)), len(pairs))
        # The first pipe always reaches the goal tank, so every scene can move its level.
        first = int(rng.integers(1, n))
        rest = [pair for pair in pairs if pair != (0, first)]
        chosen = [(0, first)] + [rest[i] for i in sorted(rng.choice(len(rest), size=count - 1, replace=False))]
        # A pipe's pump lifts from pipe_from to pipe_to; draw its direction.
        pipes = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in chosen]
        area = rng.uniform(*p.area, size=n)
        capacity = rng.uniform(*p.capacity, size=n)
        levels = capacity * rng.uniform(0.1, 0.9, size=n)
        target = float(capacity[0] * rng.uniform(0.2, 0.9))
        return {
            "num_tanks": n,
            "area": [float(v) for v in area],
            "capacity": [float(v) for v in capacity],
            "pipe_from": [int(a) for a, _ in pipes],
            "pipe_to": [int(b) for _, b in pipes],
            "conductance": [float(v) for v in rng.uniform(*p.conductance, size=len(pipes))],
            "initial_levels": [float(v) for v in levels],
            "target_level": target,
        }

    def initial_state(self, scene: dict) -> np.ndarray:
        """The tanks' initial levels (m)."""
        return np.asarray(scene["initial_levels"], dtype=np.float64).copy()

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        """1 (wait) + the valves with a head + the pumps with water and room."""
        return len(self._offered(scene, state))

    def step(self, scene: dict, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        """Candidate ``action`` carried out: the new levels and the reward."""
        kind, pipe = self._offered(scene, state)[action]
        after = state.copy()
        cost = 0.0
        if kind == "valve":
            after = self._open_valve(scene, after, pipe)
        elif kind == "pump":
            moved = self._pump(scene, after, pipe)
            cost = self.parameters.pump_cost * moved
        return after, self._progress(scene, state, after) - cost

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-tank features, the goal's, each candidate's features and the tank water leaves."""
        n = int(scene["num_tanks"])
        area, capacity = scene["area"], scene["capacity"]
        objects = np.array(
            [[state[i], area[i], capacity[i], 1.0 if i == 0 else 0.0] for i in range(n)], dtype=np.float64
        )
        goal = np.array([scene["target_level"], capacity[0]], dtype=np.float64)
        full = area[0] * capacity[0]
        features, acts_on = [], []
        for kind, pipe in self._offered(scene, state):
            if kind == "wait":
                features.append([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
                acts_on.append(-1)
                continue
            source, sink = self._ends(scene, state, kind, pipe)
            volume = self._volume(scene, state, kind, pipe)
            touches = 1.0 if 0 in (source, sink) else 0.0
            head = state[source] - state[sink]
            features.append([0.0, float(kind == "valve"), float(kind == "pump"), head, volume / full, touches])
            acts_on.append(source)
        return objects, goal, np.array(features, dtype=np.float64), np.array(acts_on, dtype=np.int64)

    # -- the dynamics ---------------------------------------------------------------------------

    def _offered(self, scene: dict, state: np.ndarray) -> list[tuple[str, int]]:
        offered: list[tuple[str, int]] = [("wait", -1)]
        pipes = range(len(scene["pipe_from"]))
        offered += [("valve", i) for i in pipes if state[scene["pipe_from"][i]] != state[scene["pipe_to"][i]]]
        offered += [
            ("pump", i)
            for i in pipes
            if state[scene["pipe_from"][i]] > 0.0
            and state[scene["pipe_to"][i]] < scene["capacity"][scene["pipe_to"][i]]
        ]
        return offered

    @staticmethod
    def _ends(scene: dict, state: np.ndarray, kind: str, pipe: int) -> tuple[int, int]:
        a, b = scene["pipe_from"][pipe], scene["pipe_to"][pipe]
        if kind == "valve" and state[b] > state[a]:
            return b, a
        return a, b

    def _volume(self, scene: dict, state: np.ndarray, kind: str, pipe: int) -> float:
        """The volume the candidate would move (m³), estimated without moving it: a valve's flow at
        its opening head for ``valve_seconds`` (never more than equalises the levels), a pump's
        volume as far as water and room allow."""
        a, b = scene["pipe_from"][pipe], scene["pipe_to"][pipe]
        if kind == "valve":
            head = abs(float(state[a] - state[b]))
            area_a, area_b = scene["area"][a], scene["area"][b]
            flow = scene["conductance"][pipe] * math.sqrt(2.0 * GRAVITY * head) * self.parameters.valve_seconds
            return min(flow, head * area_a * area_b / (area_a + area_b))
        available = state[a] * scene["area"][a]
        room = (scene["capacity"][b] - state[b]) * scene["area"][b]
        return float(min(self.parameters.pump_volume, available, room))

    def _open_valve(self, scene: dict, levels: np.ndarray, pipe: int) -> np.ndarray:
        """Torricelli flow through pipe ``pipe`` for ``valve_seconds``, in explicit substeps that never
        overshoot equal levels (an overflow cannot happen: water only falls to a lower level)."""
        a, b = scene["pipe_from"][pipe], scene["pipe_to"][pipe]
        area_a, area_b = scene["area"][a], scene["area"][b]
        dt = self.parameters.valve_seconds / self.parameters.substeps
        c = scene["conductance"][pipe]
        for _ in range(self.parameters.substeps):
            head = float(levels[a] - levels[b])
            if head == 0.0:
                break
            flow = c * math.sqrt(2.0 * GRAVITY * abs(head)) * dt
            # The volume that would equalise the two levels bounds the substep's flow.
            flow = min(flow, abs(head) * area_a * area_b / (area_a + area_b))
            sign = 1.0 if head > 0 else -1.0
            levels[a] -= sign * flow / area_a
            levels[b] += sign * flow / area_b
        return levels

    def _pump(self, scene: dict, levels: np.ndarray, pipe: int) -> float:
        """Pump up to ``pump_volume`` from pipe_from to pipe_to; return the volume moved (m³)."""
        a, b = scene["pipe_from"][pipe], scene["pipe_to"][pipe]
        available = levels[a] * scene["area"][a]
        room = (scene["capacity"][b] - levels[b]) * scene["area"][b]
        moved = float(min(self.parameters.pump_volume, available, room))
        levels[a] = max(0.0, levels[a] - moved / scene["area"][a])
        levels[b] = min(scene["capacity"][b], levels[b] + moved / scene["area"][b])
        return moved

    def _progress(self, scene: dict, before: np.ndarray, after: np.ndarray) -> float:
        target = scene["target_level"]
        gap_after = abs(float(after[0]) - target)
        bonus = self.parameters.goal_bonus if gap_after <= self.parameters.goal_tolerance else 0.0
        return abs(float(before[0]) - target) - gap_after + bonus


def make(options: dict) -> TankNetwork:
    """The tank network of a preset's ``[environment.options]`` (every other parameter at its default)."""
    return TankNetwork(TankParameters.from_options(options))
