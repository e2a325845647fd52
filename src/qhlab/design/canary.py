"""The E0 canary rules: which TRAIN row, what a canary fits, and when it recovers the optimum.

Owns: the prospective selection rule of the canary row (``select_canary_row``), the recovery
rule on that row's original labels (``canary_recovery``), the canary recipe (the frozen
baseline with its row's successors anchored, ``canary_recipe``) and the failure records and
sentences of a failed gate. Pure: arrays and recipes in, JSON-able records out. Does not own:
running the canary fits (``cells``) or deciding and publishing the gate (``admission``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from qhlab.finite_horizon.recipe import recipe_digest

if TYPE_CHECKING:
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = [
    "CANARY_ONLINE_WHY",
    "CANARY_SUCCESSOR_WHY",
    "canary_failures",
    "canary_recipe",
    "canary_recovery",
    "failure_text",
    "select_canary_row",
]


def select_canary_row(
    population: Any, chains: list[dict], tie_band: float, *, gap_multiple: float = 1.0
) -> dict | None:
    """The first chain state, in canonical order, whose best label beats the runner-up by more
    than ``gap_multiple * tie_band`` at every horizon (rule fixed before looking at any fit).

    Why a multiple: a correct canary learns its row's labels at H >= 2 only to a few
    millimetres (measured: <= 9 mm at 2400 updates on the default preset); a row whose best and
    runner-up labels are closer than that is a coin toss for a correct pipeline (a fresh TRAIN
    seed's first row had a 4.3 mm gap at H=3 and failed the gate with tie_band 1 mm). The
    multiple leaves the canary a margin of its accuracy, and a broken pipeline (no learning, a
    mean for the max, candidates ignored) still cannot find the row's best action (tested).

    Args:
        population: a TRAIN ``Population`` (``q`` [S, K, H], ``candidate_mask`` [S, K],
            ``horizon``, and the identities ``state_id``, ``scene_id``, ``chain_id``, ``step`` [S]).
        chains: ``[{"rows": [...]}, ...]``, the chains in canonical order
            (``qhlab.finite_horizon.benchmark.canonical_chains``), rows in step order.
        tie_band: native Q tolerance.
        gap_multiple: the best label must beat the runner-up by more than this many tie bands.

    Returns:
        None when no row qualifies; else the record of the row: ``row``, its identities,
        ``best_action`` [H] (candidate index), ``gaps`` [H], ``labels`` [K][H] and
        ``candidate_mask`` [K].
    """
    q = population.q.numpy()
    mask = population.candidate_mask.numpy()
    horizon = int(population.horizon)
    for row in (r for chain in chains for r in chain["rows"]):
        labels = q[row][mask[row]][:, :horizon]  # [K_valid, H]
        if labels.shape[0] < 2:
            continue
        ordered = np.sort(labels, axis=0)[::-1]
        gaps = ordered[0] - ordered[1]
        if bool((gaps > gap_multiple * tie_band).all()):
            valid = np.flatnonzero(mask[row])
            return {
                "row": int(row),
                "state_id": int(population.state_id[row]),
                "scene_id": int(population.scene_id[row]),
                "chain_id": int(population.chain_id[row]),
                "step": int(population.step[row]),
                "best_action": [int(valid[int(np.argmax(labels[:, h]))]) for h in range(horizon)],
                "gaps": [float(g) for g in gaps],
                "labels": q[row][:, :horizon].tolist(),
                "candidate_mask": [bool(m) for m in mask[row]],
            }
    return None


def canary_recovery(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray, tie_band: float) -> list[dict]:
    """Per horizon: the predicted tie set (within ``tie_band`` of the predicted max) must hold
    only actions whose original label is within ``tie_band`` of the best label.

    Args:
        pred: [K, H] predictions of the row.
        labels: [K, H] original labels of the row.
        mask: [K] bool, the real candidates (a masked candidate is never chosen).
        tie_band: native Q tolerance of both the tie set and the admission.

    Returns:
        One record per horizon: ``horizon`` (1-based), ``chosen`` (candidate indices of the
        predicted tie set), ``recovered`` (bool) and ``predicted`` [K].
    """
    out = []
    for h in range(labels.shape[1]):
        p = np.where(mask, pred[:, h], -np.inf)
        chosen = np.flatnonzero(mask & (p >= p.max() - tie_band))
        best = labels[mask, h].max()
        ok = bool((labels[chosen, h] >= best - tie_band).all())
        out.append(
            {
                "horizon": h + 1,
                "chosen": [int(c) for c in chosen],
                "recovered": ok,
                "predicted": [float(v) for v in pred[:, h]],
            }
        )
    return out


CANARY_ONLINE_WHY = (
    "E0 checks the learner: the canary's labels are read from its online weights, which a "
    "recipe's Polyak-averaged evaluation weights never feed back into (the average is not used "
    "by the loss, the targets or the optimizer), so they are the same with or without averaging"
)

CANARY_SUCCESSOR_WHY = (
    "a canary trains one TRAIN row; its Q_h targets (h >= 2) bootstrap through the target "
    "scorer's Q_{h-1} on the row's successor states, which no TD row of a one-row fit trains "
    "(successor states carry no successors of their own), so without an anchor those values "
    "stay at their initialization and the canary could fail (or pass) whatever the learning "
    "rule does; the canary therefore also fits the successors' Q_1..Q_{H-1} heads to their "
    "exact stored TRAIN labels, and its batch is its one row repeated, so one anchored row "
    "covers every successor"
)


def canary_recipe(recipe: QhRecipe) -> tuple[QhRecipe, dict]:
    """The recipe a canary fits: the frozen baseline recipe with its successors anchored.

    ``successor_label_rows`` becomes 1 (see ``CANARY_SUCCESSOR_WHY``) and
    ``evaluation.average_decay`` None (see ``CANARY_ONLINE_WHY``); every other field is the
    frozen recipe's. The change is a fixed rule of this (frozen) source package applied to
    the authenticated frozen recipe, so the freeze still determines exactly what a canary runs.

    Args:
        recipe: the authenticated baseline ``QhRecipe`` at ``canary_updates``.

    Returns:
        (the canary ``QhRecipe``, a JSON-able record of the change and why for the cell
        receipt).
    """

    raw = recipe.model_dump()
    canary = type(recipe).model_validate(
        {**raw, "successor_label_rows": 1, "evaluation": {**raw["evaluation"], "average_decay": None}}
    )
    record = {
        "successor_label_rows": 1,
        "study_successor_label_rows": int(recipe.successor_label_rows),
        "evaluated": "online",
        "study_average_decay": recipe.evaluation.average_decay,
        "evaluated_why": CANARY_ONLINE_WHY,
        "successor_reward_rows": int(recipe.successor_reward_rows),
        "frozen_recipe_digest": recipe_digest(recipe),
        "canary_recipe_digest": recipe_digest(canary),
        "why": CANARY_SUCCESSOR_WHY,
    }
    return canary, record


def canary_failures(canaries: list[dict], selected: dict) -> list[dict]:
    """One record per failing (canary, horizon): the chosen candidates and the optimal one,
    each with predicted and true (original label) values. ``selected["labels"]`` is [K][H]."""
    labels = selected["labels"]
    failures = []
    for c in canaries:
        for h in c["canary"]["per_horizon"]:
            if h["recovered"]:
                continue
            i = h["horizon"] - 1
            best = selected["best_action"][i]
            failures.append(
                {
                    "cell": c["cell"],
                    "seed": c["seed"],
                    "horizon": h["horizon"],
                    "chosen": h["chosen"],
                    "chosen_predicted": [h["predicted"][a] for a in h["chosen"]],
                    "chosen_true": [labels[a][i] for a in h["chosen"]],
                    "optimal": best,
                    "optimal_predicted": h["predicted"][best],
                    "optimal_true": labels[best][i],
                }
            )
    return failures


def failure_text(f: dict) -> str:
    """One sentence naming what a failing canary chose and the optimal candidate (a failure record)."""

    def values(xs: list[float]) -> str:
        return ", ".join(f"{x:.4f}" for x in xs)

    return (
        f"{f['cell']} (seed {f['seed']}) at H={f['horizon']} chose candidate(s) "
        f"{', '.join(map(str, f['chosen']))} (predicted {values(f['chosen_predicted'])}; "
        f"true {values(f['chosen_true'])}); the optimal candidate is {f['optimal']} "
        f"(predicted {f['optimal_predicted']:.4f}; true {f['optimal_true']:.4f})"
    )
