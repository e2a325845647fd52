"""``qhlab tune``: run a tuning's trials as real fits, with Optuna on SQLite, and publish its record.

Owns: the tuning directory (``trials.db``, ``config.toml``, ``fits/``, the record), the batch
loop (each trial's parameters suggested from the trials of earlier batches only, by a sampler
seeded for that trial, so the trials do not depend on the worker count, the executor or an
interruption), adopting the finished fits of an interrupted run, and the refusals before
anything is written. Does not own: the config (``config``), the winner rule (``rule``), the
record's layout and checks (``record``) or fitting (``qhlab.finite_horizon.fit``).

Trials are kept in Optuna's RDB storage only once they are finished (``Study.add_trial``, in
trial order), so the database never holds a half-made trial: after a SIGKILL the same command
suggests the unfinished batch again (the same parameters), adopts the fits that had finished,
and runs the rest.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qhlab.design.study_config import read_study_config
from qhlab.design.tuning_config import (
    TUNE_CALL,
    QhTuningConfig,
    arm_recipe,
    optuna_distributions,
    power_design,
    quiet_optuna,
    read_tuning_config,
    trial_recipe,
)
from qhlab.design.tuning_record import (
    CONFIG_COPY,
    FITS_DIR,
    RECEIPT,
    RECIPE,
    RECORD,
    TRIALS_DB,
    population_record,
    publish_record,
    read_record,
    refuse_sealed_validation,
)
from qhlab.design.tuning_rule import pick_winner, planned_mde, prune_at, running_means, trial_score
from qhlab.evidence import canonical_json, input_error, sha256_bytes
from qhlab.execution import JobRunner
from qhlab.finite_horizon.fit_job import FitJob
from qhlab.preparation.declared import declared_population, refuse_unservable, study_populations, unit_suffix
from qhlab.preparation.fits import (
    ToolRun,
    adopt_or_fit,
    finished_record,
    fit_evidence,
    publish_config_copy,
    resolve_tool_population,
    run_fits,
    tool_fit_job,
)
from qhlab.scenes.manifest import reward_unit
from qhlab.training.terminal import fit_runner

__all__ = ["run_tuning"]

_LOCK = ".tune.lock"
# What a tuning writes in its directory (SQLite's journal files beside its database included):
# another name there is not this tuning's, and is refused.
_OWN = (
    CONFIG_COPY,
    FITS_DIR,
    TRIALS_DB,
    *(f"{TRIALS_DB}-{suffix}" for suffix in ("journal", "wal", "shm")),
    RECORD,
    RECEIPT,
    RECIPE,
    _LOCK,
)


def _config_digest(config: QhTuningConfig, base: dict, design: dict | None = None) -> str:
    """What makes two runs the same tuning: the recorded config, the base recipe's fields and, for an
    "mde" objective, the study design it plans for."""
    same = {"config": config.record(), "base_recipe": base}
    return sha256_bytes(canonical_json(same if design is None else {**same, "design": design}))


def _sampler(config: QhTuningConfig, number: int):
    """The sampler that suggests trial ``number``: seeded by the config's seed and the number only."""
    import optuna

    seed = int.from_bytes(hashlib.sha256(f"{config.sampler_seed}:{number}".encode()).digest()[:4], "big")
    if config.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def _suggest(config: QhTuningConfig, number: int, earlier: list) -> dict:
    """Trial ``number``'s parameters from the finished trials of earlier batches (``earlier``)."""
    import optuna

    if config.sampler == "grid":
        return config.grid_points()[number]
    scratch = optuna.create_study(direction="minimize", sampler=_sampler(config, number))
    scratch.add_trials(earlier)
    return dict(scratch.ask(fixed_distributions=optuna_distributions(config.space)).params)


def _refuse_foreign_db(directory: Path, config: QhTuningConfig, digest: str) -> None:
    """Refuse a ``trials.db`` that is not an Optuna database of this config's trials (read-only)."""
    path = directory / TRIALS_DB
    if not path.exists():
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            names = [r[0] for r in connection.execute("SELECT study_name FROM studies")]
            recorded = [
                r[0]
                for r in connection.execute("SELECT value_json FROM study_user_attributes WHERE key = 'config_sha256'")
            ]
    except sqlite3.Error as exc:
        raise input_error(
            TUNE_CALL,
            "trials.db",
            str(path),
            "an Optuna SQLite database written by qhlab tune",
            f"it is unreadable ({exc}); nothing was overwritten: move it away or use another --output",
        ) from None
    if names != [config.name]:
        raise input_error(
            TUNE_CALL,
            "trials.db",
            str(path),
            f"the database of tuning {config.name!r}",
            f"it holds studies {names!r}; nothing was overwritten: use another --output",
        )
    if recorded and recorded != [json.dumps(digest)]:
        raise input_error(
            TUNE_CALL,
            "trials.db",
            str(path),
            f"the trials of this config (config_sha256 {digest})",
            f"it holds the trials of another config ({recorded[0]}); nothing was overwritten: use another --output",
        )


