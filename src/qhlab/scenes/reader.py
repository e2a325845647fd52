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
            reader refuses a chain-row candidate without one; a terminal state's is itself).
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
    manifest, big_h, k, widths, counts = _checked_manifest(path, split, horizon)
    files = _Files(path)
    scenes, states, cands = _tables(files, counts)
    rows = _state_rows(files, scenes, states)
    objects, object_mask, goal = _objects_and_goal(files, states, rows.order, widths)
    grid = _candidate_grid(files, cands, rows, k)
    features = _rows_of_width(cands, "features", widths["candidates"], files.at_cands, "candidates")
    _check_finite(files.cands, "features", features, grid.state, "state_id")
    reward_flat = cands.column("reward").to_numpy().astype(np.float64)
    _check_finite(files.cands, "reward", reward_flat, grid.state, "state_id")
    struck = _ints(cands, "object")
    n_of_row = object_mask.sum(axis=1)
    if ((struck < -1) | (struck >= n_of_row[grid.row])).any():
        bad = int(np.argmax((struck < -1) | (struck >= n_of_row[grid.row])))
        raise input_error(
            files.at_cands,
            "object",
            int(struck[bad]),
            f"-1 or 0..{int(n_of_row[grid.row[bad]]) - 1} at state_id {int(grid.state[bad])}",
            "a candidate acts on an object of its state, or on none (-1).",
        )
    step = rows.step
    q = _labels(files, cands, grid, step, big_h, k)
    succ_rows = _successor_rows(files, cands, grid, rows)

    reward_grid, succ_grid = grid.place(reward_flat, np.float64), grid.place(succ_rows, np.int64)
    # The checks see a state's missing candidates as missing (NaN); the arrays hold zeros there.
    labels = LabelArrays(
        state_id=rows.state_id,
        scene_id=_ints(states, "scene_id")[rows.order],
        chain_id=_ints(states, "chain_id")[rows.order],
        step=step,
        reward=np.where(grid.mask, reward_grid, np.nan),
        q=np.where(grid.mask[:, :, None], q, np.nan),
        horizons=np.where(step >= 0, big_h, big_h - 1),
        successor=np.where(grid.mask, succ_grid, -1),
        mask=grid.mask,
    )
    check_structure(files.cands, labels, call=_CALL)
    check_bellman(files.cands, labels.q, labels.reward, labels.successor, labels.horizons, rows.state_id, call=_CALL)
    # Bellman leaves the rewards and successors themselves to the environment: every chain
    # state's one-step successors are stepped again on every load (read in file order, as the
    # files hold them; a user environment from the frozen copy inside the population).
    check_successors(path, manifest, read_labels(path, manifest, call=_CALL), call=_CALL)
    return PopulationArrays(
        manifest=manifest,
        path=path,
        digest=sha256_file(path / "manifest.json"),
        split=split,
        horizon=big_h,
        num_candidates=k,
        name=str(manifest["name"]),
        objects=objects,
        object_mask=object_mask,
        goal=goal,
        candidates=grid.place(features, np.float64),
        candidate_object=grid.place(struck, np.int64),
        candidate_mask=grid.mask,
        reward=reward_grid,
        q=q,
        q_horizons=np.where(step >= 0, big_h, big_h - 1).astype(np.int64),
        successor=succ_grid,
        scene_index=rows.scene_index,
        scene_id=rows.scene_ids[rows.scene_index].astype(np.int64),
        state_id=rows.state_id.astype(np.int64),
        chain_id=_ints(states, "chain_id")[rows.order].copy(),
        step=step.astype(np.int64),
        is_chain=step >= 0,
    )


@dataclass(frozen=True)
class _Files:
    """A population's three tables, and the prefix of a refusal that names each."""

    path: Path

    @property
    def scenes(self) -> Path:
        return self.path / "scenes.parquet"

    @property
    def states(self) -> Path:
        return self.path / "states.parquet"

    @property
    def cands(self) -> Path:
        return self.path / "candidates.parquet"

    @property
    def at_scenes(self) -> str:
        return f"{_CALL}: {self.scenes}"

    @property
    def at_states(self) -> str:
        return f"{_CALL}: {self.states}"

    @property
    def at_cands(self) -> str:
        return f"{_CALL}: {self.cands}"


def _checked_manifest(
    path: Path, split: str, horizon: int | None
) -> tuple[dict, int, int, dict[str, int], dict[str, int]]:
    """The authenticated manifest of the split and horizon asked for: ``(manifest, H, K, feature
    widths {objects, goal, candidates}, row counts {scenes, states, candidates})``."""
    if split not in SPLITS:
        raise input_error(_CALL, "split", split, ", ".join(SPLITS), "name the split you mean to read.")
    if horizon is not None:
        require_int(
            _CALL, "horizon", horizon, minimum=1, hint="pass the H you expect, or None to accept the population's."
        )
    manifest = read_manifest(path)
    at_manifest = f"{_CALL}: {path / 'manifest.json'}"
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
    return manifest, big_h, k, widths, counts


