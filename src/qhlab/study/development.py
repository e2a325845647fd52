"""Step 3, development: open and seal the validation population after the E0 gate has passed.

Owns: ``seal_development`` (``Study.prepare_development``): authenticating validation (TRAIN's
horizon, features and K; no scene physically equal to a TRAIN scene), the TRAIN-only constant
predictor and its validation metrics, the heuristic references, and the development receipt binding
the validation files. Does not own: the evaluation arithmetic or the references' policies
(``qhlab.finite_horizon.evaluation``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qhlab.design.study_records import StudyDevelopmentReceipt
from qhlab.evidence import OrderError, PublishConflictError, input_error, read_receipt, sha256_file, write_receipt
from qhlab.evidence.layout import CANARY_DIR, DEVELOPMENT_RECEIPT, E0_RECEIPT
from qhlab.finite_horizon.evaluation import (
    constant_predictions,
    evaluate_population,
    population_heuristic_references,
    population_train_constant,
)
from qhlab.scenes.audit import audit_population
from qhlab.scenes.seals import mark_sealed
from qhlab.study.authentication import FrozenStudy, authenticate_e0
from qhlab.study.populations import (
    labelling_record,
    population_files,
    population_support,
    resolve_population,
    validation_environment,
)
from qhlab.study.preparation import check_populations, refuse_tuned_scenes

__all__ = ["seal_development"]


def seal_development(frozen: FrozenStudy, *, executor=None) -> dict:
    """``prepare_development`` on an authenticated study, labelling a preset validation on
    ``executor`` (an ``ExecutorChoice``; None: the config's). Validation's bytes do not depend on it."""
    # Lazy: keeps importing this module free of torch and pyarrow.
    from qhlab.finite_horizon.data import load_population

    path = _development_receipt_path(frozen)
    config = frozen.config
    source = config.validation
    validation_path = _validation_path(frozen, executor)
    validation = load_population(validation_path, split="validation", horizon=frozen.horizon)  # Bellman-checked
    train = frozen.train_population()
    _refuse_other_shape(train, validation, validation_path)
    _refuse_shared_scenes(frozen.train_path, validation_path)
    # Its generator, now that it is drawn (a validation named by path was declared only at the freeze).
    check_populations(
        config,
        frozen.body.preparation,
        train.manifest["generator"],
        validation.manifest["generator"],
        call="prepare_development",
    )
    refuse_tuned_scenes(frozen.output, frozen.body.preparation, validation_path, "prepare_development")
    # After the cheap disjointness check (it names the shared pair), before anything is computed.
    audit = audit_population(validation_path, call="prepare_development")
    constant = population_train_constant(train)
    summary = evaluate_population(
        constant_predictions(constant, validation.candidate_mask.numpy()), validation, tie_band=config.tie_band
    )
    # Cheap policies next to the constant: the fixed index is chosen on TRAIN chain rows only;
    # every reference is evaluated on validation chain rows in the cells' scene order.
    references = population_heuristic_references(train, validation, tie_band=config.tie_band)
    body = {
        "study": config.name,
        "validation": {
            "path": str(validation_path.resolve()),
            "manifest_sha256": validation.digest,
            "support": population_support(validation),
            "declared": source.model_dump(mode="json"),
            # Re-simulated chain states drawn with OS randomness: evidence, never recomputed.
            "audit": audit,
        },
        "train_constant": [float(v) for v in constant],
        "constant_on_validation": summary,
        "references": references,
    }
    inputs = {"freeze": frozen.receipt_path, "e0": frozen.output / CANARY_DIR / E0_RECEIPT}
    inputs.update({f"validation/{k}": v for k, v in population_files(validation_path).items()})
    # Execution evidence, not a decision input: which executor labelled validation, and where.
    body["validation"]["labelling"], generation = labelling_record(
        validation_path, executor or config.executor_choice()
    )
    inputs.update({f"validation/{k}": v for k, v in generation.items()})
    write_receipt(path, StudyDevelopmentReceipt, body=body, inputs=inputs)
    # Held out from now on: `qhlab tune` refuses to tune on it and `qhlab fit` warns before scoring on it.
    mark_sealed(
        config.population_cache,
        validation.digest,
        study=config.name,
        freeze_receipt_sha256=sha256_file(frozen.receipt_path),
        path=validation_path,
    )
    # Written here from this process's digests: the next step takes it without re-hashing.
    frozen.keep("_development", path, read_receipt(path, StudyDevelopmentReceipt, verify_files=False))
    frozen.keep_population(validation)
    return body


def _development_receipt_path(frozen: FrozenStudy) -> Path:
    """The development receipt's path; refuses a study whose E0 gate did not pass, or whose
    development is already sealed."""
    e0 = authenticate_e0(frozen, "prepare_development")
    if not e0.body.passed:
        raise OrderError(
            f"prepare_development: the E0 gate did not pass ({e0.body.reason}); validation "
            "stays closed. HINT: a study whose canaries fail is stopped; fix the recipe and freeze a new study."
        )
    path = frozen.output / DEVELOPMENT_RECEIPT
    if path.exists():
        raise PublishConflictError(f"prepare_development: {path} already exists; development is sealed once.")
    return path


def _validation_path(frozen: FrozenStudy, executor) -> Path:
    """The validation population's directory: the declared path, or the frozen preset labelled on
    ``executor`` (None: the config's)."""
    config = frozen.config
    source = config.validation
    if source.path is not None and not Path(source.path).is_dir():
        raise input_error(
            "prepare_development",
            "validation.path",
            source.path,
            "an existing population directory",
            "generate it with `qhlab scenes generate --split validation` or name a preset",
        )
    preset = environment = None
    if frozen.body.validation.get("preset") is not None:
        # The preset as frozen, drawn from TRAIN's environment (a user one from TRAIN's frozen copy).
        preset, environment = validation_environment(
            frozen.body.validation["preset"],
            frozen.train_path,
            frozen.train_population().manifest,
            call="prepare_development",
        )
    return resolve_population(
        source,
        "validation",
        config.population_cache,
        progress=True,
        executor=executor or config.executor_choice(),
        preset=preset,
        environment=environment,
        call="prepare_development",
    )


def _refuse_other_shape(train: Any, validation: Any, validation_path: Path) -> None:
    """Refuse a validation population whose features or K are not TRAIN's."""
    if (
        train.manifest.get("features") != validation.manifest.get("features")
        or train.num_candidates != validation.num_candidates
    ):
        raise input_error(
            "prepare_development",
            "validation",
            str(validation_path),
            "a population with TRAIN's features and K",
            "use the same preset family for both splits",
        )


def _refuse_shared_scenes(train_path: Path, validation_path: Path) -> None:
    """Refuse validation scenes whose physical content is a TRAIN scene's, naming each pair.

    Compared by ``scene_content_digests``: scene ids hash the split, so equal ids cannot occur
    across splits and would prove nothing.
    """
    # Lazy: keeps importing this module free of pyarrow.
    from qhlab.scenes.population import scene_content_digests

    train = {digest: scene for scene, digest in scene_content_digests(train_path).items()}
    shared = [
        f"validation scene {scene} = TRAIN scene {train[digest]}"
        for scene, digest in sorted(scene_content_digests(validation_path).items())
        if digest in train
    ]
    if shared:
        raise input_error(
            "prepare_development",
            "validation",
            f"{len(shared)} scene(s) shared with TRAIN: {'; '.join(shared)}",
            "scenes disjoint from TRAIN by physical content",
            "generate validation with split='validation' and another seed",
        )
    _refuse_repeated_starts(train_path, validation_path)


def _refuse_repeated_starts(train_path: Path, validation_path: Path) -> None:
    """Refuse validation scenes that start where another validation scene or a TRAIN scene does.

    Scenes drawn from different seeds can still start in one state (a task with one start cell,
    or few): such a validation is not held out, and repeats count twice in every mean.
    """
    # Lazy: keeps importing this module free of pyarrow.
    from qhlab.scenes.population import scene_start_digests

    train = {}
    for scene, digest in sorted(scene_start_digests(train_path).items()):
        train.setdefault(digest, scene)
    first: dict[str, int] = {}
    repeats = []
    for scene, digest in sorted(scene_start_digests(validation_path).items()):
        if digest in train:
            repeats.append(f"validation scene {scene} starts where TRAIN scene {train[digest]} does")
        elif digest in first:
            repeats.append(f"validation scene {scene} starts where validation scene {first[digest]} does")
        first.setdefault(digest, scene)
    if repeats:
        shown = "; ".join(repeats[:3]) + (f"; and {len(repeats) - 3} more" if len(repeats) > 3 else "")
        raise input_error(
            "prepare_development",
            "validation",
            f"{len(repeats)} scene(s) that repeat a start: {shown}",
            "validation scenes whose initial states differ from each other and from TRAIN's (a held-out validation)",
            "the task has few distinct starts: `qhlab env check` counts them; spread the start (its reset options "
            "or kwargs), or draw fewer scenes",
        )
