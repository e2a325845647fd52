"""The report's lead section: the answer to the researcher's question, then the family.

Owns: each variant's answer (its seed-pooled difference from the baseline, its probability of
improvement over scenes, then the pre-registered rule's decision in one of ``DECISIONS``, with
why, and what would decide it where the study could not: the bound plan's cheapest deciding
design, or, where none decides, the part of the variant's planned variance that dominates; and one
sentence where the study's own seeds contradicted its pilot's seed component of one of the
variant's intervals), how each seed
reads the rule in the same words, each variant's per-scene regret profile against the baseline
(for its figure), and the family table (each arm's make-up, parameter count and cost): the
``question`` and ``family`` fields of ``report.json`` and their markdown and W&B table. Does not
own: the statistics it reads (the ``retention`` and ``replication`` entries that the report's
earlier sections wrote: ``report``, ``seed_aware``) or writing the files (``render``).
"""

from __future__ import annotations

import numpy as np

from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.evidence.canonical import dotted
from qhlab.report.render import table
from qhlab.report.sections import ReportInputs, Tables
from qhlab.statistics.bootstrap import DECISIONS, probability_of_improvement
from qhlab.statistics.variance import VARIANCE_COMPONENTS

__all__ = ["ANSWER_DECISIONS", "build", "markdown", "tables"]

ANSWER_DECISIONS = DECISIONS
"""The words the answer gives a variant, the same as every seed's reading and every replica's."""

_NO_PILOT = (
    "two seeds alone cannot decide: with no pilot, the seed variance is read from the study's own two seeds, "
    "one degree of freedom, so every interval reaches 12.7 standard errors either side; `qhlab pilot` "
    "measures each comparison's seed and TRAIN-draw variance on a tuning population, `qhlab plan` predicts "
    "the MDE it gives, and `[preparation] pilot` binds it"
)


def _unit(report: dict) -> str:
    """What follows a reward-valued number: " m" for the puck world, "" for a reward that names no unit."""
    return f" {report['unit']}" if report["unit"] else ""


def _interval(margin: dict, unit: str) -> str:
    return f"{margin['estimate']:+.4f}{unit} [{margin['low']:+.4f}, {margin['high']:+.4f}]"


def _why(entry: dict, config: QhArchitectureStudyConfig, unit: str) -> str:
    """Why the rule decided as it did, in words, with the margins' intervals (``unit``: as ``_unit``)."""
    margins = entry["pooled_margins"]
    reg, mae = margins["D_reg"], margins["D_mae"]
    words = {
        "D_reg": f"regret_H below {config.regret_fraction:g} x `{entry['structural_control']}`'s",
        "D_mae": f"MAE_H below {config.mae_fraction:g} x `{entry['matched_control']}`'s",
    }
    if entry["decision"] == "retained":
        return (
            f"both margins lie below 0: D_reg {_interval(reg, unit)} ({words['D_reg']}) and D_mae "
            f"{_interval(mae, unit)} ({words['D_mae']})"
        )
    if entry["decision"] == "not retained":
        above = [n for n, m in margins.items() if m["low"] is not None and m["low"] > 0]
        return "the gain is below the margin: " + " and ".join(
            f"{n} {_interval(margins[n], unit)} lies above 0 (its {words[n].replace(' below ', ' is not below ')})"
            for n in above
        )
    why = (
        f"the study could not tell a difference this small from noise: D_reg {_interval(reg, unit)}, D_mae "
        f"{_interval(mae, unit)} (MDE D_reg {reg['mde']:.4f}{unit}, D_mae {mae['mde']:.4f}{unit})"
    )
    if entry["decision_reason"].startswith("fewer than"):
        why = f"{entry['decision_reason']}; {why}"
    if reg["seed_sd_source"].startswith("study:"):
        why += f"; {_NO_PILOT}"
    return why


# What shrinks each part of a margin's predicted variance (``variance_components``' names).
_LEVERS = {
    "scene": "more validation scenes shrink it",
    "seed": "more training seeds shrink it",
    "draw": "neither seeds nor scenes shrink it, and what a larger TRAIN population would do is unmeasured",
}


