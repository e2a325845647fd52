"""How the study was prepared: the freeze binds the tuning, pilot and E0 check records it names.

Owns: ``check_preparation`` (at freeze, before anything is written: authenticate and recompute a
``qhlab tune`` record, a ``qhlab pilot`` record and a ``qhlab e0-check`` record; refuse a recipe
other than the tuning's winner outside its declared deviations, a pilot of another study design, a
typed ``[seed_variance]`` beside a pilot, a pilot scored on too few validation scenes
(``refuse_few_validation_scenes``), a tuning or pilot population that is the study's validation,
and an E0 check of another gate, one that fell short of its minimum pass share or one that gated
the study's own TRAIN seed), ``check_populations`` (once TRAIN is resolved: every
record was made on the study's own population distributions, compared by generator identity
however each was named, and none scored on the study's validation draw),
``copy_preparation`` (the records' copies inside the study, which the freeze receipt binds),
``refuse_tuned_scenes`` (at development: no sealed validation scene may be a tuning or pilot scene,
by physical content) and ``frozen_noise`` (the pilot components each comparison's interval
carries). Does not own: the report's section (``qhlab.report.preparation_section``), the records
themselves (``qhlab.design.tuning_record``, ``qhlab.design.pilot_record``,
``qhlab.design.e0_record``) or the freeze (``freeze``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qhlab.design import e0_record as e0_record
from qhlab.design import pilot_record as pilot_record
from qhlab.design import plan_record as plan_record
from qhlab.design import tuning_record as tuning_record
from qhlab.design.e0_config import e0_design
from qhlab.design.pilot_config import refuse_few_validation_scenes, study_design
from qhlab.design.preparation_record import close_values
from qhlab.design.preparation_record import record_path as record_file
from qhlab.design.study_config import QhArchitectureStudyConfig, declared_scenes
from qhlab.design.tuning_record import CONFIG_COPY, RECEIPT, RECIPE, RECORD
from qhlab.evidence import PublishConflictError, differing_keys, input_error, publish_bytes, sha256_file
from qhlab.evidence.layout import PLAN_MARKDOWN, PREPARATION_DIR
from qhlab.scenes.manifest import generator_identity
from qhlab.statistics.variance import FitNoise

__all__ = ["check_populations", "check_preparation", "copy_preparation", "frozen_noise", "refuse_tuned_scenes"]
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


def _checked_record(field: str, module: Any, path: Path) -> tuple[Path, dict, dict]:
    """The record a ``[preparation]`` field names: its directory, the record (authenticated) and
    ``module.check_record``'s result (every value recomputed), after its path is checked
    (``record_path``: a refusal says which record a wrong file is, and what to name)."""
    source = record_file(_CALL, field, path, field.removeprefix("preparation.")).parent
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
            deviations, the pilot measured another study design or was scored on too few
            validation scenes, a typed ``[seed_variance]`` stands beside a pilot, a tuning or
            pilot population is the study's validation, or the E0 check ran another gate, fell
            short of its minimum pass share or gated the study's TRAIN.
    """
    preparation = config.preparation
    if preparation is None or all(getattr(preparation, k) is None for k in ("tuning", "pilot", "e0", "plan")):
        return None, {}
    body, found = {"tuning": None, "pilot": None, "e0": None, "plan": None}, {}
    if preparation.tuning is not None:
        body["tuning"], found["tuning"] = _check_tuning(config, Path(preparation.tuning))
    if preparation.pilot is not None:
        body["pilot"], found["pilot"] = _check_pilot(config, Path(preparation.pilot), sources)
    if preparation.e0 is not None:
        body["e0"], found["e0"] = _check_e0(config, Path(preparation.e0))
    if preparation.plan is not None:
        body["plan"], found["plan"] = _check_plan(config, Path(preparation.plan), body, found)
    return body, found


def _check_tuning(config: QhArchitectureStudyConfig, record_path: Path) -> tuple[dict, Path]:
    source, record, checked = _checked_record("preparation.tuning", tuning_record, record_path)
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
        "populations": _populations(record),
        "fits_recomputed": checked["fits_recomputed"],
        "optuna": record["optuna"],
        "space": record["config"]["space"],
    }, source


