"""How the study was prepared: the freeze binds the tuning, pilot and E0 check records it names.

Owns: ``check_preparation`` (at freeze, before anything is written: authenticate and recompute a
``qhlab tune`` record, a ``qhlab pilot`` record and a ``qhlab e0-check`` record; refuse a recipe
other than the tuning's winner outside its declared deviations, a pilot of another study design, a
typed ``[seed_variance]`` other than the pilot's, a tuning or pilot population that is the study's
validation, and an E0 check of another gate, one that fell short of its minimum pass share or one
that gated the study's own TRAIN seed), ``copy_preparation`` (the records' copies inside the study,
which the freeze receipt binds), ``refuse_tuned_scenes`` (at development: no sealed validation scene
may be a tuning or pilot scene, by physical content), ``frozen_pilot`` (the seed and TRAIN-draw
variance the report's intervals carry) and the report's section. Does not own: the records
themselves (``qhlab.design.tuning_record``, ``qhlab.design.pilot_record``,
``qhlab.design.e0_record``) or the freeze (``freeze``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qhlab.design import e0_record as e0_record
from qhlab.design import pilot_record as pilot_record
from qhlab.design import tuning_record as tuning_record
from qhlab.design.e0_config import e0_design
from qhlab.design.pilot_config import study_design
from qhlab.design.study_config import QhArchitectureStudyConfig
from qhlab.design.tuning_record import CONFIG_COPY, RECEIPT, RECIPE, RECORD
from qhlab.evidence import PublishConflictError, differing_keys, input_error, publish_bytes, sha256_file
from qhlab.evidence.layout import PREPARATION_DIR
from qhlab.study.render import fmt, table

__all__ = ["check_preparation", "copy_preparation", "frozen_pilot", "refuse_tuned_scenes"]
_CALL = "freeze_study"
# Recipe fields that are the study's own, never compared with the tuning's winner.
_STUDY_FIELDS = ("name", "seed", "data", "accelerator", "devices", "precision")


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {} if value is None else {prefix[:-1]: value}


def _compared(recipe: dict) -> dict[str, Any]:
    return _flat({k: v for k, v in recipe.items() if k not in _STUDY_FIELDS})


def _copy_into(source: Path, target: Path) -> None:
    """Publish ``source``'s bytes at ``target``; a killed freeze's identical copy stays."""
    data = source.read_bytes()
    try:
        publish_bytes(target, data)
    except PublishConflictError:
        if target.read_bytes() != data:
            raise


def _checked_record(field: str, module: Any, record_path: Path, what: str, command: str) -> tuple[Path, dict, dict]:
    """The record a ``[preparation]`` field names: its directory, the record (authenticated) and
    ``module.check_record``'s result (every value recomputed), after its file name is checked."""
    if record_path.name != module.RECORD:
        raise input_error(
            _CALL,
            field,
            str(record_path),
            f"the path of {what}'s {module.RECORD}",
            f"name the {module.RECORD} that `{command}` wrote",
        )
    source = record_path.parent
    return source, module.read_record(source), module.check_record(source)


def _bound(kind: str, module: Any, record_path: Path, record: dict) -> dict[str, Any]:
    """What the freeze binds of every preparation record: where it was, where its copy goes, the
    digests of the record and its receipt, its name and its config's digest."""
    source = record_path.parent
    return {
        "source": str(record_path.resolve()),
        "copy": f"{PREPARATION_DIR}/{kind}",
        "record_sha256": sha256_file(source / module.RECORD),
        "receipt_sha256": sha256_file(source / module.RECEIPT),
        "name": record["name"],
        "config_sha256": record["config_sha256"],
    }


