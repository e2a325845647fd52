"""Scene-weighted evaluation of Q_1..Q_H predictions against exact labels.

Owns: the evaluation arithmetic of SPEC §5 as pure functions over arrays (per-candidate absolute
error and per-state regret, averaged within state, then states within scene, then scenes
equally), the TRAIN-only constant predictor and its uniform-tie regret, the cheap heuristic
reference policies (the TRAIN-chosen best fixed candidate index, the straight strike and the
myopic oracle, which reads the evaluated labels), and conveniences that apply them to the chain
rows of loaded ``Population`` objects.

Does not own: checking inputs and selecting chain rows (``evaluation_inputs``), running a
scorer (callers pass predictions), loading populations
(``qhlab.finite_horizon.data``), confidence intervals and retention margins
(``qhlab.statistics.bootstrap``), or writing receipts.

Inputs may be torch tensors or numpy arrays; every result is numpy (float64) or, for the
summaries, plain JSON-able Python values. Each public function checks its inputs once, at
entry, and composes private kernels (``_state_mae``, ``_state_regret``, ...) on the checked
arrays; no check runs twice on one call. The statistical unit is the scene: per-scene arrays
are ordered by ascending ``scene_index`` of the scenes present in the rows given.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qhlab.evidence import input_error
from qhlab.finite_horizon.evaluation_inputs import (
    chain_arrays,
    chain_rows,
    checked_choices,
    checked_index,
    checked_inputs,
    checked_tie_band,
    float_array,
    population_identity,
    scene_ids_of,
    to_numpy,
)
from qhlab.scenes.difficulty import reference_name

__all__ = [
    "CANDIDATE_ZERO_INDEX",
    "best_fixed_index",
    "constant_predictions",
    "evaluate_population",
    "fixed_index_regret",
    "myopic_oracle_regret",
    "per_scene_mae",
    "per_scene_regret",
    "per_scene_uniform_regret",
    "per_state_choice_regret",
    "population_heuristic_references",
    "population_train_constant",
    "scene_means",
    "scene_weighted_summary",
    "train_constant",
]

# Every state offers candidate 0 (an environment's ``candidates`` is at least 1), so slot 0 is a
# fixed policy of every environment: the environment's reference candidate (in the puck world,
# by its candidate layout, the target struck straight at the goal centre).
CANDIDATE_ZERO_INDEX = 0
_SLOT_ZERO_POLICY = {
    "straight_strike": "always candidate slot 0: the target struck straight at the goal centre (scene layout contract)"
}


def _slot_zero_candidate(population: Any) -> str:
    """The environment's name for candidate 0, read from the population's difficulty card."""
    manifest = getattr(population, "manifest", None) or {}
    card = manifest.get("difficulty") if isinstance(manifest, dict) else None
    return reference_name(card) if card else "first_candidate"


# ---------------------------------------------------------------------------------------------
# Per-state kernels, on checked arrays (``checked_inputs``): each returns float64 [S, H].


def _state_mae(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean absolute error over the valid candidates: mean_{a valid} |Q_h(s, a) - Q*_h(s, a)|."""
    weights = mask[:, :, None].astype(np.float64)
    error = np.where(mask[:, :, None], np.abs(pred - labels), 0.0)
    return error.sum(axis=1) / weights.sum(axis=1)


def _state_regret(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray, band: float) -> np.ndarray:
    """Regret of acting greedily on the predictions, with ties averaged.

    The chosen set is every valid candidate whose prediction lies within ``band`` of the
    largest valid prediction; the regret is ``max_{a valid} Q*_h(s, a) - mean_{a chosen}
    Q*_h(s, a)`` (uniform tie-breaking), every entry >= 0.
    """
    valid = mask[:, :, None]
    best_label = np.where(valid, labels, -np.inf).max(axis=1)
    best_pred = np.where(valid, pred, -np.inf).max(axis=1)
    tied = valid & (pred >= best_pred[:, None, :] - band)
    chosen_value = np.where(tied, labels, 0.0).sum(axis=1) / tied.sum(axis=1)
    # Rounding of the mean can dip a hair below the max when every tied label equals it.
    return np.maximum(best_label - chosen_value, 0.0)