def _next_step(plan: dict | None, variant: str, unit: str) -> str:
    """What would decide an undecided variant, by the study's bound plan ("" without one): the
    cheapest design the plan weighed that reaches its target on enough scenes to decide (its
    ``chosen``); else the part of this variant's planned variance that dominates, and what shrinks it."""
    if plan is None:
        return ""
    chosen = plan.get("chosen")
    if chosen is not None:
        mde = {m: chosen["rows"][f"{m} {variant}"]["mde"] for m in ("D_reg", "D_mae")}
        return (
            f"; the plan's cheapest next step that would decide it is the {chosen['recipe']} recipe with "
            f"{chosen['validation_scenes']} validation scenes ({chosen['cost']['seconds']:.0f} CPU s), planned MDE "
            f"D_reg {mde['D_reg']:.4f}{unit}, D_mae {mde['D_mae']:.4f}{unit}"
        )
    target = {"D_reg": plan["target"]["d_reg"], "D_mae": plan["target"]["d_mae"]}
    options = (plan.get("levers") or {}).get("pilot_draws") or []
    mdes = {o["draws"]: {m: o["rows"][f"{m} {variant}"] for m in target} for o in options}
    draws = [o for o in options if all(mdes[o["draws"]][m] <= target[m] for m in target)]
    if draws:
        o = min(draws, key=lambda o: o["seconds"])
        return (
            f"; no design the plan weighed reaches its target, but a pilot of {o['draws']} TRAIN draws would "
            f"({o['extra_fits']} more pilot fits, {o['seconds']:.0f} CPU s): planned MDE D_reg "
            f"{mdes[o['draws']]['D_reg']:.4f}{unit}, D_mae {mdes[o['draws']]['D_mae']:.4f}{unit}"
        )
    rows = plan["planned"]["rows"]
    worst = max(target, key=lambda m: rows[f"{m} {variant}"]["mde"] / target[m])
    dominant = (rows[f"{worst} {variant}"].get("variance") or {}).get("dominant")
    part = f"; the {dominant} part dominates its variance ({_LEVERS[dominant]})" if dominant in _LEVERS else ""
    more = ""
    if options:
        o = options[-1]
        more = (
            f"; nor would a pilot of {o['draws']} TRAIN draws ({o['extra_fits']} more pilot fits, "
            f"{o['seconds']:.0f} CPU s: {worst} MDE {mdes[o['draws']][worst]:.4f}{unit})"
        )
    return (
        f"; no design the plan weighed reaches its target of D_reg {target['D_reg']:g}{unit}, D_mae "
        f"{target['D_mae']:g}{unit}, so the plan names no next step that would decide it: its {worst} MDE here was "
        f"planned at {rows[f'{worst} {variant}']['mde']:.4f}{unit}{part}{more}"
    )


# A variance part in the words of a pooled record's ``sources``.
_PART_WORDS = {"scene": "scenes", "seed": "training seed", "draw": "TRAIN draw"}


def _dominant(margin: dict) -> str:
    """The part of a pooled margin's interval variance with the largest share (``variance_shares``;
    a tie goes to ``VARIANCE_COMPONENTS``' order)."""
    shares = margin["variance_shares"]
    return max((n for n in VARIANCE_COMPONENTS if shares[n] is not None), key=lambda n: shares[n])


def _variance_sentence(e: dict, unit: str) -> str:
    """One sentence: each margin's MDE and the part that dominates its interval's variance, with its share
    (on the scene-only floor, the scenes alone, and why)."""
    said = []
    for name in ("D_reg", "D_mae"):
        margin = e["pooled_margins"][name]
        part = _dominant(margin)
        said.append(
            f"{name} {margin['mde']:.4f}{unit}, "
            + (
                "scenes alone (the pilot's fit-noise estimate fell below 0, so the interval is the scene-only one)"
                if margin["floored"]
                else f"mostly {_PART_WORDS[part]} ({margin['variance_shares'][part]:.0%})"
            )
        )
    return f" Its MDE and the largest part of each margin's variance: {'; '.join(said)}."


def _against_baseline(report: dict, variant: str, baseline: str, metric: str) -> dict | None:
    """The seed-pooled (variant minus baseline) difference of ``metric`` at H, or None if not compared."""
    for row in report.get("replication", []):
        if row["metric"] == metric and {row["arm"], row["against"]} == {variant, baseline}:
            pooled = row["pooled"]
            sign = 1.0 if row["arm"] == variant else -1.0
            low, high = (pooled["low"], pooled["high"]) if sign > 0 else (-pooled["high"], -pooled["low"])
            return {"estimate": sign * pooled["estimate"], "low": low, "high": high, "confidence": pooled["confidence"]}
    return None


