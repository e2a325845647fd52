"""``qhlab pilot``: fit every arm of a study with extra seeds and TRAIN draws on a tuning population.

Owns: the pilot directory (``config.toml``, ``fits/``, the record), the design's fit jobs
(every arm with every seed on ``[train]``, and every arm with each draw's own seeds on that TRAIN
draw),
adopting the finished fits of an interrupted run, and the refusals before anything is written.
Does not own: the config (``config``), the arithmetic (``variance``), the record's layout and
checks (``record``) or fitting (``qhlab.preparation.fits``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.design.pilot_config import PILOT_CALL, QhPilotConfig, pilot_digest, read_pilot_config, study_design
from qhlab.design.pilot_record import FITS_DIR, RECEIPT, components_of, publish_record, read_record
from qhlab.design.study_config import PopulationSource
from qhlab.design.tuning_record import population_record, refuse_sealed_validation
from qhlab.design.user_sources import user_source_digests
from qhlab.evidence import input_error, sha256_file
from qhlab.evidence.layout import FAMILY_DIR, MANIFEST
from qhlab.preparation.fits import (
    ToolRun,
    adopt_or_fit,
    finished_record,
    fit_evidence,
    resolve_tool_population,
    run_fits,
    study_record_head,
)
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.presets import load_preset
from qhlab.study.family import copy_sources, provide_shipped, shipped_sources
from qhlab.training.terminal import fit_runner

__all__ = ["run_pilot"]

_LOCK = ".pilot.lock"


def _pilot_fit(job: dict) -> dict:
    """One pilot fit (a pool or Ray task): its per-scene metrics at H and its evidence."""
    # A user arm is imported from the copy this pilot made, shipped with the job.
    provide_shipped(job["shipped"], Path(job["fits"]).parent / FAMILY_DIR / job["arm"])
    directory, adopted = adopt_or_fit(job)
    evidence, _, evaluation = fit_evidence(directory, Path(job["fits"]).parent)
    return {
        "arm": job["arm"],
        "draw": job["draw"],
        "seed": int(job["recipe"]["seed"]),
        "regret": [row[-1] for row in evaluation.per_scene["regret"]],
        "mae": [row[-1] for row in evaluation.per_scene["mae"]],
        "regret_mean": evaluation.regret_primary,
        "mae_mean": evaluation.mae_primary,
        "horizon": evaluation.horizon,
        **evidence,
        "adopted": adopted,
    }


def _resolve(config: QhPilotConfig, study: Any, choice: Any) -> dict[str, Path]:
    # The validation first: it is refused (sealed, or the study's own) before any TRAIN is drawn.
    sources = {"validation": config.validation, "train": config.train}
    sources.update({f"draw {d}": PopulationSource(preset=config.train.preset, seed=d) for d in config.train_draws})
    out = {}
    for role, source in sources.items():
        split = "validation" if role == "validation" else "train"
        out[role] = resolve_tool_population(source, split, config, choice, call=PILOT_CALL, role=role)
        if role == "validation":
            _refuse_the_studys_validation(out[role], study.validation)
            refuse_sealed_validation(PILOT_CALL, out[role], config.population_cache)
    return out


def _refuse_the_studys_validation(validation: Path, declared: PopulationSource) -> None:
    """Refuse a tuning validation that is the study's validation by content, however it is named
    (a path, a link or a copy of the population the study names by preset and seed).

    Compared without generating the study's validation: a path is compared by its manifest's
    digest; a preset and seed by what the tuning validation's manifest says it was drawn as.
    """
    manifest = read_manifest(validation)
    if declared.path is not None:
        same = Path(declared.path).is_dir() and sha256_file(Path(declared.path) / MANIFEST) == sha256_file(
            validation / MANIFEST
        )
    else:
        generator = manifest.get("generator") or {}
        preset = load_preset(declared.preset, call=PILOT_CALL).name
        same = (manifest.get("split"), generator.get("preset"), generator.get("seed")) == (
            "validation",
            preset,
            declared.seed,
        )
    if same:
        raise input_error(
            PILOT_CALL,
            "validation",
            str(validation),
            "a tuning population the study never scores on",
            "it is the study's validation population (by content, whatever its path); a pilot must not look at "
            "held-out scenes",
        )


def run_pilot(run: ToolRun) -> dict:
    """Run (or resume, or re-read) a pilot (``run``) and publish its record.

    Returns:
        The record (``pilot.json``'s document).

    Raises:
        QhInputError: an invalid config, a sealed or study validation population; nothing written.
        LockHeldError: another ``qhlab pilot`` writes the output.
    """
    config, data, study = read_pilot_config(run.config_path)
    # A user arm's source as it is now: the design binds it, and the pilot fits a copy of it.
    design = study_design(study, user_source_digests(study, Path(config.study).parent))
    digest = pilot_digest(config, design)
    directory = run.directory
    record = finished_record(directory, RECEIPT, read_record, digest, call=PILOT_CALL, what="pilot", data=data)
    if record is not None:
        run.say(f"pilot {config.name}: already finished ({len(record['fits'])} fits)")
        return record
    choice = run.choice(config, PILOT_CALL)
    populations = _resolve(config, study, choice)
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
        return _run_locked(
            run, config, study, design, digest, populations, shipped_sources(copied, run.directory), choice
        )


def _run_locked(
    run: ToolRun,
    config: QhPilotConfig,
    study: Any,
    design: dict,
    digest: str,
    populations: dict[str, Path],
    shipped: dict[str, dict],
    choice: Any,
) -> dict:
    directory, workers, say = run.directory, run.jobs_at_once(config), run.say
    main = int(config.train.seed)
    plan = [
        (arm, draw, "train" if draw == main else f"draw {draw}", seed)
        for draw, seeds in config.layout
        for arm in study.arms
        for seed in seeds
    ]
    jobs = [
        {
            "arm": arm,
            "draw": draw,
            "cell": f"{arm}-d{draw}-s{seed}",
            "profile": study.profile,
            "recipe": study.cell_recipe(
                arm, seed, study.broad_updates, sources={a: s["record"]["sha256"] for a, s in shipped.items()} or None
            ).model_dump(mode="json"),
            "shipped": shipped.get(arm),
            "fits": str(directory / FITS_DIR),
            "train": str(populations[role]),
            "validation": str(populations["validation"]),
            "job_type": "pilot",
            "group": config.name,
            "tag": f"{arm}-d{draw}",
            "torch_threads": config.torch_threads,
        }
        for arm, draw, role, seed in plan
    ]
    say(
        f"pilot {config.name}: {len(study.arms)} arms x {len(config.seeds)} seeds on TRAIN {main}"
        + (
            f", and x {sum(len(s) for s in config.draw_seeds)} more seeds on {len(config.train_draws)} more TRAIN "
            "draws (each seed on one draw)"
            if config.train_draws
            else ""
        )
        + f": {len(jobs)} fits"
    )

    def done(job: dict, result: dict) -> None:
        how = "adopted" if result["adopted"] else f"{result['wall_seconds']:.1f} s"
        say(
            f"fit {len(finished) + 1}/{len(jobs)} {job['arm']} draw {job['draw']} seed {result['seed']}: "
            f"regret_{result['horizon']} {result['regret_mean']:.4f}, MAE {result['mae_mean']:.4f} ({how})"
        )
        finished.append(result)

    finished: list[dict] = []
    with fit_runner(choice, workers, PILOT_CALL) as runner:
        outputs = run_fits(
            runner, _pilot_fit, [(job,) for job in jobs], on_result=lambda i, result: done(jobs[i], result)
        )
    results = {(j["arm"], j["draw"], j["recipe"]["seed"]): result for j, result in zip(jobs, outputs, strict=True)}
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
            "interval": "qhlab.statistics.replication.pooled_difference: scene variance + MS_b/n0 + "
            "MS_w (1/S - 1/n0) - r/(S n_p), Student's t with Satterthwaite's degrees of freedom",
        },
    }
    publish_record(directory, record)
    say(f"pilot {config.name}: each comparison's own seed and TRAIN-draw components; {directory / 'pilot.json'}")
    for row in record["comparisons"] + record["margins"]:
        what = f"{row['arm']} - {row['against']}" if "arm" in row else f"margins of {row['variant']}"
        say(
            "  "
            + what
            + ": "
            + "; ".join(
                f"{metric} tau {noise['tau']:.5f}" + ("" if noise["omega"] is None else f", omega {noise['omega']:.5f}")
                for metric, noise in row["noise"].items()
            )
        )
    return record
