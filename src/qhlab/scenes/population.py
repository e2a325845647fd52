"""The population WRITER: generate a labelled population of any environment and publish it write-once.

Owns: ``generate_population`` (make the preset's environment and check its contract, draw its
scenes from the population's scene seeds, run chains with exact labels through its ``step``,
write ``scenes.parquet`` (one column per key of the environment's scenes), ``states.parquet``,
``candidates.parquet``, a user environment's source under ``environment/``, ``manifest.json``
binding the SHA-256 of every file, a ``population.receipt.json`` so ``qhlab verify``
authenticates it, and a ``generation.receipt.json`` saying which executor labelled it, on which
nodes), the content-addressed cache ``cached_population``, and ``scene_content_digests``, the
identity of each scene's content that disjointness checks compare. Does not own: the format's
names and reading a manifest back (``manifest``), the environment (``environment``) or turning a
population into tensors (``qhlab.finite_horizon.data``).

Write-once: the population is staged in a hidden sibling directory and renamed into place
only when complete, so a crash never leaves a half-written population at ``out``.
Determinism: the same (environment, its source, preset, split, seed) gives byte-identical files:
labels do not depend on the executor or the worker count, the manifest and population receipt
hold no time or host, and Parquet is written with fixed options. Only ``generation.receipt.json``
(execution evidence, not part of the population's identity) differs between a local and a Ray
run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qhlab.evidence import (
    MAX_WORKERS,
    EvidenceError,
    PublishConflictError,
    QhInputError,
    canonical_json,
    file_in_the_way,
    input_error,
    publish_bytes,
    publish_directory,
    publish_file,
    publish_json,
    require_workers,
    sha256_bytes,
    write_receipt,
)
from qhlab.evidence.layout import GENERATION_RECEIPT, MANIFEST, POPULATION_FILES
from qhlab.evidence.layout import POPULATION_RECEIPT as RECEIPT
from qhlab.execution import ExecutorChoice, RayExecutor, open_executor, where_am_i
from qhlab.scenes.audit import audit_population
from qhlab.scenes.chains import StateRow, run_chains
from qhlab.scenes.difficulty import CARD_TIE_BAND, difficulty_card
from qhlab.scenes.environment import Environment, EnvironmentSpec, read_environment_source
from qhlab.scenes.gymnasium_ids import registration_source
from qhlab.scenes.manifest import ENVIRONMENT_DIR, MANIFEST_KIND, MANIFEST_SCHEMA_VERSION, read_manifest
from qhlab.scenes.presets import Preset, load_preset
from qhlab.scenes.probes import check_contract
from qhlab.scenes.records import PopulationGenerationReceipt, PopulationReceipt
from qhlab.scenes.sampler import GENERATOR_VERSION, scene_seed

__all__ = [
    "cached_population",
    "environment_spec",
    "expected_generator",
    "generate_population",
    "planned_simulations",
    "scene_content_digests",
    "scene_start_digests",
]

# The scenes.parquet columns that are not the scene's content: they derive from the split,
# seed and draw index. Every other column is one key of the environment's scene.
SCENE_IDENTITY_COLUMNS = ("scene_id", "scene_index")
# The built-in factory of Gymnasium tasks by id.
GYMNASIUM_FACTORY = "qhlab.scenes.gymnasium:make"


def planned_simulations(preset: Preset, max_candidates: int) -> int:
    """Simulations a population needs at most (every state with ``max_candidates`` candidates, no
    two searched states the same).

    The first chain state needs K + K^2 + ... + K^H; each later one only K^H, because its
    subtree to depth H-1 was stepped in the previous state's tree.
    """
    k, h = max_candidates, preset.horizon
    chains = preset.scenes * preset.chains_per_scene
    return chains * (sum(k**i for i in range(1, h + 1)) + (preset.steps - 1) * k**h)


def environment_spec(preset: Preset, *, call: str = "generate_population") -> EnvironmentSpec:
    """The environment a preset names: a built-in one by its factory, a user one with its source
    read from the user's files (relative to the preset file) for generation."""
    declared = preset.environment
    if declared.factory == GYMNASIUM_FACTORY:
        # A task one's own module registers (env_id = "my_tasks:MyTask-v0") freezes that module.
        own = registration_source(declared.options.get("env_id"), preset.base, call=call)
        if own is not None:
            record, files, root = own
            return EnvironmentSpec(declared.factory, dict(declared.options), source=record, files=files, root=str(root))
    if declared.factory.startswith("qhlab."):
        return EnvironmentSpec(declared.factory, dict(declared.options))
    record, files, root = read_environment_source(declared.factory, preset.base, call=call)
    return EnvironmentSpec(declared.factory, dict(declared.options), source=record, files=files, root=str(root))


