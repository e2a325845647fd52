"""The report's lead section: the answer to the researcher's question, then the family.

Owns: each variant's answer (its seed-pooled difference from the baseline, then the
pre-registered rule's decision in one of ``ANSWER_DECISIONS``, with why), how the rule read each
seed, and the family table (each arm's make-up, parameter count and cost): the ``question`` and
``family`` fields of ``report.json`` and their markdown and W&B table. Does not own: the
statistics it reads (the ``retention`` and ``replication`` entries that the report's earlier
sections wrote: ``report``, ``seed_aware``) or writing the files (``render``).
"""

from __future__ import annotations

import numpy as np

from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.statistics.bootstrap import MIN_SCENES_FOR_ROBUST
from qhlab.study.render import table
from qhlab.study.sections import ReportInputs, Tables

__all__ = ["ANSWER_DECISIONS", "build", "markdown", "tables"]


def _why_inconclusive(entry: dict, n_scenes: int) -> str | None:
    """Why a variant's decision is not replicated or not robust, in words (None: it is replicated)."""
    if entry["replication"] == "replicated":
        return None
    reasons = []
    if n_scenes < MIN_SCENES_FOR_ROBUST:
        reasons.append(f"only {n_scenes} validation scenes (fewer than {MIN_SCENES_FOR_ROBUST})")
    if entry["verdict"] == "not replicated":
        reasons.append("the seeds decide differently")
    for name, margin in entry["pooled_margins"].items():
        low, high = margin["low"], margin["high"]
        if (low is None or low <= 0) and (high is None or high >= 0):
            reasons.append(
                f"the pooled {name} {margin['estimate']:+.4f} m has an interval that includes 0 "
                f"(MDE {margin['mde']:.4f} m)"
            )
    return "; ".join(reasons) or "a seed's decision is not robust"


ANSWER_DECISIONS = ("retained", "not retained", "undecided")
"""The words the answer gives a variant: none of them can contradict another."""


def _decision(entry: dict, config: QhArchitectureStudyConfig, n_scenes: int) -> tuple[str, str]:
    """A variant's decision in plain words, and why: the pre-registered rule's verdict, made one.

    "retained" and "not retained" are a rule's verdict that both seeds reached and the study's
    scenes and seeds confirm; anything else is "undecided", with its reason.
    """
    margins = entry["pooled_margins"]
    mde = f"MDE D_reg {margins['D_reg']['mde']:.4f} m, D_mae {margins['D_mae']['mde']:.4f} m"
    if entry["replication"] == "replicated" and entry["verdict"] == "retained":
        return "retained", (
            f"its regret_H is below {config.regret_fraction:g} x `{entry['structural_control']}`'s and its "
            f"MAE_H below {config.mae_fraction:g} x `{entry['matched_control']}`'s, on every seed"
        )
    if entry["replication"] == "replicated" and entry["verdict"] == "rejected":
        failing = []
        if margins["D_reg"]["estimate"] > 0:
            failing.append(
                f"its regret_H is not below {config.regret_fraction:g} x `{entry['structural_control']}`'s "
                f"(D_reg {margins['D_reg']['estimate']:+.4f} m)"
            )
        if margins["D_mae"]["estimate"] > 0:
            failing.append(
                f"its MAE_H is not below {config.mae_fraction:g} x `{entry['matched_control']}`'s "
                f"(D_mae {margins['D_mae']['estimate']:+.4f} m)"
            )
        return "not retained", " and ".join(failing) or "a margin fails on every seed"
    scenes = f"only {n_scenes} validation scenes; " if n_scenes < MIN_SCENES_FOR_ROBUST else ""
    if entry["verdict"] == "not replicated":
        return "undecided", f"{scenes}its seeds disagree ({mde})"
    return "undecided", f"{scenes}the study could not tell a difference this small from noise ({mde})"


