"""A population directory read back: authenticated manifest, Parquet tables, checks, arrays.

Owns: ``read_population``, the one reader of the population format that
``qhlab.scenes.manifest`` names and ``qhlab.scenes.population`` writes. It authenticates the
manifest and every file digest (``manifest.read_manifest``), checks the requested split and
horizon, each table's columns and types, shapes, identities and finiteness, refuses a chain-row
candidate without a successor, checks every label against the Bellman rule and every successor
against physics (``audit``), and returns ``PopulationArrays``: numpy arrays in the row order that
training and evaluation use. Does not own: tensors (``qhlab.finite_horizon.data`` turns the
arrays into a ``Population``), writing populations, or the sampled physics audit.

Row order: S = chain rows (step >= 0) in file order, then successor rows (step == -1) in
file order. Labels, rewards and features stay float64 here; every value must fit float32,
the tensors' type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qhlab.evidence import QhInputError, SchemaMismatchError, input_error, require_int, sha256_file
from qhlab.scenes.audit import check_successors
from qhlab.scenes.bellman import LabelArrays, check_bellman, check_structure, read_labels
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.sampler import SPLITS

__all__ = ["PopulationArrays", "PopulationFields", "read_population"]

# The array type of a population's fields: numpy here, torch tensors in training.
A = TypeVar("A")

# Refusals of a file name it right after the call: "load_population: <file>: <field>=...".
# ``qhlab.finite_horizon.data.load_population`` is how every caller reads a population.
_CALL = "load_population"

_F64 = pa.float64()
_I64 = pa.int64()
_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "scenes.parquet": {"scene_id": _I64},
    "states.parquet": {
        "state_id": _I64,
        "scene_id": _I64,
        "chain_id": _I64,
        "step": _I64,
        "num_objects": _I64,
        "objects": pa.list_(pa.list_(_F64)),
        "goal": pa.list_(_F64),
    },
    "candidates.parquet": {
        "state_id": _I64,
        "candidate": _I64,
        "object": _I64,
        "features": pa.list_(_F64),
        "reward": _F64,
        "q": pa.list_(_F64),
        "successor_state_id": _I64,
    },
}


@dataclass(frozen=True, eq=False)
class PopulationFields(Generic[A]):
    """The fields of a loaded population (S rows: chain states, then successor states), whatever
    holds its arrays: ``PopulationArrays`` (numpy, as read) and ``qhlab.finite_horizon.data.Population``
    (torch tensors, the training contract).

    Attributes:
        manifest: the authenticated manifest.
        path: the population directory.
        digest: SHA-256 of ``manifest.json`` bytes (the manifest binds every file digest).
        split: ``"train"``, ``"validation"`` or ``"test"``.
        horizon: H.
        num_candidates: K.
        name: population name from the manifest.
        objects: [S, N, F] per-object features, zero-padded.
        object_mask: [S, N] bool, real objects.
        goal: [S, G] goal features.
        candidates: [S, K, C] candidate features.
        candidate_object: [S, K] int64 index in N of the object the candidate acts on.
        candidate_mask: [S, K] bool, real candidates.
        reward: [S, K] r(s, a), native units.
        q: [S, K, H] exact labels; successor rows hold 1..H-1, 0.0 beyond.
        q_horizons: [S] int64 valid label horizons (H chain rows, H-1 successor rows).
        successor: [S, K] int64 row of the successor state; -1 only on successor rows (the
            reader refuses a chain-row candidate without a successor: no terminal state).
        scene_index: [S] int64 dense 0..n_scenes-1 (scene order of ``scenes.parquet``).
        scene_id: [S] int64.
        state_id: [S] int64.
        chain_id: [S] int64.
        step: [S] int64, -1 for successors.
        is_chain: [S] bool, step >= 0.
    """

    manifest: dict
    path: Path
    digest: str
    split: str
    horizon: int
    num_candidates: int
    name: str
    objects: A
    object_mask: A
    goal: A
    candidates: A
    candidate_object: A
    candidate_mask: A
    reward: A
    q: A
    q_horizons: A
    successor: A
    scene_index: A
    scene_id: A
    state_id: A
    chain_id: A
    step: A
    is_chain: A


@dataclass(frozen=True, eq=False)
class PopulationArrays(PopulationFields[np.ndarray]):
    """A read and checked population as numpy arrays: features, rewards and labels in float64 as
    stored, identities in int64, masks in bool."""


def _read_table(path: Path) -> pa.Table:
    expected = _COLUMNS[path.name]
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise SchemaMismatchError(f"load_population: {path} is not a readable Parquet file ({exc}).") from None
    for column, dtype in expected.items():
        if column not in table.column_names:
            raise SchemaMismatchError(
                f"load_population: {path} lacks column {column!r}; required columns: "
                f"{sorted(expected)}. HINT: regenerate the population with this qhlab."
            )
        actual = table.schema.field(column).type
        if actual != dtype:
            raise SchemaMismatchError(f"load_population: {path} column {column!r} has type {actual}; allowed: {dtype}.")
        if table.column(column).null_count:
            raise QhInputError(f"load_population: {path} column {column!r} holds null values; allowed: none.")
    return table.combine_chunks()


def _ints(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).to_numpy().astype(np.int64, copy=False)


def _lists(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(lengths [rows], flat float64 values) of a list<double> column."""
    arr = table.column(column).combine_chunks()
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _rows_of_width(table: pa.Table, column: str, width: int, where: str, feature: str) -> np.ndarray:
    """A list<double> column whose every row holds ``width`` values, as float64 [rows, width];
    refused (naming the first other width) otherwise. ``feature``: its manifest field."""
    lengths, flat = _lists(table, column)
    if (lengths != width).any():
        raise input_error(
            where,
            column,
            f"width {int(lengths[lengths != width][0])}",
            f"{width} (manifest features.{feature})",
            "regenerate the population.",
        )
    return flat.reshape(-1, width)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_finite(path: Path, column: str, values: np.ndarray, ids: np.ndarray, what: str) -> None:
    rows = values.reshape(len(values), -1)
    # Values are stored as float64 but become float32 tensors: beyond float32's range is inf.
    bad = ~np.isfinite(rows) | (np.abs(rows) > _FLOAT32_MAX)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise QhInputError(
            f"load_population: {path} column {column!r} holds {float(rows[row, col])!r} at "
            f"{what}={int(ids[row])}; allowed: finite numbers within float32 range only. HINT: the population is "
            "corrupt; regenerate it."
        )


