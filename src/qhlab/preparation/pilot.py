"""``qhlab pilot``: fit every arm of a study with extra seeds and TRAIN draws on a tuning population.

Owns: the pilot directory (``config.toml``, ``fits/``, the record), the design's fit jobs
(every arm with every seed on ``[train]``, and every arm with each draw's own seeds on that TRAIN
draw),
adopting the finished fits of an interrupted run or of an earlier pilot of the same cells
(``--adopt-from``: an arm added later fits only its own cells), and the refusals before anything
is written.
Does not own: the config (``config``), the arithmetic (``variance``), the record's layout and
checks (``record``) or fitting (``qhlab.preparation.fits``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.design.pilot_config import (
    PILOT_CALL,
    QhPilotConfig,
    pilot_digest,
    read_pilot_config,
    refuse_few_validation_scenes,
    study_design,
)
from qhlab.design.pilot_record import (
    CONFIG_COPY,
    FITS_DIR,
    RECEIPT,
    RECORD,
    components_of,
    fits_words,
    publish_record,
    read_record,
)
from qhlab.design.study_config import PopulationSource, declared_scenes
from qhlab.design.tuning_record import population_record, refuse_sealed_validation
from qhlab.design.user_sources import user_source_digests
from qhlab.evidence import QhInputError, input_error
from qhlab.evidence.layout import FAMILY_DIR
from qhlab.finite_horizon.fit_job import FitJob
from qhlab.preparation.declared import (
    Declared,
    declared_population,
    declared_unit,
    refuse_unservable,
    study_populations,
    unit_suffix,
)
from qhlab.preparation.fits import (
    ToolRun,
    adopt_or_fit,
    finished_record,
    fit_evidence,
    resolve_tool_population,
    run_fits,
    study_record_head,
    tool_fit_job,
)
from qhlab.study.family import copy_sources, provide_shipped, shipped_sources
from qhlab.training.terminal import fit_runner

__all__ = ["run_pilot"]

_LOCK = ".pilot.lock"
# What a pilot writes in its directory: another name there is not this pilot's, and is refused.
_OWN = (CONFIG_COPY, FITS_DIR, FAMILY_DIR, RECORD, RECEIPT, _LOCK)


def _pilot_fit(job: dict) -> dict:
    """One pilot fit (a pool or Ray task): its per-scene metrics at H and its evidence."""
    fit: FitJob = job["fit"]
    # A user arm is imported from the copy this pilot made, shipped with the job.
    provide_shipped(job["shipped"], Path(fit.output).parent / FAMILY_DIR / job["arm"])
    directory, adopted = adopt_or_fit(fit)
    evidence, _, evaluation = fit_evidence(directory, Path(fit.output).parent)
    return {
        "arm": job["arm"],
        "draw": job["draw"],
        "seed": int(fit.recipe.seed),
        "regret": [row[-1] for row in evaluation.per_scene["regret"]],
        "mae": [row[-1] for row in evaluation.per_scene["mae"]],
        "regret_mean": evaluation.regret_primary,
        "mae_mean": evaluation.mae_primary,
        "horizon": evaluation.horizon,
        **evidence,
        "adopted": adopted,
    }


def _resolve(config: QhPilotConfig, choice: Any) -> dict[str, Path]:
    # The validation first: a sealed one is refused before any TRAIN is drawn.
    sources = {"validation": config.validation, "train": config.train}
    sources.update({f"draw {d}": PopulationSource(preset=config.train.preset, seed=d) for d in config.train_draws})
    out = {}
    for role, source in sources.items():
        split = "validation" if role == "validation" else "train"
        out[role] = resolve_tool_population(source, split, config, choice, call=PILOT_CALL, role=role)
        if role == "validation":
            refuse_sealed_validation(PILOT_CALL, out[role], config.population_cache)
    return out


def _refuse_unservable(config: QhPilotConfig, study: Any) -> dict[str, Declared | None]:
    """Refuse, before any population is drawn, a pilot whose populations cannot serve its study:
    another environment, preset or horizon than the study's TRAIN and validation, the study's
    own validation (by content, whatever its path) or a TRAIN population as the pilot's validation,
    or a validation of fewer scenes than ``refuse_few_validation_scenes`` admits (counted from its
    preset or its manifest).

    Returns:
        The pilot's TRAIN and validation as declared (``declared_population``).
    """
    declared = {
        role: declared_population(getattr(config, role), role, field=role, call=PILOT_CALL)
        for role in ("train", "validation")
    }
    horizon = study.cell_recipe(study.baseline_arm, study.seeds[0], study.broad_updates).horizon
    refuse_unservable(
        PILOT_CALL,
        "a pilot",
        declared,
        horizon=horizon,
        horizon_source="the study's recipe",
        study=study_populations(study, call=PILOT_CALL),
    )
    validation = declared["validation"]
    if validation is not None:
        # The freeze refuses such a record; refused here, no fit is spent on it.
        refuse_few_validation_scenes(
            PILOT_CALL,
            validation.field,
            validation.value,
            declared_scenes(config.validation, call=PILOT_CALL),
            study,
            remedy="name",
        )
    return declared


def run_pilot(run: ToolRun) -> dict:
    """Run (or resume, or re-read) a pilot (``run``) and publish its record.

    Returns:
        The record (``pilot.json``'s document).

    Raises:
        QhInputError: an invalid config, a population that cannot serve the study (another
            environment, preset or horizon; the study's own validation or a TRAIN population as
            the validation; a validation of too few scenes), a sealed validation, or an output that
            is not new, empty or this pilot's own; nothing written (the first two before any
            population is drawn).
        LockHeldError: another ``qhlab pilot`` writes the output.
    """
    config, data, study = read_pilot_config(run.config_path)
    # A user arm's source as it is now: the design binds it, and the pilot fits a copy of it.
    design = study_design(study, user_source_digests(study, Path(config.study).parent))
    digest = pilot_digest(config, design)
    directory = run.directory
    record = finished_record(
        directory, RECEIPT, read_record, digest, call=PILOT_CALL, what="pilot", data=data, own=_OWN
    )
    if record is not None:
        run.say(f"pilot {config.name}: already finished ({len(record['fits'])} fits)")
        return record
    earlier = _earlier(run, directory)
    unit = declared_unit(_refuse_unservable(config, study)["validation"])
    choice = run.choice(config, PILOT_CALL)
    populations = _resolve(config, choice)
    with run.writing(PILOT_CALL, _LOCK, data):
        copied = copy_sources(study, Path(config.study).parent, directory)
        if {arm: record["sha256"] for arm, record in copied.items()} != user_source_digests(
            study, Path(config.study).parent
        ):
            raise input_error(
                PILOT_CALL,
                "study",
                config.study,
                "user arms whose files do not change while the pilot starts",
                "an arm's file changed between reading and copying it; run the pilot again",
            )
        shipped = shipped_sources(copied, run.directory)
        return _run_locked(run, config, study, design, digest, populations, shipped, choice, unit, earlier)


def _earlier(run: ToolRun, directory: Path) -> Path | None:
    """The earlier pilot whose finished fits of the same cells this one adopts (``--adopt-from``), its
    record authenticated first; None without one.

    Raises:
        QhInputError: not a finished pilot's directory (its record and receipt), or this output itself.
    """
    if run.adopt_from is None:
        return None
    earlier = Path(run.adopt_from).expanduser().absolute()
    allowed = "a finished pilot's directory other than --output (its pilot.json and receipt)"
    if earlier.resolve() == directory.resolve():
        raise input_error(
            PILOT_CALL, "--adopt-from", str(earlier), allowed, "it is --output itself; name the earlier pilot"
        )
    try:
        read_record(earlier)
    except (OSError, QhInputError) as exc:
        raise input_error(
            PILOT_CALL,
            "--adopt-from",
            str(earlier),
            allowed,
            f"its record does not authenticate ({str(exc).splitlines()[0]}); name a finished pilot",
        ) from None
    return earlier


def _run_locked(
    run: ToolRun,
    config: QhPilotConfig,
    study: Any,
    design: dict,
    digest: str,
    populations: dict[str, Path],
    shipped: dict[str, dict],
    choice: Any,
    unit: str,
    earlier: Path | None,
) -> dict:
    """The pilot under its lock: every fit run or adopted, then its record built, published and told."""
    jobs = _jobs(config, study, run.directory, populations, shipped, earlier)
    results = _fit_all(run, config, study, jobs, choice, unit_suffix(unit), earlier)
    fits = [{k: v for k, v in results[key].items() if k not in ("adopted", "horizon")} for key in sorted(results)]
    layout = [(draw, list(seeds)) for draw, seeds in config.layout]
    record = {
        **study_record_head("pilot_record", config, digest, study, design),
        "horizon": next(iter(results.values()))["horizon"],
        "populations": {role: population_record(path) for role, path in populations.items()},
        "layout": [{"draw": draw, "seeds": seeds} for draw, seeds in layout],
        "fits": fits,
        **components_of(design, fits, layout=layout),
        "estimators": {
            "noise": "qhlab.statistics.variance.fit_noise on each comparison's fits x scenes table, nested by "
            "TRAIN draw: mean squares within and between draws, the residual per scene",
            "interval": "qhlab.statistics.replication.pooled_difference: max(scene variance, scene variance + "
            "MS_b/n0 + MS_w (1/S - 1/n0) - r/(S n_p)), Student's t, Satterthwaite's dof; tau checked by the study",
        },
    }
    publish_record(run.directory, record)
    _say_components(run, config, record, unit_suffix(unit))
    return record


def _fit_all(
    run: ToolRun, config: QhPilotConfig, study: Any, jobs: list[dict], choice: Any, u: str, earlier: Path | None
) -> dict:
    """Run (or adopt) every fit job, each announced as it finishes ({(arm, draw, seed): result}).

    ``u`` is the reward's unit as printed: every reward-valued number is followed by it.
    """
    say = run.say
    say(
        f"pilot {config.name}: {len(study.arms)} arms x {len(config.seeds)} seeds on TRAIN {int(config.train.seed)}"
        + (
            f", and x {sum(len(s) for s in config.draw_seeds)} more seeds on {len(config.train_draws)} more TRAIN "
            "draws (each seed on one draw)"
            if config.train_draws
            else ""
        )
        + f": {len(jobs)} fits"
        + ("" if earlier is None else f"; the finished fits of the same cells in {earlier} are adopted")
    )

    def done(job: dict, result: dict) -> None:
        how = "adopted" if result["adopted"] else f"{result['wall_seconds']:.1f} s"
        say(
            f"fit {len(finished) + 1}/{len(jobs)} {job['arm']} draw {job['draw']} seed {result['seed']}: "
            f"regret_{result['horizon']} {result['regret_mean']:.4f}{u}, MAE {result['mae_mean']:.4f}{u} ({how})"
        )
        finished.append(result)

    finished: list[dict] = []
    with fit_runner(choice, run.jobs_at_once(config), PILOT_CALL) as runner:
        outputs = run_fits(
            runner, _pilot_fit, [(job,) for job in jobs], on_result=lambda i, result: done(jobs[i], result)
        )
    return {(j["arm"], j["draw"], j["fit"].recipe.seed): result for j, result in zip(jobs, outputs, strict=True)}


def _say_components(run: ToolRun, config: QhPilotConfig, record: dict, u: str) -> None:
    """Print where the record is and each comparison's and margin's components, in the unit ``u``."""
    run.say(
        f"pilot {config.name}: each comparison's own seed and TRAIN-draw components, from "
        f"{fits_words(len(record['fits']), len(config.fits), len(record['layout']))}; {run.directory / 'pilot.json'}"
    )
    for row in record["comparisons"] + record["margins"]:
        what = f"{row['arm']} - {row['against']}" if "arm" in row else f"margins of {row['variant']}"
        taus = (
            f"{metric} tau {noise['tau']:.5f}{u}"
            + ("" if noise["omega"] is None else f", omega {noise['omega']:.5f}{u}")
            for metric, noise in row["noise"].items()
        )
        run.say(f"  {what}: " + "; ".join(taus))


def _jobs(
    config: QhPilotConfig,
    study: Any,
    directory: Path,
    populations: dict[str, Path],
    shipped: dict[str, dict],
    earlier: Path | None,
) -> list[dict]:
    """The pilot's fit jobs: every arm with every seed of each draw of its layout, on that draw."""
    main = int(config.train.seed)
    plan = [
        (arm, draw, "train" if draw == main else f"draw {draw}", seed)
        for draw, seeds in config.layout
        for arm in study.arms
        for seed in seeds
    ]
    sources = {a: s["record"]["sha256"] for a, s in shipped.items()} or None
    return [
        {
            "arm": arm,
            "draw": draw,
            "shipped": shipped.get(arm),
            "fit": tool_fit_job(
                config,
                study.cell_recipe(arm, seed, study.broad_updates, sources=sources),
                study.profile,
                directory,
                f"{arm}-d{draw}-s{seed}",
                populations[role],
                populations["validation"],
                job_type="pilot",
                tag=f"{arm}-d{draw}",
                adopt_from=earlier,
            ),
        }
        for arm, draw, role, seed in plan
    ]
