"""Candidate strikes of a state, their features, the reward, and state features.

Owns: the candidate layout (``CandidateLayout``: which strikes a state offers, in a fixed
order), the deterministic list of K strikes offered in a state (a function of the scene and
the positions only), the feature vectors a scorer sees for states and candidates (names and
units), and the reward of a transition. Does not own: simulating a strike (``world``) or
searching trees of strikes (``labels``).

Reward (native metres, not normalized): ``d(s) - d(s') + goal_bonus * [d(s') <= goal_radius]``
where ``d`` is the target centre's distance to the goal centre. The game has no terminal
state: after the target reaches the goal, play continues and every transition that ends with
the target in the goal earns the bonus again. This keeps Q*_h(s, a) = r(s, a) + max over
C(s') of Q*_{h-1}(s', .) exact at every horizon with no special case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qhlab.scenes.puck.world import Scene

__all__ = [
    "CANDIDATE_FEATURES",
    "GOAL_FEATURES",
    "OBJECT_FEATURES",
    "CandidateLayout",
    "Strike",
    "candidate_features",
    "candidate_strikes",
    "goal_features",
    "object_features",
    "reward",
    "target_goal_distance",
]


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


OBJECT_FEATURES: tuple[tuple[str, str], ...] = (
    ("x", "m"),
    ("y", "m"),
    ("radius", "m"),
    ("mass", "kg"),
    ("friction", "1"),
    ("is_target", "1"),
    ("goal_dx", "m"),
    ("goal_dy", "m"),
    ("goal_distance", "m"),
)
"""Per-puck features (name, unit); ``goal_d*`` is goal centre minus puck centre."""

GOAL_FEATURES: tuple[tuple[str, str], ...] = (("x", "m"), ("y", "m"), ("radius", "m"))
"""Goal features (name, unit)."""

CANDIDATE_FEATURES: tuple[tuple[str, str], ...] = (
    ("cos_direction", "1"),
    ("sin_direction", "1"),
    ("speed", "m/s"),
    ("strikes_target", "1"),
)
"""Candidate features (name, unit): the strike's direction in the table frame, its speed and
whether the struck puck is the target. Which puck is struck is ``candidates.parquet`` column
``object``. Nothing here says how a strike relates to the goal or to other pucks: a scorer
must learn what a strike does from the objects."""


@dataclass(frozen=True)
class Strike:
    """One candidate: give puck ``puck`` speed ``speed`` along ``direction`` (radians).

    ``relative`` is the direction minus the target->goal angle; it documents the layout and
    is deliberately not a feature.
    """

    puck: int
    direction: float
    relative: float
    speed: float


def target_goal_distance(scene: Scene, positions: np.ndarray) -> float:
    """Distance (m) from the target centre (puck 0) to the goal centre."""
    return math.hypot(scene.goal[0] - float(positions[0, 0]), scene.goal[1] - float(positions[0, 1]))


def _blocker(positions: np.ndarray, radius: tuple[float, ...], goal: tuple[float, float]) -> int:
    """The other puck that most obstructs the target->goal segment.

    Obstruction is the free gap between the puck and the segment swept by the target
    (distance from its centre to the segment minus both radii); the smallest gap wins and
    ties go to the lowest index, so the choice is a function of the state alone.
    """
    start = positions[0]
    seg = np.asarray(goal, dtype=np.float64) - start
    length2 = float(seg @ seg)
    others = positions[1:]
    t = np.zeros(len(others)) if length2 == 0.0 else np.clip((others - start) @ seg / length2, 0.0, 1.0)
    closest = start + t[:, None] * seg
    gap = np.hypot(*(others - closest).T) - (np.asarray(radius[1:]) + radius[0])
    return 1 + int(np.argmin(gap))


def _bank_aims(scene: Scene, positions: np.ndarray, count: int) -> list[float]:
    """Directions of one-cushion shots: the target aimed at the goal mirrored in a wall.

    The target's centre turns at ``radius`` from a wall, so the mirror line is offset by it.
    Walls are ordered by the banked path length (shortest first; ties by wall order).
    """
    tx, ty = float(positions[0, 0]), float(positions[0, 1])
    gx, gy = scene.goal
    r = scene.radius[0]
    w, h = scene.physics.table_width, scene.physics.table_height
    mirrors = [(2 * r - gx, gy), (2 * (w - r) - gx, gy), (gx, 2 * r - gy), (gx, 2 * (h - r) - gy)]
    ranked = sorted(range(4), key=lambda i: (math.hypot(mirrors[i][0] - tx, mirrors[i][1] - ty), i))
    return [math.atan2(mirrors[i][1] - ty, mirrors[i][0] - tx) for i in ranked[:count]]


def candidate_strikes(scene: Scene, positions: np.ndarray, layout: CandidateLayout) -> list[Strike]:
    """The K strikes offered in a state, in the fixed order of ``CandidateLayout``.

    ``theta_goal`` is the angle of the target->goal line (0 when the target sits exactly on
    the goal centre). Candidate 0 is always the straight strike of the target at the goal.

    Args:
        scene: the scene.
        positions: puck centres [n, 2], metres.
        layout: the preset's candidate layout.

    Returns:
        K strikes.
    """
    tx, ty = float(positions[0, 0]), float(positions[0, 1])
    theta_goal = math.atan2(scene.goal[1] - ty, scene.goal[0] - tx)
    strikes = [Strike(0, theta_goal, 0.0, speed) for speed in layout.speeds]
    strikes += [Strike(0, theta_goal + off, off, layout.fast_speed) for off in layout.offsets]
    strikes += [
        Strike(0, aim, aim - theta_goal, layout.fast_speed) for aim in _bank_aims(scene, positions, layout.bank_shots)
    ]
    if layout.blocker_strikes:
        blocker = _blocker(positions, scene.radius, scene.goal)
        for side in (0.5 * math.pi, -0.5 * math.pi):
            strikes.append(Strike(blocker, theta_goal + side, side, layout.slow_speed))
    return strikes


def candidate_features(strikes: list[Strike]) -> np.ndarray:
    """Feature rows of the strikes.

    Returns:
        [K, len(CANDIDATE_FEATURES)] float64.
    """
    return np.array(
        [(math.cos(s.direction), math.sin(s.direction), s.speed, 1.0 if s.puck == 0 else 0.0) for s in strikes],
        dtype=np.float64,
    )


def object_features(scene: Scene, positions: np.ndarray) -> np.ndarray:
    """Per-puck feature rows.

    Returns:
        [n, len(OBJECT_FEATURES)] float64.
    """
    n = scene.num_pucks
    out = np.empty((n, len(OBJECT_FEATURES)), dtype=np.float64)
    out[:, 0:2] = positions
    out[:, 2] = scene.radius
    out[:, 3] = scene.mass
    out[:, 4] = scene.friction
    out[:, 5] = 0.0
    out[0, 5] = 1.0
    out[:, 6] = scene.goal[0] - positions[:, 0]
    out[:, 7] = scene.goal[1] - positions[:, 1]
    out[:, 8] = np.hypot(out[:, 6], out[:, 7])
    return out


def goal_features(scene: Scene) -> np.ndarray:
    """Goal feature row: [len(GOAL_FEATURES)] float64."""
    return np.array([scene.goal[0], scene.goal[1], scene.goal_radius], dtype=np.float64)


def reward(scene: Scene, before: np.ndarray, after: np.ndarray, layout: CandidateLayout) -> float:
    """r(s, a) in metres: decrease of the target-goal distance plus the goal bonus.

    Args:
        scene: the scene.
        before: positions before the strike [n, 2].
        after: positions at rest after the strike [n, 2].
        layout: supplies ``goal_bonus``.
    """
    d_after = target_goal_distance(scene, after)
    bonus = layout.goal_bonus if d_after <= scene.goal_radius else 0.0
    return (target_goal_distance(scene, before) - d_after) + bonus
