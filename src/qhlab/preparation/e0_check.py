"""``qhlab e0-check``: run a study's E0 gate on fresh TRAIN draws, each frozen as a study of its own.

Owns: the check directory (``config.toml``, ``studies/``, the record), the config each draw is
frozen from (the study's, with only its name, TRAIN seed and population cache changed and its
``[preparation]`` left out), running each draw's freeze and E0 gate (a finished gate is
adopted; a killed one resumes with the study machinery), and the refusals before anything is
written. Does not own: the config (``config``), the record's layout and checks (``record``), or
the freeze and the gate (``qhlab.study.freeze``, ``qhlab.study.admission``).
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path
from typing import Any

from qhlab.design.config_files import read_toml
from qhlab.design.e0_config import E0_CHECK_CALL, QhE0CheckConfig, e0_design, e0_digest, read_e0_config
from qhlab.design.e0_record import CONFIG_COPY, RECEIPT, RECORD, STUDIES_DIR, draw_outcome, publish_record, read_record
from qhlab.design.study_config import STUDY_PATH_FIELDS, STUDY_PRESET_FIELDS, PopulationSource
from qhlab.design.study_records import StudyE0Receipt, StudyFreezeReceipt
from qhlab.evidence import authentication_roots, input_error, publish_bytes, read_receipt, recorded_origin
from qhlab.evidence.layout import CANARY_DIR, E0_RECEIPT, FREEZE_RECEIPT, STUDY_CALL
from qhlab.execution.user_code import locate_source, parse_entry
from qhlab.preparation.declared import declared_population, declared_unit, unit_suffix
from qhlab.preparation.fits import ToolRun, finished_record, run_fits, study_record_head
from qhlab.scenes.manifest import generator_identity, read_manifest
from qhlab.scenes.presets import load_preset
from qhlab.study.populations import resolve_population
from qhlab.study.study import Study
from qhlab.training.terminal import fit_runner

__all__ = ["draw_config", "run_e0_check"]

_LOCK = ".e0-check.lock"
# What a check writes in its directory: another name there is not this check's, and is refused.
_OWN = (CONFIG_COPY, STUDIES_DIR, RECORD, RECEIPT, _LOCK)


def draw_config(study_path: str | os.PathLike, *, name: str, train_seed: int, population_cache: str) -> bytes:
    """The TOML a draw's sub-study is frozen from: the study's settings, with its name, TRAIN seed
    and population cache replaced, its paths absolute and its ``[preparation]`` and
    ``[seed_variance]`` left out (the records a check produces are not inputs of its gate).

    Returns:
        The config's bytes (UTF-8 TOML).
    """
    import tomli_w

    raw, _, _ = read_toml(
        study_path,
        call=STUDY_CALL,
        field="study",
        example="examples/default-study.toml",
        relative=STUDY_PATH_FIELDS,
        toml_files=STUDY_PRESET_FIELDS,
    )
    raw = {k: v for k, v in raw.items() if k not in ("preparation", "seed_variance")}
    base = Path(study_path).expanduser().resolve().parent
    for arm in (raw.get("experiment") or {}).get("arms") or []:
        if isinstance(arm, dict) and isinstance(arm.get("builder"), str):
            arm["builder"] = _absolute_builder(arm["builder"], base)
    raw.update(
        name=name, population_cache=str(Path(population_cache).expanduser()), train={**raw["train"], "seed": train_seed}
    )
    header = (
        f"# Written by {E0_CHECK_CALL}: the study {str(Path(study_path).resolve())!r} with its TRAIN seed "
        f"replaced by {train_seed}.\n"
    )
    return (header + tomli_w.dumps(raw)).encode("utf-8")


def _absolute_builder(builder: str, base: Path) -> str:
    """A user arm's builder as the draw's config, written elsewhere, must name it: a file by its
    absolute path (an installed or malformed one as it is; the sub-study's freeze refuses the latter)."""
    try:
        located = locate_source(parse_entry(builder), base)
    except ValueError:
        return builder
    if located.kind == "file":
        return f"{located.path}:{located.function}"
    if located.kind == "package":
        parts = located.module.split(".")
        module = located.path.parent.joinpath(*parts)
        file = module / "__init__.py" if (module / "__init__.py").is_file() else module.with_suffix(".py")
        return f"{file}:{located.function}"
    return builder


def _gate_draw(job: dict) -> dict:
    """One draw (a pool or Ray task): freeze its sub-study and decide its E0 gate, or adopt both."""
    started = time.perf_counter()
    config, study = Path(job["config"]), Path(job["study"])
    adopted = (study / CANARY_DIR / E0_RECEIPT).is_file()
    if not adopted:
        gate = Study.open(config, study)
        if not (study / FREEZE_RECEIPT).is_file():
            gate.freeze(gate_feasible=False)
        gate.admit_canaries()
    # A moved check adopts its sub-studies' own bytes, never those at the paths they were made at.
    with authentication_roots(study, original=recorded_origin(study)):
        e0 = read_receipt(study / CANARY_DIR / E0_RECEIPT, StudyE0Receipt)
        frozen_body = read_receipt(study / FREEZE_RECEIPT, StudyFreezeReceipt).body
    return {
        "adopted": adopted,
        "wall_seconds": time.perf_counter() - started,
        **draw_outcome(
            job["seed"], e0.body.model_dump(mode="json"), frozen_body.train["manifest_sha256"], study, Path(job["root"])
        ),
    }


def _refuse_unservable(config: QhE0CheckConfig, study: Any) -> None:
    """Refuse, before any TRAIN is drawn, a check whose draws no sub-study could freeze: a TRAIN
    preset of another horizon than the study's recipe learns, or a validation preset of another
    environment than TRAIN's (each draw's freeze would refuse it after its TRAIN was drawn)."""
    train = load_preset(study.train.preset, call=E0_CHECK_CALL)
    horizon = study.cell_recipe(study.baseline_arm, study.seeds[0], study.canary_updates).horizon
    if train.horizon != horizon:
        raise input_error(
            E0_CHECK_CALL,
            "study",
            config.study,
            f"a study whose TRAIN preset has the horizon its recipe learns (H={horizon})",
            f"its TRAIN preset {study.train.preset!r} has H={train.horizon}, so every draw's freeze would refuse it "
            "after drawing its TRAIN: make the study's recipe and TRAIN preset agree, then check it",
        )
    if study.validation.preset is not None:
        validation = load_preset(study.validation.preset, call=E0_CHECK_CALL)
        if validation.environment.factory != train.environment.factory:
            raise input_error(
                E0_CHECK_CALL,
                "study",
                config.study,
                f"a study whose validation preset is of its TRAIN's environment ({train.environment.factory!r})",
                f"its validation preset {study.validation.preset!r} names {validation.environment.factory!r}, so "
                "every draw's freeze would refuse it after drawing its TRAIN: draw the validation from TRAIN's "
                "environment",
            )


def _resolve(config: QhE0CheckConfig, preset: str, choice: Any) -> dict[int, Path]:
    """Generate (or reuse) every draw's TRAIN population first, each on every core."""
    return {
        seed: Path(
            resolve_population(
                PopulationSource(preset=preset, seed=seed),
                "train",
                config.population_cache,
                progress=True,
                executor=choice,
                call=E0_CHECK_CALL,
            )
        ).absolute()
        for seed in config.train_seeds
    }


def run_e0_check(run: ToolRun) -> dict:
    """Run (or resume, or re-read) an E0 check (``run``) and publish its record.

    Returns:
        The record (``e0.json``'s document).

    Raises:
        QhInputError: an invalid config, a study whose draws no freeze could accept, or an output
            that is not new, empty or this check's own; nothing written, no TRAIN drawn.
        LockHeldError: another ``qhlab e0-check`` writes the output.
    """
    config, data, study = read_e0_config(run.config_path)
    design = e0_design(study)
    digest = e0_digest(config, design)
    directory, say = run.directory, run.say
    record = finished_record(
        directory, RECEIPT, read_record, digest, call=E0_CHECK_CALL, what="check", data=data, own=_OWN
    )
    if record is not None:
        say(f"e0 check {config.name}: already finished ({record['passed']} of {record['draws']} draws passed)")
        return record
    _refuse_unservable(config, study)
    first = PopulationSource(preset=study.train.preset, seed=config.train_seeds[0])
    unit = unit_suffix(declared_unit(declared_population(first, "train", field="study train", call=E0_CHECK_CALL)))
    choice = run.choice(config, E0_CHECK_CALL)
    with run.writing(E0_CHECK_CALL, _LOCK, data):
        say(
            f"e0 check {config.name}: the E0 gate of {study.name} (canary_updates {study.canary_updates}, "
            f"canary_gap_multiple {study.canary_gap_multiple}, tie_band {study.tie_band}{unit}) on "
            f"{len(config.train_seeds)} fresh TRAIN draws of {study.train.preset}"
        )
        populations = _resolve(config, study.train.preset, choice)
        return _run_locked(run, config, study, design, digest, populations, choice)


def _run_locked(
    run: ToolRun,
    config: QhE0CheckConfig,
    study: Any,
    design: dict,
    digest: str,
    populations: dict[int, Path],
    choice: Any,
) -> dict:
    directory, workers, say = run.directory, run.jobs_at_once(config), run.say
    jobs = []
    for seed in config.train_seeds:
        name = f"{config.name}-{seed}"
        path = directory / STUDIES_DIR / f"{name}.toml"
        text = draw_config(config.study, name=name, train_seed=seed, population_cache=config.population_cache)
        path.parent.mkdir(exist_ok=True)
        if not path.is_file():
            publish_bytes(path, text)
        # Its settings, not its header comment (which names where the study was): a moved check resumes.
        elif tomllib.loads(path.read_text(encoding="utf-8")) != tomllib.loads(text.decode("utf-8")):
            raise input_error(
                E0_CHECK_CALL,
                "--output",
                str(directory),
                "a directory begun with this study's config",
                f"{path} was written from another version of the study; use another --output",
            )
        jobs.append(
            {"seed": seed, "config": str(path), "study": str(directory / STUDIES_DIR / name), "root": str(directory)}
        )

    def done(job: dict, result: dict) -> None:
        finished.append(result)
        how = "adopted" if result["adopted"] else f"{result['wall_seconds']:.0f} s"
        row = result["selected"]
        where = "no row qualified" if row is None else f"row state {row['state_id']}"
        # A failed gate says why: the reason names each failing canary, its horizon, what it chose
        # and by how much its prediction missed, as the draw's E0 receipt does.
        why = "" if result["passed"] else f": {result['reason']}"
        say(
            f"draw {len(finished)}/{len(jobs)} TRAIN {job['seed']}: E0 {'passed' if result['passed'] else 'FAILED'} "
            f"({where}; {how}){why}"
        )

    finished: list[dict] = []
    with fit_runner(choice, workers, E0_CHECK_CALL) as runner:
        outputs = run_fits(
            runner,
            _gate_draw,
            [(job,) for job in jobs],
            on_result=lambda i, result: done(jobs[i], result),
            prefixes=[f"TRAIN {job['seed']} " for job in jobs],
        )
    results = {job["seed"]: result for job, result in zip(jobs, outputs, strict=True)}
    outcomes = [
        {k: v for k, v in results[seed].items() if k not in ("adopted", "wall_seconds")} for seed in config.train_seeds
    ]
    passed = sum(o["passed"] for o in outcomes)
    identities = {generator_identity(read_manifest(path)["generator"]) for path in populations.values()}
    if len(identities) != 1:
        raise input_error(
            E0_CHECK_CALL,
            "study",
            config.study,
            "TRAIN draws of one population distribution",
            "the draws' generators differ (the preset or its environment changed during the check); run it again",
        )
    record = {
        **study_record_head("e0_record", config, digest, study, design),
        "train_generator_sha256": identities.pop(),
        "outcomes": outcomes,
        "draws": len(outcomes),
        "passed": passed,
        "pass_share": passed / len(outcomes),
        "min_pass_share": config.min_pass_share,
        "meets_min_pass_share": passed / len(outcomes) >= config.min_pass_share,
    }
    publish_record(directory, record)
    say(
        f"e0 check {config.name}: {passed} of {len(outcomes)} draws passed (share {record['pass_share']:.2f}; "
        f"required {config.min_pass_share}); {directory / 'e0.json'}"
    )
    return record
