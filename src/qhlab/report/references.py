"""The report's heuristic references and its headline: does the learned baseline beat cheap policies?

Owns: ``reference_comparisons`` (each reference's regret with its scene-bootstrap interval,
the paired (baseline - reference) interval per seed, and the one-sentence headline against
the best TRAIN-chosen fixed index) and the labels the report prints for references. Pure of
files. Does not own: the references' policies and their per-scene regret
(``qhlab.finite_horizon.evaluation.population_heuristic_references``, sealed by development)
or the bootstrap (``statistics``, through ``BootstrapConfig.interval``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from qhlab.design.study_config import BootstrapConfig
from qhlab.evidence import EvidenceError, input_error

__all__ = ["ORACLE_MARK", "REFERENCE_NAMES", "reference_comparisons"]

REFERENCE_NAMES = ("best_fixed_index", "candidate_0", "myopic_oracle")
ORACLE_MARK = "(oracle: reads validation labels)"
_REFERENCE_LABELS = {
    "best_fixed_index": "best fixed index (TRAIN-chosen: index {index})",
    "candidate_0": "{candidate} (index {index})",
    "myopic_oracle": "myopic oracle (argmax Q*_1)",
}
_BEATS_RULE = (
    "beats = the baseline's scene-weighted regret_H is below the heuristic's AND the upper "
    "bound of the paired scene-bootstrap interval of (baseline - heuristic) regret_H is < 0"
)


def _g(value: float | None) -> str:
    """A number in the headline: 4 significant digits, "-" for None."""
    return "-" if value is None else f"{value:.4g}"


def reference_comparisons(
    references: dict,
    baseline_regret: dict,
    *,
    scene_ids: Sequence[int],
    bootstrap: BootstrapConfig | dict,
    baseline_arm: str = "baseline",
) -> dict:
    """The report's heuristic references and its headline, from per-scene values (pure of files).

    Every interval uses the study's scene-bootstrap settings, as the paired comparisons between
    arms do. The headline asks one question: does the learned baseline beat the best
    TRAIN-chosen heuristic (the best fixed index; the straight strike is itself a fixed index,
    so the TRAIN choice covers it) on every seed? The myopic oracle reads validation labels, so
    it is shown but never the headline's yardstick.

    Args:
        references: the development receipt's ``references`` (as written by
            ``qhlab.finite_horizon.evaluation.population_heuristic_references``): for each name
            of ``REFERENCE_NAMES``, ``per_scene`` = {``scene_id`` [n_scenes], ``regret``
            [n_scenes, H]} and the policy fields (``policy``, ``oracle``, ``index``...).
        baseline_regret: {seed: float [n_scenes, H]}, the baseline arm's per-scene regret of
            each seed, scenes in ``scene_ids`` order.
        scene_ids: [n_scenes], the scene order of the cells' evaluation; every reference must
            have been evaluated on exactly these scenes in this order.
        bootstrap: the study's ``BootstrapConfig`` (or its dict: resamples, seed, confidence).
        baseline_arm: the baseline arm's name, recorded in every paired entry.

    Returns:
        JSON-able {``references``: {name: entry}, ``headline``: {...}}. An entry has ``label``,
        ``policy``, ``oracle``, ``note`` (``ORACLE_MARK`` for the oracle, else None), ``index``,
        ``chosen_on``, ``regret`` [H], ``regret_interval`` (scene bootstrap at H) and ``paired``:
        per seed, the interval of (baseline - reference) regret_H. The headline has ``text``
        (one plain sentence), ``beats_every_seed``, ``rule``, the heuristic's ``index`` and
        ``heuristic_regret``, and ``per_seed`` (baseline regret_H, ``ratio`` baseline /
        heuristic or None when the heuristic's regret is 0, the paired interval, ``beats``).
    """
    settings = bootstrap if isinstance(bootstrap, BootstrapConfig) else BootstrapConfig.model_validate(bootstrap)
    per_scene, baseline, horizon = _checked_inputs(references, baseline_regret, [int(s) for s in scene_ids])
    section = {
        name: _reference_entry(name, references[name], per_scene[name], baseline, settings, baseline_arm)
        for name in REFERENCE_NAMES
    }
    headline = _headline(section["best_fixed_index"], baseline, settings, baseline_arm, horizon)
    return {"references": section, "headline": headline}


def _checked_inputs(
    references: Any, baseline_regret: Any, order: list[int]
) -> tuple[dict[str, np.ndarray], dict[Any, np.ndarray], int]:
    """``reference_comparisons``' inputs, refused unless they are a development receipt's
    references and the baseline's per-scene regret on the cells' scenes.

    Returns:
        ``(per_scene, baseline, H)``: {reference name: float [n_scenes, H]}, {seed: float
        [n_scenes, H]} and the horizon.
    """
    call = "reference_comparisons"
    if not isinstance(references, dict) or set(references) != set(REFERENCE_NAMES):
        raise input_error(
            call,
            "references",
            sorted(references) if isinstance(references, dict) else references,
            f"exactly {list(REFERENCE_NAMES)}",
            "pass the development receipt's references (population_heuristic_references)",
        )
    if not baseline_regret:
        raise input_error(
            call,
            "baseline_regret",
            baseline_regret,
            "one [n_scenes, H] array per seed",
            "pass the baseline arm's per-scene regret of every seed",
        )
    # The headline's yardstick must be chosen on TRAIN and the oracle must say it is one:
    # a references block that claims otherwise cannot reach a report.
    for name, field, want in (
        ("best_fixed_index", "chosen_on", "train"),
        ("myopic_oracle", "oracle", True),
        ("candidate_0", "oracle", False),
        ("best_fixed_index", "oracle", False),
    ):
        if references[name].get(field) != want:
            raise input_error(
                call,
                f"references[{name!r}].{field}",
                references[name].get(field),
                repr(want),
                "pass the development receipt's references (population_heuristic_references)",
                error=EvidenceError,
            )
    per_scene: dict[str, np.ndarray] = {}
    for name in REFERENCE_NAMES:
        ref = references[name]
        if [int(s) for s in ref["per_scene"]["scene_id"]] != order:
            raise EvidenceError(
                f"{call}: reference {name} was evaluated on other scenes (or another "
                "order) than the cells. HINT: references and cells must both use the "
                "sealed validation population."
            )
        per_scene[name] = np.asarray(ref["per_scene"]["regret"], dtype=np.float64)
    horizon = per_scene[REFERENCE_NAMES[0]].shape[1] if per_scene[REFERENCE_NAMES[0]].ndim == 2 else 0
    baseline = {s: np.asarray(values, dtype=np.float64) for s, values in baseline_regret.items()}
    for label, values in [
        *((f"references[{n!r}]", v) for n, v in per_scene.items()),
        *((f"baseline_regret[{s!r}]", v) for s, v in baseline.items()),
    ]:
        if values.shape != (len(order), horizon) or horizon < 1 or not np.isfinite(values).all():
            raise input_error(
                call,
                label,
                f"shape {values.shape}",
                f"finite values of shape {(len(order), max(horizon, 1))}",
                "per-scene regret [n_scenes][H] in the cells' scene order",
            )
    return per_scene, baseline, horizon


def _reference_entry(
    name: str,
    ref: dict,
    values: np.ndarray,
    baseline: dict[Any, np.ndarray],
    settings: BootstrapConfig,
    baseline_arm: str,
) -> dict:
    """One reference's entry: its label and policy, mean regret [H], the interval of its regret_H
    and, per seed, the paired interval of the baseline's regret_H minus its own.

    Args:
        values: float [n_scenes, H], the reference's per-scene regret.
        baseline: {seed: float [n_scenes, H]}, the baseline's per-scene regret.
    """
    oracle = bool(ref.get("oracle", False))
    return {
        "reference": name,
        "label": _REFERENCE_LABELS[name].format(
            index=ref.get("index"), candidate=str(ref.get("candidate", "candidate 0")).replace("_", " ")
        ),
        "policy": ref.get("policy"),
        "oracle": oracle,
        "note": ORACLE_MARK if oracle else None,
        "index": ref.get("index"),
        "chosen_on": ref.get("chosen_on"),
        "regret": [float(v) for v in values.mean(axis=0)],
        "regret_interval": settings.interval(values[:, -1]),
        "paired": [
            {
                "arm": baseline_arm,
                "seed": s,
                "relation": "baseline minus reference",
                "metric": "regret",
                "horizon": values.shape[1],
                "interval": settings.interval(own[:, -1], values[:, -1]),
            }
            for s, own in baseline.items()
        ],
    }


def _headline(
    best: dict, baseline: dict[Any, np.ndarray], settings: BootstrapConfig, baseline_arm: str, horizon: int
) -> dict:
    """The headline: does the learned baseline beat the best TRAIN-chosen heuristic (``best``,
    its reference entry) on every seed, by mean regret_H and a paired interval below 0?

    Args:
        baseline: {seed: float [n_scenes, H]}, the baseline's per-scene regret.
    """
    heuristic = best["regret"][-1]
    rows = []
    for paired in best["paired"]:
        seed, interval = paired["seed"], paired["interval"]
        own = float(baseline[seed][:, -1].mean())
        high = interval["high"]
        rows.append(
            {
                "seed": seed,
                "baseline_regret": own,
                "heuristic_regret": heuristic,
                "ratio": own / heuristic if heuristic > 0 else None,
                "difference": interval["estimate"],
                "low": interval["low"],
                "high": high,
                "method": interval["method"],
                "beats": bool(own < heuristic and high is not None and high < 0),
            }
        )
    beats_every_seed = all(r["beats"] for r in rows)
    every = "both seeds" if len(rows) == 2 else ("its seed" if len(rows) == 1 else f"all {len(rows)} seeds")
    level = f"{settings.confidence:.0%}"
    parts = []
    for r in rows:
        ratio = "ratio undefined: the heuristic's regret is 0" if r["ratio"] is None else f"ratio {r['ratio']:.3g}"
        verdict = "" if beats_every_seed else (": beats" if r["beats"] else ": does not beat")
        parts.append(
            f"seed {r['seed']}: baseline regret_{horizon} {_g(r['baseline_regret'])} vs heuristic "
            f"{_g(heuristic)} ({ratio}), "
            f"paired {level} CI of baseline minus heuristic [{_g(r['low'])}, {_g(r['high'])}]{verdict}"
        )
    text = (
        f"The learned {baseline_arm} {'beats' if beats_every_seed else 'does not beat'} the best "
        f"TRAIN-chosen heuristic (fixed candidate index {best['index']}) on {every} at H={horizon}"
        + ("" if beats_every_seed else f" (it does on {sum(r['beats'] for r in rows)} of {len(rows)})")
        + ": "
        + "; ".join(parts)
        + "."
    )
    return {
        "text": text,
        "beats_every_seed": beats_every_seed,
        "rule": _BEATS_RULE,
        "baseline_arm": baseline_arm,
        "heuristic": "best_fixed_index",
        "index": best["index"],
        "horizon": horizon,
        "heuristic_regret": heuristic,
        "per_seed": rows,
    }