def check_preparation(
    config: QhArchitectureStudyConfig, sources: dict[str, str] | None = None
) -> tuple[dict | None, dict[str, Path]]:
    """Check the study against its tuning and pilot records; nothing is written.

    Args:
        config: the study config (``preparation.tuning`` names a ``tuning.json``,
            ``preparation.pilot`` a ``pilot.json``, ``preparation.e0`` an ``e0.json``).
        sources: ``{arm: sha256}`` of the user arms' sources (a pilot binds the versions it fit).

    Returns:
        (the freeze body's ``preparation`` record ``{"tuning", "pilot", "e0"}``, each None when
        not named, or None without any; ``{"tuning"|"pilot"|"e0": the record's directory}``, for
        ``copy_preparation``).

    Raises:
        EvidenceError: a record does not authenticate, or its values do not recompute.
        QhInputError: the study's recipe is not the tuning's winner outside the declared
            deviations, the pilot measured another study design, a typed ``[seed_variance]``
            is not the pilot's, a tuning or pilot population is the study's validation, or the E0
            check ran another gate, fell short of its minimum pass share or gated the study's TRAIN.
    """
    preparation = config.preparation
    if preparation is None or (preparation.tuning is None and preparation.pilot is None and preparation.e0 is None):
        return None, {}
    body, found = {"tuning": None, "pilot": None, "e0": None}, {}
    if preparation.tuning is not None:
        body["tuning"], found["tuning"] = _check_tuning(config, Path(preparation.tuning))
    if preparation.pilot is not None:
        body["pilot"], found["pilot"] = _check_pilot(config, Path(preparation.pilot), sources)
    if preparation.e0 is not None:
        body["e0"], found["e0"] = _check_e0(config, Path(preparation.e0))
    return body, found


def _check_tuning(config: QhArchitectureStudyConfig, record_path: Path) -> tuple[dict, Path]:
    source, record, checked = _checked_record(
        "preparation.tuning", tuning_record, record_path, "a tuning", "qhlab tune"
    )
    winner = record["winner"]
    if winner["number"] is None:
        raise input_error(
            _CALL,
            "preparation.tuning",
            str(record_path),
            "a tuning record with a winner",
            "this tuning found no admissible trial; tune again or drop [preparation]",
        )
    study = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
    ours, theirs = _compared(study), _compared(winner["recipe"])
    differing = differing_keys(ours, theirs)
    undeclared = [k for k in differing if k not in record["deviations"]]
    if undeclared:
        shown = ", ".join(f"{k}={ours.get(k)!r} (winner {theirs.get(k)!r})" for k in undeclared)
        raise input_error(
            _CALL,
            "experiment.recipe",
            shown,
            f"the tuning winner's values (trial {winner['number'] + 1} of {record_path}), except its "
            f"declared deviations ({', '.join(record['deviations']) or 'none'})",
            f"set experiment.recipe = {str(source / RECIPE)!r}, or tune again",
        )
    _refuse_tuning_validation(config, record, record_path)
    return {
        **_bound("tuning", tuning_record, record_path, record),
        "objective": record["objective"],
        "rule": record["rule"],
        "trials": [
            {k: t[k] for k in ("number", "params", "state", "reason", "mean", "seed_sd", "cost")}
            for t in record["trials"]
        ],
        "winner": {k: winner[k] for k in ("number", "params", "mean", "margin", "tied")},
        "deviations": {"declared": record["deviations"], "used": differing},
        "populations": {
            role: {k: p.get(k) for k in ("preset", "split", "seed", "manifest_sha256")}
            for role, p in record["populations"].items()
        },
        "fits_recomputed": checked["fits_recomputed"],
        "optuna": record["optuna"],
        "space": record["config"]["space"],
    }, source


