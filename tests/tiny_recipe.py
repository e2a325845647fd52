"""The tiny recipe of the tests: ``examples/tiny-recipe.toml``, the one copy of its text.

Owns: the example's path (``TINY_RECIPE``) and its text with some lines replaced
(``tiny_recipe_text``), for tests that need a variant (another budget, populations, a smaller
scorer). Shared by test modules in several directories (``pythonpath = ["tests"]``), like
``synthetic_population``. Does not own: recipe validation (``qhlab.finite_horizon.recipe``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["TINY_RECIPE", "tiny_recipe_text"]

TINY_RECIPE = Path(__file__).resolve().parents[1] / "examples" / "tiny-recipe.toml"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + " }"
    return json.dumps(str(value))


def tiny_recipe_text(**lines: Any) -> str:
    """The example recipe's text with the line of each keyword replaced by ``key = value``.

    Args:
        lines: ``key=value`` for keys the example sets on a line of their own, e.g.
            ``updates=5``, ``name="rel-tiny"``, ``encoder={"depth": 1, "width": 16, "heads": 2}``,
            ``train="/path/to/population"``. Values are written as TOML.

    Returns:
        The TOML text.

    Raises:
        KeyError: a key the example does not set on a line of its own.
    """
    text = TINY_RECIPE.read_text(encoding="utf-8").splitlines()
    for key, value in lines.items():
        index = next((i for i, line in enumerate(text) if line.startswith(f"{key} = ")), None)
        if index is None:
            raise KeyError(f"{TINY_RECIPE.name} has no line '{key} = ...'")
        text[index] = f"{key} = {_toml(value)}"
    return "\n".join(text) + "\n"