def refuse_unwritable_cache(cache_root: str | os.PathLike, *, call: str, field: str) -> None:
    """Refuse a cache directory that cannot take a new population: a file or device there or
    above it, or a directory this process may not write. Labelling takes minutes and would fail
    only when it publishes, so this is asked before it starts.

    Args:
        cache_root: the cache directory (it need not exist yet).
        call, field: what the refusal names.

    Raises:
        QhInputError: the refusal, naming ``field`` and the path in the way.
    """
    root = Path(cache_root).expanduser()
    in_the_way = file_in_the_way(root)
    existing = next((p for p in (root, *root.parents) if p.exists()), root)
    if in_the_way is not None:
        kind = "a file" if in_the_way.is_file() else "not a directory"
        why = f"{str(in_the_way)!r} is {kind}"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{str(existing)!r} is not writable by this user"
    else:
        return
    raise input_error(
        call,
        field,
        str(cache_root),
        f"a directory qhlab can create or write new populations in ({why})",
        "name a writable directory (the default is ~/.cache/qhlab/populations)",
    )


def _resolve_workers(workers: int | None) -> int:
    if workers is None:
        return min(os.cpu_count() or 1, MAX_WORKERS)
    return require_workers(
        "generate_population",
        "workers",
        workers,
        hint="None uses every core (up to the limit); labels do not depend on the worker count.",
    )


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


def _scenes_table(scenes: list[dict], scene_ids: list[int]) -> pa.Table:
    """scene_id, scene_index and one column per key of the scenes (Arrow types inferred), refused
    unless every scene has the same keys and reads back exactly as it was written."""
    keys = list(scenes[0])
    columns = {"scene_id": pa.array(scene_ids, pa.int64()), "scene_index": pa.array(range(len(scenes)), pa.int64())}
    for index, scene in enumerate(scenes):
        if list(scene) != keys or set(keys) & set(SCENE_IDENTITY_COLUMNS):
            raise QhInputError(
                f"generate_population: scene {index} has keys {list(scene)}; allowed: the keys of scene 0 ({keys}), "
                f"none of {list(SCENE_IDENTITY_COLUMNS)}. HINT: every scene of an environment is the same JSON layout."
            )
    for key in keys:
        try:
            columns[key] = pa.array([scene[key] for scene in scenes])
        except (pa.ArrowException, TypeError, OverflowError, ValueError) as exc:
            raise QhInputError(
                f"generate_population: scene key {key!r} holds values Parquet cannot store as one column ({exc}); "
                "allowed: one JSON type per key across scenes (numbers, strings, booleans, lists and objects of them)."
            ) from None
    table = pa.table(columns)
    for index, row in enumerate(table.to_pylist()):
        if canonical_json({k: row[k] for k in keys}) != canonical_json(scenes[index]):
            raise QhInputError(
                f"generate_population: scene {index} does not read back from Parquet as it was drawn. HINT: give every "
                "scene the same keys, nested objects the same keys, and integers within 64 bits."
            )
    return table