def _check_pilot(
    config: QhArchitectureStudyConfig, record_path: Path, sources: dict[str, str] | None
) -> tuple[dict, Path]:
    source, record, checked = _checked_record("preparation.pilot", pilot_record, record_path, "a pilot", "qhlab pilot")
    differing = differing_keys(study_design(config, sources), record["design"])
    if differing:
        raise input_error(
            _CALL,
            "preparation.pilot",
            str(record_path),
            f"a pilot of this study's design (it differs in {', '.join(differing)})",
            "a pilot's variance belongs to the arms, recipe, budget and fractions it fitted; run "
            "`qhlab pilot` again for this design",
        )
    _refuse_other_presets(config, record, record_path)
    shared = sorted(set(record["config"]["seeds"]) & set(config.seeds))
    if shared:
        raise input_error(
            _CALL,
            "seeds",
            list(config.seeds),
            f"seeds the pilot did not fit (it fitted {shared})",
            "a pilot measures the seed variance on seeds the study does not report; run the pilot with other seeds",
        )
    seed_variance = record["seed_variance"]
    typed = config.seed_variance
    if typed is not None and (
        typed.seeds != seed_variance["seeds"]
        or any(round(seed_variance[m], 5) != round(getattr(typed, m), 5) for m in ("regret", "mae"))
    ):
        raise input_error(
            _CALL,
            "seed_variance",
            typed.model_dump(mode="json", exclude={"source"}),
            f"the pilot record's values (regret {seed_variance['regret']:.5f}, mae "
            f"{seed_variance['mae']:.5f}, seeds {seed_variance['seeds']}; {record_path})",
            "drop [seed_variance]: a study that names a pilot record reads it from there",
        )
    _refuse_tuning_validation(config, record, record_path)
    return {
        **_bound("pilot", pilot_record, record_path, record),
        "seeds": record["config"]["seeds"],
        "draws": record["draws"],
        "draw_seeds": record["draw_seeds"],
        "seed_variance": seed_variance,
        "train_draw": record["train_draw"],
        "comparisons": record["comparisons"],
        "margins": record["margins"],
        "populations": {
            role: {k: p.get(k) for k in ("preset", "split", "seed", "manifest_sha256")}
            for role, p in record["populations"].items()
        },
        "fits": checked["fits"],
        "fits_recomputed": checked["fits_recomputed"],
    }, source


def _check_e0(config: QhArchitectureStudyConfig, record_path: Path) -> tuple[dict, Path]:
    source, record, checked = _checked_record("preparation.e0", e0_record, record_path, "an E0 check", "qhlab e0-check")
    differing = differing_keys(e0_design(config), record["design"])
    if differing:
        raise input_error(
            _CALL,
            "preparation.e0",
            str(record_path),
            f"an E0 check of this study's gate (it differs in {', '.join(differing)})",
            "a check holds only for the canary budget, row margin, tie band, seeds, baseline recipe "
            "and lane it ran; run `qhlab e0-check` again for this gate",
        )
    if not record["meets_min_pass_share"]:
        raise input_error(
            _CALL,
            "preparation.e0",
            str(record_path),
            f"an E0 check that reached its minimum pass share (it passed {record['passed']} of "
            f"{record['draws']} draws, share {record['pass_share']:.2f} < {record['min_pass_share']})",
            "the gate fails too often on fresh TRAIN draws; widen canary_gap_multiple or raise "
            "canary_updates, then check again",
        )
    seeds = record["config"]["train_seeds"]
    if config.train.seed in seeds:
        raise input_error(
            _CALL,
            "train.seed",
            config.train.seed,
            f"a TRAIN seed the E0 check did not gate (it gated {seeds})",
            "the check shows the gate holds on draws the study never trains on; check other seeds",
        )
    return {
        **_bound("e0", e0_record, record_path, record),
        "train_seeds": seeds,
        "gate": {k: record["design"][k] for k in ("canary_updates", "canary_gap_multiple", "tie_band", "seeds")},
        "draws": record["draws"],
        "passed": record["passed"],
        "pass_share": record["pass_share"],
        "min_pass_share": record["min_pass_share"],
        "outcomes": [
            {
                "train_seed": o["train_seed"],
                "passed": o["passed"],
                "state_id": None if o["selected"] is None else o["selected"]["state_id"],
                "min_gap": None if o["selected"] is None else min(o["selected"]["gaps"]),
            }
            for o in record["outcomes"]
        ],
        "studies_checked": checked["studies_checked"],
    }, source


