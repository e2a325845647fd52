"""The pymunk table: scene parameters, world building, one strike simulated to rest.

Owns: the physical model of a scene (walled table, round pucks with their own radius, mass
and table friction, one goal circle), how a pymunk space is built from puck positions, and
how one strike is simulated until every puck rests (or a time cap). Does not own: which
strikes are offered (``candidates``), what they are worth (``candidates.reward``), or how
trees of strikes are searched (``labels``).

Physics decisions (they are part of what the labels mean):

* Table friction is isotropic: every puck is tied to the static body by a ``PivotJoint`` at
  its centre with ``max_bias = 0`` (no position correction) and ``max_force = mu * m * g``,
  so the joint removes at most ``mu*g*dt`` of speed per step in whatever direction the puck
  moves. The joint acts at the centre of mass, so it applies no torque.
* Shape friction is zero (puck-puck and puck-wall contacts are frictionless), so contact
  impulses go through the centres of round pucks and no puck ever spins; angular velocity
  stays exactly 0 and no rotational friction is needed.
* Restitution: contacts use the product of the two shapes' elasticities (Chipmunk's rule).
* Walls are static segments whose inner faces are the table edges, so a puck's centre stays
  at least its radius inside the table.
* A fixed time step; the simulation stops at the first step after which every puck's speed
  is below ``rest_speed`` (then the pucks are at rest to that tolerance and their remaining
  velocity is discarded: a state is positions only), or at ``time_cap``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pymunk

__all__ = [
    "PhysicsConfig",
    "Scene",
    "StrikeOutcome",
    "build_space",
    "engine_identity",
    "kinetic_energy",
    "simulate_strike",
]

GRAVITY = 9.81
"""Standard gravity (m/s^2) in the table friction force ``mu * m * g``."""


@dataclass(frozen=True)
class PhysicsConfig:
    """Fixed physical constants of a preset (not randomized per scene).

    Attributes:
        table_width: table extent along x, metres.
        table_height: table extent along y, metres.
        dt: simulation time step, seconds.
        rest_speed: every puck slower than this (m/s) means the scene is at rest.
        time_cap: longest simulated time per strike, seconds.
        puck_elasticity: elasticity of each puck shape (contact restitution is the product).
        wall_elasticity: elasticity of the wall segments.
        collision_slop: pymunk ``collision_slop`` in metres.
        iterations: pymunk solver iterations per step.
    """

    table_width: float = 1.2
    table_height: float = 0.8
    dt: float = 1.0 / 120.0
    rest_speed: float = 1e-3
    time_cap: float = 4.0
    puck_elasticity: float = 0.95
    wall_elasticity: float = 0.85
    collision_slop: float = 1e-4
    iterations: int = 10


@dataclass(frozen=True)
class Scene:
    """One scene's fixed parameters; a *state* of the scene is the puck positions.

    Attributes:
        radius: puck radii [n], metres. Puck 0 is the target.
        mass: puck masses [n], kilograms.
        friction: table friction coefficients mu [n], dimensionless.
        goal: goal centre (x, y), metres.
        goal_radius: goal circle radius, metres; the target is in the goal when its centre
            is within this distance of the goal centre.
        physics: the preset's fixed physical constants.
    """

    radius: tuple[float, ...]
    mass: tuple[float, ...]
    friction: tuple[float, ...]
    goal: tuple[float, float]
    goal_radius: float
    physics: PhysicsConfig

    @property
    def num_pucks(self) -> int:
        """Number of pucks n (3-5 in the presets)."""
        return len(self.radius)


@dataclass(frozen=True)
class StrikeOutcome:
    """Where one strike left the pucks.

    Attributes:
        positions: puck centres at rest [n, 2], float64, metres.
        steps: simulation steps taken.
        at_rest: True when the rest threshold was met (False: the time cap ended it).
    """

    positions: np.ndarray
    steps: int
    at_rest: bool


def engine_identity() -> dict[str, str]:
    """Name and versions of the physics engine; labels depend on them."""
    return {
        "engine": "pymunk",
        "pymunk_version": pymunk.version,
        "chipmunk_version": pymunk.chipmunk_version,
    }


def build_space(scene: Scene, positions: np.ndarray) -> tuple[pymunk.Space, list[pymunk.Body]]:
    """Build a fresh pymunk space with the scene's pucks at rest at ``positions``.

    Rebuilding from positions is cheaper than ``space.copy()`` and makes every simulation a
    function of (scene, positions) alone, which is what makes labels reproducible.

    Args:
        scene: the scene parameters.
        positions: puck centres [n, 2], metres.

    Returns:
        The space and the puck bodies in puck order.
    """
    physics = scene.physics
    space = pymunk.Space()
    space.iterations = physics.iterations
    space.collision_slop = physics.collision_slop
    static = space.static_body
    width, height = physics.table_width, physics.table_height
    # Segment radius puts each wall's inner face exactly on the table edge.
    thickness = 0.02
    corners = [
        (-thickness, -thickness),
        (width + thickness, -thickness),
        (width + thickness, height + thickness),
        (-thickness, height + thickness),
    ]
    walls = []
    for i in range(4):
        wall = pymunk.Segment(static, corners[i], corners[(i + 1) % 4], thickness)
        wall.elasticity = physics.wall_elasticity
        wall.friction = 0.0
        walls.append(wall)
    space.add(*walls)
    bodies = []
    for i in range(scene.num_pucks):
        mass, radius = scene.mass[i], scene.radius[i]
        body = pymunk.Body(mass, pymunk.moment_for_circle(mass, 0.0, radius))
        body.position = (float(positions[i, 0]), float(positions[i, 1]))
        shape = pymunk.Circle(body, radius)
        shape.elasticity = physics.puck_elasticity
        shape.friction = 0.0
        joint = pymunk.PivotJoint(static, body, (0.0, 0.0), (0.0, 0.0))
        joint.max_bias = 0.0
        joint.max_force = scene.friction[i] * mass * GRAVITY
        space.add(body, shape, joint)
        bodies.append(body)
    return space, bodies


def kinetic_energy(bodies: list[pymunk.Body]) -> float:
    """Total translational plus rotational kinetic energy (J) of the pucks."""
    total = 0.0
    for body in bodies:
        vx, vy = body.velocity
        total += 0.5 * body.mass * (vx * vx + vy * vy) + 0.5 * body.moment * body.angular_velocity**2
    return total


def simulate_strike(
    scene: Scene,
    positions: np.ndarray,
    puck: int,
    direction: float,
    speed: float,
    *,
    energy_trace: list[float] | None = None,
) -> StrikeOutcome:
    """Strike one puck and simulate until all pucks rest or the time cap.

    Args:
        scene: the scene parameters.
        positions: puck centres at rest [n, 2], metres.
        puck: index of the struck puck.
        direction: strike direction in the table frame, radians.
        speed: initial speed given to the struck puck, m/s.
        energy_trace: when a list is given, the kinetic energy after the strike and after
            every step is appended (for physics tests; costs time).

    Returns:
        The rest positions [n, 2] (float64), the step count and whether rest was reached.
    """
    space, bodies = build_space(scene, positions)
    bodies[puck].velocity = (speed * math.cos(direction), speed * math.sin(direction))
    physics = scene.physics
    dt = physics.dt
    # Chipmunk's cpBodyKineticEnergy is m*|v|^2 + I*w^2 (no 1/2); comparing it with
    # m*rest_speed^2 tests |v| < rest_speed (w is always 0 here) in one C call per body.
    thresholds = [(body, body.mass * physics.rest_speed**2) for body in bodies]
    max_steps = int(math.ceil(physics.time_cap / dt))
    if energy_trace is not None:
        energy_trace.append(kinetic_energy(bodies))
    steps = 0
    at_rest = False
    step = space.step
    while steps < max_steps:
        step(dt)
        steps += 1
        if energy_trace is not None:
            energy_trace.append(kinetic_energy(bodies))
        for body, threshold in thresholds:
            if body.kinetic_energy >= threshold:
                break
        else:
            at_rest = True
            break
    out = np.array([tuple(body.position) for body in bodies], dtype=np.float64)
    return StrikeOutcome(positions=out, steps=steps, at_rest=at_rest)