def _seed_check_sentence(report: dict, e: dict, baseline: str) -> str:
    """One sentence where the study's own seeds contradicted the pilot's seed component of one of this
    variant's intervals (its margins, its difference from the baseline), else ""."""
    h = report["primary_horizon"]
    pooled = [(name, e["pooled_margins"][name]) for name in ("D_reg", "D_mae")]
    for row in report.get("replication", []):
        if {row["arm"], row["against"]} == {e["variant"], baseline}:
            name = f"regret_{h}" if row["metric"] == "regret" else f"MAE_{h}"
            pooled.append((f"{name} against `{baseline}`", row["pooled"]))
    found = [(name, p["seed_check"]) for name, p in pooled if (p.get("seed_check") or {}).get("contradicts")]
    if not found:
        return ""
    listed = " and ".join(
        f"{name} (F {c['statistic']:.3g} on {c['dof_observed']} and {c['dof_predicted']:.1f} dof, p {c['p_value']:.3g})"
        for name, c in found
    )
    return (
        f" The study's own seeds contradict the pilot's seed component of {listed}, p below "
        f"{found[0][1]['threshold']:g}, so {'that interval carries' if len(found) == 1 else 'those intervals carry'} "
        "the study's own seed term instead of the pilot's."
    )


def _answer(e: dict, inputs: ReportInputs, report: dict) -> dict:
    """One variant's answer: its difference from the baseline and how often it wins a scene, then the decision."""
    config = inputs.config
    h, baseline = report["primary_horizon"], config.baseline_arm
    differences = {m: _against_baseline(report, e["variant"], baseline, m) for m in ("regret", "mae")}
    wins = {}
    for metric in ("regret", "mae"):
        table_ = np.stack(
            [inputs.at_h(e["variant"], s, metric) - inputs.at_h(baseline, s, metric) for s in config.seeds]
        )
        wins[metric] = probability_of_improvement(
            table_,
            confidence=config.bootstrap.confidence,
            n_resamples=config.bootstrap.resamples,
            rng_seed=config.bootstrap.seed,
        ).as_dict()
    parts = []
    for metric, name in (("regret", f"regret_{h}"), ("mae", f"MAE_{h}")):
        d = differences[metric]
        if d is not None:
            parts.append(f"{name} {_interval(d, _unit(report))}")
    confidence = config.bootstrap.confidence
    against = (
        f"against `{baseline}`: " + ", ".join(parts) + f" (variant minus baseline, seeds pooled, {confidence:.0%} "
        "two-sided; below 0 is better)"
        if parts
        else f"not compared with `{baseline}` directly"
    )
    won = wins["regret"]
    scenes = (
        f"; it has the lower regret_{h} on {won['estimate']:.0%} of scenes [{won['low']:.0%}, {won['high']:.0%}]"
        if won["low"] is not None and won["high"] is not None
        else f"; it has the lower regret_{h} on {won['estimate']:.0%} of scenes"
    )
    why = _why(e, config, _unit(report))
    if e["decision"] == "undecided":
        why += _next_step((inputs.freeze.get("preparation") or {}).get("plan"), e["variant"], _unit(report))
    return {
        "decision": e["decision"],
        "why": why,
        "against_baseline": differences,
        "probability_of_improvement": wins,
        "text": f"`{e['variant']}` {against}{scenes}. By the pre-registered rule: **{e['decision']}**: {why}."
        + _variance_sentence(e, _unit(report))
        + _seed_check_sentence(report, e, baseline),
    }


def _profile(inputs: ReportInputs, variant: str) -> list[float]:
    """The variant's seed-averaged per-scene regret_H minus the baseline's, sorted (the figure's curve)."""
    config = inputs.config
    pooled = np.mean(
        [inputs.at_h(variant, s, "regret") - inputs.at_h(config.baseline_arm, s, "regret") for s in config.seeds],
        axis=0,
    )
    return [float(v) for v in np.sort(pooled)]