def frozen_pilot(config: QhArchitectureStudyConfig, freeze: dict, metric: str) -> dict[str, Any]:
    """``pooled_difference``'s variance arguments for ``metric``: the pilot record's tau and TRAIN-draw
    component, else the typed ``[seed_variance]``'s tau, else none (the study's own seeds).

    Args:
        config: the study config.
        freeze: the freeze receipt's body (its ``preparation``).
        metric: "regret" or "mae".
    """
    pilot = (freeze.get("preparation") or {}).get("pilot")
    if pilot is not None:
        sv, draw = pilot["seed_variance"], pilot["train_draw"]
        out = {
            "seed_sd": float(sv[metric]),
            "seed_sd_dof": int(sv["seeds"]) - 1,
            "seed_sd_source": f"pilot record {pilot['name']} (sha256 {pilot['record_sha256'][:12]}, "
            f"{sv['seeds']} seeds)",
        }
        if draw is not None:
            out.update(draw_sd=float(draw[metric]), draw_sd_dof=float(draw[f"{metric}_dof"]))
        return out
    typed = config.seed_variance
    if typed is None:
        return {}
    return {"seed_sd": float(getattr(typed, metric)), "seed_sd_source": typed.source, "seed_sd_dof": typed.seeds - 1}


def copy_preparation(sources: dict[str, Path], output: Path) -> dict[str, Path]:
    """Copy each checked record into ``output/preparation/<tuning|pilot|e0>/``.

    Returns:
        The copies the freeze receipt binds as outputs, by name.
    """
    names = {
        "tuning": [RECORD, RECEIPT, CONFIG_COPY, RECIPE],
        "pilot": [pilot_record.RECORD, pilot_record.RECEIPT, pilot_record.CONFIG_COPY],
        "e0": [e0_record.RECORD, e0_record.RECEIPT, e0_record.CONFIG_COPY],
    }
    out = {}
    for role, source in sources.items():
        target = output / PREPARATION_DIR / role
        target.mkdir(parents=True, exist_ok=True)
        for name in names[role]:
            _copy_into(source / name, target / name)
            out[f"{PREPARATION_DIR}/{role}/{name}"] = target / name
    return out


def _declared_preset(source: Any) -> str | None:
    """A population source's preset: declared, or read from its manifest when it is a path."""
    if source.preset is not None:
        return source.preset
    manifest = Path(source.path) / "manifest.json"
    if not manifest.is_file():
        return None
    return (json.loads(manifest.read_text(encoding="utf-8")).get("generator") or {}).get("preset")


def _refuse_other_presets(config: QhArchitectureStudyConfig, record: dict, record_path: Path) -> None:
    """Refuse a pilot whose TRAIN or validation population is of another preset than the study's:
    its variance would be another distribution's."""
    for role in ("train", "validation"):
        ours, theirs = _declared_preset(getattr(config, role)), record["populations"][role].get("preset")
        if ours != theirs:
            raise input_error(
                _CALL,
                "preparation.pilot",
                str(record_path),
                f"a pilot whose {role} population is of the study's preset {ours!r} (it is {theirs!r})",
                f"the pilot's variance belongs to the {role} distribution it was measured on",
            )


def _refuse_tuning_validation(config: QhArchitectureStudyConfig, record: dict, record_path: Path) -> None:
    """Refuse a tuning or pilot population that is the study's validation, by preset and seed or by manifest."""
    declared = config.validation
    manifest = None
    if declared.path is not None and (Path(declared.path) / "manifest.json").is_file():
        manifest = sha256_file(Path(declared.path) / "manifest.json")
    for role, population in record["populations"].items():
        same_draw = (
            declared.preset is not None
            and population.get("split") == "validation"
            and population.get("preset") == declared.preset
            and population.get("seed") == declared.seed
        )
        if same_draw or (manifest is not None and population.get("manifest_sha256") == manifest):
            raise input_error(
                _CALL,
                "validation",
                declared.model_dump(mode="json", exclude_none=True),
                f"a population other than the {record['kind'].split('_')[0]}'s {role} population ({record_path})",
                "a study is never scored on the population its recipe was tuned on; declare another validation seed",
            )