def _open_storage(directory: Path, config: QhTuningConfig, digest: str):
    """Optuna's study in ``DIR/trials.db`` (checked by ``_refuse_foreign_db`` first)."""
    import optuna

    _refuse_foreign_db(directory, config, digest)
    storage = optuna.storages.RDBStorage(f"sqlite:///{directory / TRIALS_DB}")
    study = optuna.create_study(study_name=config.name, storage=storage, direction="minimize", load_if_exists=True)
    if study.user_attrs.get("config_sha256") is None:
        study.set_user_attr("config_sha256", digest)
    return study


def _fit_job(job: dict) -> dict:
    """One fit of one trial (a pool or Ray task): adopt a finished attempt of its cell, or fit it.
    An "mde" trial's fit also keeps its arm and its per-scene values at H."""
    fit: FitJob = job["fit"]
    directory, adopted = adopt_or_fit(fit)
    evidence, _, evaluation = fit_evidence(directory, Path(fit.output).parent)
    own = {}
    if job.get("arm") is not None:
        own = {
            "arm": job["arm"],
            "scenes": {m: [row[-1] for row in evaluation.per_scene[m]] for m in ("regret", "mae")},
        }
    return {
        "seed": int(fit.recipe.seed),
        "regret": evaluation.regret_primary,
        "mae": evaluation.mae_primary,
        **own,
        **evidence,
        "adopted": adopted,
    }


def _cell(number: int, seed: int, arm: str | None = None) -> str:
    return f"t{number:04d}-s{seed}" if arm is None else f"t{number:04d}-{arm}-s{seed}"


def _trial_entry(
    number: int,
    batch: int,
    params: dict,
    cost: int,
    fits: list[dict] | None,
    metric: str,
    max_cost: int | None,
    pruner: Any,
    pruned_at: int | None = None,
    design: dict | None = None,
) -> dict:
    """A finished trial as the record holds it (``fits`` None: over the cost limit, not run;
    ``pruned_at``: the rung the pruner stopped it at, its ``fits`` the ones it made; ``design``: an
    "mde" objective's, whose score is the trial's planned MDE)."""
    who = {"number": number, "batch": batch, "params": params, "cost": cost}
    if fits is None:
        reason = f"cost {cost} > max_cost {max_cost}"
        return {**who, "state": "pruned", "reason": reason, "fits": [], "mean": None, "seed_sd": None}
    if design is not None:
        return {**who, "state": "complete", "reason": None, "fits": fits, **planned_mde(fits, design)}
    values = [f[metric] for f in fits]
    intermediate = {} if pruner is None else {"intermediate": running_means(values, pruner.rungs)}
    if pruned_at is not None:
        mean = intermediate["intermediate"][str(pruned_at)]
        reason = f"{pruner.kind} pruner after {pruned_at} of its fits (running mean {mean:.4f})"
        return {**who, "state": "pruned", "reason": reason, "fits": fits, "mean": None, "seed_sd": None, **intermediate}
    return {**who, "state": "complete", "reason": None, "fits": fits, **trial_score(values), **intermediate}


def _pruned_rung(config: QhTuningConfig, earlier: list[dict], fits: list[dict], done: int) -> int | None:
    """The rung at which the pruner stops a trial that has made ``done`` fits, or None."""
    if config.pruner is None or done not in config.pruner.rungs:
        return None
    running = running_means([f[config.objective.metric] for f in fits], config.pruner.rungs)
    return done if prune_at(config.pruner.model_dump(mode="json"), earlier, running, done) else None


def _add_finished(study, entry: dict, distributions: dict) -> None:
    import optuna

    state = optuna.trial.TrialState.COMPLETE if entry["state"] == "complete" else optuna.trial.TrialState.PRUNED
    study.add_trial(
        optuna.trial.create_trial(
            params=entry["params"],
            distributions=distributions,
            state=state,
            value=entry["mean"] if entry["state"] == "complete" else None,
            intermediate_values={int(r): v for r, v in entry.get("intermediate", {}).items()},
            user_attrs={"qhlab": entry},
        )
    )


def _stored(trial: Any) -> dict:
    """A trial as trials.db stores it (what the first run recorded; checked before it is used)."""
    stored = trial.user_attrs.get("qhlab")
    return dict(stored) if isinstance(stored, dict) else {}