def build(inputs: ReportInputs, report: dict) -> None:
    """The researcher's question first: each variant's decision; then each arm's make-up and cost."""
    report["question"] = [
        {
            "variant": e["variant"],
            "decision": e["decision"],
            "per_seed": {s: d["decision"] for s, d in e["per_seed"].items()},
            "seeds_agree": e["seeds_agree"],
            "mde_d_reg": e["pooled_margins"]["D_reg"]["mde"],
            "mde_d_mae": e["pooled_margins"]["D_mae"]["mde"],
            "dominant": {m: _dominant(e["pooled_margins"][m]) for m in ("D_reg", "D_mae")},
            "answer": _answer(e, inputs, report),
            "regret_profile": _profile(inputs, e["variant"]),
        }
        for e in report["retention"]
    ]
    report["family"] = []
    for a in inputs.freeze["arms"]:
        cells = [c for c in report["cells"] if c["arm"] == a["arm"]]
        walls = [c["wall_seconds"] for c in cells if c.get("wall_seconds")]
        report["family"].append(
            {
                "arm": a["arm"],
                "role": a["role"],
                "builder": a.get("builder", "qhlab"),
                "source_sha256": (a.get("source") or {}).get("sha256"),
                "architecture": {
                    k: v for k, v in a["architecture"].items() if k not in ("arm", "builder", "source_sha256")
                },
                "parameters": (a.get("contract") or {}).get("parameters"),
                "mean_cell_wall_seconds": float(np.mean(walls)) if walls else None,
                "updates_per_second": (
                    float(np.mean([c["observed_updates"] / c["wall_seconds"] for c in cells if c.get("wall_seconds")]))
                    if walls
                    else None
                ),
            }
        )
    report["summary"]["question"] = {q["variant"]: q["decision"] for q in report["question"]}


def markdown(report: dict) -> list[str]:
    level = f"{report['bootstrap']['confidence']:.0%}"
    lines = ["## The answer: is each variant better than the baseline?", ""]
    lines += [f"- {q['answer']['text']}" for q in report["question"]]
    lines += [
        "",
        "Each variant's decision is one of "
        + ", ".join(f"**{d}**" for d in ANSWER_DECISIONS)
        + f": the pre-registered margins D_reg and D_mae, pooled over both seeds, read on {level} intervals that "
        "carry the fits' own noise: retained when both lie at or below 0, not retained when one lies above 0. "
        f"The MDE is the smallest margin the study detects with 80% power in a two-sided {level} test, defined so "
        "for every comparison and margin of the report. The share of scenes counts a tie as half; its interval "
        "is over scenes only. `regret_profile.png` draws each variant's per-scene regret against the baseline's.",
        "",
        "## How each seed reads the rule",
        "",
    ]
    for q in report["question"]:
        seeds = ", ".join(f"seed {s} {d}" for s, d in q["per_seed"].items())
        agree = "" if q["seeds_agree"] else "; the seeds read it differently"
        lines.append(
            f"- `{q['variant']}`: {seeds}{agree}; the study, both seeds pooled: {q['decision']} (MDE D_reg "
            f"{q['mde_d_reg']:.4f}{_unit(report)}, D_mae {q['mde_d_mae']:.4f}{_unit(report)})."
        )
    rows = [
        [
            f["arm"],
            f["role"],
            "built-in" if f["builder"] == "qhlab" else f"`{f['builder']}`",
            "`" + ", ".join(f"{k}={v}" for k, v in dotted(f["architecture"]).items()) + "`",
            "-" if f["parameters"] is None else f"{f['parameters']:,}",
            "-" if f["mean_cell_wall_seconds"] is None else f"{f['mean_cell_wall_seconds']:.1f}",
            "-" if f["updates_per_second"] is None else f"{f['updates_per_second']:.1f}",
        ]
        for f in report["family"]
    ]
    return lines + [
        "",
        "### The family",
        "",
        *table(["arm", "role", "builder", "architecture", "parameters / member", "wall s / cell", "updates / s"], rows),
        "",
        "Wall time is the fit's, learning-curve evaluations included, averaged over seeds.",
        *(
            [
                "A user arm's architecture is what its builder receives (`ArchitectureConfig`); the builder "
                "decides which of those fields it reads, and its parameter count is that of the module it built.",
            ]
            if any(f["builder"] != "qhlab" for f in report["family"])
            else []
        ),
        "",
    ]


def tables(report: dict) -> Tables:
    rows = [
        [f["arm"], f["role"], f["builder"], f["parameters"], f["mean_cell_wall_seconds"], f["updates_per_second"]]
        for f in report["family"]
    ]
    return {"family": (["arm", "role", "builder", "parameters", "wall_seconds", "updates_per_second"], rows)}