def _uniform_regret(labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Regret when every valid candidate ties (any constant predictor): max - mean of Q*_h."""
    valid = mask[:, :, None]
    best = np.where(valid, labels, -np.inf).max(axis=1)
    mean = np.where(valid, labels, 0.0).sum(axis=1) / valid.sum(axis=1)
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
    vals = to_numpy(values).astype(np.float64, copy=False)
    scene = to_numpy(scene_index)
    if vals.ndim < 1 or scene.shape != (vals.shape[0],) or not np.issubdtype(scene.dtype, np.integer):
        raise input_error(
            "scene_means",
            "scene_index",
            f"shape {tuple(scene.shape)} dtype {scene.dtype}",
            f"an integer array of shape {(vals.shape[0] if vals.ndim else 0,)}",
            "one scene index per state row",
        )
    if vals.shape[0] == 0:
        raise input_error(
            "scene_means",
            "values.shape",
            tuple(vals.shape),
            "at least one state row",
            "select some states before aggregating",
        )
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
        is the column mean; ``scene_index = arange(S)`` (one state per scene) gives per-state
        values, as for the other ``per_scene_*`` functions.
    """
    pred_np, labels_np, mask, scene = checked_inputs("per_scene_mae", pred, labels, candidate_mask, scene_index)
    return scene_means(_state_mae(pred_np, labels_np, mask), scene)[1]


def per_scene_regret(pred: Any, labels: Any, candidate_mask: Any, scene_index: Any, *, tie_band: float) -> np.ndarray:
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
    band = checked_tie_band("per_scene_regret", tie_band)
    pred_np, labels_np, mask, scene = checked_inputs("per_scene_regret", pred, labels, candidate_mask, scene_index)
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
    _, labels_np, mask, scene = checked_inputs("per_scene_uniform_regret", None, labels, candidate_mask, scene_index)
    return scene_means(_uniform_regret(labels_np, mask), scene)[1]


def scene_weighted_summary(
    pred: Any, labels: Any, candidate_mask: Any, scene_index: Any, *, tie_band: float
) -> dict[str, Any]:
    """MAE_h and regret_h for every horizon, scene-weighted, with the per-scene arrays.

    Args:
        pred, labels, candidate_mask, scene_index, tie_band: as for ``per_scene_regret``: [S, K, H]
            predictions and exact labels, bool [S, K], int [S], a finite tolerance >= 0 in Q units.

    Returns:
        JSON-able dict: ``mae`` / ``regret`` are lists of H floats (index h-1), ``mae_primary`` /
        ``regret_primary`` the values at horizon H (the primary horizon), counts, and
        ``per_scene`` = {``scene_index``: [n_scenes], ``mae``: [n_scenes][H], ``regret``:
        [n_scenes][H]} in ascending scene_index order.
    """
    call = "scene_weighted_summary"
    band = checked_tie_band(call, tie_band)
    return _summary(*checked_inputs(call, pred, labels, candidate_mask, scene_index), band)


def _summary(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray, scene: np.ndarray, band: float) -> dict:
    scenes, mae = scene_means(_state_mae(pred, labels, mask), scene)
    _, regret = scene_means(_state_regret(pred, labels, mask, band), scene)
    horizon = int(mae.shape[1])
    mae_h = mae.mean(axis=0)
    regret_h = regret.mean(axis=0)
    return {
        "weighting": "candidates within state, states within scene, scenes equally",
        "horizon": horizon,
        "primary_horizon": horizon,
        "horizons": list(range(1, horizon + 1)),
        "tie_band": float(band),
        "n_scenes": int(scenes.size),
        "n_states": int(mask.shape[0]),
        "n_candidates": int(mask.sum()),
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
    _, labels_np, mask, _ = checked_inputs("train_constant", None, train_labels, candidate_mask)
    return labels_np[mask].mean(axis=0)


def constant_predictions(constant: Any, candidate_mask: Any) -> np.ndarray:
    """Broadcast a per-horizon constant to every candidate slot of a population.

    Args:
        constant: [H] values (e.g. ``train_constant``).
        candidate_mask: bool [S, K] of the population to predict.

    Returns:
        float64 [S, K, H], the constant at every slot (padding slots too; masks ignore them).
    """
    values = float_array("constant_predictions", "constant", constant, 1)
    mask = to_numpy(candidate_mask)
    if mask.ndim != 2 or values.size == 0 or not np.isfinite(values).all():
        raise input_error(
            "constant_predictions",
            "constant/candidate_mask",
            f"constant {values.tolist()} mask shape {tuple(mask.shape)}",
            "a finite [H] constant (H >= 1) and a [S, K] mask",
            "compute the constant with train_constant on TRAIN chain rows",
        )
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
        raise input_error(
            "population_train_constant",
            "population.split",
            split,
            "'train'",
            "the constant predictor is fitted on TRAIN only; never on validation or test",
        )
    rows = chain_rows("population_train_constant", population, None)
    horizon = int(population.horizon)
    labels = to_numpy(population.q)[rows][:, :, :horizon]
    return train_constant(labels, to_numpy(population.candidate_mask)[rows])


# ---------------------------------------------------------------------------------------------
# Heuristic reference policies: cheap policies a learned scorer must beat to be worth it.


def _choice_regret(labels: np.ndarray, mask: np.ndarray, picks: np.ndarray) -> np.ndarray:
    # A one-hot prediction with a zero tie band chooses exactly the picked slot, so the
    # regret arithmetic stays the one of ``_state_regret``.
    one_hot = np.zeros(labels.shape, dtype=np.float64)
    one_hot[np.arange(picks.size), picks, :] = 1.0
    return _state_regret(one_hot, labels, mask, 0.0)


def per_state_choice_regret(labels: Any, candidate_mask: Any, chosen: Any) -> np.ndarray:
    """Regret of a policy that picks one candidate per state, at every horizon.

    Args:
        labels: exact labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K], real candidates.
        chosen: int [S], the picked candidate slot of each state; it must be a valid candidate.

    Returns:
        float64 [S, H]: ``max_{a valid} Q*_h(s, a) - Q*_h(s, chosen[s])``, every entry >= 0.
    """
    call = "per_state_choice_regret"
    _, labels_np, mask, _ = checked_inputs(call, None, labels, candidate_mask)
    return _choice_regret(labels_np, mask, checked_choices(call, chosen, mask))


def fixed_index_regret(labels: Any, candidate_mask: Any, scene_index: Any, index: int) -> np.ndarray:
    """Per-scene regret_h of the policy that always picks candidate slot ``index``.

    Args:
        labels: exact labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K]; ``index`` must be a valid candidate of every state.
        scene_index: int [S].
        index: the fixed candidate slot, in [0, K).

    Returns:
        float64 [n_scenes, H], scenes in ascending scene_index order; the scene-weighted
        regret_h is the column mean.
    """
    call = "fixed_index_regret"
    return _fixed_index_regret(call, *checked_inputs(call, None, labels, candidate_mask, scene_index)[1:], index)


def _fixed_slots(mask: np.ndarray, slot: int) -> np.ndarray:
    """Fixed index ``slot`` in every state: its candidate ``slot``, or its last one where it has
    fewer (the difficulty card's rule; a state offers its first k candidates, k >= 1)."""
    return np.minimum(slot, mask.sum(axis=1) - 1).astype(np.int64)


def _fixed_index_regret(call: str, labels: np.ndarray, mask: np.ndarray, scene: np.ndarray, index: Any) -> np.ndarray:
    slot = checked_index(call, index, mask.shape[1])
    picks = checked_choices(call, _fixed_slots(mask, slot), mask)
    return scene_means(_choice_regret(labels, mask, picks), scene)[1]


def best_fixed_index(train_labels: Any, candidate_mask: Any, scene_index: Any) -> tuple[int, np.ndarray]:
    """The fixed candidate slot with the lowest scene-weighted TRAIN regret_H.

    Pass TRAIN chain rows only: the choice is part of the reference policy, so it must never
    see validation or test labels. A state offers its first k candidates; fixed index i takes
    candidate i, or the state's last candidate where it has fewer than i + 1 (the difficulty
    card's rule), so every slot some state offers is eligible.

    Args:
        train_labels: exact TRAIN labels Q*_h, shape [S, K, H].
        candidate_mask: bool [S, K].
        scene_index: int [S].

    Returns:
        (index, regret_by_index): ``index`` the chosen slot (ties go to the lowest index);
        ``regret_by_index`` float64 [K], the scene-weighted TRAIN regret_H of each slot
        (``inf`` for a slot no state offers).
    """
    call = "best_fixed_index"
    return _best_fixed_index(call, *checked_inputs(call, None, train_labels, candidate_mask, scene_index)[1:])


def _best_fixed_index(call: str, labels: np.ndarray, mask: np.ndarray, scene: np.ndarray) -> tuple[int, np.ndarray]:
    _, k, _ = labels.shape
    by_index = np.full(k, np.inf, dtype=np.float64)
    for slot in np.flatnonzero(mask.any(axis=0)):
        picks = _fixed_slots(mask, slot)
        by_index[slot] = scene_means(_choice_regret(labels, mask, picks)[:, -1], scene)[1].mean()
    if not np.isfinite(by_index).any():
        raise input_error(
            call,
            "candidate_mask",
            "no slot is valid in every state",
            "at least one candidate slot valid in every TRAIN state",
            "a fixed-index policy needs a slot every state offers",
        )
    # Equal regrets summed in a different order can differ in the last bits; treat those as the
    # tie they are, so the documented lowest-index rule decides and not rounding.
    best = by_index.min()
    tied = np.flatnonzero(by_index <= best + 1e-12 * max(1.0, abs(best)))
    return int(tied[0]), by_index


def myopic_oracle_regret(labels: Any, candidate_mask: Any, scene_index: Any, *, tie_band: float) -> np.ndarray:
    """Per-scene regret_h of the myopic oracle: act greedily on the exact Q*_1 labels.

    An ORACLE: it reads the labels of the rows it is evaluated on, so it is a reference for how
    much look-ahead matters, never a deployable policy. Candidates whose Q*_1 lies within
    ``tie_band`` of the best Q*_1 tie, and the regret at each horizon is averaged over the tied
    set exactly as in ``per_scene_regret``.

    Args:
        labels: exact labels Q*_h, shape [S, K, H] (horizon 1 at ``[..., 0]``).
        candidate_mask: bool [S, K].
        scene_index: int [S].
        tie_band: finite tolerance >= 0, native Q units.

    Returns:
        float64 [n_scenes, H], scenes in ascending scene_index order (0 at horizon 1 up to the
        tie band).
    """
    call = "myopic_oracle_regret"
    band = checked_tie_band(call, tie_band)
    return _myopic_regret(*checked_inputs(call, None, labels, candidate_mask, scene_index)[1:], band)


def _myopic_regret(labels: np.ndarray, mask: np.ndarray, scene: np.ndarray, band: float) -> np.ndarray:
    # Q*_1 broadcast to every horizon is a prediction whose greedy choice is the myopic one.
    myopic = np.broadcast_to(labels[:, :, :1], labels.shape)
    return scene_means(_state_regret(myopic, labels, mask, band), scene)[1]


# ---------------------------------------------------------------------------------------------
# Population convenience.


def evaluate_population(pred: Any, population: Any, *, tie_band: float, rows: Any | None = None) -> dict[str, Any]:
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
    band = checked_tie_band(call, tie_band)
    selected = chain_rows(call, population, rows)
    horizon = int(population.horizon)
    labels_all = to_numpy(population.q)
    pred_np = float_array(call, "pred", pred, 3)
    if pred_np.shape[0] == labels_all.shape[0]:
        pred_np = pred_np[selected]
    elif pred_np.shape[0] != selected.size:
        raise input_error(
            call,
            "pred.shape[0]",
            int(pred_np.shape[0]),
            f"{labels_all.shape[0]} (all rows) or {selected.size} (selected rows)",
            "predict every population row, or exactly the selected chain rows in order",
        )
    if pred_np.shape[2] != horizon:
        raise input_error(
            call, "pred.shape[2]", int(pred_np.shape[2]), f"the horizon {horizon}", "the scorer must predict Q_1..Q_H"
        )
    summary = _summary(*checked_inputs(call, pred_np, *chain_arrays(call, population, selected)), band)
    summary["per_scene"]["scene_id"] = scene_ids_of(call, population, selected, summary["per_scene"]["scene_index"])
    summary["rows"] = int(selected.size)
    summary.update(population_identity(population))
    return summary


def _reference_split_horizon(call: str, train_population: Any, validation_population: Any) -> tuple[str, int]:
    """The held-out split and the shared horizon; refuses a non-TRAIN train, a non-held-out one, or unequal H."""
    train_split = getattr(train_population, "split", None)
    if train_split != "train":
        raise input_error(
            call,
            "train_population.split",
            train_split,
            "'train'",
            "the fixed index is chosen on TRAIN only; never on validation or test",
        )
    split = getattr(validation_population, "split", None)
    if split not in ("validation", "test"):
        raise input_error(
            call,
            "validation_population.split",
            split,
            "'validation' | 'test'",
            "references are evaluated on held-out scenes, like the scorer",
        )
    horizon = int(validation_population.horizon)
    if int(train_population.horizon) != horizon:
        raise input_error(
            call,
            "train_population.horizon",
            int(train_population.horizon),
            f"the evaluated population's horizon {horizon}",
            "use TRAIN and validation populations of the same preset family",
        )
    return split, horizon


def _reference_arrays(
    call: str, train_population: Any, validation_population: Any
) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Checked chain arrays: TRAIN's (labels, mask, scene), then the held-out rows, labels, mask and scene."""
    train_rows = chain_rows(call, train_population, None)
    train = checked_inputs(call, None, *chain_arrays(call, train_population, train_rows))[1:]
    rows = chain_rows(call, validation_population, None)
    labels, mask, scene_index = checked_inputs(call, None, *chain_arrays(call, validation_population, rows))[1:]
    if train[0].shape[1] != labels.shape[1]:
        raise input_error(
            call,
            "train_population K",
            int(train[0].shape[1]),
            f"the evaluated population's K {labels.shape[1]}",
            "a fixed index means the same candidate slot in both populations",
        )
    return train, rows, labels, mask, scene_index


def _reference_entry(per_scene: np.ndarray, where: tuple, /, **fields: Any) -> dict[str, Any]:
    """One reference's JSON entry: ``fields``, then its regret [H], per-scene regrets and ``evaluated_on``.

    ``where`` is (horizon, scenes, scene_ids, evaluated_on) of the held-out population.
    """
    horizon, scenes, scene_ids, evaluated_on = where
    regret = per_scene.mean(axis=0)
    return {
        **fields,
        "horizon": horizon,
        "regret": [float(v) for v in regret],
        "regret_primary": float(regret[-1]),
        "per_scene": {
            "scene_index": [int(v) for v in scenes],
            "scene_id": list(scene_ids),
            "regret": per_scene.tolist(),
        },
        "evaluated_on": dict(evaluated_on),
    }


def population_heuristic_references(
    train_population: Any, validation_population: Any, *, tie_band: float
) -> dict[str, dict[str, Any]]:
    """The cheap heuristic reference policies on a held-out population's chain rows.

    * ``best_fixed_index``: always the candidate slot with the lowest scene-weighted TRAIN
      regret_H (``best_fixed_index`` on TRAIN chain rows only; ties go to the lowest index).
    * ``candidate_0``: always slot ``CANDIDATE_ZERO_INDEX`` (0), which every state offers:
      the environment's reference candidate (``candidate``, from the population's difficulty
      card; the puck world's is the target struck straight at the goal centre).
    * ``myopic_oracle``: argmax of the evaluated rows' exact Q*_1 (ties within ``tie_band``
      averaged). It is an ORACLE (``"oracle": True``): it reads the held-out labels.

    Args:
        train_population: a TRAIN ``Population`` (``split == "train"``); only its chain rows
            are read, and only to choose the fixed index.
        validation_population: the held-out ``Population`` (``split`` "validation" or "test")
            with TRAIN's horizon and K; every chain row is evaluated.
        tie_band: finite tolerance >= 0, native Q units (the myopic oracle's ties).

    Returns:
        JSON-able ``{name: entry}`` for the three names above, in that order. Every entry has
        ``policy`` (words), ``oracle`` (bool), ``horizon``, ``regret`` [H] (scene-weighted,
        index h-1), ``regret_primary`` (at H), ``per_scene`` = {``scene_index`` [n_scenes],
        ``scene_id`` [n_scenes], ``regret`` [n_scenes][H]} in ascending scene_index order (the
        order of ``evaluate_population``), and ``evaluated_on`` (name, split, digest, rows).
        The fixed-index entries add ``index``; ``candidate_0`` adds ``candidate`` (the
        environment's name for candidate 0); ``best_fixed_index`` adds ``chosen_on``
        ("train"), ``train_population_digest`` and ``train_regret_by_index`` [K] (None for a
        slot no TRAIN state offers); the oracle adds ``reads`` and ``tie_band``.
    """
    call = "population_heuristic_references"
    band = checked_tie_band(call, tie_band)
    split, horizon = _reference_split_horizon(call, train_population, validation_population)
    train, rows, labels, mask, scene_index = _reference_arrays(call, train_population, validation_population)
    index, train_by_index = _best_fixed_index(call, *train)
    candidate = _slot_zero_candidate(validation_population)
    scenes = np.unique(scene_index)
    scene_ids = scene_ids_of(call, validation_population, rows, scenes.tolist())
    evaluated_on: dict[str, Any] = {**population_identity(validation_population), "rows": int(rows.size)}
    where = (horizon, scenes, scene_ids, evaluated_on)
    return {
        "best_fixed_index": _reference_entry(
            _fixed_index_regret(call, labels, mask, scene_index, index),
            where,
            policy="always the candidate slot with the lowest scene-weighted TRAIN regret_H (ties: lowest index)",
            oracle=False,
            index=index,
            chosen_on="train",
            train_population_digest=population_identity(train_population)["digest"],
            train_regret_by_index=[float(v) if np.isfinite(v) else None for v in train_by_index],
        ),
        "candidate_0": _reference_entry(
            _fixed_index_regret(call, labels, mask, scene_index, CANDIDATE_ZERO_INDEX),
            where,
            policy=_SLOT_ZERO_POLICY.get(
                candidate, f"always candidate slot 0: the environment's reference candidate ({candidate})"
            ),
            oracle=False,
            index=CANDIDATE_ZERO_INDEX,
            candidate=candidate,
        ),
        "myopic_oracle": _reference_entry(
            _myopic_regret(labels, mask, scene_index, band),
            where,
            policy="argmax of the exact Q*_1 labels of each evaluated state (ties within tie_band averaged)",
            oracle=True,
            reads=f"{split} labels",
            tie_band=band,
        ),
    }
