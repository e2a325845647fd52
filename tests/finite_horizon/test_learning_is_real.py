"""End to end: on the demo populations and budget, the baseline really learns.

The demo study's TRAIN and validation populations (same presets and seeds as
``examples/default-study.toml``) are generated into a temporary cache, and the demo recipe
is fitted for both study seeds on the CPU lane. The criterion is the project's: validation
MAE_H at most half the TRAIN-only constant's, and regret_H below the constant's.
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
def test_baseline_beats_half_the_train_constant_on_the_demo(seed, demo_populations, tmp_path):
    from qhlab.finite_horizon.fit import fit_recipe
    from qhlab.finite_horizon.recipe import load_recipe

    recipe = load_recipe(ROOT / "examples" / "demo-recipe.toml").model_copy(update={"seed": seed})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the demo's per-fit thread count; CPU results depend on it
    try:
        result = fit_recipe(
            recipe, profile="cpu-fp32", output=tmp_path, train=demo_populations["train"],
            validation=demo_populations["validation"], progress=False,
        )
    finally:
        torch.set_num_threads(threads)
    m = result.metrics
    assert result.observed_updates == recipe.updates
    assert m["val_mae_h3"] <= 0.5 * m["constant_mae_h3"], m
    assert m["val_regret_h3"] < m["constant_regret_h3"], m
