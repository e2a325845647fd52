"""Scene-weighted MAE / regret and the TRAIN-only constant, on hand-computed tensors."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from qhlab.evidence.errors import QhInputError
from qhlab.finite_horizon.evaluation import (
    CANDIDATE_ZERO_INDEX,
    best_fixed_index,
    constant_predictions,
    evaluate_population,
    fixed_index_regret,
    myopic_oracle_regret,
    per_scene_mae,
    per_scene_regret,
    per_scene_uniform_regret,
    per_state_choice_regret,
    population_heuristic_references,
    population_train_constant,
    scene_means,
    scene_weighted_summary,
    train_constant,
)

# Three states, K=3, H=2. Scene 0 holds states A and B, scene 1 holds state C only, and the
# states have 3, 2 and 1 valid candidates: every weighting (candidate, state, scene) differs.
LABELS = np.array(
    [
        [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]],  # A
        [[0.0, 1.0], [1.0, 1.0], [99.0, 99.0]],  # B (slot 2 is padding)
        [[2.0, 3.0], [0.0, 0.0], [0.0, 0.0]],  # C (slots 1, 2 padding)
    ]
)
PRED = np.array(
    [
        [[1.5, 2.0], [2.0, 4.0], [2.0, 7.0]],
        [[1.0, 0.0], [1.0, 3.0], [-50.0, 1000.0]],  # padding prediction is huge: must be ignored
        [[0.0, 3.0], [9.0, 9.0], [9.0, 9.0]],
    ]
)
MASK = np.array([[True, True, True], [True, True, False], [True, False, False]])
SCENE = np.array([0, 0, 1])
EACH = np.arange(3)  # one state per scene: the per_scene_* functions give per-state values


def test_per_state_mae_ignores_padding_candidates():
    # A: h1 (.5 + 0 + 1)/3, h2 (0 + 0 + 1)/3; B: h1 (1 + 0)/2, h2 (1 + 2)/2; C: h1 2, h2 0.
    expected = np.array([[0.5, 1 / 3], [0.5, 1.5], [2.0, 0.0]])
    np.testing.assert_allclose(per_scene_mae(PRED, LABELS, MASK, EACH), expected)


def test_per_scene_mae_weights_states_within_scene_then_scenes_equally():
    per_scene = per_scene_mae(PRED, LABELS, MASK, SCENE)
    np.testing.assert_allclose(per_scene, [[0.5, 11 / 12], [2.0, 0.0]])
    summary = scene_weighted_summary(PRED, LABELS, MASK, SCENE, tie_band=0.0)
    np.testing.assert_allclose(summary["mae"], [1.25, 11 / 24])
    assert summary["mae_primary"] == pytest.approx(11 / 24)
    # State weighting would give 1.0 at h1; the scene weighting must not.
    assert summary["mae"][0] != pytest.approx(1.0)


def test_regret_without_band_averages_exact_ties_and_ignores_padding():
    # A h1: preds 2, 2 tie -> labels 2, 3 -> mean 2.5, regret .5; A h2 picks label 6 = max.
    # B h1: preds 1, 1 tie -> labels 0, 1 -> regret .5; B h2 picks slot 1 (padding 1000 ignored).
    expected = np.array([[0.5, 0.0], [0.5, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(per_scene_regret(PRED, LABELS, MASK, EACH, tie_band=0.0), expected)
    np.testing.assert_allclose(per_scene_regret(PRED, LABELS, MASK, SCENE, tie_band=0.0), [[0.5, 0.0], [0.0, 0.0]])


def test_tie_band_widens_the_tied_set():
    # band .6 at A h1: max pred 2, and 1.5 >= 1.4 ties too -> mean label 2 -> regret 1.
    per_state = per_scene_regret(PRED, LABELS, MASK, EACH, tie_band=0.6)
    np.testing.assert_allclose(per_state[:, 0], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(per_state[:, 1], [0.0, 0.0, 0.0])
    # band 3.5 at A h2: preds 4 and 7 tie (4 >= 3.5, 2 < 3.5) -> labels 4, 6 -> regret 6 - 5.
    wide = per_scene_regret(PRED, LABELS, MASK, EACH, tie_band=3.5)
    assert wide[0, 1] == pytest.approx(6.0 - 5.0)
    summary = scene_weighted_summary(PRED, LABELS, MASK, SCENE, tie_band=0.6)
    np.testing.assert_allclose(summary["regret"], [0.375, 0.0])
    np.testing.assert_allclose(summary["per_scene"]["regret"], [[0.75, 0.0], [0.0, 0.0]])


def test_summary_is_json_and_lists_all_horizons():
    summary = scene_weighted_summary(
        torch.tensor(PRED, dtype=torch.float32),
        torch.tensor(LABELS),
        torch.tensor(MASK),
        torch.tensor(SCENE),
        tie_band=0.0,
    )
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text)["horizons"] == [1, 2]
    assert summary["primary_horizon"] == 2
    assert summary["n_scenes"] == 2 and summary["n_states"] == 3 and summary["n_candidates"] == 6
    assert summary["per_scene"]["scene_index"] == [0, 1]
    assert summary["regret_primary"] == summary["regret"][-1]


def test_scene_means_orders_scenes_and_counts_states():
    scenes, means = scene_means(np.array([[1.0], [3.0], [10.0], [5.0]]), np.array([4, 2, 4, 2]))
    assert scenes.tolist() == [2, 4]
    np.testing.assert_allclose(means, [[4.0], [5.5]])


def test_train_constant_is_the_candidate_mean_of_valid_labels():
    # h1: 1+2+3+0+1+2 = 9 over 6 valid; h2: 2+4+6+1+1+3 = 17 over 6; padding 99 excluded.
    constant = train_constant(LABELS, MASK)
    np.testing.assert_allclose(constant, [1.5, 17 / 6])
    broadcast = constant_predictions(constant, MASK)
    assert broadcast.shape == (3, 3, 2)
    np.testing.assert_allclose(broadcast[1, 2], [1.5, 17 / 6])


@pytest.mark.parametrize("band", [0.0, 0.3, 100.0])
def test_constant_regret_is_mean_regret_over_valid_candidates(band):
    # A: h1 3 - 2 = 1, h2 6 - 4 = 2; B: h1 1 - .5 = .5, h2 0; C: 0.
    uniform = per_scene_uniform_regret(LABELS, MASK, SCENE)
    np.testing.assert_allclose(uniform, [[0.75, 1.0], [0.0, 0.0]])
    constant = constant_predictions(train_constant(LABELS, MASK), MASK)
    np.testing.assert_allclose(per_scene_regret(constant, LABELS, MASK, SCENE, tie_band=band), uniform)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(tie_band=-0.1), "tie_band=-0.1"),
        (dict(tie_band=float("nan")), "tie_band=nan"),
        (dict(tie_band=0.0, mask=np.array([[True] * 3, [False] * 3, [True] * 3])), "candidate_mask="),
        (dict(tie_band=0.0, mask=MASK[:2]), "candidate_mask.shape=(2, 3)"),
        (dict(tie_band=0.0, pred=PRED[:, :, :1]), "pred.shape=(3, 3, 1)"),
        (dict(tie_band=0.0, scene=np.array([0, -1, 1])), "scene_index=-1"),
    ],
)
def test_bad_inputs_name_the_field(kwargs, field):
    pred = kwargs.get("pred", PRED)
    mask = kwargs.get("mask", MASK)
    scene = kwargs.get("scene", SCENE)
    with pytest.raises(QhInputError) as info:
        scene_weighted_summary(pred, LABELS, mask, scene, tie_band=kwargs["tie_band"])
    assert field in str(info.value) and "HINT" in str(info.value)


def test_non_finite_prediction_at_a_valid_candidate_is_refused_padding_is_not():
    padded_nan = PRED.copy()
    padded_nan[2, 1, 0] = np.nan  # a padding slot: ignored
    per_scene_mae(padded_nan, LABELS, MASK, SCENE)
    bad = PRED.copy()
    bad[0, 0, 1] = np.inf
    with pytest.raises(QhInputError, match="pred='non-finite values at valid candidates'"):
        per_scene_mae(bad, LABELS, MASK, SCENE)


# A tiny stand-in with the Population attribute names of docs/ARCHITECTURE.md: chain rows A, B,
# C (scene ids 205, 205, 117 -> dense indices 1, 1, 0) plus two successor rows whose labels stop
# at H-1 (0.0 at H).
@dataclass(frozen=True)
class _Population:
    q: torch.Tensor
    candidate_mask: torch.Tensor
    scene_index: torch.Tensor
    scene_id: torch.Tensor
    is_chain: torch.Tensor
    q_horizons: torch.Tensor
    horizon: int = 2
    split: str = "validation"
    name: str = "hand"
    digest: str = "0" * 64


def _population(split: str = "validation") -> _Population:
    successor_labels = np.array([[[5.0, 0.0]] * 3] * 2)
    q = np.concatenate([LABELS[:2], successor_labels, LABELS[2:]])
    mask = np.concatenate([MASK[:2], np.ones((2, 3), bool), MASK[2:]])
    return _Population(
        q=torch.tensor(q, dtype=torch.float32),
        candidate_mask=torch.tensor(mask),
        scene_index=torch.tensor([1, 1, 1, 0, 0]),
        scene_id=torch.tensor([205, 205, 205, 117, 117]),
        is_chain=torch.tensor([True, True, False, False, True]),
        q_horizons=torch.tensor([2, 2, 1, 1, 2]),
        split=split,
    )


def _full_pred() -> np.ndarray:
    filler = np.full((2, 3, 2), 123.0)
    return np.concatenate([PRED[:2], filler, PRED[2:]])


def test_evaluate_population_selects_chain_rows_and_names_scene_ids():
    population = _population()
    summary = evaluate_population(_full_pred(), population, tie_band=0.6)
    # Scenes in ascending dense index: index 0 (id 117) is state C, index 1 (id 205) is A, B.
    assert summary["per_scene"]["scene_index"] == [0, 1]
    assert summary["per_scene"]["scene_id"] == [117, 205]
    np.testing.assert_allclose(summary["per_scene"]["mae"], [[2.0, 0.0], [0.5, 11 / 12]])
    np.testing.assert_allclose(summary["regret"], [0.375, 0.0])
    assert summary["rows"] == 3 and summary["split"] == "validation" and summary["name"] == "hand"
    # Predictions for exactly the selected rows give the same result.
    only_chain = evaluate_population(PRED, population, tie_band=0.6)
    assert only_chain == summary
    json.dumps(summary, allow_nan=False)


def test_evaluate_population_rows_subset_and_refusals():
    population = _population()
    one = evaluate_population(_full_pred(), population, tie_band=0.0, rows=[4])
    assert one["n_scenes"] == 1 and one["per_scene"]["scene_id"] == [117]
    np.testing.assert_allclose(one["mae"], [2.0, 0.0])
    with pytest.raises(QhInputError, match=r"successor rows \[2\]"):
        evaluate_population(_full_pred(), population, tie_band=0.0, rows=[0, 2])
    with pytest.raises(QhInputError, match="repeated indices"):
        evaluate_population(_full_pred(), population, tie_band=0.0, rows=[0, 0])
    with pytest.raises(QhInputError, match=r"pred.shape\[0\]=4"):
        evaluate_population(PRED[:1].repeat(4, axis=0), population, tie_band=0.0)


def test_population_train_constant_uses_train_chain_rows_only():
    np.testing.assert_allclose(population_train_constant(_population("train")), [1.5, 17 / 6])
    with pytest.raises(QhInputError, match="population.split='validation'"):
        population_train_constant(_population("validation"))


# ---------------------------------------------------------------------------------------------
# Heuristic reference policies. Three states, K=3, H=2: scene 0 holds A and B, scene 1 holds C,
# whose slot 2 is padding (so fixed index 2 takes C's last candidate, slot 1).
REF_LABELS = np.array(
    [
        [[2.0, 2.0], [1.6, 5.0], [0.0, 1.0]],  # A
        [[0.0, 4.0], [1.0, 2.0], [3.0, 3.0]],  # B
        [[1.0, 1.0], [1.0, 2.0], [99.0, 99.0]],  # C (slot 2 padding)
    ]
)
REF_MASK = np.array([[True, True, True], [True, True, True], [True, True, False]])
REF_SCENE = np.array([0, 0, 1])


def test_per_state_choice_regret_is_best_label_minus_the_chosen_label():
    # A picks 1: h1 2 - 1.6, h2 5 - 5; B picks 2: h1 3 - 3, h2 4 - 3; C picks 0: h1 0, h2 2 - 1.
    regret = per_state_choice_regret(REF_LABELS, REF_MASK, np.array([1, 2, 0]))
    np.testing.assert_allclose(regret, [[0.4, 0.0], [0.0, 1.0], [0.0, 1.0]])


@pytest.mark.parametrize(
    "chosen, message",
    [
        (np.array([0, 0, 2]), "chosen='padding slots at rows [2]'"),
        (np.array([0, 3, 0]), "chosen='[3] at rows [1]'"),
        (np.array([0, 0]), "chosen='shape (2,)"),
    ],
)
def test_choice_regret_refuses_padding_and_out_of_range_picks(chosen, message):
    with pytest.raises(QhInputError) as info:
        per_state_choice_regret(REF_LABELS, REF_MASK, chosen)
    assert message in str(info.value) and "HINT" in str(info.value)


def test_fixed_index_regret_weights_states_within_scene_then_scenes():
    # Slot 0 per state (h1, h2): A (0, 3), B (3, 0), C (0, 1) -> scene 0 (1.5, 1.5), scene 1 (0, 1).
    np.testing.assert_allclose(fixed_index_regret(REF_LABELS, REF_MASK, REF_SCENE, 0), [[1.5, 1.5], [0.0, 1.0]])
    # Slot 1: A (.4, 0), B (2, 2), C (0, 0) -> scene 0 (1.2, 1), scene 1 (0, 0).
    np.testing.assert_allclose(fixed_index_regret(REF_LABELS, REF_MASK, REF_SCENE, 1), [[1.2, 1.0], [0.0, 0.0]])
    # Slot 2: A (2, 4), B (0, 1), C its last candidate, slot 1 (0, 0) -> scene 0 (1, 2.5), scene 1 (0, 0).
    np.testing.assert_allclose(fixed_index_regret(REF_LABELS, REF_MASK, REF_SCENE, 2), [[1.0, 2.5], [0.0, 0.0]])
    with pytest.raises(QhInputError, match=r"index=3 is not allowed; allowed: an integer in \[0, 2\]"):
        fixed_index_regret(REF_LABELS, REF_MASK, REF_SCENE, 3)


def test_best_fixed_index_minimises_scene_weighted_regret_at_h():
    # Regret_H by slot: 0 -> (1.5 + 1) / 2 = 1.25, 1 -> (1 + 0) / 2 = 0.5, 2 -> (2.5 + 0) / 2 = 1.25
    # (C has two candidates, so fixed index 2 takes its slot 1).
    index, by_index = best_fixed_index(REF_LABELS, REF_MASK, REF_SCENE)
    assert index == 1
    np.testing.assert_allclose(by_index, [1.25, 0.5, 1.25])
    # A slot no state offers is no policy at all.
    narrow = np.array([[True, True, False]] * 3)
    assert best_fixed_index(REF_LABELS, narrow, REF_SCENE)[1][2] == np.inf


def test_best_fixed_index_ties_go_to_the_lowest_index():
    # One scene, H=1: slot 0 regret (1 + 1) / 2 = 1; slots 1 and 2 both (0 + 1) / 2 = .5.
    labels = np.array([[[0.0], [1.0], [0.0]], [[0.0], [0.0], [1.0]]])
    index, by_index = best_fixed_index(labels, np.ones((2, 3), bool), np.array([0, 0]))
    assert index == 1
    np.testing.assert_allclose(by_index, [1.0, 0.5, 0.5])
    # Every slot ties: slot 0 wins.
    assert best_fixed_index(np.ones((2, 3, 1)), np.ones((2, 3), bool), np.array([0, 1]))[0] == 0


def test_myopic_oracle_averages_ties_within_the_band_at_every_horizon():
    # Band .5: A's Q*_1 2 and 1.6 tie -> h1 2 - 1.8 = .2, h2 5 - (2 + 5) / 2 = 1.5; B picks slot 2
    # (1 < 3 - .5) -> (0, 1); C ties exactly (padding 99 ignored) -> (0, 2 - 1.5).
    wide = myopic_oracle_regret(REF_LABELS, REF_MASK, REF_SCENE, tie_band=0.5)
    np.testing.assert_allclose(wide, [[0.1, 1.25], [0.0, 0.5]])
    # Band 0: A picks slot 0 alone -> (0, 3); B and C unchanged.
    exact = myopic_oracle_regret(REF_LABELS, REF_MASK, REF_SCENE, tie_band=0.0)
    np.testing.assert_allclose(exact, [[0.0, 2.0], [0.0, 0.5]])
    with pytest.raises(QhInputError, match="tie_band=-1.0"):
        myopic_oracle_regret(REF_LABELS, REF_MASK, REF_SCENE, tie_band=-1.0)


def _reference_populations() -> tuple[_Population, _Population]:
    # TRAIN: chain rows A, B, C plus one successor row in C's scene whose labels would flip the
    # best fixed index to slot 0 if it were (wrongly) counted.
    successor = np.array([[[0.0, 9.0], [0.0, 0.0], [0.0, 0.0]]])
    train = _Population(
        q=torch.tensor(np.concatenate([REF_LABELS, successor]), dtype=torch.float64),
        candidate_mask=torch.tensor(np.concatenate([REF_MASK, np.ones((1, 3), bool)])),
        scene_index=torch.tensor([0, 0, 1, 1]),
        scene_id=torch.tensor([10, 10, 11, 11]),
        is_chain=torch.tensor([True, True, True, False]),
        q_horizons=torch.tensor([2, 2, 2, 1]),
        split="train",
        name="train-hand",
        digest="1" * 64,
    )
    # Validation: V1 in scene index 1 (id 50), V2 in scene index 0 (id 40).
    labels = np.array(
        [
            [[1.0, 1.0], [0.0, 3.0], [2.0, 2.0]],  # V1
            [[0.0, 4.0], [2.0, 1.0], [2.0, 0.0]],  # V2
        ]
    )
    validation = _Population(
        q=torch.tensor(labels, dtype=torch.float64),
        candidate_mask=torch.ones((2, 3), dtype=torch.bool),
        scene_index=torch.tensor([1, 0]),
        scene_id=torch.tensor([50, 40]),
        is_chain=torch.tensor([True, True]),
        q_horizons=torch.tensor([2, 2]),
    )
    return train, validation


def test_population_heuristic_references_choose_on_train_and_evaluate_on_validation():
    train, validation = _reference_populations()
    refs = population_heuristic_references(train, validation, tie_band=0.5)
    assert list(refs) == ["best_fixed_index", "candidate_0", "myopic_oracle"]
    best = refs["best_fixed_index"]
    assert best["index"] == 1 and best["chosen_on"] == "train" and best["oracle"] is False
    # Slot 2 is padding in TRAIN state C, which fixed index 2 meets with its last candidate.
    assert best["train_regret_by_index"] == pytest.approx([1.25, 0.5, 1.25])
    assert best["train_population_digest"] == "1" * 64
    # Slot 1 on validation: V1 (2 - 0, 3 - 3), V2 (2 - 2, 4 - 1); scenes ordered by index (V2 first).
    assert best["per_scene"]["scene_index"] == [0, 1] and best["per_scene"]["scene_id"] == [40, 50]
    np.testing.assert_allclose(best["per_scene"]["regret"], [[0.0, 3.0], [2.0, 0.0]])
    np.testing.assert_allclose(best["regret"], [1.0, 1.5])
    assert best["regret_primary"] == pytest.approx(1.5)
    # Straight strike (slot 0): V1 (1, 2), V2 (2, 0).
    straight = refs["candidate_0"]
    assert straight["index"] == CANDIDATE_ZERO_INDEX == 0 and straight["oracle"] is False
    np.testing.assert_allclose(straight["per_scene"]["regret"], [[2.0, 0.0], [1.0, 2.0]])
    np.testing.assert_allclose(straight["regret"], [1.5, 1.0])
    # Myopic oracle, band .5: V1 picks slot 2 -> (0, 3 - 2); V2 ties slots 1, 2 -> (0, 4 - .5).
    oracle = refs["myopic_oracle"]
    assert oracle["oracle"] is True and oracle["reads"] == "validation labels" and oracle["tie_band"] == 0.5
    np.testing.assert_allclose(oracle["per_scene"]["regret"], [[0.0, 3.5], [0.0, 1.0]])
    np.testing.assert_allclose(oracle["regret"], [0.0, 2.25])
    assert oracle["evaluated_on"] == {"name": "hand", "split": "validation", "digest": "0" * 64, "rows": 2}
    json.dumps(refs, allow_nan=False)


def test_population_heuristic_references_refuse_swapped_splits():
    train, validation = _reference_populations()
    with pytest.raises(QhInputError, match="train_population.split='validation'"):
        population_heuristic_references(validation, validation, tie_band=0.0)
    with pytest.raises(QhInputError, match="validation_population.split='train'"):
        population_heuristic_references(train, train, tie_band=0.0)
