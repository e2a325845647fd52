"""Scene-weighted evaluation of Q_1..Q_H predictions against exact labels.

Owns: the evaluation arithmetic of SPEC §5 as pure functions over arrays (per-candidate absolute
error and per-state regret, averaged within state, then states within scene, then scenes
equally), the TRAIN-only constant predictor and its uniform-tie regret, and a convenience that
applies them to the chain rows of a loaded ``Population``.

Does not own: running a scorer (callers pass predictions), loading populations
(``qhlab.finite_horizon.data``), confidence intervals and retention margins
(``qhlab.finite_horizon.studies.statistics``), or writing receipts.

Inputs may be torch tensors or numpy arrays; every result is numpy (float64) or, for the
summaries, plain JSON-able Python values. The statistical unit is the scene: per-scene arrays
are ordered by ascending ``scene_index`` of the scenes present in the rows given.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qhlab.evidence.errors import QhInputError

__all__ = [
    "per_state_mae",
    "per_state_regret",
    "per_state_uniform_regret",
    "scene_means",
    "per_scene_mae",
    "per_scene_regret",
    "per_scene_uniform_regret",
    "scene_weighted_summary",
    "train_constant",
    "constant_predictions",
    "population_train_constant",
    "evaluate_population",
]


# ---------------------------------------------------------------------------------------------
# Input checks (private): one clear error naming the field, the value and what is allowed.


def _to_numpy(value: Any) -> np.ndarray:
    # torch is optional here on purpose: the arithmetic is numpy, and tensors may live on a
    # device or require grad, so detach and move before converting.
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if hasattr(value, "numpy"):
            return value.numpy()
    return np.asarray(value)


def _fail(call: str, field: str, value: Any, allowed: str, hint: str) -> QhInputError:
    return QhInputError(f"{call}: {field}={value!r} is not allowed; allowed: {allowed}. HINT: {hint}")


def _float_array(call: str, field: str, value: Any, ndim: int) -> np.ndarray:
    array = _to_numpy(value)
    if array.ndim != ndim:
        raise _fail(call, f"{field}.shape", tuple(array.shape), f"{ndim} dimensions",
                    "pass [S, K, H] for predictions/labels")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise _fail(call, f"{field}.dtype", str(array.dtype), "a real numeric dtype",
                    "convert predictions and labels to float")
    array = array.astype(np.float64, copy=False)
    return array


def _check_inputs(
    call: str,
    pred: Any,
    labels: Any,
    candidate_mask: Any,
    scene_index: Any | None = None,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None]:
    labels_np = _float_array(call, "labels", labels, 3)
    pred_np = None if pred is None else _float_array(call, "pred", pred, 3)
    mask = _to_numpy(candidate_mask)
    if mask.dtype != np.bool_:
        raise _fail(call, "candidate_mask.dtype", str(mask.dtype), "bool",
                    "pass the population's boolean candidate_mask[S, K]")
    s, k, h = labels_np.shape
    if s == 0 or k == 0 or h == 0:
        raise _fail(call, "labels.shape", (s, k, h), "S >= 1, K >= 1, H >= 1",
                    "evaluate at least one state with one candidate and one horizon")
    if pred_np is not None and pred_np.shape != labels_np.shape:
        raise _fail(call, "pred.shape", tuple(pred_np.shape), f"the labels' shape {(s, k, h)}",
                    "predict every candidate slot of every state at every horizon")
    if mask.shape != (s, k):
        raise _fail(call, "candidate_mask.shape", tuple(mask.shape), f"{(s, k)} (labels' [S, K])",
                    "the mask marks real candidates of each state")
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise _fail(call, "candidate_mask", f"rows {empty[:5].tolist()} have no valid candidate",
                    "every state has at least one valid candidate",
                    "drop states without candidates before evaluation")
    if not np.isfinite(labels_np[mask]).all():
        raise _fail(call, "labels", "non-finite values at valid candidates", "finite labels",
                    "the population loader rejects NaN labels; check the rows selected")
    if pred_np is not None and not np.isfinite(pred_np[mask]).all():
        raise _fail(call, "pred", "non-finite values at valid candidates", "finite predictions",
                    "a diverged scorer cannot be scored; inspect the fit receipt")
    scene = None
    if scene_index is not None:
        scene = _to_numpy(scene_index)
        if scene.shape != (s,) or not np.issubdtype(scene.dtype, np.integer):
            raise _fail(call, "scene_index", f"shape {tuple(scene.shape)} dtype {scene.dtype}",
                        f"an integer array of shape {(s,)}", "pass the population's scene_index[S]")
        if scene.min() < 0:
            raise _fail(call, "scene_index", int(scene.min()), "non-negative dense scene indices",
                        "pass the population's scene_index, not scene_id with sentinels")
        scene = scene.astype(np.int64, copy=False)
    return pred_np, labels_np, mask, scene


def _check_tie_band(call: str, tie_band: Any) -> float:
    if isinstance(tie_band, bool) or not isinstance(tie_band, (int, float)) or not math.isfinite(
        float(tie_band)
    ) or float(tie_band) < 0:
        raise _fail(call, "tie_band", tie_band, "a finite number >= 0 (native Q units, metres)",
                    "use the study's declared tie_band")
    return float(tie_band)


# ---------------------------------------------------------------------------------------------
# Per-state quantities.


def per_state_mae(pred: Any, labels: Any, candidate_mask: Any) -> np.ndarray:
    """Mean absolute error over the valid candidates of each state.

    Args:
        pred: predictions Q_h, shape [S, K, H].
        labels: exact labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K], real candidates.

    Returns:
        float64 [S, H]: mean_{a valid} |Q_h(s, a) - Q*_h(s, a)|.
    """
    pred_np, labels_np, mask, _ = _check_inputs("per_state_mae", pred, labels, candidate_mask)
    return _state_mae(pred_np, labels_np, mask)


def _state_mae(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[:, :, None].astype(np.float64)
    error = np.where(mask[:, :, None], np.abs(pred - labels), 0.0)
    return error.sum(axis=1) / weights.sum(axis=1)


def per_state_regret(pred: Any, labels: Any, candidate_mask: Any, *, tie_band: float) -> np.ndarray:
    """Regret of acting greedily on the predictions, with ties averaged.

    For each state and horizon h, the chosen set is every valid candidate whose prediction lies
    within ``tie_band`` of the largest valid prediction; the regret is
    ``max_{a valid} Q*_h(s, a) - mean_{a chosen} Q*_h(s, a)`` (uniform tie-breaking).

    Args:
        pred: predictions Q_h, shape [S, K, H].
        labels: exact labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K], real candidates.
        tie_band: finite tolerance >= 0 in native Q units.

    Returns:
        float64 [S, H], every entry >= 0.
    """
    band = _check_tie_band("per_state_regret", tie_band)
    pred_np, labels_np, mask, _ = _check_inputs("per_state_regret", pred, labels, candidate_mask)
    return _state_regret(pred_np, labels_np, mask, band)


def _state_regret(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray, band: float) -> np.ndarray:
    valid = mask[:, :, None]
    best_label = np.where(valid, labels, -np.inf).max(axis=1)
    best_pred = np.where(valid, pred, -np.inf).max(axis=1)
    tied = valid & (pred >= best_pred[:, None, :] - band)
    chosen_value = np.where(tied, labels, 0.0).sum(axis=1) / tied.sum(axis=1)
    # Rounding of the mean can dip a hair below the max when every tied label equals it.
    return np.maximum(best_label - chosen_value, 0.0)


def per_state_uniform_regret(labels: Any, candidate_mask: Any) -> np.ndarray:
    """Regret when every valid candidate ties (what any constant predictor gets).

    Args:
        labels: exact labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K].

    Returns:
        float64 [S, H]: max_{a valid} Q*_h - mean_{a valid} Q*_h.
    """
    _, labels_np, mask, _ = _check_inputs("per_state_uniform_regret", None, labels, candidate_mask)
    valid = mask[:, :, None]
    best = np.where(valid, labels_np, -np.inf).max(axis=1)
    mean = np.where(valid, labels_np, 0.0).sum(axis=1) / valid.sum(axis=1)
    return np.maximum(best - mean, 0.0)


# ---------------------------------------------------------------------------------------------
# Scene weighting.


def scene_means(values: Any, scene_index: Any) -> tuple[np.ndarray, np.ndarray]:
    """Average per-state values within each scene (every state of a scene weighs the same).

    Args:
        values: per-state values, shape [S, ...] (e.g. [S, H]).
        scene_index: int [S], the scene of each state.

    Returns:
        (scenes, means): ``scenes`` int64 [n_scenes], the distinct scene indices in ascending
        order; ``means`` float64 [n_scenes, ...], the mean over each scene's states. The
        scene-weighted metric is ``means.mean(axis=0)`` (every scene weighs the same).
    """
    vals = _to_numpy(values).astype(np.float64, copy=False)
    scene = _to_numpy(scene_index)
    if vals.ndim < 1 or scene.shape != (vals.shape[0],) or not np.issubdtype(scene.dtype, np.integer):
        raise _fail("scene_means", "scene_index",
                    f"shape {tuple(scene.shape)} dtype {scene.dtype}",
                    f"an integer array of shape {(vals.shape[0] if vals.ndim else 0,)}",
                    "one scene index per state row")
    if vals.shape[0] == 0:
        raise _fail("scene_means", "values.shape", tuple(vals.shape), "at least one state row",
                    "select some states before aggregating")
    scenes, inverse = np.unique(scene, return_inverse=True)
    counts = np.bincount(inverse, minlength=scenes.size).astype(np.float64)
    flat = vals.reshape(vals.shape[0], -1)
    sums = np.zeros((scenes.size, flat.shape[1]), dtype=np.float64)
    np.add.at(sums, inverse, flat)
    means = (sums / counts[:, None]).reshape((scenes.size,) + vals.shape[1:])
    return scenes.astype(np.int64), means


def per_scene_mae(pred: Any, labels: Any, candidate_mask: Any, scene_index: Any) -> np.ndarray:
    """Per-scene MAE_h: candidates within state, then states within scene.

    Args:
        pred: [S, K, H] predictions.
        labels: [S, K, H] exact labels.
        candidate_mask: bool [S, K].
        scene_index: int [S].

    Returns:
        float64 [n_scenes, H], scenes in ascending scene_index order. The scene-weighted MAE_h
        is the column mean.
    """
    pred_np, labels_np, mask, scene = _check_inputs(
        "per_scene_mae", pred, labels, candidate_mask, scene_index
    )
    return scene_means(_state_mae(pred_np, labels_np, mask), scene)[1]


def per_scene_regret(
    pred: Any, labels: Any, candidate_mask: Any, scene_index: Any, *, tie_band: float
) -> np.ndarray:
    """Per-scene regret_h (ties within ``tie_band`` averaged), states within scene.

    Args:
        pred: [S, K, H] predictions.
        labels: [S, K, H] exact labels.
        candidate_mask: bool [S, K].
        scene_index: int [S].
        tie_band: finite tolerance >= 0, native Q units.

    Returns:
        float64 [n_scenes, H], scenes in ascending scene_index order.
    """
    band = _check_tie_band("per_scene_regret", tie_band)
    pred_np, labels_np, mask, scene = _check_inputs(
        "per_scene_regret", pred, labels, candidate_mask, scene_index
    )
    return scene_means(_state_regret(pred_np, labels_np, mask, band), scene)[1]


def per_scene_uniform_regret(labels: Any, candidate_mask: Any, scene_index: Any) -> np.ndarray:
    """Per-scene regret of a constant predictor (all valid candidates tie).

    Args:
        labels: [S, K, H] exact labels.
        candidate_mask: bool [S, K].
        scene_index: int [S].

    Returns:
        float64 [n_scenes, H]; equals ``per_scene_regret`` of any constant prediction for every
        ``tie_band``.
    """
    _, _, _, scene = _check_inputs(
        "per_scene_uniform_regret", None, labels, candidate_mask, scene_index
    )
    return scene_means(per_state_uniform_regret(labels, candidate_mask), scene)[1]


def _summary_from_arrays(
    scenes: np.ndarray,
    mae: np.ndarray,
    regret: np.ndarray,
    *,
    tie_band: float,
    n_states: int,
    n_candidates: int,
) -> dict[str, Any]:
    horizon = int(mae.shape[1])
    mae_h = mae.mean(axis=0)
    regret_h = regret.mean(axis=0)
    return {
        "weighting": "candidates within state, states within scene, scenes equally",
        "horizon": horizon,
        "primary_horizon": horizon,
        "horizons": list(range(1, horizon + 1)),
        "tie_band": float(tie_band),
        "n_scenes": int(scenes.size),
        "n_states": int(n_states),
        "n_candidates": int(n_candidates),
        "mae": [float(v) for v in mae_h],
        "regret": [float(v) for v in regret_h],
        "mae_primary": float(mae_h[-1]),
        "regret_primary": float(regret_h[-1]),
        "per_scene": {
            "scene_index": [int(v) for v in scenes],
            "mae": mae.tolist(),
            "regret": regret.tolist(),
        },
    }


def scene_weighted_summary(
    pred: Any, labels: Any, candidate_mask: Any, scene_index: Any, *, tie_band: float
) -> dict[str, Any]:
    """MAE_h and regret_h for every horizon, scene-weighted, with the per-scene arrays.

    Args:
        pred: [S, K, H] predictions.
        labels: [S, K, H] exact labels.
        candidate_mask: bool [S, K].
        scene_index: int [S].
        tie_band: finite tolerance >= 0, native Q units.

    Returns:
        JSON-able dict: ``mae`` / ``regret`` are lists of H floats (index h-1), ``mae_primary`` /
        ``regret_primary`` the values at horizon H (the primary horizon), counts, and
        ``per_scene`` = {``scene_index``: [n_scenes], ``mae``: [n_scenes][H], ``regret``:
        [n_scenes][H]} in ascending scene_index order.
    """
    band = _check_tie_band("scene_weighted_summary", tie_band)
    pred_np, labels_np, mask, scene = _check_inputs(
        "scene_weighted_summary", pred, labels, candidate_mask, scene_index
    )
    scenes, mae = scene_means(_state_mae(pred_np, labels_np, mask), scene)
    _, regret = scene_means(_state_regret(pred_np, labels_np, mask, band), scene)
    return _summary_from_arrays(
        scenes, mae, regret, tie_band=band, n_states=mask.shape[0], n_candidates=int(mask.sum())
    )


# ---------------------------------------------------------------------------------------------
# The TRAIN-only constant predictor.


def train_constant(train_labels: Any, candidate_mask: Any) -> np.ndarray:
    """Mean TRAIN label per horizon over every valid candidate of the rows given.

    Pass TRAIN chain rows only (``population.is_chain``): successor rows carry no label at
    horizon H.

    Args:
        train_labels: [S, K, H] exact TRAIN labels.
        candidate_mask: bool [S, K].

    Returns:
        float64 [H]: sum over valid (s, a) of Q*_h(s, a) divided by the number of valid pairs.
    """
    _, labels_np, mask, _ = _check_inputs("train_constant", None, train_labels, candidate_mask)
    return labels_np[mask].mean(axis=0)


def constant_predictions(constant: Any, candidate_mask: Any) -> np.ndarray:
    """Broadcast a per-horizon constant to every candidate slot of a population.

    Args:
        constant: [H] values (e.g. ``train_constant``).
        candidate_mask: bool [S, K] of the population to predict.

    Returns:
        float64 [S, K, H], the constant at every slot (padding slots too; masks ignore them).
    """
    values = _float_array("constant_predictions", "constant", constant, 1)
    mask = _to_numpy(candidate_mask)
    if mask.ndim != 2 or values.size == 0 or not np.isfinite(values).all():
        raise _fail("constant_predictions", "constant/candidate_mask",
                    f"constant {values.tolist()} mask shape {tuple(mask.shape)}",
                    "a finite [H] constant (H >= 1) and a [S, K] mask",
                    "compute the constant with train_constant on TRAIN chain rows")
    return np.broadcast_to(values, mask.shape + values.shape).copy()


def population_train_constant(population: Any) -> np.ndarray:
    """The TRAIN-only constant from a loaded TRAIN ``Population`` (chain rows only).

    Args:
        population: a ``qhlab.finite_horizon.data.Population`` with ``split == "train"``.

    Returns:
        float64 [H].
    """
    split = getattr(population, "split", None)
    if split != "train":
        raise _fail("population_train_constant", "population.split", split, "'train'",
                    "the constant predictor is fitted on TRAIN only; never on validation or test")
    rows = _chain_rows("population_train_constant", population, None)
    horizon = int(population.horizon)
    labels = _to_numpy(population.q)[rows][:, :, :horizon]
    return train_constant(labels, _to_numpy(population.candidate_mask)[rows])


# ---------------------------------------------------------------------------------------------
# Population convenience.


def _chain_rows(call: str, population: Any, rows: Any | None) -> np.ndarray:
    is_chain = _to_numpy(population.is_chain).astype(bool)
    n_rows = is_chain.shape[0]
    if rows is None:
        selected = np.flatnonzero(is_chain)
    else:
        raw = _to_numpy(rows)
        if raw.dtype == np.bool_:
            if raw.shape != (n_rows,):
                raise _fail(call, "rows.shape", tuple(raw.shape), f"{(n_rows,)} for a bool mask",
                            "pass a bool mask over all population rows or row indices")
            selected = np.flatnonzero(raw)
        elif np.issubdtype(raw.dtype, np.integer) and raw.ndim == 1:
            if raw.size and (raw.min() < 0 or raw.max() >= n_rows):
                raise _fail(call, "rows", f"indices in [{raw.min()}, {raw.max()}]",
                            f"indices in [0, {n_rows - 1}]", "row indices of this population")
            selected = np.unique(raw)
            if selected.size != raw.size:
                raise _fail(call, "rows", "repeated indices", "each row at most once",
                            "a repeated state would weigh twice within its scene")
        else:
            raise _fail(call, "rows", f"dtype {raw.dtype} shape {tuple(raw.shape)}",
                        "None, a bool mask [S] or a 1-D integer index array",
                        "omit rows to evaluate every chain row")
        successors = selected[~is_chain[selected]]
        if successors.size:
            raise _fail(call, "rows", f"successor rows {successors[:5].tolist()}",
                        "chain rows only (population.is_chain)",
                        "successor rows lack the horizon-H label; evaluate chain rows")
    if selected.size == 0:
        raise _fail(call, "rows", "no chain rows selected", "at least one chain row",
                    "check the population has chain states")
    return selected


def evaluate_population(
    pred: Any, population: Any, *, tie_band: float, rows: Any | None = None
) -> dict[str, Any]:
    """Scene-weighted summary of predictions on a population's chain rows.

    Args:
        pred: [S_pred, K, H] predictions, where S_pred is either every population row (S) or
            exactly the selected rows in ascending row order.
        population: a ``Population`` (attributes ``q``, ``candidate_mask``, ``scene_index``,
            ``scene_id``, ``is_chain``, ``horizon``; ``name``, ``split``, ``digest`` if present).
        tie_band: finite tolerance >= 0, native Q units.
        rows: None (every chain row), a bool mask [S], or integer row indices; chain rows only.

    Returns:
        ``scene_weighted_summary`` plus ``per_scene["scene_id"]`` (aligned with
        ``per_scene["scene_index"]``), ``rows`` (number evaluated) and the population's
        ``name`` / ``split`` / ``digest``.
    """
    call = "evaluate_population"
    band = _check_tie_band(call, tie_band)
    selected = _chain_rows(call, population, rows)
    horizon = int(population.horizon)
    labels_all = _to_numpy(population.q)
    pred_np = _float_array(call, "pred", pred, 3)
    if pred_np.shape[0] == labels_all.shape[0]:
        pred_np = pred_np[selected]
    elif pred_np.shape[0] != selected.size:
        raise _fail(call, "pred.shape[0]", int(pred_np.shape[0]),
                    f"{labels_all.shape[0]} (all rows) or {selected.size} (selected rows)",
                    "predict every population row, or exactly the selected chain rows in order")
    if pred_np.shape[2] != horizon:
        raise _fail(call, "pred.shape[2]", int(pred_np.shape[2]), f"the horizon {horizon}",
                    "the scorer must predict Q_1..Q_H")
    labels = labels_all[selected][:, :, :horizon]
    q_horizons = getattr(population, "q_horizons", None)
    if q_horizons is not None:
        short = selected[_to_numpy(q_horizons)[selected] < horizon]
        if short.size:
            raise _fail(call, "rows", f"rows {short[:5].tolist()} with fewer than H labels",
                        f"rows labelled at all {horizon} horizons", "evaluate chain rows")
    mask = _to_numpy(population.candidate_mask)[selected]
    scene_index = _to_numpy(population.scene_index)[selected]
    summary = scene_weighted_summary(pred_np, labels, mask, scene_index, tie_band=band)
    scene_ids = _to_numpy(population.scene_id)[selected]
    by_index: dict[int, int] = {}
    for index, sid in zip(scene_index.tolist(), scene_ids.tolist()):
        if by_index.setdefault(int(index), int(sid)) != int(sid):
            raise _fail(call, "population.scene_id", f"scene_index {index} maps to several ids",
                        "one scene_id per scene_index", "the population file is inconsistent")
    summary["per_scene"]["scene_id"] = [by_index[i] for i in summary["per_scene"]["scene_index"]]
    summary["rows"] = int(selected.size)
    for key in ("name", "split", "digest"):
        value = getattr(population, key, None)
        summary[key] = None if value is None else str(value)
    return summary