def _check_pilot(
    config: QhArchitectureStudyConfig, record_path: Path, sources: dict[str, str] | None
) -> tuple[dict, Path]:
    source, record, checked = _checked_record("preparation.pilot", pilot_record, record_path)
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
    # The study config validated that a layout is declared wherever a pilot is bound.
    declared = config.preparation.pilot_layout.as_record()
    if [{"draw": e["draw"], "seeds": list(e["seeds"])} for e in record["layout"]] != declared:
        raise input_error(
            _CALL,
            "preparation.pilot",
            str(record_path),
            f"a pilot of the layout preparation.pilot_layout declares, {declared} (it fitted {record['layout']})",
            "one pilot per design: a pilot with other seeds or TRAIN draws is another draw of the same noise; "
            "run `qhlab pilot` with the declared layout",
        )
    seeds = sorted({s for entry in record["layout"] for s in entry["seeds"]})
    shared = sorted(set(seeds) & set(config.seeds))
    if shared:
        raise input_error(
            _CALL,
            "seeds",
            list(config.seeds),
            f"seeds the pilot did not fit (it fitted {shared})",
            "a pilot measures the seed variance on seeds the study does not report; run the pilot with other seeds",
        )
    # The record holds every fit's per-scene values (``check_record`` recomputed the components from
    # them): their length is the number of validation scenes the pilot was scored on.
    refuse_few_validation_scenes(
        _CALL,
        "preparation.pilot",
        str(record_path),
        min(len(fit["regret"]) for fit in record["fits"]),
        config,
        remedy="run `qhlab pilot` again with",
    )
    if config.seed_variance is not None:
        raise input_error(
            _CALL,
            "seed_variance",
            config.seed_variance.model_dump(mode="json", exclude={"source"}),
            f"no typed [seed_variance] beside a pilot record ({record_path})",
            "drop [seed_variance]: a study that names a pilot record carries each comparison's own components from it",
        )
    _refuse_tuning_validation(config, record, record_path)
    return {
        **_bound("pilot", pilot_record, record_path, record),
        "layout": record["layout"],
        "comparisons": record["comparisons"],
        "margins": record["margins"],
        "populations": _populations(record),
        "fits": checked["fits"],
        "fits_recomputed": checked["fits_recomputed"],
    }, source


def _populations(record: dict) -> dict:
    """What the freeze binds of a record's populations: each one's declared draw and identities."""
    return {
        role: {k: p.get(k) for k in ("preset", "split", "seed", "manifest_sha256", "generator_sha256")}
        for role, p in record["populations"].items()
    }


def _check_e0(config: QhArchitectureStudyConfig, record_path: Path) -> tuple[dict, Path]:
    source, record, checked = _checked_record("preparation.e0", e0_record, record_path)
    # The TRAIN preset is compared by generator identity once TRAIN is resolved (``check_populations``):
    # a preset file is the same distribution wherever the study and the check named it from.
    differing = [k for k in differing_keys(e0_design(config), record["design"]) if k != "train_preset"]
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
        "train_generator_sha256": record.get("train_generator_sha256"),
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


def _check_plan(config: QhArchitectureStudyConfig, record_path: Path, body: dict, found: dict) -> tuple[dict, Path]:
    """A plan made from this study's pilot (and tuning), recomputed from the records the freeze binds."""
    source, record, checked = _checked_record("preparation.plan", plan_record, record_path)
    pilot, tuning = body["pilot"], body["tuning"]
    problems = []
    if pilot is None or record["pilot"]["record_sha256"] != pilot["record_sha256"]:
        problems.append("a plan made from the pilot record the study binds (`[preparation] pilot`)")
    if record["tuning"] is not None and (
        tuning is None or record["tuning"]["record_sha256"] != tuning["record_sha256"]
    ):
        problems.append("a plan whose tuning record is the one the study binds (`[preparation] tuning`)")
    ours = (len(config.seeds), declared_scenes(config.validation, call=_CALL), config.bootstrap.confidence)
    if (record["seeds"], record["validation_scenes"], record["confidence"]) != ours:
        problems.append(
            f"a plan for this study's seeds, validation scenes and level {ours} (it planned for "
            f"{(record['seeds'], record['validation_scenes'], record['confidence'])})"
        )
    if problems:
        raise input_error(
            _CALL,
            "preparation.plan",
            str(record_path),
            "; ".join(problems),
            "run `qhlab plan` again after the study's pilot and tuning",
        )
    again = plan_record.plan_components(
        pilot_record.read_record(found["pilot"]),
        None if record["tuning"] is None else tuning_record.read_record(found["tuning"]),
    )
    if not close_values(again["rows"], record["rows"]) or not close_values(again["recipes"], record["recipes"]):
        raise input_error(
            _CALL,
            "preparation.plan",
            str(record_path),
            "a plan whose components are the bound pilot's and tuning's",
            "its recorded components are not what those records give; run `qhlab plan` again",
        )
    planned = record["designs"][record["planned"]]
    return {
        **_bound("plan", plan_record, record_path, record),
        "target": record["target"],
        "planned": planned,
        "chosen": None if record["chosen"] is None else record["designs"][record["chosen"]],
        "designs": checked["designs"],
        # A plan recorded before the levers binds none.
        **({"levers": record["levers"]} if record.get("levers") is not None else {}),
    }, source