def _tables(
    environment: Environment, scenes: list[dict], scene_ids: list[int], rows: list[StateRow]
) -> dict[str, pa.Table]:
    f64 = pa.float64()
    state_column = environment.state_column
    st = {
        k: []
        for k in (
            "state_id",
            "scene_id",
            "chain_id",
            "step",
            "parent_state_id",
            "num_objects",
            state_column,
            "objects",
            "goal",
        )
    }
    ca = {k: [] for k in ("state_id", "candidate", "object", "features", "reward", "q", "successor_state_id")}
    for index, row in enumerate(rows):
        scene = scenes[row.scene_index]
        objects, goal, features, struck = row.observed or environment.observe(scene, row.state)
        if len(struck) != len(row.reward):
            raise QhInputError(
                f"environment {environment.name!r}: observe(scene, state) returned {len(struck)} candidates for a "
                f"state whose candidates(scene, state) gave {len(row.reward)}."
            )
        st["state_id"].append(index)
        st["scene_id"].append(scene_ids[row.scene_index])
        st["chain_id"].append(row.chain)
        st["step"].append(row.step)
        st["parent_state_id"].append(row.parent)
        st["num_objects"].append(len(objects))
        st[state_column].append(row.state.tolist())
        st["objects"].append(objects.tolist())
        st["goal"].append(goal.tolist())
        for a in range(len(struck)):
            ca["state_id"].append(index)
            ca["candidate"].append(a)
            ca["object"].append(int(struck[a]))
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
            state_column: pa.array(st[state_column], pa.list_(f64)),
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
    return {
        "scenes.parquet": _scenes_table(scenes, scene_ids),
        "states.parquet": states_table,
        "candidates.parquet": candidates_table,
    }


def _card(rows: list[StateRow], max_candidates: int, reference: str) -> dict:
    chain = [row for row in rows if row.step >= 0]
    horizon = chain[0].q.shape[1]
    q = np.zeros((len(chain), max_candidates, horizon))
    mask = np.zeros((len(chain), max_candidates), dtype=bool)
    for i, row in enumerate(chain):
        q[i, : len(row.q)] = row.q
        mask[i, : len(row.q)] = True
    return difficulty_card(
        q,
        np.array([row.scene_index for row in chain]),
        tie_band=CARD_TIE_BAND,
        candidate_mask=mask,
        reference=reference,
    )


# Scenes the contract probes at generation: more than one, so that an environment stepping by the
# scene it last drew rather than the one it is passed steps one of them differently.
_CONTRACT_SCENES = 3


def generate_population(
    preset: str | os.PathLike | Preset,
    split: str,
    seed: int,
    out: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: ExecutorChoice | None = None,
    environment: EnvironmentSpec | None = None,
) -> Path:
    """Generate a population with exact labels and publish it at ``out`` (write-once).

    Args:
        preset: a built-in preset's name, a preset file, or a loaded ``Preset``.
        split: ``"train"``, ``"validation"`` or ``"test"``.
        seed: population seed (non-negative integer).
        out: directory to create; must not exist.
        workers: processes for the label search; None uses every core. Outputs do not
            depend on it. Ignored on a Ray cluster (its CPUs size the chunks).
        progress: called as ``progress(simulations_done, simulations_planned)``.
        executor: where label chunks run (default local); the Parquet files, manifest and
            population receipt are byte-identical either way.
        environment: the environment to use instead of the one the preset names (a study's
            validation uses the frozen copy its TRAIN population holds, never the user's files).

    Returns:
        ``out`` as a Path.

    Raises:
        QhInputError: bad preset, split, seed, workers or executor, an environment that breaks
            its contract (one line naming the environment, the method and the cause, the user's
            file and line where its own code raised), or a Ray cluster that does not answer;
            nothing is written.
        PublishConflictError: ``out`` exists.
    """
    spec = preset if isinstance(preset, Preset) else load_preset(preset, call="generate_population")
    out = Path(out)
    workers = _resolve_workers(workers)
    environment = Environment.make(environment or environment_spec(spec), call="generate_population")
    scenes, initial, scene_ids = _draw_scenes(environment, spec, split, seed)
    _refuse_existing(out)
    rows, simulations, generation = _label_chains(
        environment, scenes, initial, spec, split, seed, workers=workers, progress=progress, executor=executor
    )
    tables = _tables(environment, scenes, scene_ids, rows)
    manifest = _manifest(environment, spec, split, seed, scenes, rows, tables, simulations)
    copies = _environment_copies(environment)
    publish_directory(out, lambda staging: _write_population(staging, manifest, tables, copies, split, generation))
    return out


