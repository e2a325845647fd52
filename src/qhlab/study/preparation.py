"""How the study was prepared: the freeze binds the tuning record its recipe comes from.

Owns: ``check_preparation`` (at freeze, before anything is written: authenticate and recompute a
``qhlab tune`` record, refuse a recipe other than its winner outside the declared deviations and
a tuning population that is the study's validation), ``copy_preparation`` (the record's copy
inside the study, which the freeze receipt binds), ``refuse_tuned_scenes`` (at
development: no sealed validation scene may be a tuning scene, by physical content) and the
record's summary that the freeze body carries for the report. Does not own: the record itself
(``qhlab.study.tuning.record``) or the freeze (``freeze``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.evidence import PublishConflictError, input_error, publish_bytes, sha256_file
from qhlab.study.config import QhArchitectureStudyConfig
from qhlab.study.render import fmt, table
from qhlab.study.tuning.record import CONFIG_COPY, RECEIPT, RECIPE, RECORD, check_record, read_record

__all__ = ["PREPARATION_DIR", "check_preparation", "copy_preparation", "refuse_tuned_scenes"]

PREPARATION_DIR = "preparation"
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


def check_preparation(config: QhArchitectureStudyConfig) -> tuple[dict | None, Path | None]:
    """Check the study against its tuning record; nothing is written.

    Args:
        config: the study config (``preparation.tuning`` names the record's ``tuning.json``).

    Returns:
        (the freeze body's ``preparation`` record, or None without ``[preparation]``; the
        record's directory, for ``copy_preparation``).

    Raises:
        EvidenceError: the record does not authenticate, or its scores or winner do not recompute.
        QhInputError: the study's recipe is not the winner outside the declared deviations, or
            a tuning population is the study's validation population.
    """
    if config.preparation is None or config.preparation.tuning is None:
        return None, None
    record_path = Path(config.preparation.tuning)
    if record_path.name != RECORD:
        raise input_error(_CALL, "preparation.tuning", str(record_path), f"the path of a tuning's {RECORD}",
                          "name the tuning.json that `qhlab tune` wrote")
    source = record_path.parent
    record = read_record(source)
    checked = check_record(source)
    winner = record["winner"]
    if winner["number"] is None:
        raise input_error(_CALL, "preparation.tuning", str(record_path), "a tuning record with a winner",
                          "this tuning found no admissible trial; tune again or drop [preparation]")
    study = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
    ours, theirs = _compared(study), _compared(winner["recipe"])
    differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    undeclared = [k for k in differing if k not in record["deviations"]]
    if undeclared:
        shown = ", ".join(f"{k}={ours.get(k)!r} (winner {theirs.get(k)!r})" for k in undeclared)
        raise input_error(_CALL, "experiment.recipe", shown,
                          f"the tuning winner's values (trial {winner['number'] + 1} of {record_path}), except its "
                          f"declared deviations ({', '.join(record['deviations']) or 'none'})",
                          f"set experiment.recipe = {str(source / RECIPE)!r}, or tune again")
    _refuse_tuning_validation(config, record, record_path)
    body = {
        "tuning": {
            "source": str(record_path.resolve()),
            "copy": f"{PREPARATION_DIR}/tuning",
            "record_sha256": sha256_file(source / RECORD),
            "receipt_sha256": sha256_file(source / RECEIPT),
            "name": record["name"],
            "config_sha256": record["config_sha256"],
            "objective": record["objective"],
            "rule": record["rule"],
            "trials": [{k: t[k] for k in ("number", "params", "state", "reason", "mean", "seed_sd", "cost")}
                       for t in record["trials"]],
            "winner": {k: winner[k] for k in ("number", "params", "mean", "margin", "tied")},
            "deviations": {"declared": record["deviations"], "used": differing},
            "populations": {role: {k: p.get(k) for k in ("preset", "split", "seed", "manifest_sha256")}
                            for role, p in record["populations"].items()},
            "fits_recomputed": checked["fits_recomputed"],
            "optuna": record["optuna"],
        }
    }
    return body, source


def copy_preparation(source: Path, output: Path) -> dict[str, Path]:
    """Copy a checked tuning record into ``output/preparation/tuning/``.

    Returns:
        The copies the freeze receipt binds as outputs, by name.
    """
    target = output / PREPARATION_DIR / "tuning"
    target.mkdir(parents=True, exist_ok=True)
    names = [RECORD, RECEIPT, CONFIG_COPY, RECIPE]
    for name in names:
        _copy_into(source / name, target / name)
    return {f"{PREPARATION_DIR}/tuning/{name}": target / name for name in names}


def _refuse_tuning_validation(config: QhArchitectureStudyConfig, record: dict, record_path: Path) -> None:
    """Refuse a tuning population that is the study's validation, by preset and seed or by manifest."""
    declared = config.validation
    manifest = None
    if declared.path is not None and (Path(declared.path) / "manifest.json").is_file():
        manifest = sha256_file(Path(declared.path) / "manifest.json")
    for role, population in record["populations"].items():
        same_draw = (declared.preset is not None and population.get("split") == "validation"
                     and population.get("preset") == declared.preset and population.get("seed") == declared.seed)
        if same_draw or (manifest is not None and population.get("manifest_sha256") == manifest):
            raise input_error(_CALL, "validation", declared.model_dump(mode="json", exclude_none=True),
                              f"a population other than the tuning's {role} population ({record_path})",
                              "a study is never scored on the population its recipe was tuned on; declare "
                              "another validation seed")


def refuse_tuned_scenes(study: Path, preparation: dict | None, validation_path: Path, call: str) -> None:
    """Refuse a sealed validation holding a scene of a tuning population (by physical content).

    Args:
        study: the study directory (its copy of the tuning record is read).
        preparation: the freeze receipt's ``preparation`` (None when the study has no record).
        validation_path: the validation population being sealed.
        call: the step refusing.
    """
    # Lazy: keeps importing this module free of pyarrow.
    from qhlab.scenes.population import scene_content_digests

    preparation = (preparation or {}).get("tuning")
    if preparation is None:
        return
    record = read_record(study / preparation["copy"])
    ours = set(scene_content_digests(validation_path).values())
    for role, population in record["populations"].items():
        shared = ours & set(population.get("scene_digests", []))
        if shared:
            raise input_error(call, "validation", str(validation_path),
                              f"scenes disjoint from the tuning's {role} population",
                              f"{len(shared)} of its scenes are tuning scenes (by physical content); declare "
                              "another validation seed")


# ------------------------------------------------------------------ the report's section


def build(inputs: Any, report: dict) -> None:
    """The report's "How this study was prepared" fields, from the freeze body only.

    Adds ``report["preparation"]``: ``{"tuning": the freeze's tuning summary or None,
    "pilot": the frozen ``[seed_variance]`` with its source text, or None}``.
    """
    tuning = (inputs.freeze.get("preparation") or {}).get("tuning")
    pilot = inputs.config.seed_variance
    report["preparation"] = {"tuning": tuning,
                             "pilot": None if pilot is None else pilot.model_dump(mode="json")}
    report["summary"]["recipe_recorded"] = tuning is not None


def markdown(report: dict) -> list[str]:
    """The section's lines of ``report.md``."""
    prepared = report["preparation"]
    tuning, pilot = prepared["tuning"], prepared["pilot"]
    lines = ["", "## How this study was prepared", ""]
    if tuning is None:
        lines.append("The recipe is unrecorded: this study names no tuning record (`[preparation] tuning`), so "
                     "nothing shows how its recipe was chosen or on which population.")
    else:
        winner, objective = tuning["winner"], tuning["objective"]
        pops = tuning["populations"]
        lines += [
            f"The recipe is the winner of tuning `{tuning['name']}` (record sha256 `{tuning['record_sha256'][:16]}`, "
            f"config sha256 `{tuning['config_sha256'][:16]}`), bound by the freeze and copied into "
            f"`{tuning['copy']}/`.",
            "",
            "- Tuning population: " + "; ".join(
                f"{role} {p['preset']} seed {p['seed']} (manifest `{p['manifest_sha256'][:16]}`)"
                for role, p in sorted(pops.items())) + ".",
            f"- Objective: mean {objective['metric']}_H over fit seeds {objective['seeds']}; band "
            f"{objective['band']} m; max seed sd {objective['max_seed_sd']}; max cost {objective['max_cost']}.",
            f"- Rule: {tuning['rule']}.",
            f"- Winner: trial {winner['number'] + 1}, mean {fmt(winner['mean'])}, margin over the runner-up "
            f"{fmt(winner['margin'])} m; deviations used: {', '.join(tuning['deviations']['used']) or 'none'}.",
            "",
        ]
        rows = [[t["number"] + 1, "`" + ", ".join(f"{k}={fmt(v, 5)}" for k, v in sorted(t["params"].items())) + "`",
                 t["state"], fmt(t["mean"]), fmt(t["seed_sd"]), t["cost"]] for t in tuning["trials"]]
        lines += table(["trial", "parameters", "state", "mean", "seed sd", "cost"], rows)
    lines.append("")
    if pilot is None:
        lines.append("The pilot is unrecorded: the intervals estimate the training-seed variance from the study's "
                     "own seeds.")
    else:
        lines.append(f"The pilot's seed variance (tau regret {pilot['regret']:.5f} m, MAE {pilot['mae']:.5f} m, "
                     f"{pilot['seeds']} seeds) was typed into `[seed_variance]`; its source: {pilot['source']}. "
                     "It is not a record the freeze could check.")
    return lines + [""]


def tables(report: dict) -> dict:
    """The W&B table of the tuning's trials (empty without a tuning record)."""
    tuning = report["preparation"]["tuning"]
    if tuning is None:
        return {}
    rows = [[t["number"] + 1, str(sorted(t["params"].items())), t["state"], t["mean"], t["seed_sd"], t["cost"]]
            for t in tuning["trials"]]
    return {"preparation_trials": (["trial", "params", "state", "mean", "seed_sd", "cost"], rows)}