def read_population(path: str | os.PathLike, *, split: str, horizon: int | None = None) -> PopulationArrays:
    """Authenticate a population directory and read it into checked arrays.

    Args:
        path: population directory (``manifest.json`` + three Parquet files).
        split: the split the caller expects; a population of another split is refused.
        horizon: the H the caller expects; None accepts the population's H.

    Returns:
        The frozen ``PopulationArrays`` (row order: chain rows, then successor rows).

    Raises:
        MissingEvidenceError / DigestMismatchError / SchemaMismatchError: manifest or files
            missing, altered, or of another schema.
        QhInputError: split or horizon mismatch, bad shapes, unknown ids, non-finite values,
            a chain-row candidate without a successor (successor_state_id -1).
        EvidenceError: a label breaks the Bellman rule (``qhlab.scenes.bellman.check_bellman``):
            every label is checked, exactly, against the stored rewards and successors.
    """
    path = Path(path)
    if split not in SPLITS:
        raise input_error(_CALL, "split", split, ", ".join(SPLITS), "name the split you mean to read.")
    if horizon is not None:
        require_int(
            _CALL, "horizon", horizon, minimum=1, hint="pass the H you expect, or None to accept the population's."
        )
    manifest = read_manifest(path)
    manifest_path = path / "manifest.json"
    at_manifest = f"{_CALL}: {manifest_path}"
    if manifest["split"] != split:
        raise input_error(
            at_manifest,
            "split",
            manifest["split"],
            repr(split) + " (the requested split)",
            "a population is used only as the split it was generated for.",
        )
    big_h, k = manifest["horizon"], manifest["K"]
    if not isinstance(big_h, int) or big_h < 1 or not isinstance(k, int) or k < 1:
        raise input_error(at_manifest, "horizon/K", (big_h, k), "positive integers", "regenerate the population.")
    if horizon is not None and big_h != horizon:
        raise input_error(
            at_manifest,
            "horizon",
            big_h,
            f"{horizon} (the requested horizon)",
            "generate a population with the recipe's horizon.",
        )
    try:
        widths = {key: len(manifest["features"][key]) for key in ("objects", "goal", "candidates")}
        counts = {key: int(manifest["counts"][key]) for key in ("scenes", "states", "candidates")}
    except (KeyError, TypeError, ValueError):
        raise input_error(
            at_manifest, "features/counts", "incomplete", "feature lists and counts", "regenerate the population."
        ) from None

    scenes_path, states_path, cands_path = (
        path / n for n in ("scenes.parquet", "states.parquet", "candidates.parquet")
    )
    at_scenes, at_states, at_cands = (f"{_CALL}: {p}" for p in (scenes_path, states_path, cands_path))
    scenes = _read_table(scenes_path)
    states = _read_table(states_path)
    cands = _read_table(cands_path)
    for file, table, key in (
        (scenes_path, scenes, "scenes"),
        (states_path, states, "states"),
        (cands_path, cands, "candidates"),
    ):
        if table.num_rows != counts[key]:
            raise input_error(
                f"{_CALL}: {file}",
                "rows",
                table.num_rows,
                f"{counts[key]} (manifest counts.{key})",
                "the file and the manifest disagree; regenerate the population.",
            )

    scene_ids = _ints(scenes, "scene_id")
    if len(np.unique(scene_ids)) != len(scene_ids):
        raise input_error(at_scenes, "scene_id", "duplicates", "unique ids", "regenerate the population.")
    scene_dense = {int(s): i for i, s in enumerate(scene_ids)}

    # Row order: chain rows then successors, each in file order.
    step_file = _ints(states, "step")
    if (step_file < -1).any():
        raise input_error(
            at_states, "step", int(step_file.min()), "-1 (successor) or >= 0", "regenerate the population."
        )
    order = np.argsort(step_file < 0, kind="stable")
    state_id = _ints(states, "state_id")[order]
    s_rows = len(state_id)
    if len(np.unique(state_id)) != s_rows:
        raise input_error(at_states, "state_id", "duplicates", "unique ids", "regenerate the population.")
    row_of = {int(sid): i for i, sid in enumerate(state_id)}
    try:
        scene_index = np.array([scene_dense[int(s)] for s in _ints(states, "scene_id")[order]], dtype=np.int64)
    except KeyError as exc:
        raise input_error(
            at_states, "scene_id", int(exc.args[0]), f"an id of {scenes_path.name}", "regenerate the population."
        ) from None

    # Objects: list<list<double>> -> [S, N, F] padded.
    num_objects = _ints(states, "num_objects")
    obj_col = states.column("objects").combine_chunks()
    outer = pc.list_value_length(obj_col).to_numpy(zero_copy_only=False).astype(np.int64)
    if (outer != num_objects).any() or (num_objects < 1).any():
        bad = int(np.argmax((outer != num_objects) | (num_objects < 1)))
        raise input_error(
            at_states,
            "objects",
            f"{outer[bad]} objects at state_id {int(_ints(states, 'state_id')[bad])}",
            f"num_objects ({num_objects[bad]}) >= 1 objects",
            "regenerate the population.",
        )
    inner_lengths, flat = _lists(pa.table({"x": obj_col.flatten()}), "x")
    if (inner_lengths != widths["objects"]).any():
        width = int(inner_lengths[inner_lengths != widths["objects"]][0])
        raise input_error(
            at_states,
            "objects",
            f"feature width {width}",
            f"{widths['objects']} (manifest features.objects)",
            "regenerate the population.",
        )
    _check_finite(
        states_path,
        "objects",
        flat.reshape(-1, widths["objects"]),
        np.repeat(_ints(states, "state_id"), num_objects),
        "state_id",
    )
    n_max = int(num_objects.max())
    objects_file = np.zeros((s_rows, n_max, widths["objects"]), dtype=np.float64)
    mask_file = np.arange(n_max)[None, :] < num_objects[:, None]
    objects_file[mask_file] = flat.reshape(-1, widths["objects"])
    objects, object_mask = objects_file[order], mask_file[order]

    goal = _rows_of_width(states, "goal", widths["goal"], at_states, "goal")
    _check_finite(states_path, "goal", goal, _ints(states, "state_id"), "state_id")
    goal = goal[order]

    # Candidates: a state's k rows are its candidates 0..k-1 (1 <= k <= K).
    c_state = _ints(cands, "state_id")
    c_index = _ints(cands, "candidate")
    try:
        c_row = np.array([row_of[int(s)] for s in c_state], dtype=np.int64)
    except KeyError as exc:
        raise input_error(
            at_cands, "state_id", int(exc.args[0]), f"an id of {states_path.name}", "regenerate the population."
        ) from None
    if ((c_index < 0) | (c_index >= k)).any():
        raise input_error(
            at_cands,
            "candidate",
            int(c_index[(c_index < 0) | (c_index >= k)][0]),
            f"0..{k - 1}",
            "K is fixed per population.",
        )
    filled = np.zeros((s_rows, k), dtype=np.int64)
    np.add.at(filled, (c_row, c_index), 1)
    candidate_mask = np.arange(k)[None, :] < filled.sum(axis=1)[:, None]
    if (filled != candidate_mask).any() or not candidate_mask[:, 0].all():
        bad_row, bad_k = np.argwhere((filled != candidate_mask) | ~candidate_mask[:, :1])[0]
        raise input_error(
            at_cands,
            "candidate",
            f"{int(filled[bad_row, bad_k])} rows for state_id {int(state_id[bad_row])} candidate {int(bad_k)}",
            "exactly one row per (state, candidate) for a state's candidates 0..k-1 (k >= 1), none beyond",
            "a state's candidates are numbered from 0.",
        )
    features = _rows_of_width(cands, "features", widths["candidates"], at_cands, "candidates")
    _check_finite(cands_path, "features", features, c_state, "state_id")
    reward_flat = cands.column("reward").to_numpy().astype(np.float64)
    _check_finite(cands_path, "reward", reward_flat, c_state, "state_id")
    struck = _ints(cands, "object")
    n_of_row = object_mask.sum(axis=1)
    if ((struck < -1) | (struck >= n_of_row[c_row])).any():
        bad = int(np.argmax((struck < -1) | (struck >= n_of_row[c_row])))
        raise input_error(
            at_cands,
            "object",
            int(struck[bad]),
            f"-1 or 0..{int(n_of_row[c_row[bad]]) - 1} at state_id {int(c_state[bad])}",
            "a candidate acts on an object of its state, or on none (-1).",
        )

    q_lengths, q_flat = _lists(cands, "q")
    want = np.where(step_file[order] >= 0, big_h, big_h - 1)[c_row]
    if (q_lengths != want).any():
        bad = int(np.argmax(q_lengths != want))
        raise input_error(
            at_cands,
            "q",
            f"{int(q_lengths[bad])} labels at state_id {int(c_state[bad])}",
            f"{int(want[bad])} (H for chain states, H-1 for successors)",
            "regenerate the population.",
        )
    q_offsets = np.concatenate([[0], np.cumsum(q_lengths)])
    q = np.zeros((s_rows, k, big_h), dtype=np.float64)
    for h in range(big_h):
        has = q_lengths > h
        values = q_flat[q_offsets[:-1][has] + h]
        bad = ~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX)
        if bad.any():
            raise QhInputError(
                f"load_population: {cands_path} column 'q' holds {float(values[bad][0])!r} (Q*_{h + 1}) at state_id "
                f"{int(c_state[has][bad][0])} candidate {int(c_index[has][bad][0])}; allowed: finite numbers "
                "within float32 range only. HINT: the population is corrupt; regenerate it."
            )
        q[c_row[has], c_index[has], h] = values

    succ_ids = _ints(cands, "successor_state_id")
    succ_rows = np.full(len(succ_ids), -1, dtype=np.int64)
    for i in np.flatnonzero(succ_ids != -1):
        sid = int(succ_ids[i])
        if sid not in row_of:
            raise input_error(
                at_cands, "successor_state_id", sid, f"-1 or an id of {states_path.name}", "regenerate the population."
            )
        succ_rows[i] = row_of[sid]
    # The game has no terminal state: every candidate of a chain state leads somewhere, and
    # its successor row carries the labels that training bootstraps through. A chain-row -1
    # would silently turn that candidate into a terminal one (y_h = r for every h), so it is
    # refused; successor rows (step == -1) are leaves of the stored tree and keep -1.
    missing = np.flatnonzero((succ_ids == -1) & (step_file[order][c_row] >= 0))
    if missing.size:
        i = int(missing[0])
        raise input_error(
            at_cands,
            "successor_state_id",
            -1,
            f"an id of {states_path.name} for every candidate of a chain state (step >= 0; "
            f"here state_id {int(c_state[i])} candidate {int(c_index[i])}, "
            f"{missing.size} such candidate(s) in all); -1 only on successor rows (step == -1)",
            "the game has no terminal state, so every chain-row candidate has a successor "
            "state; the population is corrupt or was written by another generator; "
            "regenerate it.",
        )

    def grid(values: np.ndarray, dtype) -> np.ndarray:
        out = np.zeros((s_rows, k) + values.shape[1:], dtype=dtype)
        out[c_row, c_index] = values
        return out

    step = step_file[order]
    reward_grid, succ_grid = grid(reward_flat, np.float64), grid(succ_rows, np.int64)
    # The checks see a state's missing candidates as missing (NaN); the arrays hold zeros there.
    labels = LabelArrays(
        state_id=state_id,
        scene_id=_ints(states, "scene_id")[order],
        chain_id=_ints(states, "chain_id")[order],
        step=step,
        reward=np.where(candidate_mask, reward_grid, np.nan),
        q=np.where(candidate_mask[:, :, None], q, np.nan),
        horizons=np.where(step >= 0, big_h, big_h - 1),
        successor=np.where(candidate_mask, succ_grid, -1),
        mask=candidate_mask,
    )
    check_structure(cands_path, labels, call=_CALL)
    check_bellman(cands_path, labels.q, labels.reward, labels.successor, labels.horizons, state_id, call=_CALL)
    # Bellman leaves the rewards and successors themselves to the environment: every chain
    # state's one-step successors are stepped again on every load (read in file order, as the
    # files hold them; a user environment from the frozen copy inside the population).
    check_successors(path, manifest, read_labels(path, manifest, call=_CALL), call=_CALL)
    return PopulationArrays(
        manifest=manifest,
        path=path,
        digest=sha256_file(manifest_path),
        split=split,
        horizon=big_h,
        num_candidates=k,
        name=str(manifest["name"]),
        objects=objects,
        object_mask=object_mask,
        goal=goal,
        candidates=grid(features, np.float64),
        candidate_object=grid(struck, np.int64),
        candidate_mask=candidate_mask,
        reward=reward_grid,
        q=q,
        q_horizons=np.where(step >= 0, big_h, big_h - 1).astype(np.int64),
        successor=succ_grid,
        scene_index=scene_index,
        scene_id=scene_ids[scene_index].astype(np.int64),
        state_id=state_id.astype(np.int64),
        chain_id=_ints(states, "chain_id")[order].copy(),
        step=step.astype(np.int64),
        is_chain=step >= 0,
    )