def _refuse_short_episodes(environment: Environment, spec: Preset) -> None:
    """Refuse a horizon longer than the task's own episode limit (an env's ``episode_limit``, e.g.
    a Gymnasium spec's ``max_episode_steps`` or MiniGrid's ``max_steps``): qhlab's labels would sum
    rewards past the end the task declares."""
    limit = getattr(environment.env, "episode_limit", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and limit < spec.horizon:
        raise input_error(
            "generate_population",
            "horizon",
            spec.horizon,
            f"at most environment {environment.name!r}'s episode limit ({limit} steps)",
            "a label sums the rewards of `horizon` steps inside one episode; raise the task's own step limit (its "
            "kwargs) or shorten the horizon",
        )


def _draw_scenes(
    environment: Environment, spec: Preset, split: str, seed: int
) -> tuple[list[dict], list[np.ndarray], list[int]]:
    """Draw the preset's scenes from the population's scene seeds, the environment's contract checked first.

    Returns:
        Every scene (as JSON holds it), its initial state and its scene_id, in draw order.

    Raises:
        QhInputError: a bad split or seed, an environment that breaks its contract, or two scenes
            with one scene_id.
    """
    seeds = [scene_seed(split, seed, i) for i in range(spec.scenes)]  # validates split and seed
    check_contract(environment, tuple(seeds[:_CONTRACT_SCENES]))
    _refuse_short_episodes(environment, spec)
    # Every scene as JSON holds it: what the population stores and every later step passes.
    scenes = [json.loads(json.dumps(environment.sample_scene(s), allow_nan=False)) for s in seeds]
    initial = [environment.initial_state(scene) for scene in scenes]
    scene_ids = [environment.scene_id(scene, split=split, seed=seed, scene_index=i) for i, scene in enumerate(scenes)]
    if len(set(scene_ids)) != len(scene_ids):
        raise QhInputError(
            f"generate_population: environment {environment.name!r} gives two scenes of one population the same "
            "scene_id. HINT: a scene_id binds the split, seed and scene index."
        )
    return scenes, initial, scene_ids


def _refuse_existing(out: Path) -> None:
    """Refuse an ``out`` that already exists (a symlink included): populations are write-once.

    Raises:
        PublishConflictError: ``out`` exists.
    """
    if out.exists() or out.is_symlink():
        raise PublishConflictError(
            f"generate_population: out={str(out)!r} already exists; populations are write-once. "
            "HINT: choose a new directory, or use cached_population to reuse a population."
        )


def _label_chains(
    environment: Environment,
    scenes: list[dict],
    initial: list[np.ndarray],
    spec: Preset,
    split: str,
    seed: int,
    *,
    workers: int,
    progress: Callable[[int, int], None] | None,
    executor: ExecutorChoice | None,
) -> tuple[list[StateRow], int, dict]:
    """Run the preset's chains with exact labels on the chosen executor, reporting ``progress``.

    Returns:
        The state rows, the simulations they took and the generation record (``_generation_record``).
    """
    planned = planned_simulations(spec, environment.max_candidates)
    done = [0]

    def _on_simulations(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], max(planned, done[0]))

    choice = executor or ExecutorChoice()
    started = time.perf_counter()
    with open_executor(choice, workers, call="generate_population") as pool:
        group_workers = getattr(pool, "cpus", workers)
        rows, simulations = run_chains(
            environment,
            scenes,
            initial,
            spec,
            split,
            seed,
            executor=pool,
            workers=group_workers,
            on_simulations=_on_simulations,
        )
        generation = _generation_record(choice, pool, workers, time.perf_counter() - started)
    if progress is not None:
        progress(done[0], done[0])
    return rows, simulations, generation


