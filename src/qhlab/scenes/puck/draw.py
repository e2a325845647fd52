"""Drawing a puck scene: the world's parameters, and one scene from its seed.

Owns: ``PuckParameters`` (everything that shapes the scenes of a puck preset: candidate layout,
puck count, radius, mass and friction ranges, goal, placement, blockers, physics; read from the
preset's ``[environment.options]``) and ``draw_scene`` (one scene and its initial positions from a
generator), ``scene_generator`` (the generator of a scene seed) and ``legacy_scene_id`` (the id
the puck world has always given a scene). Does not own: physics (``world``), strikes
(``strikes``) or the environment's contract (``qhlab.scenes.puck``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

from qhlab.evidence import QhInputError, canonical_json, sha256_bytes
from qhlab.scenes.environment import dataclass_options
from qhlab.scenes.puck.strikes import CandidateLayout
from qhlab.scenes.puck.world import PhysicsConfig, Scene

__all__ = [
    "GENERATOR_VERSION",
    "PuckParameters",
    "draw_scene",
    "legacy_scene_id",
    "scene_generator",
]

GENERATOR_VERSION = 2
"""Bumped whenever a change to the puck world's sampling, candidates, rewards or labels changes
any output."""


@dataclass(frozen=True)
class PuckParameters:
    """Everything that shapes a puck preset's scenes (its ``[environment.options]``).

    Attributes:
        candidates: candidate layout (K).
        pucks: inclusive range of the puck count.
        radius: range of puck radii, metres.
        mass: range of puck masses, kilograms.
        friction: range of table friction coefficients.
        goal_radius: goal circle radius, metres.
        placement_gap: least free distance between pucks, walls and (for the target) the
            goal edge in initial positions, metres.
        blocker_probability: chance that puck 1 starts on or near the target's straight line
            to the goal (a *blocker*); otherwise it is placed uniformly like the others.
        blocker_lateral: largest sideways offset of a blocker from that line, as a multiple
            of the two pucks' summed radii (below 1 the straight strike always hits it).
        physics: fixed physical constants.
    """

    candidates: CandidateLayout = field(default_factory=CandidateLayout)
    pucks: tuple[int, int] = (3, 5)
    radius: tuple[float, float] = (0.03, 0.05)
    mass: tuple[float, float] = (0.1, 0.3)
    friction: tuple[float, float] = (0.15, 0.35)
    goal_radius: float = 0.08
    placement_gap: float = 0.01
    blocker_probability: float = 0.0
    blocker_lateral: float = 0.8
    physics: PhysicsConfig = field(default_factory=PhysicsConfig)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> PuckParameters:
        """The parameters a preset's options declare (every other one at its default).

        Raises:
            QhInputError: an unknown option, or a value outside what the world allows.
        """
        parameters = dataclass_options(cls, options, what="puck world", example="qhlab/scenes/presets/demo-train.toml")
        parameters.check()
        return parameters

    def check(self) -> None:
        """Refuse parameters the world cannot draw scenes from."""
        layout = self.candidates
        checks = {
            "candidates": len(layout.speeds) >= 1
            and all(v > 0 for v in layout.speeds)
            # Two equal speeds would be two candidates with one outcome: a tie by construction.
            and len(set(layout.speeds)) == len(layout.speeds)
            and 0 <= layout.bank_shots <= 4
            and layout.blocker_strikes in (0, 2),
            "pucks": 1 <= self.pucks[0] <= self.pucks[1]
            and (layout.blocker_strikes == 0 or self.pucks[0] >= 2)
            and (self.blocker_probability == 0.0 or self.pucks[0] >= 2),
            "blocker_probability": 0.0 <= self.blocker_probability <= 1.0 and self.blocker_lateral >= 0.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise QhInputError(
                f"puck world: options {bad} are not allowed; allowed: at least one speed, positive and "
                "distinct, 0-4 bank shots, 0 or 2 blocker strikes; at least 2 pucks when a blocker is placed or "
                "struck; blocker_probability in [0, 1]."
            )

    def record(self) -> dict:
        """The parameters as plain JSON types."""
        return asdict(self)


class _StateWords(ISeedSequence):
    """A seed sequence that hands a bit generator the given state words as they are."""

    def __init__(self, words: np.ndarray) -> None:
        self._words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        values = np.frombuffer(self._words.tobytes(), dtype=np.dtype(dtype))
        return values[:n_words].copy()


def scene_generator(seed: int) -> np.random.Generator:
    """The generator of one scene: its 256-bit seed (qhlab's scene seed: the words a
    ``SeedSequence`` of the population's seed, split and scene index generates) as PCG64's state
    words, so a scene is the one the puck world has always drawn for that seed, split and index."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**256:
        raise QhInputError(f"puck world: seed={seed!r} is not allowed; allowed: an integer in [0, 2**256).")
    words = np.frombuffer(seed.to_bytes(32, "little"), dtype=np.uint64)
    return np.random.Generator(np.random.PCG64(_StateWords(words)))


def place_pucks(rng: np.random.Generator, preset: PuckParameters, radius: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Initial positions [n, 2] of pucks of ``radius``: puck 1 a blocker on the target's line to
    the goal with ``blocker_probability``, every puck clear of the others and the walls."""
    physics = preset.physics
    gap = preset.placement_gap
    positions = np.zeros((len(radius), 2), dtype=np.float64)

    def clear_of_placed(i: int, candidate: np.ndarray) -> bool:
        lo = radius[i] + gap
        inside = lo <= candidate[0] <= physics.table_width - lo and lo <= candidate[1] <= physics.table_height - lo
        return inside and all(np.hypot(*(candidate - positions[j])) >= radius[i] + radius[j] + gap for j in range(i))

    # The blocker's draws happen for every scene (used or not), so the stream position of
    # the remaining pucks does not depend on whether a blocker was placed.
    wants_blocker = rng.random() < preset.blocker_probability
    along, sideways = rng.uniform(0.3, 0.75), rng.uniform(-1.0, 1.0)
    for i, r in enumerate(radius):
        if i == 1 and wants_blocker:
            line = goal - positions[0]
            length = float(np.hypot(*line))
            normal = np.array([-line[1], line[0]]) / max(length, 1e-12)
            candidate = positions[0] + along * line + sideways * preset.blocker_lateral * (radius[0] + r) * normal
            if clear_of_placed(i, candidate):
                positions[i] = candidate
                continue
        for _ in range(10_000):
            lo = r + gap
            candidate = np.array(
                [
                    rng.uniform(lo, physics.table_width - lo),
                    rng.uniform(lo, physics.table_height - lo),
                ]
            )
            clear = clear_of_placed(i, candidate)
            # The target starts outside the goal, so the first strike can earn the bonus.
            if i == 0:
                clear = clear and np.hypot(*(candidate - goal)) >= preset.goal_radius + r + gap
            if clear:
                positions[i] = candidate
                break
        else:  # pragma: no cover - ranges of the presets leave ample room
            raise QhInputError(f"puck world: could not place puck {i} (the ranges leave no room).")
    return positions


def draw_scene(rng: np.random.Generator, parameters: PuckParameters) -> tuple[Scene, np.ndarray]:
    """Draw one scene and its initial positions.

    Returns:
        The scene and its initial positions [n, 2] (float64, metres, non-overlapping).
    """
    physics = parameters.physics
    n = int(rng.integers(parameters.pucks[0], parameters.pucks[1] + 1))
    radius = rng.uniform(*parameters.radius, size=n)
    mass = rng.uniform(*parameters.mass, size=n)
    friction = rng.uniform(*parameters.friction, size=n)
    margin = parameters.goal_radius
    goal = np.array(
        [
            rng.uniform(margin, physics.table_width - margin),
            rng.uniform(margin, physics.table_height - margin),
        ]
    )
    positions = place_pucks(rng, parameters, radius, goal)
    scene = Scene(
        radius=tuple(float(v) for v in radius),
        mass=tuple(float(v) for v in mass),
        friction=tuple(float(v) for v in friction),
        goal=(float(goal[0]), float(goal[1])),
        goal_radius=float(parameters.goal_radius),
        physics=physics,
    )
    return scene, positions


def legacy_scene_id(scene: Scene, positions: np.ndarray, split: str, seed: int, scene_index: int) -> int:
    """A 62-bit scene identity bound to the split, seed, index and the scene's exact content.

    Including the split makes ids of different splits disjoint even for equal content.
    """
    record = {
        "generator_version": GENERATOR_VERSION,
        "split": split,
        "seed": seed,
        "scene_index": scene_index,
        "radius": [float.hex(v) for v in scene.radius],
        "mass": [float.hex(v) for v in scene.mass],
        "friction": [float.hex(v) for v in scene.friction],
        "goal": [float.hex(v) for v in scene.goal],
        "goal_radius": float.hex(scene.goal_radius),
        "positions": [float.hex(float(v)) for v in positions.ravel()],
    }
    return int(sha256_bytes(canonical_json(record))[:16], 16) >> 2
