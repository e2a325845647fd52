"""Physics of the table and an independent brute-force check of the stored labels.

The brute force below uses only the public world API (``Scene``, ``simulate_strike``) for
single strikes; the candidate directions, the reward and the recursion are written here
from the spec, independently of ``qhlab.scenes.puck.strikes`` and ``qhlab.scenes.labels``.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pyarrow.parquet as pq
import pytest

from puck_world import draw, puck_parameters
from qhlab.scenes import load_preset, read_manifest
from qhlab.scenes.puck.world import GRAVITY, PhysicsConfig, Scene, simulate_strike


def _lone_puck(mu: float = 0.3) -> tuple[Scene, np.ndarray]:
    physics = PhysicsConfig(table_width=3.0, table_height=3.0)
    scene = Scene(radius=(0.04,), mass=(0.2,), friction=(mu,), goal=(2.5, 2.5), goal_radius=0.08, physics=physics)
    return scene, np.array([[1.5, 1.5]])


@pytest.mark.parametrize("mu", [0.15, 0.35])
def test_lone_puck_travels_the_same_distance_in_every_direction(mu) -> None:
    scene, start = _lone_puck(mu)
    distances = []
    for degrees in (0.0, 30.0, 45.0, 60.0):
        out = simulate_strike(scene, start, 0, math.radians(degrees), 1.2)
        assert out.at_rest
        moved = out.positions[0] - start[0]
        distances.append(float(np.hypot(*moved)))
        # It moves along the strike direction (isotropic friction has no sideways pull).
        assert math.atan2(moved[1], moved[0]) == pytest.approx(math.radians(degrees), abs=1e-6)
    assert max(distances) / min(distances) - 1.0 < 0.01
    # Constant Coulomb deceleration mu*g: d = v^2 / (2 mu g), up to one time step of travel.
    assert distances[0] == pytest.approx(1.2**2 / (2 * mu * GRAVITY), abs=1.2 * scene.physics.dt)


def test_kinetic_energy_never_grows_after_a_strike() -> None:
    scene, positions = draw(puck_parameters("tiny"), "train", 0, 0)
    for puck in range(scene.num_pucks):
        for k in range(8):
            trace: list[float] = []
            simulate_strike(scene, positions, puck, 2 * math.pi * k / 8, 2.5, energy_trace=trace)
            steps = np.diff(np.array(trace))
            assert trace[0] > 0 and trace[-1] < trace[0]
            assert steps.max() <= 1e-12 * trace[0], f"energy grew by {steps.max()} (puck {puck}, k {k})"


def test_no_puck_leaves_the_table() -> None:
    preset = puck_parameters("demo-train")
    w, h = preset.physics.table_width, preset.physics.table_height
    slack = 1e-3
    for index in range(4):
        scene, positions = draw(preset, "train", 7, index)
        radius = np.array(scene.radius)
        for puck in range(scene.num_pucks):
            for k in range(6):
                # Much faster than any candidate: pucks slam into walls and each other.
                out = simulate_strike(scene, positions, puck, 2 * math.pi * k / 6 + 0.1, 4.0).positions
                assert (out[:, 0] >= radius - slack).all() and (out[:, 0] <= w - radius + slack).all()
                assert (out[:, 1] >= radius - slack).all() and (out[:, 1] <= h - radius + slack).all()


def test_simulation_is_a_pure_function_of_its_inputs() -> None:
    scene, positions = draw(puck_parameters("tiny"), "train", 0, 1)
    a = simulate_strike(scene, positions, 0, 0.3, 1.2).positions
    b = simulate_strike(scene, positions.copy(), 0, 0.3, 1.2).positions
    assert a.tobytes() == b.tobytes()


# ----------------------------------------------------------- independent brute force


def _spec_candidates(scene: Scene, pos: np.ndarray, layout) -> list[tuple[int, float, float]]:
    """(puck, direction, speed) per candidate, straight from the layout's wording."""
    target, goal, r0 = pos[0], np.array(scene.goal), scene.radius[0]
    to_goal = math.atan2(goal[1] - target[1], goal[0] - target[0])
    fast, slow = max(layout.speeds), min(layout.speeds)
    out = [(0, to_goal, v) for v in layout.speeds]
    out += [(0, to_goal + off, fast) for off in layout.offsets]
    # Mirror the goal in the line the target's centre turns at (left, right, bottom, top).
    w, h = scene.physics.table_width, scene.physics.table_height
    images = [
        (-(goal[0] - r0) + r0, goal[1]),
        (w - r0 + (w - r0 - goal[0]), goal[1]),
        (goal[0], -(goal[1] - r0) + r0),
        (goal[0], h - r0 + (h - r0 - goal[1])),
    ]
    by_path = sorted((math.dist(target, img), i) for i, img in enumerate(images))
    for _, i in by_path[: layout.bank_shots]:
        out.append((0, math.atan2(images[i][1] - target[1], images[i][0] - target[0]), fast))
    if layout.blocker_strikes:

        def gap(j: int) -> float:
            seg = goal - target
            t = min(1.0, max(0.0, float(np.dot(pos[j] - target, seg) / np.dot(seg, seg))))
            return math.dist(pos[j], target + t * seg) - scene.radius[j] - r0

        blocker = min(range(1, len(pos)), key=lambda j: (gap(j), j))
        out += [(blocker, to_goal + math.pi / 2, slow), (blocker, to_goal - math.pi / 2, slow)]
    return out


