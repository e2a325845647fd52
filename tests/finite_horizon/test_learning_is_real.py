"""End to end: on the demo populations and budget, the baseline really learns.

The demo study's TRAIN and validation populations (same presets and seeds as
``examples/default-study.toml``) are generated into a temporary cache, and the demo recipe
is fitted for both study seeds on the CPU lane. The criteria are the project's:
validation regret_H at most 0.7 x the best TRAIN-chosen heuristic's (the fixed candidate
index with the lowest TRAIN regret_H), and MAE_H at most half the TRAIN-only constant's.
Nothing here is tuned: the recipe was checked only on the declared tuning population.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_populations(tmp_path_factory) -> dict[str, Path]:
    from qhlab.scenes import cached_population

    study = tomllib.loads((ROOT / "examples" / "default-study.toml").read_text())
    cache = tmp_path_factory.mktemp("demo-populations")
    return {
        split: cached_population(study[split]["preset"], split, study[split]["seed"], cache)
        for split in ("train", "validation")
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_baseline_beats_the_train_chosen_heuristic_and_half_the_constant(seed, demo_populations, tmp_path):
    from qhlab.design.config_files import load_recipe
    from qhlab.finite_horizon.data import load_population
    from qhlab.finite_horizon.evaluation import (
        constant_predictions,
        evaluate_population,
        population_heuristic_references,
        population_train_constant,
    )
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    recipe = load_recipe(ROOT / "examples" / "demo-recipe.toml").model_copy(update={"seed": seed})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the demo's per-fit thread count; CPU results depend on it
    try:
        result = fit_recipe(
            FitRequest(
                recipe=recipe,
                profile="cpu-fp32",
                output=tmp_path,
                train=demo_populations["train"],
                validation=demo_populations["validation"],
                progress=False,
            )
        )
    finally:
        torch.set_num_threads(threads)
    m = result.metrics
    assert result.observed_updates == recipe.updates
    train = load_population(demo_populations["train"], split="train")
    validation = load_population(demo_populations["validation"], split="validation")
    # The TRAIN-only constant on validation, as a study's development step computes it.
    constant = evaluate_population(
        constant_predictions(population_train_constant(train), validation.candidate_mask.numpy()),
        validation,
        tie_band=recipe.evaluation.tie_band,
    )
    assert m["val_mae_h3"] <= 0.5 * constant["mae"][2], (m, constant["mae"])
    references = population_heuristic_references(train, validation, tie_band=recipe.evaluation.tie_band)
    heuristic = references["best_fixed_index"]["regret_primary"]
    assert m["val_regret_h3"] <= 0.7 * heuristic, (m, heuristic)
    assert references["candidate_0"]["regret_primary"] >= heuristic