def _against_baseline(report: dict, variant: str, baseline: str, metric: str) -> dict | None:
    """The seed-pooled (variant minus baseline) difference of ``metric`` at H, or None if not compared."""
    for row in report.get("replication", []):
        if row["metric"] == metric and {row["arm"], row["against"]} == {variant, baseline}:
            pooled = row["pooled"]
            sign = 1.0 if row["arm"] == variant else -1.0
            low, high = (pooled["low"], pooled["high"]) if sign > 0 else (-pooled["high"], -pooled["low"])
            return {"estimate": sign * pooled["estimate"], "low": low, "high": high, "confidence": pooled["confidence"]}
    return None


def _answer(e: dict, config: QhArchitectureStudyConfig, report: dict) -> dict:
    """One variant's answer: its seed-pooled difference from the baseline, then the rule's decision."""
    h, baseline = report["primary_horizon"], config.baseline_arm
    decision, why = _decision(e, config, report["n_scenes"])
    differences = {m: _against_baseline(report, e["variant"], baseline, m) for m in ("regret", "mae")}
    parts = []
    for metric, name in (("regret", f"regret_{h}"), ("mae", f"MAE_{h}")):
        d = differences[metric]
        if d is not None:
            parts.append(f"{name} {d['estimate']:+.4f} m [{d['low']:+.4f}, {d['high']:+.4f}]")
    confidence = next((d["confidence"] for d in differences.values() if d is not None), None)
    against = (
        f"against `{baseline}`: " + ", ".join(parts) + f" (variant minus baseline, seeds pooled, {confidence:.0%} "
        "two-sided; below 0 is better)"
        if parts
        else f"not compared with `{baseline}` directly"
    )
    return {
        "decision": decision,
        "why": why,
        "against_baseline": differences,
        "text": f"`{e['variant']}` {against}. By the pre-registered rule: **{decision}**: {why}.",
    }


def build(inputs: ReportInputs, report: dict) -> None:
    """The researcher's question first: each variant's verdict; then each arm's make-up and cost."""
    report["question"] = [
        {
            "variant": e["variant"],
            "verdict": e["verdict"],
            "replication": e["replication"],
            "mde_d_reg": e["pooled_margins"]["D_reg"]["mde"],
            "mde_d_mae": e["pooled_margins"]["D_mae"]["mde"],
            "why_inconclusive": _why_inconclusive(e, report["n_scenes"]),
            "answer": _answer(e, inputs.config, report),
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
    report["summary"]["question"] = {q["variant"]: q["verdict"] for q in report["question"]}


def markdown(report: dict) -> list[str]:
    lines = ["## The answer: is each variant better than the baseline?", ""]
    lines += [f"- {q['answer']['text']}" for q in report["question"]]
    lines += [
        "",
        "Each variant's decision is one of "
        + ", ".join(f"**{d}**" for d in ANSWER_DECISIONS)
        + ": retained or not retained only when both seeds reach the rule's verdict and the "
        "study's scenes and seeds confirm it. The MDE is the smallest margin the study detects "
        f"with 80% power in a two-sided {report['bootstrap']['confidence']:.0%} test, defined so for every "
        "comparison and margin of the report.",
        "",
        "## How the rule read each seed",
        "",
    ]
    seeds_say = {
        "retained": "each seed's point estimates retain it",
        "rejected": "each seed's point estimates reject it",
        "not replicated": "the seeds' point estimates differ",
    }
    for q in report["question"]:
        why = f"; {q['replication']} because {q['why_inconclusive']}" if q["why_inconclusive"] else ""
        lines.append(
            f"- `{q['variant']}`: {seeds_say[q['verdict']]} ({q['replication']}); MDE D_reg "
            f"{q['mde_d_reg']:.4f} m, D_mae {q['mde_d_mae']:.4f} m{why}."
        )
    rows = [
        [
            f["arm"],
            f["role"],
            "built-in" if f["builder"] == "qhlab" else f"`{f['builder']}`",
            "`" + ", ".join(f"{k}={v}" for k, v in _flat(f["architecture"]).items()) + "`",
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


def _flat(mapping: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def tables(report: dict) -> Tables:
    rows = [
        [f["arm"], f["role"], f["builder"], f["parameters"], f["mean_cell_wall_seconds"], f["updates_per_second"]]
        for f in report["family"]
    ]
    return {"family": (["arm", "role", "builder", "parameters", "wall_seconds", "updates_per_second"], rows)}