def _tables(files: _Files, counts: dict[str, int]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The scenes, states and candidates tables, each with the rows its manifest counts."""
    scenes, states, cands = _read_table(files.scenes), _read_table(files.states), _read_table(files.cands)
    for file, table, key in (
        (files.scenes, scenes, "scenes"),
        (files.states, states, "states"),
        (files.cands, cands, "candidates"),
    ):
        if table.num_rows != counts[key]:
            raise input_error(
                f"{_CALL}: {file}",
                "rows",
                table.num_rows,
                f"{counts[key]} (manifest counts.{key})",
                "the file and the manifest disagree; regenerate the population.",
            )
    return scenes, states, cands


@dataclass(frozen=True)
class _StateRows:
    """Where each state lands: ``order`` [S] maps array rows to file rows (chain rows, then
    successors, each in file order); ``state_id``, ``step`` and ``scene_index`` [S] are in array
    order; ``row_of`` maps a state id to its array row; ``scene_ids`` [n_scenes] in file order."""

    order: np.ndarray
    state_id: np.ndarray
    step: np.ndarray
    row_of: dict[int, int]
    scene_ids: np.ndarray
    scene_index: np.ndarray


def _state_rows(files: _Files, scenes: pa.Table, states: pa.Table) -> _StateRows:
    """The states' array order and ids, refused on duplicate or unknown ids or a bad step."""
    scene_ids = _ints(scenes, "scene_id")
    if len(np.unique(scene_ids)) != len(scene_ids):
        raise input_error(files.at_scenes, "scene_id", "duplicates", "unique ids", "regenerate the population.")
    scene_dense = {int(s): i for i, s in enumerate(scene_ids)}
    step_file = _ints(states, "step")
    if (step_file < -1).any():
        raise input_error(
            files.at_states, "step", int(step_file.min()), "-1 (successor) or >= 0", "regenerate the population."
        )
    order = np.argsort(step_file < 0, kind="stable")
    state_id = _ints(states, "state_id")[order]
    if len(np.unique(state_id)) != len(state_id):
        raise input_error(files.at_states, "state_id", "duplicates", "unique ids", "regenerate the population.")
    try:
        scene_index = np.array([scene_dense[int(s)] for s in _ints(states, "scene_id")[order]], dtype=np.int64)
    except KeyError as exc:
        raise input_error(
            files.at_states, "scene_id", int(exc.args[0]), f"an id of {files.scenes.name}", "regenerate the population."
        ) from None
    return _StateRows(
        order=order,
        state_id=state_id,
        step=step_file[order],
        row_of={int(sid): i for i, sid in enumerate(state_id)},
        scene_ids=scene_ids,
        scene_index=scene_index,
    )


def _objects_and_goal(
    files: _Files, states: pa.Table, order: np.ndarray, widths: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(objects [S, N, F] padded with zeros, object_mask [S, N], goal [S, G])`` in array order."""
    num_objects = _ints(states, "num_objects")
    obj_col = states.column("objects").combine_chunks()
    outer = pc.list_value_length(obj_col).to_numpy(zero_copy_only=False).astype(np.int64)
    if (outer != num_objects).any() or (num_objects < 1).any():
        bad = int(np.argmax((outer != num_objects) | (num_objects < 1)))
        raise input_error(
            files.at_states,
            "objects",
            f"{outer[bad]} objects at state_id {int(_ints(states, 'state_id')[bad])}",
            f"num_objects ({num_objects[bad]}) >= 1 objects",
            "regenerate the population.",
        )
    inner_lengths, flat = _lists(pa.table({"x": obj_col.flatten()}), "x")
    if (inner_lengths != widths["objects"]).any():
        width = int(inner_lengths[inner_lengths != widths["objects"]][0])
        raise input_error(
            files.at_states,
            "objects",
            f"feature width {width}",
            f"{widths['objects']} (manifest features.objects)",
            "regenerate the population.",
        )
    _check_finite(
        files.states,
        "objects",
        flat.reshape(-1, widths["objects"]),
        np.repeat(_ints(states, "state_id"), num_objects),
        "state_id",
    )
    n_max = int(num_objects.max())
    objects_file = np.zeros((len(order), n_max, widths["objects"]), dtype=np.float64)
    mask_file = np.arange(n_max)[None, :] < num_objects[:, None]
    objects_file[mask_file] = flat.reshape(-1, widths["objects"])
    goal = _rows_of_width(states, "goal", widths["goal"], files.at_states, "goal")
    _check_finite(files.states, "goal", goal, _ints(states, "state_id"), "state_id")
    return objects_file[order], mask_file[order], goal[order]


@dataclass(frozen=True)
class _CandidateGrid:
    """Where each candidate row lands in the [S, K] grid: its state's array ``row``, its
    ``index`` and its ``state`` id ([C] each, file order), and ``mask`` [S, K], the candidates a
    state has."""

    row: np.ndarray
    index: np.ndarray
    state: np.ndarray
    mask: np.ndarray

    def place(self, values: np.ndarray, dtype) -> np.ndarray:
        """``values`` [C, ...] (file order) as an [S, K, ...] grid, zeros where a state has no candidate."""
        out = np.zeros(self.mask.shape + values.shape[1:], dtype=dtype)
        out[self.row, self.index] = values
        return out


def _candidate_grid(files: _Files, cands: pa.Table, rows: _StateRows, k: int) -> _CandidateGrid:
    """Candidate rows on the grid: a state's k rows are its candidates 0..k-1 (1 <= k <= K)."""
    c_state = _ints(cands, "state_id")
    c_index = _ints(cands, "candidate")
    try:
        c_row = np.array([rows.row_of[int(s)] for s in c_state], dtype=np.int64)
    except KeyError as exc:
        raise input_error(
            files.at_cands, "state_id", int(exc.args[0]), f"an id of {files.states.name}", "regenerate the population."
        ) from None
    if ((c_index < 0) | (c_index >= k)).any():
        raise input_error(
            files.at_cands,
            "candidate",
            int(c_index[(c_index < 0) | (c_index >= k)][0]),
            f"0..{k - 1}",
            "K is fixed per population.",
        )
    filled = np.zeros((len(rows.state_id), k), dtype=np.int64)
    np.add.at(filled, (c_row, c_index), 1)
    candidate_mask = np.arange(k)[None, :] < filled.sum(axis=1)[:, None]
    if (filled != candidate_mask).any() or not candidate_mask[:, 0].all():
        bad_row, bad_k = np.argwhere((filled != candidate_mask) | ~candidate_mask[:, :1])[0]
        raise input_error(
            files.at_cands,
            "candidate",
            f"{int(filled[bad_row, bad_k])} rows for state_id {int(rows.state_id[bad_row])} candidate {int(bad_k)}",
            "exactly one row per (state, candidate) for a state's candidates 0..k-1 (k >= 1), none beyond",
            "a state's candidates are numbered from 0.",
        )
    return _CandidateGrid(row=c_row, index=c_index, state=c_state, mask=candidate_mask)


def _labels(files: _Files, cands: pa.Table, grid: _CandidateGrid, step: np.ndarray, big_h: int, k: int) -> np.ndarray:
    """The labels Q*_1..Q*_H as [S, K, H] (H for chain states, H-1 for successors; zeros beyond),
    refused unless finite and within float32 range."""
    q_lengths, q_flat = _lists(cands, "q")
    want = np.where(step >= 0, big_h, big_h - 1)[grid.row]
    if (q_lengths != want).any():
        bad = int(np.argmax(q_lengths != want))
        raise input_error(
            files.at_cands,
            "q",
            f"{int(q_lengths[bad])} labels at state_id {int(grid.state[bad])}",
            f"{int(want[bad])} (H for chain states, H-1 for successors)",
            "regenerate the population.",
        )
    q_offsets = np.concatenate([[0], np.cumsum(q_lengths)])
    q = np.zeros((len(step), k, big_h), dtype=np.float64)
    for h in range(big_h):
        has = q_lengths > h
        values = q_flat[q_offsets[:-1][has] + h]
        bad = ~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX)
        if bad.any():
            raise QhInputError(
                f"load_population: {files.cands} column 'q' holds {float(values[bad][0])!r} (Q*_{h + 1}) at state_id "
                f"{int(grid.state[has][bad][0])} candidate {int(grid.index[has][bad][0])}; allowed: finite numbers "
                "within float32 range only. HINT: the population is corrupt; regenerate it."
            )
        q[grid.row[has], grid.index[has], h] = values
    return q


def _successor_rows(files: _Files, cands: pa.Table, grid: _CandidateGrid, rows: _StateRows) -> np.ndarray:
    """Each candidate row's successor as an array row [C] (-1: none, on successor rows only)."""
    succ_ids = _ints(cands, "successor_state_id")
    succ_rows = np.full(len(succ_ids), -1, dtype=np.int64)
    for i in np.flatnonzero(succ_ids != -1):
        sid = int(succ_ids[i])
        if sid not in rows.row_of:
            raise input_error(
                files.at_cands,
                "successor_state_id",
                sid,
                f"-1 or an id of {files.states.name}",
                "regenerate the population.",
            )
        succ_rows[i] = rows.row_of[sid]
    # Every candidate of a chain state leads somewhere (a terminal state's back to itself), and
    # its successor row carries the labels that training bootstraps through. A chain-row -1
    # would silently turn that candidate into a leaf (y_h = r for every h), so it is refused;
    # successor rows (step == -1) are leaves of the stored tree and keep -1.
    missing = np.flatnonzero((succ_ids == -1) & (rows.step[grid.row] >= 0))
    if missing.size:
        i = int(missing[0])
        raise input_error(
            files.at_cands,
            "successor_state_id",
            -1,
            f"an id of {files.states.name} for every candidate of a chain state (step >= 0; "
            f"here state_id {int(grid.state[i])} candidate {int(grid.index[i])}, "
            f"{missing.size} such candidate(s) in all); -1 only on successor rows (step == -1)",
            "every chain-row candidate has a successor state (a terminal state's is itself); "
            "the population is corrupt or was written by another generator; regenerate it.",
        )
    return succ_rows