def _fit_values(entry: dict, metric: str) -> list:
    value = "regret" if metric == "mde" else metric
    return [(f.get("arm"), f.get("seed"), f.get(value), f.get("final_state_sha256")) for f in entry.get("fits") or []]


def _check_stored(number: int, field: str, stored: Any, derived: Any) -> None:
    """Refuse a trials.db trial whose ``field`` is not what the config and the sealed fits give."""
    if stored != derived:
        raise input_error(
            TUNE_CALL,
            f"trials.db trial {number + 1} {field}",
            stored,
            f"{derived!r}, what the config's sampler and the trial's sealed fits give",
            "trials.db is a resume cache, never evidence; it was edited or is another tuning's. Remove it (the "
            "finished fits are adopted from fits/) or use another --output",
        )


def _say_trial(
    say: Callable[[str], None], entry: dict, trials: int, metric: str, horizon: int, best: dict | None, unit: str
) -> None:
    """A finished trial's console line (and the best so far), each score followed by ``unit`` (" m" or "")."""
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(entry["params"].items())
    )
    if entry["state"] == "complete":
        spread = "" if entry["seed_sd"] is None else f" (seed sd {entry['seed_sd']:.4f}{unit})"
        wall = sum(f["wall_seconds"] for f in entry["fits"])
        score = "largest planned MDE" if metric == "mde" else f"{metric}_{horizon}"
        result = f"{score} {entry['mean']:.4f}{unit}{spread}, {len(entry['fits'])} fits, {wall:.1f} s"
    else:
        result = f"pruned: {entry['reason']}"
    say(f"trial {entry['number'] + 1}/{trials} [{params}]: {result}")
    if best is not None:
        score = "largest planned MDE" if metric == "mde" else f"{metric}_{horizon}"
        say(f"  best so far: trial {best['number'] + 1}, {score} {best['mean']:.4f}{unit}")


def run_tuning(run: ToolRun) -> dict:
    """Run (or resume, or re-read) a tuning (``run``) and publish its record.

    Returns:
        The record (``record.publish_record``'s document).

    Raises:
        QhInputError: an invalid config, a population that cannot serve the trials (or, for an
            "mde" objective, its study), a sealed validation population, a corrupt or foreign
            ``trials.db``, or an output that is not new, empty or this tuning's own; nothing is
            written or overwritten.
        LockHeldError: another ``qhlab tune`` writes the output.
    """
    quiet_optuna()
    config, data, path, base = read_tuning_config(run.config_path)
    design = power_design(config, base)
    choice, directory, say = run.choice(config, TUNE_CALL), run.directory, run.say
    digest = _config_digest(config, base, design)
    record = finished_record(
        directory, RECEIPT, read_record, digest, call=TUNE_CALL, what="tuning", data=data, own=_OWN
    )
    if record is not None:
        say(
            f"tuning {config.name}: already finished ({len(record['trials'])} trials); winner trial "
            f"{record['winner']['number'] + 1 if record['winner']['number'] is not None else 'none'}"
        )
        return record
    builder = (base.get("architecture") or {}).get("builder")
    if builder is not None:
        raise input_error(
            TUNE_CALL,
            "recipe.architecture.builder",
            builder,
            "none (a built-in arm)",
            "tune a built-in arm's recipe; tuning a user arm's recipe is not supported",
        )
    # Before any population is drawn and before the lock file: a refusal writes nothing.
    _refuse_foreign_db(directory, config, digest)
    _refuse_unservable(config, base)
    populations = _resolve_populations(config, choice)
    with run.writing(TUNE_CALL, _LOCK):
        return _run_locked(
            config, data, base, digest, directory, populations, run.jobs_at_once(config), choice, say, design
        )


def _refuse_unservable(config: QhTuningConfig, base: dict) -> None:
    """Refuse, before any population is drawn, a tuning whose populations cannot serve its trials:
    another horizon than the recipe's, a TRAIN population as its validation and, for an "mde"
    objective, another distribution than its study's TRAIN and validation, or the study's own
    validation (the freeze would refuse the record)."""
    declared = {
        role: declared_population(getattr(config, role), role, field=role, call=TUNE_CALL)
        for role in ("train", "validation")
    }
    study = None
    if config.objective.study is not None:
        study = study_populations(read_study_config(config.objective.study)[0], call=TUNE_CALL)
    horizon = base.get("horizon")
    refuse_unservable(
        TUNE_CALL,
        "a tuning",
        declared,
        horizon=horizon if isinstance(horizon, int) else None,
        horizon_source="the tuning's recipe",
        study=study,
    )


