"""Benchmark: population generation simulations/s vs raw environment steps/s x cores, for both
built-in environments.

Measured in one run on the same machine, for the puck world (``--preset``, pymunk):

1. ``generate_population("bench", ...)`` with every core (``--workers``), counting the
   simulations it actually ran (``manifest.counts.simulations``) over its wall time.
2. A raw, single-process pymunk loop written here by hand (build a space from positions,
   strike, step until rest) over the same kind of states: every state of the generated
   population struck in each of its candidate directions, for about as long as step 1 took
   per core or at least ``--raw-seconds``.

3. One authenticated ``load_population`` of the generated population, and alone the part of it
   that re-simulates every chain state's one-strike successors (``check_successors``):
   ``successor_check_share_of_load``.

And for the tank network (``--tanks-preset``), whose step is a few tens of microseconds, so
that the generic machinery (tree search, observation, Parquet, the pool) is what is measured:
its generation against its own ``step`` called directly on every state and candidate of the
generated population (``tanks_ratio``, ``tanks_cpu_efficiency``).

Prints ONE JSON line (also ``cpu_efficiency``, the same comparison per CPU-second, and the load
average, because a shared machine makes the wall-clock ratio understate): ``ratio =
generation_sims_per_s / (raw_sims_per_s * cores)``; the target is >= 0.8 for both. Run:
``python bench/labeling.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pymunk

from qhlab.scenes import generate_population, load_preset
from qhlab.scenes.audit import check_successors
from qhlab.scenes.bellman import read_labels
from qhlab.scenes.environment import Environment
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.population import SCENE_IDENTITY_COLUMNS, environment_spec
from qhlab.scenes.puck.draw import PuckParameters
from qhlab.scenes.puck.strikes import CANDIDATE_FEATURES


def _raw_strike(physics, radius, mass, friction, positions, puck, direction, speed) -> int:
    """One strike with pymunk directly; returns the steps taken."""
    space = pymunk.Space()
    space.iterations = physics.iterations
    space.collision_slop = physics.collision_slop
    w, h, t = physics.table_width, physics.table_height, 0.02
    corners = [(-t, -t), (w + t, -t), (w + t, h + t), (-t, h + t)]
    for i in range(4):
        seg = pymunk.Segment(space.static_body, corners[i], corners[(i + 1) % 4], t)
        seg.elasticity = physics.wall_elasticity
        space.add(seg)
    bodies = []
    for i in range(len(radius)):
        body = pymunk.Body(mass[i], pymunk.moment_for_circle(mass[i], 0.0, radius[i]))
        body.position = positions[i]
        shape = pymunk.Circle(body, radius[i])
        shape.elasticity = physics.puck_elasticity
        joint = pymunk.PivotJoint(space.static_body, body, (0, 0), (0, 0))
        joint.max_bias = 0.0
        joint.max_force = friction[i] * mass[i] * 9.81
        space.add(body, shape, joint)
        bodies.append(body)
    bodies[puck].velocity = (speed * math.cos(direction), speed * math.sin(direction))
    thresholds = [(b, b.mass * physics.rest_speed**2) for b in bodies]
    for step in range(1, int(math.ceil(physics.time_cap / physics.dt)) + 1):
        space.step(physics.dt)
        if all(b.kinetic_energy < limit for b, limit in thresholds):
            return step
    return step


def _cpu_seconds() -> float:
    """User+system CPU of this process and its finished children (the pool workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_FEATURES = [name for name, _ in CANDIDATE_FEATURES]


def _raw_workload(population: Path):
    scenes = pq.read_table(population / "scenes.parquet").to_pylist()
    by_id = {s["scene_id"]: s for s in scenes}
    states = pq.read_table(population / "states.parquet", columns=["state_id", "scene_id", "positions"]).to_pylist()
    candidates = pq.read_table(
        population / "candidates.parquet", columns=["state_id", "object", "features"]
    ).to_pylist()
    positions = {s["state_id"]: (by_id[s["scene_id"]], s["positions"]) for s in states}
    work = []
    for c in candidates:
        scene, flat = positions[c["state_id"]]
        pts = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]
        features = dict(zip(_FEATURES, c["features"]))
        direction = math.atan2(features["sin_direction"], features["cos_direction"])
        work.append((scene["radius"], scene["mass"], scene["friction"], pts, c["object"], direction, features["speed"]))
    return work


