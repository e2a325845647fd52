"""The report's "How this study was prepared" section, read from the freeze body alone.

Owns: ``build`` (``report["preparation"]``: the tuning, pilot, E0 check and plan summaries the
freeze bound, and the config's typed ``[seed_variance]``), ``markdown`` and ``tables``. Does not
own: binding or checking the records (``qhlab.study.preparation``, at freeze) or the records
themselves (``qhlab.design``).
"""

from __future__ import annotations

from typing import Any

from qhlab.design.pilot_record import fits_words
from qhlab.report.render import fmt, table

__all__ = ["build", "markdown", "tables"]


def build(inputs: Any, report: dict) -> None:
    """The report's "How this study was prepared" fields, from the freeze body only.

    Adds ``report["preparation"]``: ``{"tuning": the freeze's tuning summary or None, "pilot":
    the freeze's pilot summary or None, "typed_seed_variance": the config's ``[seed_variance]``
    with its source text, or None}``.
    """
    prepared = inputs.freeze.get("preparation") or {}
    typed = inputs.config.seed_variance
    report["preparation"] = {
        "tuning": prepared.get("tuning"),
        "pilot": prepared.get("pilot"),
        "e0": prepared.get("e0"),
        "plan": prepared.get("plan"),
        "typed_seed_variance": None if typed is None else typed.model_dump(mode="json"),
    }
    report["summary"]["recipe_recorded"] = prepared.get("tuning") is not None
    report["summary"]["pilot_recorded"] = prepared.get("pilot") is not None
    report["summary"]["e0_check_recorded"] = prepared.get("e0") is not None
    report["summary"]["plan_recorded"] = prepared.get("plan") is not None


def markdown(report: dict) -> list[str]:
    """The section's lines of ``report.md``."""
    prepared = report["preparation"]
    unit = f" {report['unit']}" if report["unit"] else ""
    tuning, pilot, typed = prepared["tuning"], prepared["pilot"], prepared["typed_seed_variance"]
    lines = ["", "## How this study was prepared", ""]
    lines += _tuning_lines(tuning, unit)
    lines.append("")
    lines += _pilot_lines(pilot, typed, unit)
    lines += _seed_check_line((report.get("summary") or {}).get("seed_check"))
    return lines + [""] + _plan_lines(prepared.get("plan"), unit) + _e0_lines(prepared.get("e0"), unit)


def _seed_check_line(check: dict | None) -> list[str]:
    """One line: the study's own seeds against the pilot's seed components (``summary["seed_check"]``;
    empty without a pilot)."""
    if check is None:
        return []
    rows = check["contradicted_rows"]
    found = (
        "consistent with the pilot on every row"
        if not rows
        else "they contradict it on "
        + "; ".join(
            f"{r['row']} (F {r['statistic']:.3g} on {r['dof_observed']} and {r['dof_predicted']:.1f} dof, "
            f"p {r['p_value']:.3g})"
            for r in rows
        )
        + ", whose intervals carry the study's own seed term instead"
    )
    return [
        "",
        f"The study's own seeds checked the pilot's seed component of each of its {check['rows']} rows (the "
        f"spread of their seed means against the pilot's prediction, an F test, p < {check['threshold']:g}): "
        f"{found}; family p {check['family_p']:.3g} (Bonferroni over the rows, which share arms), "
        f"{check['verdict']}. The TRAIN-draw component is not checked: the study fits one draw.",
    ]