def _resolve_populations(config: QhTuningConfig, choice: Any) -> dict[str, Path]:
    """The tuning's populations, its validation first: a sealed one is refused before any TRAIN
    population is drawn into the cache."""
    out = {}
    for split in ("validation", "train"):
        out[split] = resolve_tool_population(getattr(config, split), split, config, choice, call=TUNE_CALL, role=split)
        if split == "validation":
            refuse_sealed_validation(TUNE_CALL, out[split], config.population_cache)
    return {"train": out["train"], "validation": out["validation"]}


def _run_rungs(runner: JobRunner, config: QhTuningConfig, jobs: list[dict], complete: list[dict]) -> tuple[dict, dict]:
    """Run a batch's fit jobs, rung by rung when a pruner is declared.

    Without a pruner every job runs at once. With one, the batch's trials fit their seeds up to
    each rung together; then each trial the pruner stops (judged against ``complete``, the
    complete trials of earlier batches) fits no more seeds.

    Returns:
        (``{trial number: its fits' results, in seed order}``, ``{pruned trial number: its rung}``).
    """
    seeds = list(config.objective.seeds)
    bounds = [*(config.pruner.rungs if config.pruner is not None else ()), len(seeds)]
    fits: dict[int, list[dict]] = {job["number"]: [] for job in jobs}
    pruned: dict[int, int] = {}
    start = 0
    for end in bounds:
        wave = [job for job in jobs if job["number"] not in pruned and job["fit"].recipe.seed in seeds[start:end]]
        for job, result in zip(wave, run_fits(runner, _fit_job, [(job,) for job in wave]), strict=True):
            fits[job["number"]].append(result)
        for number in sorted(fits):
            if number not in pruned and (rung := _pruned_rung(config, complete, fits[number], end)) is not None:
                pruned[number] = rung
        start = end
    return fits, pruned


def _run_locked(
    config: QhTuningConfig,
    data: bytes,
    base: dict,
    digest: str,
    directory: Path,
    populations: dict[str, Path],
    workers: int,
    choice: Any,
    say: Callable[[str], None],
    design: dict | None = None,
) -> dict:
    """Run the tuning's batches under the output's lock, then publish its record."""
    # Lazy: keeps importing this module free of torch and pyarrow.
    from qhlab.finite_horizon.data import load_population

    study = _open_storage(directory, config, digest)
    publish_config_copy(directory / CONFIG_COPY, data, call=TUNE_CALL)
    validation = load_population(populations["validation"], split="validation")
    horizon, unit = validation.horizon, unit_suffix(reward_unit(validation.manifest["generator"]))
    distributions = optuna_distributions(config.space)
    finished = {t.number: t for t in study.get_trials(deepcopy=False)}
    metric, seeds = config.objective.metric, config.objective.seeds
    batches = [list(range(s, min(config.trials, s + config.batch))) for s in range(0, config.trials, config.batch)]
    entries: list[dict] = []
    arms = [None] if design is None else design["arms"]
    say(
        f"tuning {config.name}: {config.trials} trials in batches of {config.batch}, {len(seeds) * len(arms)} fits "
        f"each, {config.sampler} sampler (seed {config.sampler_seed}); {len(finished)} already finished"
    )
    with fit_runner(choice, workers, TUNE_CALL) as runner:
        for index, numbers in enumerate(batches):
            planned = _plan_batch(config, base, numbers, finished)
            jobs = [
                job
                for number, params, cost in planned
                if not _over_cost(config, cost)
                for job in _trial_jobs(config, base, directory, populations, design, arms, number, params)
            ]
            # The pruner's evidence: the complete trials of earlier batches only (never this batch's).
            complete = [entry for entry in entries if entry["state"] == "complete"]
            fits, pruned = _run_rungs(runner, config, jobs, complete)
            for number, params, cost in planned:
                entry = _batch_entry(config, index, number, params, cost, fits, pruned, design)
                entry = _keep_entry(study, finished, number, entry, metric, distributions)
                entries.append(entry)
                best = pick_winner(entries, band=0.0, max_seed_sd=config.objective.max_seed_sd)
                _say_trial(
                    say,
                    entry,
                    config.trials,
                    metric,
                    horizon,
                    None if best["number"] is None else entries[best["number"]],
                    unit,
                )
    return _publish_tuning(config, digest, base, entries, populations, design, directory, horizon, say, unit)


def _over_cost(config: QhTuningConfig, cost: int) -> bool:
    """Whether a trial of this cost is over the objective's cost limit (and so is never run)."""
    return config.objective.max_cost is not None and cost > config.objective.max_cost