def refuse_tuned_scenes(study: Path, preparation: dict | None, validation_path: Path, call: str) -> None:
    """Refuse a sealed validation holding a scene of a tuning or pilot population (by physical content).

    Args:
        study: the study directory (its copies of the records are read).
        preparation: the freeze receipt's ``preparation`` (None when the study has no record).
        validation_path: the validation population being sealed.
        call: the step refusing.
    """
    # Lazy: keeps importing this module free of pyarrow.
    from qhlab.scenes.population import scene_content_digests

    records = []
    for kind, module in (("tuning", tuning_record), ("pilot", pilot_record)):
        summary = (preparation or {}).get(kind)
        if summary is not None:
            records.append((kind, module.read_record(study / summary["copy"])))
    if not records:
        return
    ours = set(scene_content_digests(validation_path).values())
    for kind, record in records:
        for role, population in record["populations"].items():
            shared = ours & set(population.get("scene_digests", []))
            if shared:
                raise input_error(
                    call,
                    "validation",
                    str(validation_path),
                    f"scenes disjoint from the {kind}'s {role} population",
                    f"{len(shared)} of its scenes are {kind} scenes (by physical content); declare "
                    "another validation seed",
                )


# ------------------------------------------------------------------ the report's section


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
        "typed_seed_variance": None if typed is None else typed.model_dump(mode="json"),
    }
    report["summary"]["recipe_recorded"] = prepared.get("tuning") is not None
    report["summary"]["pilot_recorded"] = prepared.get("pilot") is not None
    report["summary"]["e0_check_recorded"] = prepared.get("e0") is not None


