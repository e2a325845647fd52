"""Input checks and row selection shared by the evaluation functions.

Owns: turning evaluation inputs (torch tensors or numpy arrays) into checked numpy arrays and
refusing bad ones with one clear error naming the call, the field, the value and what is
allowed (``qhlab.evidence.input_error``); selecting a population's chain rows and their
labels, masks and scene identities. Does not own: any metric (``evaluation``), loading
populations (``data``) or the message format (``qhlab.evidence``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qhlab.evidence import input_error, require_number

__all__ = [
    "chain_arrays",
    "chain_rows",
    "checked_choices",
    "checked_index",
    "checked_inputs",
    "checked_tie_band",
    "float_array",
    "population_identity",
    "scene_ids_of",
    "to_numpy",
]


def to_numpy(value: Any) -> np.ndarray:
    """``value`` (torch tensor on any device, numpy array or sequence) as a numpy array."""
    # torch is optional here on purpose: the arithmetic is numpy, and tensors may live on a
    # device or require grad, so detach and move before converting.
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if hasattr(value, "numpy"):
            return value.numpy()
    return np.asarray(value)


def float_array(call: str, field: str, value: Any, ndim: int) -> np.ndarray:
    """``value`` as float64 with ``ndim`` dimensions; refuses other ranks and non-real dtypes."""
    array = to_numpy(value)
    if array.ndim != ndim:
        raise input_error(
            call, f"{field}.shape", tuple(array.shape), f"{ndim} dimensions", "pass [S, K, H] for predictions/labels"
        )
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise input_error(
            call, f"{field}.dtype", str(array.dtype), "a real numeric dtype", "convert predictions and labels to float"
        )
    array = array.astype(np.float64, copy=False)
    return array


def checked_inputs(
    call: str,
    pred: Any,
    labels: Any,
    candidate_mask: Any,
    scene_index: Any | None = None,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None]:
    """Checked (pred [S,K,H] or None, labels [S,K,H], candidate_mask [S,K], scene_index [S] or None).

    Refuses wrong ranks, dtypes and shapes, a state without a valid candidate, non-finite
    labels or predictions at valid candidates, and negative or non-integer scene indices.
    """
    labels_np = float_array(call, "labels", labels, 3)
    pred_np = None if pred is None else float_array(call, "pred", pred, 3)
    mask = to_numpy(candidate_mask)
    if mask.dtype != np.bool_:
        raise input_error(
            call, "candidate_mask.dtype", str(mask.dtype), "bool", "pass the population's boolean candidate_mask[S, K]"
        )
    s, k, h = labels_np.shape
    if s == 0 or k == 0 or h == 0:
        raise input_error(
            call,
            "labels.shape",
            (s, k, h),
            "S >= 1, K >= 1, H >= 1",
            "evaluate at least one state with one candidate and one horizon",
        )
    if pred_np is not None and pred_np.shape != labels_np.shape:
        raise input_error(
            call,
            "pred.shape",
            tuple(pred_np.shape),
            f"the labels' shape {(s, k, h)}",
            "predict every candidate slot of every state at every horizon",
        )
    if mask.shape != (s, k):
        raise input_error(
            call,
            "candidate_mask.shape",
            tuple(mask.shape),
            f"{(s, k)} (labels' [S, K])",
            "the mask marks real candidates of each state",
        )
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise input_error(
            call,
            "candidate_mask",
            f"rows {empty[:5].tolist()} have no valid candidate",
            "every state has at least one valid candidate",
            "drop states without candidates before evaluation",
        )
    if not np.isfinite(labels_np[mask]).all():
        raise input_error(
            call,
            "labels",
            "non-finite values at valid candidates",
            "finite labels",
            "the population loader rejects NaN labels; check the rows selected",
        )
    if pred_np is not None and not np.isfinite(pred_np[mask]).all():
        raise input_error(
            call,
            "pred",
            "non-finite values at valid candidates",
            "finite predictions",
            "a diverged scorer cannot be scored; inspect the fit receipt",
        )
    scene = None
    if scene_index is not None:
        scene = _integer_rows(call, "scene_index", scene_index, s, "pass the population's scene_index[S]")
        if scene.min() < 0:
            raise input_error(
                call,
                "scene_index",
                int(scene.min()),
                "non-negative dense scene indices",
                "pass the population's scene_index, not scene_id with sentinels",
            )
        scene = scene.astype(np.int64, copy=False)
    return pred_np, labels_np, mask, scene


def _integer_rows(call: str, field: str, value: Any, s: int, hint: str) -> np.ndarray:
    """``value`` as a numpy integer array of shape [S]; else the refusal naming its shape and dtype."""
    array = to_numpy(value)
    if array.shape != (s,) or not np.issubdtype(array.dtype, np.integer):
        raise input_error(
            call, field, f"shape {tuple(array.shape)} dtype {array.dtype}", f"an integer array of shape {(s,)}", hint
        )
    return array


def checked_tie_band(call: str, tie_band: Any) -> float:
    """``tie_band`` as a float: a finite number >= 0 in native Q units."""
    return require_number(
        call, "tie_band", tie_band, minimum=0, hint="use the study's declared tie_band (native Q units, metres)"
    )


def checked_choices(call: str, chosen: Any, mask: np.ndarray) -> np.ndarray:
    """``chosen`` as int64 [S]: one valid candidate slot per state (never a padding slot)."""
    s, k = mask.shape
    picks = _integer_rows(call, "chosen", chosen, s, "pass one candidate index per state")
    picks = picks.astype(np.int64, copy=False)
    outside = np.flatnonzero((picks < 0) | (picks >= k))
    if outside.size:
        raise input_error(
            call,
            "chosen",
            f"{picks[outside[:5]].tolist()} at rows {outside[:5].tolist()}",
            f"indices in [0, {k - 1}]",
            "a policy picks one of the K candidate slots",
        )
    invalid = np.flatnonzero(~mask[np.arange(s), picks])
    if invalid.size:
        # A padding slot has no outcome: silently scoring it would invent a regret.
        raise input_error(
            call,
            "chosen",
            f"padding slots at rows {invalid[:5].tolist()}",
            "a valid candidate of each state (candidate_mask True)",
            "a policy can only pick a real candidate",
        )
    return picks


def checked_index(call: str, index: Any, k: int) -> int:
    """``index`` as an int in [0, k); bools are refused."""
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) or not 0 <= int(index) < k:
        raise input_error(
            call, "index", index, f"an integer in [0, {k - 1}]", "a fixed policy names one candidate slot"
        )
    return int(index)


def chain_rows(call: str, population: Any, rows: Any | None) -> np.ndarray:
    """Sorted population row indices to evaluate: every chain row, or the selected ones.

    ``rows`` is None, a bool mask [S] or integer row indices; successor rows, repeated or
    out-of-range indices and an empty selection are refused.
    """
    is_chain = to_numpy(population.is_chain).astype(bool)
    n_rows = is_chain.shape[0]
    if rows is None:
        selected = np.flatnonzero(is_chain)
    else:
        raw = to_numpy(rows)
        if raw.dtype == np.bool_:
            if raw.shape != (n_rows,):
                raise input_error(
                    call,
                    "rows.shape",
                    tuple(raw.shape),
                    f"{(n_rows,)} for a bool mask",
                    "pass a bool mask over all population rows or row indices",
                )
            selected = np.flatnonzero(raw)
        elif np.issubdtype(raw.dtype, np.integer) and raw.ndim == 1:
            if raw.size and (raw.min() < 0 or raw.max() >= n_rows):
                raise input_error(
                    call,
                    "rows",
                    f"indices in [{raw.min()}, {raw.max()}]",
                    f"indices in [0, {n_rows - 1}]",
                    "row indices of this population",
                )
            selected = np.unique(raw)
            if selected.size != raw.size:
                raise input_error(
                    call,
                    "rows",
                    "repeated indices",
                    "each row at most once",
                    "a repeated state would weigh twice within its scene",
                )
        else:
            raise input_error(
                call,
                "rows",
                f"dtype {raw.dtype} shape {tuple(raw.shape)}",
                "None, a bool mask [S] or a 1-D integer index array",
                "omit rows to evaluate every chain row",
            )
        successors = selected[~is_chain[selected]]
        if successors.size:
            raise input_error(
                call,
                "rows",
                f"successor rows {successors[:5].tolist()}",
                "chain rows only (population.is_chain)",
                "successor rows lack the horizon-H label; evaluate chain rows",
            )
    if selected.size == 0:
        raise input_error(
            call, "rows", "no chain rows selected", "at least one chain row", "check the population has chain states"
        )
    return selected


def chain_arrays(call: str, population: Any, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """labels [R, K, H], candidate_mask [R, K] and scene_index [R] of the selected chain rows."""
    horizon = int(population.horizon)
    labels = to_numpy(population.q)[selected][:, :, :horizon]
    q_horizons = getattr(population, "q_horizons", None)
    if q_horizons is not None:
        short = selected[to_numpy(q_horizons)[selected] < horizon]
        if short.size:
            raise input_error(
                call,
                "rows",
                f"rows {short[:5].tolist()} with fewer than H labels",
                f"rows labelled at all {horizon} horizons",
                "evaluate chain rows",
            )
    mask = to_numpy(population.candidate_mask)[selected]
    scene_index = to_numpy(population.scene_index)[selected]
    return labels, mask, scene_index


def scene_ids_of(call: str, population: Any, selected: np.ndarray, scenes: list[int]) -> list[int]:
    """The scene_id of each scene index in ``scenes`` (checked one id per index)."""
    scene_index = to_numpy(population.scene_index)[selected]
    scene_ids = to_numpy(population.scene_id)[selected]
    by_index: dict[int, int] = {}
    for index, sid in zip(scene_index.tolist(), scene_ids.tolist()):
        if by_index.setdefault(int(index), int(sid)) != int(sid):
            raise input_error(
                call,
                "population.scene_id",
                f"scene_index {index} maps to several ids",
                "one scene_id per scene_index",
                "the population file is inconsistent",
            )
    return [by_index[int(i)] for i in scenes]


def population_identity(population: Any) -> dict[str, str | None]:
    """The population's ``name``, ``split`` and ``digest`` as strings (None where absent)."""
    values = {}
    for key in ("name", "split", "digest"):
        value = getattr(population, key, None)
        values[key] = None if value is None else str(value)
    return values