def frozen_noise(config: QhArchitectureStudyConfig, freeze: dict, row: tuple[str, str] | str, metric: str) -> dict:
    """``pooled_difference``'s variance arguments for one comparison or margin: the pilot record's
    components of that row, else the typed ``[seed_variance]``'s tau, else none (the study's own seeds).

    Args:
        config: the study config.
        freeze: the freeze receipt's body (its ``preparation``).
        row: ``(arm, against)`` of a paired comparison, or a variant's name for its retention margins.
        metric: "regret" or "mae" (a margin's D_reg is its "regret", D_mae its "mae").

    Raises:
        QhInputError: the pilot holds no components for ``row`` (a freeze bound a pilot of this design).
    """
    pilot = (freeze.get("preparation") or {}).get("pilot")
    if pilot is not None:
        if isinstance(row, tuple):
            entries = [c for c in pilot["comparisons"] if (c["arm"], c["against"]) == row]
        else:
            entries = [m for m in pilot["margins"] if m["variant"] == row]
        if len(entries) != 1:
            raise input_error(
                "report_study",
                "preparation.pilot",
                pilot["name"],
                f"a pilot with the components of {row!r}",
                "the freeze binds pilots of this study's design only; freeze the study again",
            )
        seeds = sum(len(entry["seeds"]) for entry in pilot["layout"])
        return {
            "noise": FitNoise.from_dict(entries[0]["noise"][metric]),
            "noise_source": f"pilot record {pilot['name']} (sha256 {pilot['record_sha256'][:12]}, "
            f"{pilot_record.fits_words(pilot['fits'], seeds, len(pilot['layout']))})",
        }
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
        "plan": [plan_record.RECORD, plan_record.RECEIPT, plan_record.CONFIG_COPY, PLAN_MARKDOWN],
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


def check_populations(
    config: QhArchitectureStudyConfig,
    preparation: dict | None,
    train: dict,
    validation: dict | None,
    *,
    call: str = _CALL,
) -> None:
    """Refuse a record made on another population distribution than the study's, or scored on its validation draw.

    Populations are compared by generator identity (``qhlab.scenes.manifest.generator_identity``),
    so a study binds a record made for its populations whether either named them by a built-in
    preset, a preset file or a directory.

    Args:
        config: the study config.
        preparation: the freeze body's ``preparation`` (None: nothing to check).
        train: the study TRAIN's generator record (its manifest's).
        validation: the study validation's generator record (expected from its preset at the freeze,
            its manifest's at development); None: not known yet (a validation named by path, at the
            freeze), so only the TRAIN side is compared.
        call: the step refusing.

    Raises:
        QhInputError: a record without generator identities (made by an older qhlab), a record whose
            TRAIN or validation populations are of another distribution, or one that scored on the
            study's validation draw.
    """
    if not preparation:
        return
    ours = {
        "train": generator_identity(train),
        "validation": None if validation is None else generator_identity(validation),
    }
    for kind, command in (("tuning", "qhlab tune"), ("pilot", "qhlab pilot")):
        summary = preparation.get(kind)
        if summary is None:
            continue
        for role, population in summary["populations"].items():
            split = "validation" if role == "validation" else "train"
            if ours[split] is None:
                continue
            _same_distribution(
                f"preparation.{kind}", summary, role, population.get("generator_sha256"), ours[split], command, call
            )
            if split == "validation" and population.get("seed") == validation.get("seed"):
                raise input_error(
                    call,
                    "validation",
                    config.validation.model_dump(mode="json", exclude_none=True),
                    f"a population other than the {kind}'s {role} population ({summary['source']})",
                    "a study is never scored on the population its recipe was tuned or its variance measured on; "
                    "declare another validation seed",
                )
    e0 = preparation.get("e0")
    if e0 is not None:
        _same_distribution(
            "preparation.e0", e0, "TRAIN", e0.get("train_generator_sha256"), ours["train"], "qhlab e0-check", call
        )


def _same_distribution(
    field: str, summary: dict, role: str, theirs: str | None, ours: str, command: str, call: str
) -> None:
    if theirs is None:
        raise input_error(
            call,
            field,
            summary["source"],
            "a record that names its populations' generator identity",
            f"it was made by an older qhlab; run `{command}` again",
        )
    if theirs != ours:
        raise input_error(
            call,
            field,
            summary["source"],
            f"a record made on the study's own population distributions (its {role} population's generator "
            f"{theirs[:12]} is not the study's {ours[:12]})",
            "its environment, options, preset sizes or actor differ from the study's; a record's numbers belong to "
            "the distribution it was measured on",
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