def _manifest(
    environment: Environment,
    spec: Preset,
    split: str,
    seed: int,
    scenes: list[dict],
    rows: list[StateRow],
    tables: dict[str, pa.Table],
    simulations: int,
) -> dict:
    """The population's manifest, its ``files`` still empty (``_write_population`` fills them)."""
    n_chain = sum(1 for r in rows if r.step >= 0)
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "name": f"{spec.name}-{split}-seed{seed}",
        "split": split,
        "horizon": spec.horizon,
        "K": environment.max_candidates,
        "features": environment.feature_names(),
        "generator": environment.generator_record(spec, split=split, seed=seed, generator_version=GENERATOR_VERSION),
        "counts": {
            "scenes": len(scenes),
            "chains": len(scenes) * spec.chains_per_scene,
            "chain_states": n_chain,
            "successor_states": len(rows) - n_chain,
            "states": len(rows),
            "candidates": tables["candidates.parquet"].num_rows,
            "max_objects": int(max(tables["states.parquet"].column("num_objects").to_pylist())),
            "simulations": simulations,
        },
        "difficulty": _card(rows, environment.max_candidates, environment.reference_candidate),
        "files": {},
    }


def _environment_copies(environment: Environment) -> dict[str, bytes]:
    """``{path under ENVIRONMENT_DIR: bytes}`` of a user environment's source; empty for a built-in one."""
    source = environment.spec.source
    return (
        {} if source is None else {f"{ENVIRONMENT_DIR}/{rel}": data for rel, data in environment.source_files.items()}
    )


def _write_population(
    staging: Path,
    manifest: dict,
    tables: dict[str, pa.Table],
    copies: dict[str, bytes],
    split: str,
    generation: dict,
) -> None:
    """Write the population into ``staging``: its Parquet files, the environment copy, the manifest
    (its ``files`` filled in) and both receipts."""
    for name in POPULATION_FILES:
        manifest["files"][name] = _write_parquet(staging / name, tables[name])
    # A user environment's source, as it was imported for these labels: every later use
    # imports this copy, never the user's files.
    for rel, data in copies.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        publish_bytes(staging / rel, data)
        manifest["files"][rel] = sha256_bytes(data)
    publish_json(staging / MANIFEST, manifest)
    body = {
        "name": manifest["name"],
        "split": split,
        "generator": manifest["generator"],
        "counts": manifest["counts"],
    }
    if copies:
        body["sealed_directories"] = [ENVIRONMENT_DIR]
    write_receipt(
        staging / RECEIPT,
        PopulationReceipt,
        body=body,
        outputs={name: staging / name for name in (*POPULATION_FILES, *copies, MANIFEST)},
    )
    write_receipt(
        staging / GENERATION_RECEIPT,
        PopulationGenerationReceipt,
        body=generation,
        inputs={"manifest": staging / MANIFEST},
    )


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
    """{scene_id: SHA-256 of the canonical JSON of its content} of a population: every column of
    ``scenes.parquet`` but ``SCENE_IDENTITY_COLUMNS`` (the environment's scene as it was drawn).

    Two scenes with the same digest are the same scene whatever their split, seed or index. Reads
    ``scenes.parquet`` as it is; authenticate the population first (``read_manifest``).
    """
    table = pq.read_table(Path(path) / "scenes.parquet")
    content = [c for c in table.column_names if c not in SCENE_IDENTITY_COLUMNS]
    return {
        int(row["scene_id"]): sha256_bytes(canonical_json({k: row[k] for k in content})) for row in table.to_pylist()
    }


# The states.parquet columns that place a state in its population rather than describe it.
_STATE_PLACE_COLUMNS = ("state_id", "scene_id", "chain_id", "step", "parent_state_id")


def scene_start_digests(path: str | os.PathLike) -> dict[int, str]:
    """{scene_id: SHA-256 of its initial state} of a population: every column of its first chain's
    step-0 row in ``states.parquet`` but those that place it (ids, step, parent).

    Two scenes with one digest start in the same state, whatever their seeds: a task with few
    distinct starts (CliffWalking starts every episode in one cell) gives many. Reads the file as
    it is; authenticate the population first (``read_manifest``).
    """
    import pyarrow.compute as pc

    table = pq.read_table(Path(path) / "states.parquet")
    starts = table.filter(pc.equal(table["step"], 0)).sort_by([("scene_id", "ascending"), ("chain_id", "ascending")])
    content = [c for c in starts.column_names if c not in _STATE_PLACE_COLUMNS]
    digests: dict[int, str] = {}
    for row in starts.to_pylist():
        digests.setdefault(int(row["scene_id"]), sha256_bytes(canonical_json({k: row[k] for k in content})))
    return digests


