"""The population WRITER: generate a labelled population and publish it write-once.

Owns: ``generate_population`` (sample scenes, run chains with exact labels, write
``scenes.parquet``, ``states.parquet``, ``candidates.parquet``, ``manifest.json`` binding the
SHA-256 of every file, a ``population.receipt.json`` so ``qhlab verify`` authenticates it,
and a ``generation.receipt.json`` saying which executor labelled it, on which nodes), the
content-addressed cache ``cached_population``, and ``scene_content_digests``, the identity
of each scene's physics that disjointness checks compare. Does not own: the format's names and
reading a manifest back (``manifest``), or turning a population into tensors
(``qhlab.finite_horizon.data``).

Write-once: the population is staged in a hidden sibling directory and renamed into place
only when complete, so a crash never leaves a half-written population at ``out``.
Determinism: the same (generator version, engine version, preset, split, seed) gives
byte-identical files: labels do not depend on the executor or the worker count, the manifest
and population receipt hold no time or host, and Parquet is written with fixed options. Only
``generation.receipt.json`` (execution evidence, not part of the population's identity)
differs between a local and a Ray run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qhlab.evidence import (
    EvidenceError,
    PublishConflictError,
    QhInputError,
    canonical_json,
    publish_directory,
    publish_file,
    publish_json,
    sha256_bytes,
    write_receipt,
)
from qhlab.evidence.layout import GENERATION_RECEIPT, MANIFEST, POPULATION_FILES
from qhlab.evidence.layout import POPULATION_RECEIPT as RECEIPT
from qhlab.execution import ExecutorChoice, RayExecutor, open_executor, where_am_i
from qhlab.scenes.audit import audit_population
from qhlab.scenes.candidates import (
    CANDIDATE_FEATURES,
    GOAL_FEATURES,
    OBJECT_FEATURES,
    candidate_features,
    candidate_strikes,
    goal_features,
    object_features,
)
from qhlab.scenes.chains import StateRow, run_chains
from qhlab.scenes.difficulty import CARD_TIE_BAND, difficulty_card
from qhlab.scenes.labels import TreeSearch
from qhlab.scenes.manifest import MANIFEST_KIND, MANIFEST_SCHEMA_VERSION, read_manifest
from qhlab.scenes.records import PopulationGenerationReceipt, PopulationReceipt
from qhlab.scenes.sampler import GENERATOR_VERSION, Preset, get_preset, sample_scene, scene_id_for
from qhlab.scenes.world import engine_identity

__all__ = [
    "cached_population",
    "generate_population",
    "planned_simulations",
    "scene_content_digests",
]

# The scenes.parquet columns that make a scene what it is physically: pucks, their radius,
# mass and friction, the goal and its radius, the initial positions. Not scene_id or
# scene_index, which derive from the split, seed and draw index.
SCENE_CONTENT_COLUMNS = (
    "num_pucks",
    "radius",
    "mass",
    "friction",
    "goal_x",
    "goal_y",
    "goal_radius",
    "initial_positions",
)


def planned_simulations(preset: Preset) -> int:
    """Simulations a population needs when no two searched states coincide.

    The first chain state needs K + K^2 + ... + K^H; each later one only K^H, because its
    subtree to depth H-1 was simulated in the previous state's tree.
    """
    k, h = preset.candidates.num_candidates, preset.horizon
    chains = preset.scenes * preset.chains_per_scene
    return chains * (sum(k**i for i in range(1, h + 1)) + (preset.steps - 1) * k**h)


def _resolve_workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise QhInputError(
            f"generate_population: workers={workers!r} is not allowed; allowed: an integer >= 1 "
            "or None (all cores). HINT: labels do not depend on the worker count."
        )
    return workers


def _write_parquet(path: Path, table: pa.Table) -> str:
    # Fixed options so equal tables give equal bytes (no statistics, no dictionary pages).
    return publish_file(
        path,
        lambda tmp: pq.write_table(
            table,
            tmp,
            compression="zstd",
            compression_level=3,
            use_dictionary=False,
            write_statistics=False,
            row_group_size=1 << 20,
        ),
    )


def _tables(preset: Preset, scenes, initial, scene_ids, rows: list[StateRow]) -> dict[str, pa.Table]:
    f64 = pa.float64()
    scenes_table = pa.table(
        {
            "scene_id": pa.array(scene_ids, pa.int64()),
            "scene_index": pa.array(range(len(scenes)), pa.int64()),
            "num_pucks": pa.array([s.num_pucks for s in scenes], pa.int64()),
            "radius": pa.array([list(s.radius) for s in scenes], pa.list_(f64)),
            "mass": pa.array([list(s.mass) for s in scenes], pa.list_(f64)),
            "friction": pa.array([list(s.friction) for s in scenes], pa.list_(f64)),
            "goal_x": pa.array([s.goal[0] for s in scenes], f64),
            "goal_y": pa.array([s.goal[1] for s in scenes], f64),
            "goal_radius": pa.array([s.goal_radius for s in scenes], f64),
            "initial_positions": pa.array([p.ravel().tolist() for p in initial], pa.list_(f64)),
        }
    )
    layout = preset.candidates
    st = {
        k: []
        for k in (
            "state_id",
            "scene_id",
            "chain_id",
            "step",
            "parent_state_id",
            "num_objects",
            "positions",
            "objects",
            "goal",
        )
    }
    ca = {k: [] for k in ("state_id", "candidate", "object", "features", "reward", "q", "successor_state_id")}
    for index, row in enumerate(rows):
        scene = scenes[row.scene_index]
        st["state_id"].append(index)
        st["scene_id"].append(scene_ids[row.scene_index])
        st["chain_id"].append(row.chain)
        st["step"].append(row.step)
        st["parent_state_id"].append(row.parent)
        st["num_objects"].append(scene.num_pucks)
        st["positions"].append(row.positions.ravel().tolist())
        st["objects"].append(object_features(scene, row.positions).tolist())
        st["goal"].append(goal_features(scene).tolist())
        strikes = candidate_strikes(scene, row.positions, layout)
        features = candidate_features(strikes)
        for a, strike in enumerate(strikes):
            ca["state_id"].append(index)
            ca["candidate"].append(a)
            ca["object"].append(strike.puck)
            ca["features"].append(features[a].tolist())
            ca["reward"].append(float(row.reward[a]))
            ca["q"].append(row.q[a].tolist())
            ca["successor_state_id"].append(int(row.successor[a]))
    states_table = pa.table(
        {
            "state_id": pa.array(st["state_id"], pa.int64()),
            "scene_id": pa.array(st["scene_id"], pa.int64()),
            "chain_id": pa.array(st["chain_id"], pa.int64()),
            "step": pa.array(st["step"], pa.int64()),
            "parent_state_id": pa.array(st["parent_state_id"], pa.int64()),
            "num_objects": pa.array(st["num_objects"], pa.int64()),
            "positions": pa.array(st["positions"], pa.list_(f64)),
            "objects": pa.array(st["objects"], pa.list_(pa.list_(f64))),
            "goal": pa.array(st["goal"], pa.list_(f64)),
        }
    )
    candidates_table = pa.table(
        {
            "state_id": pa.array(ca["state_id"], pa.int64()),
            "candidate": pa.array(ca["candidate"], pa.int64()),
            "object": pa.array(ca["object"], pa.int64()),
            "features": pa.array(ca["features"], pa.list_(f64)),
            "reward": pa.array(ca["reward"], f64),
            "q": pa.array(ca["q"], pa.list_(f64)),
            "successor_state_id": pa.array(ca["successor_state_id"], pa.int64()),
        }
    )
    return {"scenes.parquet": scenes_table, "states.parquet": states_table, "candidates.parquet": candidates_table}


def _card(rows: list[StateRow]) -> dict:
    chain = [row for row in rows if row.step >= 0]
    return difficulty_card(
        np.stack([row.q for row in chain]), np.array([row.scene_index for row in chain]), tie_band=CARD_TIE_BAND
    )


def _features_record() -> dict:
    def names(spec):
        return [{"name": n, "unit": u} for n, u in spec]

    return {"objects": names(OBJECT_FEATURES), "goal": names(GOAL_FEATURES), "candidates": names(CANDIDATE_FEATURES)}


def _generator_record(preset: Preset, split: str, seed: int) -> dict:
    return {
        **engine_identity(),
        "generator_version": GENERATOR_VERSION,
        "preset": preset.name,
        "preset_parameters": preset.as_record(),
        "split": split,
        "seed": seed,
        "actor": {
            "kind": preset.actor.kind,
            "epsilon": preset.actor.epsilon,
            "seed_stream": "SeedSequence(seed, spawn_key=(split, scene_index, 1 + chain))",
        },
        "label_dtype": "float64",
        "reward": "target-goal distance decrease (m) + goal_bonus if the target ends in the goal; no terminal state",
    }


def generate_population(
    preset: str,
    split: str,
    seed: int,
    out: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: ExecutorChoice | None = None,
) -> Path:
    """Generate a population with exact labels and publish it at ``out`` (write-once).

    Args:
        preset: registered preset name (``qhlab.scenes.PRESETS``).
        split: ``"train"``, ``"validation"`` or ``"test"``.
        seed: population seed (non-negative integer).
        out: directory to create; must not exist.
        workers: processes for the label search; None uses every core. Outputs do not
            depend on it. Ignored on a Ray cluster (its CPUs size the chunks).
        progress: called as ``progress(simulations_done, simulations_planned)``.
        executor: where label chunks run (default local); the Parquet files, manifest and
            population receipt are byte-identical either way.

    Returns:
        ``out`` as a Path.

    Raises:
        QhInputError: bad preset, split, seed, workers or executor, or a Ray cluster that
            does not answer (nothing is written).
        PublishConflictError: ``out`` exists.
    """
    spec = get_preset(preset)
    out = Path(out)
    workers = _resolve_workers(workers)
    scenes, initial, scene_ids = [], [], []
    for i in range(spec.scenes):
        scene, positions = sample_scene(spec, split, seed, i)  # validates split and seed
        scenes.append(scene)
        initial.append(positions)
        scene_ids.append(scene_id_for(scene, positions, split, seed, i))
    if out.exists() or out.is_symlink():
        raise PublishConflictError(
            f"generate_population: out={str(out)!r} already exists; populations are write-once. "
            "HINT: choose a new directory, or use cached_population to reuse a population."
        )
    planned = planned_simulations(spec)
    done = [0]

    def _on_simulations(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], max(planned, done[0]))

    choice = executor or ExecutorChoice()
    started = time.perf_counter()
    with open_executor(choice, workers, call="generate_population") as pool:
        chunk_workers = getattr(pool, "cpus", workers)
        search = TreeSearch(
            scenes, spec.candidates, executor=pool, workers=chunk_workers, on_simulations=_on_simulations
        )
        rows = run_chains(search, scenes, initial, spec, split, seed)
        generation = _generation_record(choice, pool, workers, time.perf_counter() - started)
    if progress is not None:
        progress(done[0], done[0])
    tables = _tables(spec, scenes, initial, scene_ids, rows)
    n_chain = sum(1 for r in rows if r.step >= 0)
    manifest = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "name": f"{spec.name}-{split}-seed{seed}",
        "split": split,
        "horizon": spec.horizon,
        "K": spec.candidates.num_candidates,
        "features": _features_record(),
        "generator": _generator_record(spec, split, seed),
        "counts": {
            "scenes": len(scenes),
            "chains": len(scenes) * spec.chains_per_scene,
            "chain_states": n_chain,
            "successor_states": len(rows) - n_chain,
            "states": len(rows),
            "candidates": tables["candidates.parquet"].num_rows,
            "max_objects": max(s.num_pucks for s in scenes),
            "simulations": search.simulations,
        },
        "difficulty": _card(rows),
        "files": {},
    }

    def _write(staging: Path) -> None:
        for name in POPULATION_FILES:
            manifest["files"][name] = _write_parquet(staging / name, tables[name])
        publish_json(staging / MANIFEST, manifest)
        write_receipt(
            staging / RECEIPT,
            PopulationReceipt,
            body={
                "name": manifest["name"],
                "split": split,
                "generator": manifest["generator"],
                "counts": manifest["counts"],
            },
            outputs={name: staging / name for name in (*POPULATION_FILES, MANIFEST)},
        )
        write_receipt(
            staging / GENERATION_RECEIPT,
            PopulationGenerationReceipt,
            body=generation,
            inputs={"manifest": staging / MANIFEST},
        )

    publish_directory(out, _write)
    return out


def _generation_record(choice: ExecutorChoice, pool, workers: int, seconds: float) -> dict:
    """Which executor labelled the population and where: execution evidence, not identity."""
    driver = where_am_i()
    record = {
        **choice.record(),
        "driver": {"hostname": driver["hostname"], "pid": driver["pid"]},
        "label_seconds": round(seconds, 3),
    }
    if isinstance(pool, RayExecutor):
        record.update(cluster_cpus=pool.cpus, **pool.record())
    else:
        record.update(processes=workers if pool is not None else 1)
    return record


def scene_content_digests(path: str | os.PathLike) -> dict[int, str]:
    """{scene_id: SHA-256 of the canonical JSON of its ``SCENE_CONTENT_COLUMNS``} of a population.

    Two scenes with the same digest are the same physical scene whatever their split, seed or
    index. Reads ``scenes.parquet`` as it is; authenticate the population first
    (``read_manifest``).
    """
    rows = pq.read_table(Path(path) / "scenes.parquet", columns=["scene_id", *SCENE_CONTENT_COLUMNS]).to_pylist()
    return {
        int(row["scene_id"]): sha256_bytes(canonical_json({k: row[k] for k in SCENE_CONTENT_COLUMNS})) for row in rows
    }


def _cache_key(spec: Preset, split: str, seed: int) -> str:
    return sha256_bytes(
        canonical_json(
            {
                "schema_version": MANIFEST_SCHEMA_VERSION,
                "generator_version": GENERATOR_VERSION,
                "engine": engine_identity(),
                "preset": spec.as_record(),
                "split": split,
                "seed": seed,
            }
        )
    )


def cached_population(
    preset: str,
    split: str,
    seed: int,
    cache_root: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: ExecutorChoice | None = None,
    audit: bool = True,
) -> Path:
    """Return a population for (preset, split, seed), generating it only once per cache.

    The cache directory name carries a digest of the arguments, the generator version, the
    population schema and the engine version, so a change to any of them misses the cache.
    A cached population is authenticated (manifest schema, every file digest, and its
    recorded generator) and, since anyone can write to a cache, audited against physics
    (``qhlab.scenes.audit.audit_population``: every scene regenerated, every label's Bellman
    rule, ``AUDIT_STATES`` chain states re-simulated) before it is reused.

    Args:
        audit: False only where the caller audits the returned population itself and records
            the audit (the study steps do).

    Raises:
        EvidenceError: a cached population exists but fails authentication or the audit (it
            is never overwritten; remove it by hand).
    """
    spec = get_preset(preset)
    sample_scene(spec, split, seed, 0)  # validates split and seed before touching the cache
    key = _cache_key(spec, split, seed)
    target = Path(cache_root) / f"{spec.name}-{split}-seed{seed}-{key[:16]}"
    if not target.exists():
        try:
            return generate_population(
                preset, split, seed, target, workers=workers, progress=progress, executor=executor
            )
        except PublishConflictError:
            if not target.exists():
                raise
    manifest = read_manifest(target)
    if canonical_json(manifest["generator"]) != canonical_json(_generator_record(spec, split, seed)):
        raise EvidenceError(
            f"cached_population: {target / MANIFEST} records generator "
            f"{manifest['generator'].get('preset')!r}/{manifest['generator'].get('seed')!r} that does not "
            "match the requested arguments. HINT: remove the stale cache directory."
        )
    if audit:
        audit_population(target, call="cached_population")
    return target