def test_stored_labels_equal_an_independent_brute_force_recursion(tiny_train) -> None:
    preset = puck_parameters("tiny")
    layout = preset.candidates
    manifest = read_manifest(tiny_train)
    horizon = manifest["horizon"]
    scenes_rows = pq.read_table(tiny_train / "scenes.parquet").to_pylist()
    scenes = {
        r["scene_id"]: Scene(
            tuple(r["radius"]),
            tuple(r["mass"]),
            tuple(r["friction"]),
            (r["goal_x"], r["goal_y"]),
            r["goal_radius"],
            preset.physics,
        )
        for r in scenes_rows
    }
    states = pq.read_table(tiny_train / "states.parquet").to_pylist()
    labels: dict[int, dict[int, list[float]]] = {}
    for row in pq.read_table(tiny_train / "candidates.parquet").to_pylist():
        labels.setdefault(row["state_id"], {})[row["candidate"]] = row["q"]

    def goal_distance(scene: Scene, pos: np.ndarray) -> float:
        return math.dist(pos[0], scene.goal)

    @cache
    def q_values(scene_id: int, flat: tuple[float, ...], h: int) -> tuple[float, ...]:
        scene = scenes[scene_id]
        pos = np.array(flat).reshape(-1, 2)
        values = []
        for puck, direction, speed in _spec_candidates(scene, pos, layout):
            after = simulate_strike(scene, pos, puck, direction, speed).positions
            d_after = goal_distance(scene, after)
            r = goal_distance(scene, pos) - d_after + (layout.goal_bonus if d_after <= scene.goal_radius else 0.0)
            future = 0.0 if h == 1 else max(q_values(scene_id, tuple(after.ravel()), h - 1))
            values.append(r + future)
        return tuple(values)

    checked = 0
    for state in states:
        if state["step"] < 0:
            continue
        stored = labels[state["state_id"]]
        for h in range(1, horizon + 1):
            brute = q_values(state["scene_id"], tuple(state["positions"]), h)
            for a, value in enumerate(brute):
                assert stored[a][h - 1] == pytest.approx(value, abs=1e-12, rel=0), (state["state_id"], a, h)
                checked += 1
    tiny = load_preset("tiny")
    assert checked == tiny.scenes * tiny.steps * layout.num_candidates * horizon