def _plan_batch(config: QhTuningConfig, base: dict, numbers: list[int], finished: dict) -> list[tuple[int, dict, int]]:
    """A batch's trials as ``(number, params, cost)``; those over the cost limit are never fitted.

    Every trial is suggested from the finished trials of earlier batches only (``finished``).
    """
    seeds = config.objective.seeds
    earlier = [finished[n] for n in range(numbers[0])]
    planned = []
    for number in numbers:
        # A trial trials.db holds is suggested again (the sampler is a function of the
        # config and the earlier trials) and its fits re-read from their sealed receipts
        # (they are adopted, not run): the record never takes trials.db's word for either.
        params = _suggest(config, number, earlier)
        if number in finished:
            _check_stored(number, "params", _stored(finished[number]).get("params"), params)
        recipe = trial_recipe(config, params, seed=seeds[0], base=base)
        cost = int(recipe.updates) * int(recipe.ensemble_members)
        planned.append((number, params, cost))
    return planned


def _trial_jobs(
    config: QhTuningConfig,
    base: dict,
    directory: Path,
    populations: dict[str, Path],
    design: dict | None,
    arms: list,
    number: int,
    params: dict,
) -> list[dict]:
    """One trial's fit jobs: one per seed and, for an "mde" objective, per arm (seeds outermost)."""
    jobs = []
    for seed in config.objective.seeds:
        for arm in arms:
            recipe = (
                trial_recipe(config, params, seed=seed, base=base)
                if arm is None
                else arm_recipe(config, params, seed=seed, base=base, architecture=design["architectures"][arm])
            )
            jobs.append(
                {
                    "number": number,
                    "arm": arm,
                    "fit": tool_fit_job(
                        config,
                        recipe,
                        config.profile,
                        directory,
                        _cell(number, seed, arm),
                        populations["train"],
                        populations["validation"],
                        job_type="trial",
                        tag=f"trial-{number + 1}",
                    ),
                }
            )
    return jobs


def _batch_entry(
    config: QhTuningConfig,
    index: int,
    number: int,
    params: dict,
    cost: int,
    fits: dict[int, list[dict]],
    pruned: dict[int, int],
    design: dict | None,
) -> dict:
    """Trial ``number`` of batch ``index`` as the record holds it, from the batch's fits."""
    return _trial_entry(
        number,
        index,
        params,
        cost,
        None if _over_cost(config, cost) else fits[number],
        config.objective.metric,
        config.objective.max_cost,
        config.pruner,
        pruned.get(number),
        design,
    )


def _keep_entry(study, finished: dict, number: int, entry: dict, metric: str, distributions: dict) -> dict:
    """The entry the record keeps for trial ``number``: a trial trials.db already holds is checked
    against ``entry`` and kept as stored; a new one is added to trials.db (and to ``finished``)."""
    if number in finished:
        stored = _stored(finished[number])
        for field in ("state", "cost", "mean", "seed_sd", "intermediate", "margins"):
            _check_stored(number, field, stored.get(field), entry.get(field))
        _check_stored(number, "fits", _fit_values(stored, metric), _fit_values(entry, metric))
        # Its fits' adoption flags are the first run's: the record of a resumed tuning
        # is the record of an uninterrupted one.
        return stored
    _add_finished(study, entry, distributions)
    finished[number] = study.get_trials(deepcopy=False)[number]
    if finished[number].number != number:
        raise RuntimeError(f"{TUNE_CALL}: trials.db numbered trial {number} as {finished[number].number}")
    return entry


def _publish_tuning(
    config: QhTuningConfig,
    digest: str,
    base: dict,
    entries: list[dict],
    populations: dict[str, Path],
    design: dict | None,
    directory: Path,
    horizon: int,
    say: Callable[[str], None],
    unit: str,
) -> dict:
    """Publish the tuning's record and say its winner (or that there is none), its score followed by
    ``unit`` (" m" or "")."""
    metric, seeds = config.objective.metric, config.objective.seeds
    record = publish_record(
        directory,
        config=config,
        config_sha256=digest,
        base=base,
        entries=entries,
        populations={k: population_record(p) for k, p in populations.items()},
        recipe_of=lambda params: trial_recipe(config, params, seed=seeds[0], base=base),
        design=design,
    )
    winner = record["winner"]
    if winner["number"] is None:
        say(f"tuning {config.name}: no admissible trial; no recipe.toml was written")
    else:
        score = "largest planned MDE" if metric == "mde" else f"{metric}_{horizon}"
        say(
            f"winner: trial {winner['number'] + 1} by the rule ({score} "
            f"{entries[winner['number']]['mean']:.4f}{unit}); {directory / 'recipe.toml'}"
        )
    return record
