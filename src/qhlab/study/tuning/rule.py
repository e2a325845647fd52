"""The tuning objective as pure functions: a trial's score from its fits, and the winner rule.

Owns: ``trial_score`` (mean and seed spread of the metric over a trial's fits) and
``pick_winner`` (the rule the config declares, applied mechanically). Both are pure functions
over plain numbers, torch-free, so ``qhlab verify`` recomputes them from a record. Does not
own: fitting (``run``) or the record (``record``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["pick_winner", "trial_score"]


def trial_score(values: Sequence[float]) -> dict[str, float | None]:
    """The score of one trial from its fits' metric values.

    Args:
        values: float [S], the metric at H of each fit seed, in the objective's seed order.

    Returns:
        ``{"mean": the mean over the S fits, "seed_sd": the sample standard deviation
        (ddof 1; None when S = 1)}``. Sums run in seed order, so the result is bit-exact
        wherever it is recomputed.
    """
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"trial_score: values={values!r}; allowed: at least one finite number")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return {"mean": mean, "seed_sd": None}
    return {"mean": mean, "seed_sd": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))}


def pick_winner(trials: Sequence[Mapping], *, band: float, max_seed_sd: float | None) -> dict:
    """The winning trial by the declared rule.

    Admissible trials are complete (``state == "complete"``) with a ``seed_sd`` within
    ``max_seed_sd`` (when set). Among them the best is the lowest ``mean``; every trial within
    ``band`` of it is tied, and the tie goes to the lowest ``cost``, then the lowest mean, then
    the lowest trial number.

    Args:
        trials: ``[{"number", "state", "mean", "seed_sd", "cost"}]`` (others are ignored).
        band: metres of the tie band (>= 0).
        max_seed_sd: the spread limit, or None.

    Returns:
        ``{"number": the winner's trial number, or None when no trial is admissible,
        "admissible": [numbers], "tied": [numbers within the band, by rule order],
        "margin": the runner-up's mean minus the winner's (None with fewer than two admissible)}``.
    """
    admissible = [t for t in trials if t["state"] == "complete"
                  and (max_seed_sd is None or (t["seed_sd"] is not None and t["seed_sd"] <= max_seed_sd))]
    if not admissible:
        return {"number": None, "admissible": [], "tied": [], "margin": None}
    best = min(t["mean"] for t in admissible)
    order = sorted((t for t in admissible if t["mean"] <= best + band),
                   key=lambda t: (t["cost"], t["mean"], t["number"]))
    winner = order[0]
    others = [t["mean"] for t in admissible if t["number"] != winner["number"]]
    return {"number": int(winner["number"]), "admissible": sorted(int(t["number"]) for t in admissible),
            "tied": [int(t["number"]) for t in order],
            "margin": None if not others else min(others) - winner["mean"]}
