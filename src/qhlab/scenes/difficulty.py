"""The difficulty card of a population: how well cheap policies do on its exact labels.

Owns: ``difficulty_card`` (pure numpy over the chain states' labels) and ``card_lines`` (the
card as the text ``qhlab scenes describe`` prints). Does not own: recomputing a population's
card from its files and checking it (``describe``), learned
predictions or their evaluation (``qhlab.finite_horizon.evaluation``), or choosing a
heuristic for a report (a report chooses on TRAIN; the card describes one population).

A benchmark is only worth its receipts if learned decisions can beat cheap ones. The card
gives, at the primary horizon H and weighted like every qhlab metric (states within scene,
then scenes equally), the regret of:

* the uniform-random policy (what any constant predictor gets);
* every fixed candidate index (candidate 0 under its own name: the straight strike at the goal in
  the puck world);
* the myopic oracle, argmax of the exact Q*_1 (ties within ``tie_band`` averaged);

and the share of chain states where the myopic choice (its ties averaged, as in its regret)
loses more than ``tie_band`` at H, and
the distribution and entropy of the optimal index (an index within ``tie_band`` of the best
shares the state's unit weight with the other tied indices).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qhlab.evidence import QhInputError
from qhlab.scenes.manifest import reward_unit

__all__ = [
    "CARD_TIE_BAND",
    "card_lines",
    "card_warnings",
    "difficulty_card",
    "reference_name",
    "suggested_settings",
]

CARD_TIE_BAND = 0.001
"""Tie band (in the reward's unit) of the card written at generation: the default study's ``tie_band``."""


def _scene_weighted(values: np.ndarray, scene_index: np.ndarray) -> np.ndarray:
    """Mean over states within each scene, then over scenes: [S, ...] -> [...]."""
    scenes, inverse = np.unique(scene_index, return_inverse=True)
    flat = values.reshape(values.shape[0], -1)
    sums = np.zeros((scenes.size, flat.shape[1]))
    np.add.at(sums, inverse, flat)
    counts = np.bincount(inverse, minlength=scenes.size).astype(np.float64)
    return (sums / counts[:, None]).mean(axis=0).reshape(values.shape[1:])


def difficulty_card(
    q: Any,
    scene_index: Any,
    *,
    tie_band: float = CARD_TIE_BAND,
    candidate_mask: Any = None,
    reference: str = "first_candidate",
) -> dict[str, Any]:
    """The difficulty card of a population's chain states.

    A state with fewer candidates than K takes part in every policy: the uniform policy and the
    oracles choose among its own candidates, and fixed index i takes its candidate
    min(i, k - 1), its last one where it has fewer than i + 1.

    Args:
        q: exact labels Q*_1..Q*_H of the chain states, [S, K, H].
        scene_index: the scene of each state, integer [S].
        tie_band: finite tolerance >= 0, in the labels' unit.
        candidate_mask: [S, K] bool, the candidates each state has (its first k); None: all.
        reference: the card's name for candidate 0's policy (``"straight_strike"`` in the puck world).

    Returns:
        JSON-able dict: ``regret_H`` (uniform, fixed_index [K], ``reference``, best_fixed_index,
        myopic_oracle), the same as ``ratio_to_uniform``, ``myopic_loses_share`` (share of chain
        states, unweighted, whose myopic regret at H, the loss of the myopic choice with its
        ties averaged, exceeds ``tie_band``), and ``optimal_index`` (distribution [K] over chain states,
        entropy in bits, and entropy / log2 K).

    Raises:
        QhInputError: wrong shapes, non-finite labels or a bad ``tie_band``.
    """
    labels = np.asarray(q, dtype=np.float64)
    scenes = np.asarray(scene_index)
    mask = np.ones(labels.shape[:2], dtype=bool) if candidate_mask is None else np.asarray(candidate_mask, dtype=bool)
    if labels.ndim != 3 or 0 in labels.shape or scenes.shape != (labels.shape[0],):
        raise QhInputError(
            f"difficulty_card: q.shape={labels.shape!r} is not allowed; allowed: [S, K, H] with S, K, H >= 1 "
            f"and scene_index of shape [S]. HINT: pass the chain states' labels."
        )
    if mask.shape != labels.shape[:2] or not mask[:, 0].all():
        raise QhInputError(
            f"difficulty_card: candidate_mask of shape {mask.shape!r} is not allowed; allowed: [S, K] bool, every "
            "state's first candidate present."
        )
    if not np.isfinite(labels[mask]).all():
        raise QhInputError(
            "difficulty_card: q holds non-finite labels; allowed: finite. HINT: regenerate the population."
        )
    if isinstance(tie_band, bool) or not isinstance(tie_band, (int, float)) or not 0 <= tie_band < math.inf:
        raise QhInputError(f"difficulty_card: tie_band={tie_band!r} is not allowed; allowed: a finite number >= 0.")
    s, k, h = labels.shape
    # A state's missing candidates: never the maximum, never in a set, never in a mean.
    final = np.where(mask, labels[:, :, h - 1], -np.inf)
    first = np.where(mask, labels[:, :, 0], -np.inf)
    best = final.max(axis=1)  # [S]
    uniform = best - np.where(mask, final, 0.0).sum(axis=1) / mask.sum(axis=1)
    # Fixed index i takes a state's candidate min(i, k - 1).
    slot = np.minimum(np.arange(k)[None, :], mask.sum(axis=1)[:, None] - 1)
    fixed = best[:, None] - np.take_along_axis(final, slot, axis=1)  # [S, K]
    myopic_set = first >= first.max(axis=1, keepdims=True) - tie_band
    myopic = best - np.where(myopic_set, final, 0.0).sum(axis=1) / myopic_set.sum(axis=1)
    optimal_set = final >= best[:, None] - tie_band
    distribution = (optimal_set / optimal_set.sum(axis=1, keepdims=True)).mean(axis=0)
    nonzero = distribution[distribution > 0]
    entropy = float(-(nonzero * np.log2(nonzero)).sum())
    regrets = _scene_weighted(np.column_stack([uniform, fixed, myopic]), scenes)
    uniform_w, fixed_w, myopic_w = float(regrets[0]), regrets[1 : 1 + k], float(regrets[-1])
    best_index = int(np.argmin(fixed_w))  # ties to the lowest index

    def ratio(value: float) -> float | None:
        return None if uniform_w == 0.0 else float(value / uniform_w)

    return {
        "tie_band": float(tie_band),
        "horizon": h,
        "K": k,
        "chain_states": s,
        "scenes": int(np.unique(scenes).size),
        "weighting": "states within scene, scenes equally",
        "regret_H": {
            "uniform": uniform_w,
            "fixed_index": [float(v) for v in fixed_w],
            reference: float(fixed_w[0]),
            "best_fixed_index": {"index": best_index, "regret": float(fixed_w[best_index])},
            "myopic_oracle": myopic_w,
        },
        "ratio_to_uniform": {
            reference: ratio(float(fixed_w[0])),
            "best_fixed_index": ratio(float(fixed_w[best_index])),
            "myopic_oracle": ratio(myopic_w),
        },
        "myopic_loses_share": float((myopic > tie_band).mean()),
        "optimal_index": {
            "distribution": [float(v) for v in distribution],
            "entropy_bits": entropy,
            "entropy_over_log2K": None if k == 1 else entropy / math.log2(k),
        },
    }


def card_lines(described: dict[str, Any]) -> list[str]:
    """The difficulty card as text lines, one quantity per line (``qhlab scenes describe``).

    Args:
        described: the result of ``describe_population`` (``name``, ``split`` and ``card``).

    Returns:
        A header line naming the population, its size, K, H, the tie band and the weighting,
        then one indented line per regret reference, the regret by fixed index, the myopic
        loss share and the optimal index's distribution and entropy.
    """
    card = described["card"]
    unit = reward_unit(described["generator"])
    unit_words = unit or "the environment's own reward, which names no unit"
    regret, ratio = card["regret_H"], card["ratio_to_uniform"]
    reference = reference_name(card)
    best = regret["best_fixed_index"]
    h = card["horizon"]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} x uniform"

    return [
        f"{described['name']} ({described['split']}): {card['scenes']} scenes, {card['chain_states']} chain "
        f"states, K={card['K']}, H={h}, tie_band={card['tie_band']}{' ' + unit if unit else ''}; "
        f"{card['weighting']}; rewards and regret in {unit_words}",
        f"  regret_{h} uniform random      {regret['uniform']:.4f}",
        # Labels padded as the fixed ones are, so that the values stand in one column.
        f"  regret_{h} {reference.replace('_', ' ') + ' (0)':<19} {regret[reference]:.4f}  ({share(ratio[reference])})",
        f"  regret_{h} {'best fixed index ' + str(best['index']):<19} {best['regret']:.4f}  "
        f"({share(ratio['best_fixed_index'])})",
        f"  regret_{h} myopic oracle       {regret['myopic_oracle']:.4f}  ({share(ratio['myopic_oracle'])})",
        "  regret_{} by fixed index      {}".format(h, " ".join(f"{v:.4f}" for v in regret["fixed_index"])),
        f"  myopic choice loses > tie_band at H in {100 * card['myopic_loses_share']:.1f}% of chain states",
        "  optimal index distribution    {}".format(
            " ".join(f"{v:.3f}" for v in card["optimal_index"]["distribution"])
        ),
        f"  optimal index entropy         {card['optimal_index']['entropy_bits']:.3f} bits "
        f"({_ratio_text(card['optimal_index']['entropy_over_log2K'])} x log2 K)",
        *(f"  WARNING: {warning}" for warning in card_warnings(card)),
        *_suggestion_lines(described.get("suggested"), unit),
    ]


def _suggestion_lines(suggested: dict[str, Any] | None, unit: str) -> list[str]:
    if not suggested:
        return []
    unit = f" {unit}" if unit else ""
    if suggested["tie_band"] is None:
        return ["  suggested for a study on it: none: no chain state's candidates differ at H"]
    gap = suggested["canary_gap_multiple_at_most"]
    spread = (
        "a hundredth of the median spread of Q*_H over the states whose candidates differ, "
        f"{suggested['spread_H']:.4g}{unit}"
    )
    why = spread
    if "tie_band" in suggested["clamped"]:
        why = f"clamped to what a study accepts: {spread}, is {_one_digit(suggested['spread_H'] / 100.0):g}{unit}"
    return [
        f"  suggested for a study on it: tie_band {suggested['tie_band']:g}{unit} ({why}), huber_delta "
        f"{suggested['huber_delta']:g}{unit} (the sd of Q*_H), canary_gap_multiple "
        + (
            f"at most {gap} at that tie_band (half the smallest gap over horizons of the 90th percentile chain "
            "state among those whose candidates differ at every horizon)"
            if gap is not None
            else "none: no chain state's candidates differ at every horizon, so no E0 gate can pass"
        )
        + (f"; clamped to what a study accepts: {', '.join(suggested['clamped'])}" if suggested["clamped"] else "")
    ]


def _one_digit(value: float) -> float:
    """``value`` rounded down to one significant digit (0.0143 -> 0.01, 0.3 -> 0.3), or 0.0."""
    if value <= 0 or not math.isfinite(value):
        return 0.0
    exponent = math.floor(math.log10(value))
    # The digit, rounded first to absorb binary noise (0.3 / 0.1 is 2.9999999999999996).
    digit = math.floor(round(value / 10.0**exponent, 9))
    return float(f"{digit}e{exponent}")


# What a study accepts (QhArchitectureStudyConfig, Recipe): a suggestion beyond it is clamped.
_LIMITS = {"tie_band": 10.0, "huber_delta": 10.0, "canary_gap_multiple_at_most": 1000}


def suggested_settings(q: np.ndarray, candidate_mask: np.ndarray) -> dict[str, Any]:
    """A study's reward-scale settings suggested from a population's exact labels.

    The defaults (``tie_band`` 0.001, ``huber_delta`` 0.25, ``canary_gap_multiple`` 10) were chosen
    for the puck world, whose Q*_H spreads about 0.14 m across a state's candidates; a reward on
    another scale needs them scaled with it. These are where to start, never a tuned choice.

    Args:
        q: float64 [S, K, H], the chain states' labels.
        candidate_mask: bool [S, K], the candidates each state offers.

    Returns:
        ``{"spread_H": the median, over states whose candidates differ at H, of max - min Q*_H,
        "tie_band": a hundredth of it (one significant digit, rounded down; None: no state's
        candidates differ at H), "huber_delta": the sd of Q*_H over every offered candidate (one
        digit), "canary_gap_multiple_at_most": the largest multiple of that tie_band that half
        the 90th percentile of each state's smallest best-minus-runner-up gap over horizons
        reaches, over the states whose gap is positive at every horizon (None: there are none),
        "clamped": the names of the suggestions lowered to what a study accepts}``.
    """
    valid = candidate_mask[:, :, None]
    best = np.where(valid, q, -np.inf).max(axis=1)  # [S, H]
    worst = np.where(valid, q, np.inf).min(axis=1)
    spread_h = best[:, -1] - worst[:, -1]
    differing = spread_h[spread_h > 0]
    spread = float(np.median(differing)) if differing.size else 0.0
    tie_band = _one_digit(spread / 100.0) if differing.size else None
    clamped = []
    if tie_band is not None and tie_band > _LIMITS["tie_band"]:
        # The multiple below is of the tie_band a study can take, so it is worked out at that one.
        tie_band = _LIMITS["tie_band"]
        clamped.append("tie_band")
    if q.shape[1] > 1:
        runner_up = np.sort(np.where(valid, q, -np.inf), axis=1)[:, -2, :]
        gaps = np.where(np.isfinite(runner_up), best - runner_up, 0.0).min(axis=1)  # [S]: smallest over h
    else:
        gaps = np.zeros(q.shape[0])
    gaps = gaps[gaps > 0]
    multiple = None
    if tie_band and gaps.size:
        multiple = max(1, int(float(np.percentile(gaps, 90)) / 2.0 // tie_band))
    at_h = q[:, :, -1][candidate_mask]
    suggested = {
        "spread_H": spread,
        "tie_band": tie_band,
        "huber_delta": _one_digit(float(np.std(at_h))) if at_h.size else 0.0,
        "canary_gap_multiple_at_most": multiple,
        "clamped": clamped,
    }
    for name, limit in _LIMITS.items():
        if name != "tie_band" and suggested[name] is not None and suggested[name] > limit:
            suggested[name] = limit
            suggested["clamped"].append(name)
    return suggested


def card_warnings(card: dict[str, Any]) -> list[str]:
    """What a card says a population cannot teach, in words (empty: nothing to warn of).

    * every chain state's candidates tie at H (the uniform policy's regret is 0): there is nothing
      to learn, and no study's E0 gate can pass on it;
    * the myopic choice is optimal in every chain state: a one-step scorer does as well as any, so a
      finite-horizon study of it cannot show what H adds.
    """
    regret = card["regret_H"]
    h = card["horizon"]
    if regret["uniform"] <= card["tie_band"] and card["myopic_loses_share"] == 0.0:
        return [
            f"nothing to learn: every chain state's candidates tie within the tie band at H={h} (uniform random "
            "regret 0); a study's freeze refuses it as TRAIN. HINT: a reward that tells actions apart, a longer "
            "horizon, other scenes"
        ]
    if card["myopic_loses_share"] == 0.0:
        return [
            f"the myopic choice is optimal in every chain state at H={h}: a one-step scorer does as well as any, "
            "so a study on it cannot show what the horizon adds"
        ]
    return []


def _ratio_text(value: float | None) -> str:
    # None where log2 K is 0 (K = 1): there is no choice to spread.
    return "-" if value is None else f"{value:.3f}"


def reference_name(card: dict[str, Any]) -> str:
    """The card's name for candidate 0's policy (the one key of ``regret_H`` beside the others)."""
    standard = {"uniform", "fixed_index", "best_fixed_index", "myopic_oracle"}
    return next(key for key in card["regret_H"] if key not in standard)