def _expected(
    preset: str | os.PathLike | Preset, split: str, seed: int, environment: EnvironmentSpec | None, *, call: str
) -> tuple[Preset, EnvironmentSpec, dict]:
    """The preset, the environment and the generator record a population of (preset, split, seed) has."""
    spec = preset if isinstance(preset, Preset) else load_preset(preset, call=call)
    scene_seed(split, seed, 0)  # validates split and seed before touching a cache
    environment = environment or environment_spec(spec, call=call)
    made = Environment.make(environment, call=call)
    return spec, environment, made.generator_record(spec, split=split, seed=seed, generator_version=GENERATOR_VERSION)


def expected_generator(
    preset: str | os.PathLike | Preset,
    split: str,
    seed: int,
    *,
    environment: EnvironmentSpec | None = None,
    call: str,
) -> dict:
    """The generator record a population of (preset, split, seed) has, without generating it.

    Args:
        preset: a built-in preset's name, a preset file, or a loaded ``Preset``.
        environment: the environment to use instead of the one the preset names (a study's
            validation is drawn from its TRAIN's frozen environment).
        call: the command named in a refusal.
    """
    return _expected(preset, split, seed, environment, call=call)[2]


def cached_population(
    preset: str | os.PathLike | Preset,
    split: str,
    seed: int,
    cache_root: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: ExecutorChoice | None = None,
    audit: bool = True,
    environment: EnvironmentSpec | None = None,
    call: str = "cached_population",
    field: str = "cache_root",
) -> Path:
    """Return a population for (preset, split, seed), generating it only once per cache.

    The cache directory name carries a digest of the population schema and the generator record
    (the environment, its options and source digest, its identity and engine versions, the
    preset's sizes and actor, the split and the seed), so a change to any of them misses the
    cache. A cached population is authenticated (manifest schema, every file digest, and its
    recorded generator) and, since anyone can write to a cache, audited (every scene
    regenerated, every label's Bellman rule, ``AUDIT_STATES`` chain states re-simulated) before
    it is reused.

    Args:
        preset: a built-in preset's name, a preset file, or a loaded ``Preset``.
        audit: False only where the caller audits the returned population itself and records
            the audit (the study steps do).
        environment: the environment to use instead of the one the preset names
            (``generate_population``).
        call, field: what a refusal of ``cache_root`` names (a study's ``population_cache``).

    Raises:
        EvidenceError: a cached population exists but fails authentication or the audit (it
            is never overwritten; remove it by hand).
        QhInputError: the population is not cached and ``cache_root`` cannot hold it (not a
            directory, below a file, or not writable), before anything is labelled.
    """
    spec, environment, record = _expected(preset, split, seed, environment, call="cached_population")
    key = sha256_bytes(canonical_json({"schema_version": MANIFEST_SCHEMA_VERSION, "generator": record}))
    target = Path(cache_root) / f"{spec.name}-{split}-seed{seed}-{key[:16]}"
    if not target.exists():
        refuse_unwritable_cache(cache_root, call=call, field=field)
        try:
            return generate_population(
                spec,
                split,
                seed,
                target,
                workers=workers,
                progress=progress,
                executor=executor,
                environment=environment,
            )
        except PublishConflictError:
            if not target.exists():
                raise
    manifest = read_manifest(target)
    if canonical_json(manifest["generator"]) != canonical_json(record):
        raise EvidenceError(
            f"cached_population: {target / MANIFEST} records generator "
            f"{manifest['generator'].get('preset')!r}/{manifest['generator'].get('seed')!r} that does not "
            "match the requested arguments. HINT: remove the stale cache directory."
        )
    if audit:
        audit_population(target, call="cached_population")
    return target
