"""The one bound on an optimizer-update budget, torch-free.

Owns: ``MAX_UPDATES``, the largest final budget of any fit (a recipe's ``updates``, a study's
``canary_updates`` / ``broad_updates``). Lives in its own module so that the study config,
which must stay torch-free, and the recipe (``qhlab.finite_horizon.recipe``, which imports the
scorer and so torch) share one constant. Does not own: validation (the pydantic models).
"""

from __future__ import annotations

__all__ = ["MAX_UPDATES"]

# Ten million updates is days of CPU on the demo scorer; a larger budget is a typo
# (`updates = 100000000000000000000` in a recipe ran until it was killed).
MAX_UPDATES = 10_000_000
