"""Finite-horizon Q-learning ("QH"): recipe, scorer family, TD learning rule, data, evaluation.

Sub-modules are imported on demand (`from qhlab.finite_horizon.recipe import QhRecipe`);
this package imports none of them eagerly so that light callers (the CLI's argument parsing,
evidence verification) do not pay for torch and Lightning.
"""

__all__ = [
    "benchmark",
    "commission",
    "data",
    "diagnostics",
    "evaluation",
    "fit",
    "predict",
    "q_learning",
    "recipe",
    "scorer",
    "studies",
]