def _tuning_lines(tuning: dict | None, unit: str) -> list[str]:
    """The recipe's paragraph, bullets and trials table (one sentence without a tuning record)."""
    if tuning is None:
        return [
            "The recipe is unrecorded: this study names no tuning record (`[preparation] tuning`), so "
            "nothing shows how its recipe was chosen or on which population."
        ]
    winner, objective = tuning["winner"], tuning["objective"]
    pops = tuning["populations"]
    lines = [
        f"The recipe is the winner of tuning `{tuning['name']}` (record sha256 `{tuning['record_sha256'][:16]}`, "
        f"config sha256 `{tuning['config_sha256'][:16]}`), bound by the freeze and copied into "
        f"`{tuning['copy']}/`.",
        "",
        "- Tuning population: "
        + "; ".join(
            f"{role} {p['preset']} seed {p['seed']} (manifest `{p['manifest_sha256'][:16]}`)"
            for role, p in sorted(pops.items())
        )
        + ".",
        (
            f"- Objective: the largest planned MDE of the study's retention margins (every arm fitted with "
            f"seeds {objective['seeds']}; the paired seed effect each margin carries); band "
            if objective["metric"] == "mde"
            else f"- Objective: mean {objective['metric']}_H over fit seeds {objective['seeds']}; band "
        )
        + f"{objective['band']}{unit}; max seed sd "
        + ("none" if objective["max_seed_sd"] is None else f"{objective['max_seed_sd']}{unit}")
        + "; max cost "
        + ("none" if objective["max_cost"] is None else f"{objective['max_cost']} (updates x members)")
        + ".",
        f"- Rule: {tuning['rule']}.",
        f"- Winner: trial {winner['number'] + 1}, mean {fmt(winner['mean'])}, margin over the runner-up "
        f"{fmt(winner['margin'])}{unit}; deviations used: {', '.join(tuning['deviations']['used']) or 'none'}.",
        "",
    ]
    rows = [
        [
            t["number"] + 1,
            "`" + ", ".join(f"{k}={fmt(v, 5)}" for k, v in sorted(t["params"].items())) + "`",
            t["state"],
            fmt(t["mean"]),
            fmt(t["seed_sd"]),
            t["cost"],
        ]
        for t in tuning["trials"]
    ]
    score = "planned MDE" if objective["metric"] == "mde" else "mean"
    lines += table(["trial", "parameters", "state", score, "seed sd", "cost"], rows)
    if sum(t["state"] == "complete" for t in tuning["trials"]) >= 2:
        lines += [
            "",
            "Figures: `tuning_history.png` (each trial's objective and the best so far) and "
            "`tuning_importances.png` (each searched field's importance, Optuna's fANOVA over the "
            "complete trials: with few trials, a coarse reading).",
        ]
    return lines


def _pilot_lines(pilot: dict | None, typed: dict | None, unit: str) -> list[str]:
    """The fits' noise: the pilot record's paragraph and components table, else the typed
    ``[seed_variance]`` sentence, else the sentence that the pilot is unrecorded."""
    if pilot is not None:
        pops = pilot["populations"]
        layout = pilot["layout"]
        draws = ", ".join(f"{d['draw']} (seeds {', '.join(str(x) for x in d['seeds'])})" for d in layout)
        lines = [
            f"The fits' noise is the pilot record `{pilot['name']}` (record sha256 "
            f"`{pilot['record_sha256'][:16]}`), bound by the freeze and copied into `{pilot['copy']}/`: every arm "
            f"fitted on {len(layout)} TRAIN draw{'s' if len(layout) != 1 else ''} of {pops['train']['preset']} "
            f"({draws}; each seed on one draw), scored on {pops['validation']['preset']} seed "
            f"{pops['validation']['seed']} (manifest `{pops['validation']['manifest_sha256'][:16]}`); "
            f"{fits_words(pilot['fits'], sum(len(d['seeds']) for d in layout), len(layout))}.",
            "",
            "Each comparison's interval carries its own components, estimated from every pilot fit of that "
            "comparison (a nested analysis of variance: within and between TRAIN draws), never another row's: "
            "tau is the seed effect of the paired difference, omega the TRAIN-draw effect (both shown clamped at "
            "0; the intervals use the unbiased estimates), dof the degrees of freedom within and between draws."
            + ("" if len(layout) > 1 else " With one TRAIN draw, no interval carries the TRAIN draw."),
            "",
        ]
        rows = [
            [c["arm"], c["against"], *_noise_cells(c["noise"]["regret"]), *_noise_cells(c["noise"]["mae"])]
            for c in pilot["comparisons"]
        ]
        rows += [
            [m["variant"], "retention margins", *_noise_cells(m["noise"]["regret"]), *_noise_cells(m["noise"]["mae"])]
            for m in pilot["margins"]
        ]
        first = next((c["noise"]["regret"] for c in pilot["comparisons"] + pilot["margins"]), None)
        lines += table(["arm", "against", "tau regret", "omega regret", "tau MAE", "omega MAE"], rows)
        if first is not None:
            lines += [
                "",
                f"Degrees of freedom: {first['dof_within']} within draws, {first['dof_between']} between draws "
                f"(margins: D_reg as regret, D_mae as MAE).",
            ]
        return lines
    if typed is not None:
        return [
            f"The pilot's seed variance (tau regret {typed['regret']:.5f}{unit}, MAE {typed['mae']:.5f}{unit}, "
            f"{typed['seeds']} seeds) was typed into `[seed_variance]`; its source: {typed['source']}. "
            "It is not a record the freeze could check, and the intervals do not carry the TRAIN draw."
        ]
    return [
        "The pilot is unrecorded: the intervals estimate the training-seed variance from the study's "
        "own two seeds (one degree of freedom) and do not carry the TRAIN draw, so they are too wide to "
        "decide anything but a very large effect. `qhlab pilot` measures each comparison's components on a "
        "tuning population; `[preparation] pilot` binds its record."
    ]