def _tanks(preset: str, workers: int, raw_seconds: float) -> dict:
    """The tank network: its generation against its own step called directly, in one process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "population"
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        generate_population(preset, "train", 0, out, workers=workers)
        generation_s = time.perf_counter() - start
        generation_cpu_s = _cpu_seconds() - cpu_before
        simulations = json.loads((out / "manifest.json").read_text())["counts"]["simulations"]
        environment = Environment.make(environment_spec(load_preset(preset)))
        scenes = {
            row["scene_id"]: {k: v for k, v in row.items() if k not in SCENE_IDENTITY_COLUMNS}
            for row in pq.read_table(out / "scenes.parquet").to_pylist()
        }
        states = pq.read_table(out / "states.parquet", columns=["scene_id", "levels"]).to_pylist()
    import numpy as np

    work = [(scenes[s["scene_id"]], np.asarray(s["levels"], dtype=np.float64)) for s in states]
    env = environment.env  # the raw object: no contract checks, as a user's own loop would call it
    raw_sims = 0
    raw_cpu_before = time.process_time()
    start = time.perf_counter()
    budget = max(raw_seconds, generation_s / 2)
    while time.perf_counter() - start < budget:
        for scene, state in work:
            for action in range(env.candidates(scene, state)):
                env.step(scene, state, action)
                raw_sims += 1
    raw_s = time.perf_counter() - start
    raw_cpu_s = time.process_time() - raw_cpu_before
    generation_rate = simulations / generation_s
    raw_rate = raw_sims / raw_s
    return {
        "tanks_preset": preset,
        "tanks_generation_simulations": simulations,
        "tanks_generation_seconds": round(generation_s, 3),
        "tanks_generation_sims_per_s": round(generation_rate, 1),
        "tanks_raw_steps_per_s_one_process": round(raw_rate, 1),
        "tanks_ratio": round(generation_rate / (raw_rate * workers), 3),
        "tanks_cpu_efficiency": round((simulations / generation_cpu_s) / (raw_sims / raw_cpu_s), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tanks-preset", default="tanks-bench")
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    args = parser.parse_args()
    physics = PuckParameters.from_options(load_preset(args.preset).environment.options).physics
    tanks = _tanks(args.tanks_preset, args.workers, args.raw_seconds)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "population"
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        generate_population(args.preset, "train", 0, out, workers=args.workers)
        generation_s = time.perf_counter() - start
        generation_cpu_s = _cpu_seconds() - cpu_before
        manifest = json.loads((out / "manifest.json").read_text())
        simulations = manifest["counts"]["simulations"]
        work = _raw_workload(out)
        # Imported only now: the label workers are spawned, and a spawned worker re-imports this
        # script's top level, so torch imported above would delay every worker's start (the
        # `qhlab` command's workers import the light CLI module instead).
        from qhlab.finite_horizon.data import load_population

        # What every load pays for physics: the one-strike re-simulation of every successor,
        # timed alone and inside a whole authenticated load.
        start = time.perf_counter()
        load_population(out, split="train")
        load_s = time.perf_counter() - start
        labels = read_labels(out, read_manifest(out))
        successors = check_successors(out, read_manifest(out), labels)
    raw_sims, raw_steps = 0, 0
    raw_cpu_before = time.process_time()
    start = time.perf_counter()
    budget = max(args.raw_seconds, generation_s / 2)
    while time.perf_counter() - start < budget:
        for item in work:
            raw_steps += _raw_strike(physics, *item)
            raw_sims += 1
            if raw_sims % 64 == 0 and time.perf_counter() - start >= budget:
                break
    raw_s = time.perf_counter() - start
    raw_cpu_s = time.process_time() - raw_cpu_before
    generation_rate = simulations / generation_s
    raw_rate = raw_sims / raw_s
    print(
        json.dumps(
            {
                "bench": "labeling",
                "preset": args.preset,
                "workers": args.workers,
                "cores": os.cpu_count(),
                "generation_simulations": simulations,
                "generation_seconds": round(generation_s, 3),
                "generation_sims_per_s": round(generation_rate, 1),
                "raw_sims_per_s_one_process": round(raw_rate, 1),
                "raw_mean_steps": round(raw_steps / max(raw_sims, 1), 2),
                "ratio": round(generation_rate / (raw_rate * args.workers), 3),
                # Load-robust companion: simulations per CPU-second (all processes) vs raw per
                # CPU-second. On a machine shared with other jobs the wall-clock ratio understates.
                "cpu_efficiency": round((simulations / generation_cpu_s) / (raw_sims / raw_cpu_s), 3),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "target": ">= 0.8",
                "load_seconds": round(load_s, 3),
                "successor_check_seconds": successors["seconds"],
                "successor_check_simulations": successors["simulations"],
                "successor_check_share_of_load": round(successors["seconds"] / load_s, 3),
                **tanks,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