def markdown(report: dict) -> list[str]:
    """The section's lines of ``report.md``."""
    prepared = report["preparation"]
    tuning, pilot, typed = prepared["tuning"], prepared["pilot"], prepared["typed_seed_variance"]
    lines = ["", "## How this study was prepared", ""]
    if tuning is None:
        lines.append(
            "The recipe is unrecorded: this study names no tuning record (`[preparation] tuning`), so "
            "nothing shows how its recipe was chosen or on which population."
        )
    else:
        winner, objective = tuning["winner"], tuning["objective"]
        pops = tuning["populations"]
        lines += [
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
            f"- Objective: mean {objective['metric']}_H over fit seeds {objective['seeds']}; band "
            f"{objective['band']} m; max seed sd "
            + ("none" if objective["max_seed_sd"] is None else f"{objective['max_seed_sd']} m")
            + "; max cost "
            + ("none" if objective["max_cost"] is None else f"{objective['max_cost']} (updates x members)")
            + ".",
            f"- Rule: {tuning['rule']}.",
            f"- Winner: trial {winner['number'] + 1}, mean {fmt(winner['mean'])}, margin over the runner-up "
            f"{fmt(winner['margin'])} m; deviations used: {', '.join(tuning['deviations']['used']) or 'none'}.",
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
        lines += table(["trial", "parameters", "state", "mean", "seed sd", "cost"], rows)
        if sum(t["state"] == "complete" for t in tuning["trials"]) >= 2:
            lines += [
                "",
                "Figures: `tuning_history.png` (each trial's objective and the best so far) and "
                "`tuning_importances.png` (each searched field's importance, Optuna's fANOVA over the "
                "complete trials: with few trials, a coarse reading).",
            ]
    lines.append("")
    if pilot is not None:
        sv, draw = pilot["seed_variance"], pilot["train_draw"]
        pops = pilot["populations"]
        lines += [
            f"The seed variance is the pilot record `{pilot['name']}` (record sha256 "
            f"`{pilot['record_sha256'][:16]}`), bound by the freeze and copied into `{pilot['copy']}/`: every arm "
            f"fitted with seeds {pilot['seeds']} on TRAIN {pops['train']['preset']} seed {pops['train']['seed']}"
            + (f", and with seeds {pilot['draw_seeds']} on TRAIN draws {pilot['draws'][1:]}" if draw else "")
            + f", scored on {pops['validation']['preset']} seed {pops['validation']['seed']} (manifest "
            f"`{pops['validation']['manifest_sha256'][:16]}`); {pilot['fits']} fits.",
            "",
            f"- Seed effect tau (largest over comparisons and margins): regret {sv['regret']:.5f} m, MAE "
            f"{sv['mae']:.5f} m ({sv['seeds']} seeds).",
            (
                "- TRAIN-draw effect (largest): "
                + (
                    f"regret {draw['regret']:.5f} m, MAE {draw['mae']:.5f} m "
                    f"({draw['draws']} draws x {draw['seeds_per_draw']} seeds)."
                    if draw
                    else "not measured (the pilot fitted one draw)."
                )
            ),
            "- The seed-pooled intervals below carry: scenes, training seed"
            + (", TRAIN draw." if draw else "; not the TRAIN draw."),
            "",
        ]
        rows = [
            [
                c["arm"],
                c["against"],
                fmt(c["tau"]["regret"], 5),
                fmt(c["tau"]["mae"], 5),
                *((fmt(c["draw_sd"]["regret"], 5), fmt(c["draw_sd"]["mae"], 5)) if c["draw_sd"] else ("-", "-")),
            ]
            for c in pilot["comparisons"]
        ]
        rows += [
            [
                m["variant"],
                "retention margins",
                fmt(m["tau"]["regret"], 5),
                fmt(m["tau"]["mae"], 5),
                *((fmt(m["draw_sd"]["regret"], 5), fmt(m["draw_sd"]["mae"], 5)) if m["draw_sd"] else ("-", "-")),
            ]
            for m in pilot["margins"]
        ]
        lines += table(["arm", "against", "tau regret", "tau MAE", "draw regret", "draw MAE"], rows)
    elif typed is not None:
        lines.append(
            f"The pilot's seed variance (tau regret {typed['regret']:.5f} m, MAE {typed['mae']:.5f} m, "
            f"{typed['seeds']} seeds) was typed into `[seed_variance]`; its source: {typed['source']}. "
            "It is not a record the freeze could check, and the intervals do not carry the TRAIN draw."
        )
    else:
        lines.append(
            "The pilot is unrecorded: the intervals estimate the training-seed variance from the study's "
            "own seeds, and do not carry the TRAIN draw."
        )
    return lines + [""] + _e0_lines(prepared.get("e0"))


def _e0_lines(e0: dict | None) -> list[str]:
    """The E0 check's paragraph and table (the section's last part)."""
    if e0 is None:
        return [
            "The E0 gate's margins are unchecked: this study names no E0 check record (`[preparation] e0`), so "
            "nothing shows how often its gate passes on fresh TRAIN draws.",
            "",
        ]
    gate = e0["gate"]
    lines = [
        f"The E0 gate (canary_updates {gate['canary_updates']}, canary_gap_multiple "
        f"{gate['canary_gap_multiple']:g}, tie_band {gate['tie_band']:g} m, canary seeds {gate['seeds']}) "
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
    return lines + table(["TRAIN seed", "E0", "canary row (state_id)", "smallest label gap (m)"], rows) + [""]


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

        def draw(entry: dict, metric: str) -> float | None:
            return None if entry["draw_sd"] is None else entry["draw_sd"][metric]

        rows = [
            [c["arm"], c["against"], c["tau"]["regret"], c["tau"]["mae"], draw(c, "regret"), draw(c, "mae")]
            for c in pilot["comparisons"]
        ]
        rows += [
            [m["variant"], "retention margins", m["tau"]["regret"], m["tau"]["mae"], draw(m, "regret"), draw(m, "mae")]
            for m in pilot["margins"]
        ]
        out["preparation_pilot"] = (["arm", "against", "tau_regret", "tau_mae", "draw_regret", "draw_mae"], rows)
    return out