def _noise_cells(noise: dict) -> list[str]:
    """One metric's tau and omega cells of the components table (omega "-" where the record has none)."""
    return [fmt(noise["tau"], 5), "-" if noise["omega"] is None else fmt(noise["omega"], 5)]


def _plan_lines(plan: dict | None, unit: str) -> list[str]:
    """The power plan's paragraph (empty without a plan); ``unit`` follows each MDE (" m", or "")."""
    if plan is None:
        return []
    planned, target, chosen = plan["planned"], plan["target"], plan["chosen"]
    choice = (
        "no design it weighed reaches the target"
        if chosen is None
        else f"the cheapest design that reaches it is the {chosen['recipe']} recipe with {chosen['validation_scenes']} "
        f"validation scenes ({chosen['cost']['seconds']:.0f} CPU s)"
    )
    return [
        f"The power plan `{plan['name']}` (record sha256 `{plan['record_sha256'][:16]}`, copied into "
        f"`{plan['copy']}/`) predicted this design's MDEs from the pilot alone, before any of the study's fits: "
        f"largest D_reg {fmt(planned['largest']['D_reg'])}{unit}, D_mae {fmt(planned['largest']['D_mae'])}{unit}, "
        f"against a target of {fmt(target['d_reg'])}{unit} and {fmt(target['d_mae'])}{unit}; {choice}. The tables "
        "above set each planned MDE beside the one the study achieved.",
        "",
    ]


def _e0_lines(e0: dict | None, unit: str) -> list[str]:
    """The E0 check's paragraph and table (the section's last part); ``unit`` as ``_plan_lines``'s."""
    if e0 is None:
        return [
            "The E0 gate's margins are unchecked: this study names no E0 check record (`[preparation] e0`), so "
            "nothing shows how often its gate passes on fresh TRAIN draws.",
            "",
        ]
    gate = e0["gate"]
    lines = [
        f"The E0 gate (canary_updates {gate['canary_updates']}, canary_gap_multiple "
        f"{gate['canary_gap_multiple']:g}, tie_band {gate['tie_band']:g}{unit}, canary seeds {gate['seeds']}) "
        f"was run by E0 check `{e0['name']}` (record sha256 `{e0['record_sha256'][:16]}`, copied into "
        f"`{e0['copy']}/`) on {e0['draws']} fresh TRAIN draws the study never trains on: {e0['passed']} of "
        f"{e0['draws']} passed (share {e0['pass_share']:.2f}; the check required {e0['min_pass_share']}).",
        "",
    ]
    rows = [
        [
            o["train_seed"],
            "passed" if o["passed"] else "FAILED",
            "-" if o["state_id"] is None else o["state_id"],
            "-" if o["min_gap"] is None else fmt(o["min_gap"], 4),
        ]
        for o in e0["outcomes"]
    ]
    gap = f"smallest label gap ({unit.strip()})" if unit else "smallest label gap"
    return lines + table(["TRAIN seed", "E0", "canary row (state_id)", gap], rows) + [""]


def tables(report: dict) -> dict:
    """The W&B tables of the tuning's trials and the pilot's components (each absent without its record)."""
    tuning, pilot = report["preparation"]["tuning"], report["preparation"]["pilot"]
    e0 = report["preparation"].get("e0")
    out = {}
    if e0 is not None:
        out["preparation_e0"] = (
            ["train_seed", "passed", "state_id", "min_gap"],
            [[o["train_seed"], o["passed"], o["state_id"], o["min_gap"]] for o in e0["outcomes"]],
        )
    if tuning is not None:
        rows = [
            [t["number"] + 1, str(sorted(t["params"].items())), t["state"], t["mean"], t["seed_sd"], t["cost"]]
            for t in tuning["trials"]
        ]
        out["preparation_trials"] = (["trial", "params", "state", "mean", "seed_sd", "cost"], rows)
    if pilot is not None:

        def row(entry: dict) -> list:
            return [entry["noise"][m][k] for m in ("regret", "mae") for k in ("tau", "omega")]

        rows = [[c["arm"], c["against"], *row(c)] for c in pilot["comparisons"]]
        rows += [[m["variant"], "retention margins", *row(m)] for m in pilot["margins"]]
        out["preparation_pilot"] = (
            ["arm", "against", "tau_regret", "omega_regret", "tau_mae", "omega_mae"],
            rows,
        )
    return out
