"""Presets and the seeded scene sampler.

Owns: the named presets (sizes of a population, parameter ranges, candidate layout, actor)
and the drawing of scenes and initial positions from a seeded ``numpy.random.Generator``.
A scene is a pure function of (``GENERATOR_VERSION``, preset, split, seed, scene index);
splits draw from disjoint ``SeedSequence`` streams, so TRAIN and VALIDATION never share a
scene. Does not own: physics (``world``), candidates or labels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from qhlab.evidence import QhInputError, canonical_json, sha256_bytes
from qhlab.scenes.world import PhysicsConfig, Scene

__all__ = [
    "GENERATOR_VERSION",
    "PRESETS",
    "SPLITS",
    "ActorSpec",
    "CandidateLayout",
    "Preset",
    "actor_seed_sequence",
    "get_preset",
    "sample_scene",
    "scene_id_for",
    "scene_seed_sequence",
]

GENERATOR_VERSION = 2
"""Bumped whenever a change to sampling, candidates, rewards or labels changes any output."""

SPLITS = ("train", "validation", "test")
# Disjoint SeedSequence spawn keys per split: the first key element separates the streams.
_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


@dataclass(frozen=True)
class CandidateLayout:
    """Which strikes a state offers, in a fixed order; K = ``num_candidates``.

    Every group is oriented on the state's own geometry, never on a learned quantity, and
    the order is fixed so that "always candidate k" is a meaningful (TRAIN-chosen) heuristic:

    1. one straight strike of the target at the goal centre per entry of ``speeds``
       (candidate 0, the first speed, is *the straight strike*);
    2. target strikes at ``offsets`` (radians, counter-clockwise) from the target->goal line,
       at the fastest speed: they go around a blocker or set up the next strike;
    3. ``bank_shots`` target strikes aimed at the goal's mirror image in a wall (one cushion),
       at the fastest speed, walls ordered by the length of the banked path;
    4. ``blocker_strikes`` (0 or 2) strikes of the *blocker*, the other puck that most
       obstructs the target->goal segment, perpendicular to that segment (left, then right),
       at the slowest speed: clearing the line first can be optimal at H >= 2.

    Attributes:
        speeds: straight-strike speeds, m/s (at least one; stopping in the goal depends on the
            speed, the puck's friction and, through collisions, the masses).
        offsets: relative directions of the offset strikes, radians.
        bank_shots: number of one-cushion shots (0-4).
        blocker_strikes: 0 or 2.
        goal_bonus: reward bonus (metres) when the target ends a transition in the goal.
    """

    speeds: tuple[float, ...] = (0.9, 1.5)
    offsets: tuple[float, ...] = (0.6, -0.6)
    bank_shots: int = 2
    blocker_strikes: int = 2
    goal_bonus: float = 0.1

    @property
    def num_candidates(self) -> int:
        """K, fixed for every state of the preset."""
        return len(self.speeds) + len(self.offsets) + self.bank_shots + self.blocker_strikes

    @property
    def fast_speed(self) -> float:
        """Speed of offset and bank shots (the fastest straight speed), m/s."""
        return max(self.speeds)

    @property
    def slow_speed(self) -> float:
        """Speed of blocker strikes (the slowest straight speed), m/s."""
        return min(self.speeds)


@dataclass(frozen=True)
class ActorSpec:
    """The declared policy that walks the chains.

    Attributes:
        kind: ``"uniform"`` (each candidate equally likely) or ``"epsilon-greedy"`` (with
            probability ``epsilon`` uniform, otherwise the lowest-index argmax of Q*_H).
        epsilon: exploration probability of ``"epsilon-greedy"``; ignored for ``"uniform"``.
    """

    kind: str = "epsilon-greedy"
    epsilon: float = 0.3


@dataclass(frozen=True)
class Preset:
    """Everything that sizes and shapes a population, except split and seed.

    Attributes:
        name: registry name.
        scenes: number of scenes.
        chains_per_scene: actor chains started in each scene (each from the scene's
            initial positions, with its own actor stream).
        steps: chain states per chain (the chain takes ``steps - 1`` actions).
        horizon: H, the longest label horizon.
        candidates: candidate layout (K).
        actor: the declared actor.
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

    name: str
    scenes: int
    chains_per_scene: int
    steps: int
    horizon: int
    candidates: CandidateLayout = field(default_factory=CandidateLayout)
    actor: ActorSpec = field(default_factory=ActorSpec)
    pucks: tuple[int, int] = (3, 5)
    radius: tuple[float, float] = (0.03, 0.05)
    mass: tuple[float, float] = (0.1, 0.3)
    friction: tuple[float, float] = (0.15, 0.35)
    goal_radius: float = 0.08
    placement_gap: float = 0.01
    blocker_probability: float = 0.0
    blocker_lateral: float = 0.8
    physics: PhysicsConfig = field(default_factory=PhysicsConfig)

    def __post_init__(self) -> None:
        # Successor rows carry Q*_1..Q*_{H-1} and their own candidates' rewards, so H >= 2.
        checks = {
            "scenes": self.scenes >= 1,
            "chains_per_scene": self.chains_per_scene >= 1,
            "steps": self.steps >= 1,
            "horizon": self.horizon >= 2,
            "candidates": len(self.candidates.speeds) >= 1
            and all(v > 0 for v in self.candidates.speeds)
            and 0 <= self.candidates.bank_shots <= 4
            and self.candidates.blocker_strikes in (0, 2),
            "pucks": 1 <= self.pucks[0] <= self.pucks[1]
            and (self.candidates.blocker_strikes == 0 or self.pucks[0] >= 2)
            and (self.blocker_probability == 0.0 or self.pucks[0] >= 2),
            "blocker_probability": 0.0 <= self.blocker_probability <= 1.0 and self.blocker_lateral >= 0.0,
            "actor": self.actor.kind in ("uniform", "epsilon-greedy") and 0.0 <= self.actor.epsilon <= 1.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise QhInputError(
                f"Preset {self.name!r}: fields {bad} are not allowed; allowed: scenes, chains_per_scene, "
                "steps >= 1; horizon >= 2; at least one positive speed, 0-4 bank shots, 0 or 2 blocker "
                "strikes; at least 2 pucks when a blocker is placed or struck; blocker_probability in "
                "[0, 1]; actor 'uniform' or 'epsilon-greedy' with epsilon in [0, 1]."
            )

    def as_record(self) -> dict:
        """The preset as plain JSON types (recorded in manifests and cache keys)."""
        return asdict(self)


PRESETS: dict[str, Preset] = {
    # Tests: a few seconds on one core. K=6 mixes target and nearest-other strikes so the
    # struck-object index is exercised.
    "tiny": Preset(
        name="tiny",
        scenes=3,
        chains_per_scene=1,
        steps=2,
        horizon=2,
        candidates=CandidateLayout(speeds=(0.9, 1.5), offsets=(), bank_shots=2, blocker_strikes=2),
        blocker_probability=0.5,
    ),
    # The default demo (H=3, K=8: two straight speeds, two offsets, two bank shots, two
    # blocker strikes; a blocker in half the scenes). About 2,000 simulations per CPU-second:
    # TRAIN (192 chains x 1,608 = 309k simulations) takes about 80 s and VALIDATION
    # (480 chains x 1,096 = 526k) about 140 s on 2 idle cores. Validation has 480 scenes (four
    # times 120) so that the scene part of a paired difference's standard error is half of what
    # it was; the training-seed part does not shrink with scenes (the seed effect is systematic).
    "demo-train": Preset(
        name="demo-train", scenes=192, chains_per_scene=1, steps=3, horizon=3, blocker_probability=0.5
    ),
    "demo-validation": Preset(
        name="demo-validation",
        scenes=480,
        chains_per_scene=1,
        steps=2,
        horizon=3,
        blocker_probability=0.5,
    ),
    # bench/labeling.py: about 20 seconds of labelling on 2 idle cores (amortizes pool start-up).
    "bench": Preset(name="bench", scenes=24, chains_per_scene=1, steps=3, horizon=3, blocker_probability=0.5),
}


def get_preset(name: str) -> Preset:
    """Return the registered preset ``name``.

    Raises:
        QhInputError: naming the value and the registered presets.
    """
    if name not in PRESETS:
        raise QhInputError(
            f"scenes: preset={name!r} is not allowed; allowed: {', '.join(sorted(PRESETS))}. "
            "HINT: presets are fixed so that populations are reproducible from their name."
        )
    return PRESETS[name]


def _check_split_seed(split: str, seed: int) -> None:
    if split not in _SPLIT_CODE:
        raise QhInputError(
            f"scenes: split={split!r} is not allowed; allowed: {', '.join(SPLITS)}. "
            "HINT: the split selects a disjoint random stream."
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise QhInputError(
            f"scenes: seed={seed!r} is not allowed; allowed: an integer in [0, 2**63). "
            "HINT: pass a non-negative integer."
        )


def scene_seed_sequence(split: str, seed: int, scene_index: int) -> np.random.SeedSequence:
    """The random stream of one scene's parameters and initial positions."""
    _check_split_seed(split, seed)
    return np.random.SeedSequence(entropy=seed, spawn_key=(_SPLIT_CODE[split], scene_index, 0))


def actor_seed_sequence(split: str, seed: int, scene_index: int, chain: int) -> np.random.SeedSequence:
    """The actor's own random stream for one chain (independent of the scene's stream)."""
    _check_split_seed(split, seed)
    return np.random.SeedSequence(entropy=seed, spawn_key=(_SPLIT_CODE[split], scene_index, 1 + chain))


def _place_pucks(rng: np.random.Generator, preset: Preset, radius: np.ndarray, goal: np.ndarray) -> np.ndarray:
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
            raise QhInputError(f"scenes: preset={preset.name!r} could not place puck {i}.")
    return positions


def sample_scene(preset: Preset, split: str, seed: int, scene_index: int) -> tuple[Scene, np.ndarray]:
    """Draw one scene and its initial positions.

    Args:
        preset: sizes and ranges.
        split: ``"train"``, ``"validation"`` or ``"test"`` (disjoint streams).
        seed: population seed.
        scene_index: 0-based index of the scene in the population.

    Returns:
        The scene and its initial positions [n, 2] (float64, metres, non-overlapping).
    """
    rng = np.random.Generator(np.random.PCG64(scene_seed_sequence(split, seed, scene_index)))
    physics = preset.physics
    n = int(rng.integers(preset.pucks[0], preset.pucks[1] + 1))
    radius = rng.uniform(*preset.radius, size=n)
    mass = rng.uniform(*preset.mass, size=n)
    friction = rng.uniform(*preset.friction, size=n)
    margin = preset.goal_radius
    goal = np.array(
        [
            rng.uniform(margin, physics.table_width - margin),
            rng.uniform(margin, physics.table_height - margin),
        ]
    )
    positions = _place_pucks(rng, preset, radius, goal)
    scene = Scene(
        radius=tuple(float(v) for v in radius),
        mass=tuple(float(v) for v in mass),
        friction=tuple(float(v) for v in friction),
        goal=(float(goal[0]), float(goal[1])),
        goal_radius=float(preset.goal_radius),
        physics=physics,
    )
    return scene, positions


def scene_id_for(scene: Scene, positions: np.ndarray, split: str, seed: int, scene_index: int) -> int:
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
