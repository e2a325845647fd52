"""Step 1, freeze: bind TRAIN, source, package versions, arms and every threshold before any fit.

Owns: ``freeze`` (``Study.freeze``), the rule that arms differ only in
architecture, and the one-line description of each frozen arm (``describe_family``). The
family's sources and contracts are checked by ``family``. Does not own: the
config (``config``), resolving populations (``populations``) or authenticating the freeze
later (``authentication``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from qhlab.design.canary import select_canary_row
from qhlab.design.study_config import EXECUTION_FIELDS, QhArchitectureStudyConfig, read_study_config
from qhlab.design.study_records import StudyFreezeReceipt
from qhlab.design.user_sources import preset_file_record, user_source_digests
from qhlab.evidence import (
    PublishConflictError,
    QhInputError,
    canonical_json,
    exclusive_lock,
    file_in_the_way,
    input_error,
    publish_bytes,
    read_receipt,
    sha256_bytes,
    source_package_digest,
    write_receipt,
)
from qhlab.evidence.layout import (
    FAMILY_DIR,
    FREEZE_LOCK,
    FREEZE_RECEIPT,
    PREPARATION_DIR,
    RUN_LOCK,
    STUDY_CONFIG_COPY,
    cell_name,
)
from qhlab.evidence.publish import TEMP_MARKER
from qhlab.evidence.source import runtime_versions
from qhlab.finite_horizon.benchmark import canonical_chains, canonical_first_chain
from qhlab.finite_horizon.recipe import recipe_digest
from qhlab.scenes.audit import audit_population
from qhlab.scenes.manifest import reward_unit
from qhlab.study.authentication import FrozenStudy, refuse_linked_study
from qhlab.study.family import freeze_family
from qhlab.study.populations import (
    environment_source,
    labelling_record,
    population_files,
    population_support,
    resolve_population,
    validation_generator,
    validation_preset,
    validation_start_repeats,
)
from qhlab.study.preparation import check_populations, check_preparation, copy_preparation
from qhlab.training.profiles import execution_profile

__all__ = ["describe_family", "freeze", "refuse_occupied", "release_refused_output"]


def describe_family(frozen: FrozenStudy) -> list[str]:
    """One line per arm of a frozen study: its role, builder, resolved architecture and size."""
    lines = []
    for a in frozen.body.arms:
        arch = {k: v for k, v in a["architecture"].items() if k not in ("arm", "builder", "source_sha256")}
        builder = "built-in" if a.get("builder", "qhlab") == "qhlab" else f"builder {a['builder']}"
        lines.append(
            f"  {a['arm']} ({a['role']}, {builder}): {json.dumps(arch, sort_keys=True)}, "
            f"{a['contract']['parameters']:,} parameters per member"
        )
    return lines


def freeze(
    config_path: str | os.PathLike, output: str | os.PathLike, *, executor=None, gate_feasible: bool = True
) -> FrozenStudy:
    """``freeze_study``, returning the study it froze for the next step.

    Args:
        config_path: the study TOML.
        output: the study directory (must not exist, or be empty).
        executor: where a preset TRAIN is labelled (an ``ExecutorChoice``; None: the config's).
            Not part of the freeze: TRAIN's bytes do not depend on it.
        gate_feasible: refuse a TRAIN with no row the E0 gate could select (nothing to learn at
            the gate's margin), before anything is written.

    Returns:
        The ``FrozenStudy`` of the receipt just written (its files were digested here, in this
        process, so they are not re-hashed).
    """

    config, data, resolved = read_study_config(config_path)
    execution_profile(config.profile).check_memory_ceiling(config.max_allocated_bytes)  # CUDA lanes only
    # A refused record writes nothing; checked again with the lock held.
    check_preparation(config, user_source_digests(config, resolved.parent))
    output = Path(output)
    refuse_linked_study(output, "freeze_study")
    refuse_occupied(output, data)  # before the lock file is created in a directory that is not ours
    created = not output.exists()
    before = set(os.listdir(output)) if output.is_dir() else set()
    try:
        with exclusive_lock(
            output / FREEZE_LOCK,
            hint="another `qhlab study freeze` (or `study run`) is "
            "freezing this study; wait for it, then run `qhlab study run` again",
        ):
            return _freeze_locked(config, data, resolved, output, executor, gate_feasible)
    except QhInputError:
        # Bad TRAIN data is refused with nothing written (a concurrent freeze's lock is held, so
        # its refusal is not this one).
        release_refused_output(output, created=created, before=before)
        raise


def release_refused_output(output: Path, *, created: bool, before: set[str]) -> None:
    """Leave an output that a refused run or freeze used only for its lock files as it was found.

    Args:
        output: the study's output directory.
        created: whether the refused call made the directory (it then goes too).
        before: the names the directory held before the call; those lock files stay.
    """
    if not output.is_dir():
        return
    names = {p.name for p in output.iterdir()}
    if not names <= {FREEZE_LOCK, RUN_LOCK}:
        return  # anything else there is a study's or the user's, and stays
    for name in names - before:
        (output / name).unlink(missing_ok=True)
    if created:
        shutil.rmtree(output, ignore_errors=True)


def refuse_occupied(output: Path, data: bytes) -> bool:
    """Refuse an output that is frozen, holds anything else or lies below a file; return whether
    a killed freeze of the same config bytes left only its config copy there (it may then complete).

    Raises:
        PublishConflictError: the output is frozen.
        QhInputError: any other output but a new or empty directory (or the killed freeze's).
    """
    below_file = file_in_the_way(output.parent)
    if below_file is not None:
        raise input_error(
            "freeze_study",
            "output",
            str(output),
            f"a new or empty directory (it lies below the file {str(below_file)!r})",
            "each study publishes into its own directory",
        )
    if (output / FREEZE_RECEIPT).exists():
        raise PublishConflictError(
            f"freeze_study: {output / FREEZE_RECEIPT} already exists; a study is frozen once. "
            "HINT: `qhlab study run` skips steps that already authenticate; use a new --output for a new study."
        )
    # A freeze killed after publishing its config copy leaves only that copy (and perhaps a
    # temporary file): the same config bytes may complete the freeze there.
    leftovers = (
        sorted(p.name for p in output.iterdir() if TEMP_MARKER not in p.name and p.name not in (FREEZE_LOCK, RUN_LOCK))
        if output.is_dir()
        else []
    )
    # ...and perhaps the family copies it was making, which the freeze makes again.
    resumable = (
        bool(leftovers)
        and set(leftovers) <= {STUDY_CONFIG_COPY, FAMILY_DIR, PREPARATION_DIR}
        and (STUDY_CONFIG_COPY not in leftovers or (output / STUDY_CONFIG_COPY).read_bytes() == data)
    )
    if output.exists() and (not output.is_dir() or (leftovers and not resumable)):
        raise input_error(
            "freeze_study",
            "output",
            str(output),
            "a new or empty directory",
            "each study publishes into its own directory",
        )
    return resumable


def _freeze_locked(
    config: QhArchitectureStudyConfig, data: bytes, resolved: Path, output: Path, executor, gate_feasible: bool
) -> FrozenStudy:
    """The freeze itself, with the study's freeze lock held (a second freeze exits 3)."""
    # Lazy: keeps importing this module free of torch.
    from qhlab.finite_horizon.data import load_population

    refuse_occupied(output, data)  # again, now that no other freeze can run here
    digests = user_source_digests(config, resolved.parent)
    preparation, prepared_from = check_preparation(config, digests)
    train_path = resolve_population(
        config.train,
        "train",
        config.population_cache,
        progress=True,
        executor=executor or config.executor_choice(),
        call="freeze_study",
    )
    first = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates)
    population = load_population(train_path, split="train", horizon=first.horizon)  # Bellman-checked
    audit = audit_population(train_path, call="freeze_study")
    frozen_validation = _checked_validation(config, preparation, population, train_path)
    if gate_feasible:
        _refuse_nothing_to_learn(config, population, train_path)
    support = population_support(population)
    chain = canonical_first_chain(population)
    output.mkdir(parents=True, exist_ok=True)
    sources, contracts = freeze_family(config, resolved.parent, population, output)
    shas = {arm: record["sha256"] for arm, record in sources.items()}
    if shas != digests:
        raise QhInputError(
            f"freeze_study: user arms {sorted(a for a in shas if shas[a] != digests.get(a))} changed while the "
            "study was frozen. HINT: freeze again once their files are still."
        )
    recipes = _recipe_digests(config, shas)
    arms = _arm_records(config, sources, contracts, shas)
    body = {
        "study": config.name,
        # A fresh identity: two studies frozen from the same config are still two studies, and
        # a fit of one is never adopted by the other (fit receipts carry it, adoption compares).
        "study_id": secrets.token_hex(16),
        # Where the study was made: receipts name its own files by this absolute path, so a copy
        # elsewhere maps them to its own bytes (``qhlab.evidence.recorded_origin``).
        "output": os.path.abspath(output),
        "config": _config_record(config, data, resolved),
        "profile": config.profile,
        "source_package": source_package_digest(),
        "versions": runtime_versions(),
        "train": _train_record(config, train_path, population, support, chain, audit),
        "validation": _validation_record(config, frozen_validation),
        "arms": arms,
        "recipes": recipes,
        "only_architecture_differs": _only_architecture_differs(config),
        "seeds": list(config.seeds),
        "cells": [cell_name(a, s) for a, s in config.cells],
        "budgets": {"canary_updates": config.canary_updates, "broad_updates": config.broad_updates},
        "thresholds": {
            "tie_band": config.tie_band,
            "regret_fraction": config.regret_fraction,
            "mae_fraction": config.mae_fraction,
        },
        "max_allocated_bytes": config.max_allocated_bytes,
        "test_data": "none: this study has no test stage",
    }
    if sources:
        # verify refuses a file added to the copies, as every step does before importing them.
        body["sealed_directories"] = [FAMILY_DIR]
    # How the study was prepared: the tuning and pilot records, copied in and bound (None: unrecorded).
    body["preparation"] = preparation
    prepared = copy_preparation(prepared_from, output)
    if not (output / STUDY_CONFIG_COPY).exists():
        publish_bytes(output / STUDY_CONFIG_COPY, data)
    inputs = {f"train/{k}": v for k, v in population_files(train_path).items()}
    # Execution evidence, not a decision input: which executor labelled TRAIN, and where.
    body["train"]["labelling"], generation = labelling_record(train_path, executor or config.executor_choice())
    inputs.update({f"train/{k}": v for k, v in generation.items()})
    outputs = _freeze_outputs(output, prepared, sources)
    if config.experiment.recipe_file is not None:
        inputs["recipe_file"] = Path(config.experiment.recipe_file)
    write_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt, body=body, inputs=inputs, outputs=outputs)
    receipt = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt, verify_files=False)
    frozen = FrozenStudy(config, receipt, output, resolved)
    frozen.keep_population(population)
    return frozen


def _checked_validation(
    config: QhArchitectureStudyConfig, preparation: Any, population: Any, train_path: Path
) -> dict | None:
    """Freeze the validation preset (None: a validation named by path); returns it once the
    populations' generators pass ``check_populations``."""
    frozen_validation = validation_preset(config.validation, train_path, population.manifest, call="freeze_study")
    if frozen_validation is not None:
        repeats = validation_start_repeats(
            frozen_validation, config.validation.seed, train_path, population.manifest, call="freeze_study"
        )
        if repeats:
            shown = "; ".join(repeats[:3]) + (f"; and {len(repeats) - 3} more" if len(repeats) > 3 else "")
            raise input_error(
                "freeze_study",
                "validation",
                f"{config.validation.preset} seed {config.validation.seed}: {len(repeats)} scene(s) repeat a start "
                f"({shown})",
                "validation scenes whose initial states differ from each other and from TRAIN's (held out)",
                "the task has few distinct starts (`qhlab env check` counts them): spread the start with its reset "
                "options or kwargs, draw fewer scenes, or another validation seed",
            )
    # A validation named by path is declared, not opened: its generator is compared at development.
    check_populations(
        config,
        preparation,
        population.manifest["generator"],
        None
        if frozen_validation is None
        else validation_generator(
            frozen_validation, config.validation.seed, train_path, population.manifest, call="freeze_study"
        ),
    )
    return frozen_validation


def _recipe_digests(config: QhArchitectureStudyConfig, shas: dict[str, str]) -> dict:
    """``{arm: {seed: {updates: recipe digest}}}`` of every cell at both budgets."""
    return {
        arm: {
            str(seed): {
                str(u): recipe_digest(config.cell_recipe(arm, seed, u, sources=shas))
                for u in (config.broad_updates, config.canary_updates)
            }
            for seed in config.seeds
        }
        for arm in config.arms
    }


def _arm_records(
    config: QhArchitectureStudyConfig, sources: dict[str, dict], contracts: dict[str, dict], shas: dict[str, str]
) -> list[dict]:
    """One record per arm, in the config's order: its role, architecture, builder, source and contract."""
    arms = []
    for arm in config.arms:
        declaration = config.declaration(arm)
        recipe = config.cell_recipe(arm, config.seeds[0], config.broad_updates, sources=shas)
        arms.append(
            {
                "arm": arm,
                "role": "baseline" if declaration is None else declaration.role,
                "control": None if declaration is None else declaration.control,
                "matched": None
                if declaration is None or declaration.role != "variant"
                else (declaration.matched or config.baseline_arm),
                "architecture": recipe.architecture.model_dump(mode="json"),
                # Built-in arms are built by qhlab's registered builders; a user arm from its frozen source.
                "builder": sources[arm]["builder"] if arm in sources else "qhlab",
                "source": sources.get(arm),
                "contract": contracts[arm],
            }
        )
    return arms


def _config_record(config: QhArchitectureStudyConfig, data: bytes, resolved: Path) -> dict:
    """The freeze receipt's ``config`` record: the config's bytes, where it was read, and its digests."""
    # Later steps compare the decision digest: execution fields (EXECUTION_FIELDS) may change.
    return {
        "sha256": sha256_bytes(data),
        "source_path": str(resolved),
        "resolved": config.model_dump(mode="json"),
        "decision_sha256": sha256_bytes(canonical_json(config.decision_record())),
        "execution_fields_not_frozen": list(EXECUTION_FIELDS),
    }


def _train_record(
    config: QhArchitectureStudyConfig, train_path: Path, population: Any, support: Any, chain: Any, audit: Any
) -> dict:
    """The freeze receipt's ``train`` record (its ``labelling`` is added once the receipt's inputs are listed)."""
    return {
        "path": str(train_path.resolve()),
        "declared": config.train.model_dump(mode="json"),
        "manifest_sha256": population.digest,
        "support": support,
        # The unit every reward-valued number of the study is printed in.
        "reward_unit": reward_unit(population.manifest["generator"]),
        "canonical_first_chain": chain,
        # Re-simulated chain states drawn with OS randomness: evidence, never recomputed.
        "audit": audit,
        # A user environment's own file, compared (never imported) by `study status`.
        "environment_source": environment_source(config.train, train_path, population.manifest, call="freeze_study"),
        # The preset file's bytes, compared (never read again) by `study status` and `study run`.
        "preset_file": preset_file_record(config.train),
    }


def _validation_record(config: QhArchitectureStudyConfig, frozen_validation: dict | None) -> dict:
    """The freeze receipt's ``validation`` record: its declaration and frozen preset, never opened."""
    # Declared, never opened; its preset is frozen here, drawn later from TRAIN's environment.
    return {
        "declared": config.validation.model_dump(mode="json"),
        "opened": False,
        "preset": frozen_validation,
        "preset_file": preset_file_record(config.validation),
    }


def _freeze_outputs(output: Path, prepared: dict, sources: dict[str, dict]) -> dict:
    """The freeze receipt's outputs: the config copy, the preparation copies and every family file."""
    outputs = {"config": output / STUDY_CONFIG_COPY, **prepared}
    outputs.update(
        {
            f"{FAMILY_DIR}/{arm}/{rel}": output / FAMILY_DIR / arm / rel
            for arm, record in sources.items()
            for rel in record["files"]
        }
    )
    return outputs


def _refuse_nothing_to_learn(config: QhArchitectureStudyConfig, population: Any, path: Path) -> None:
    """Refuse a TRAIN on which the E0 gate cannot pass: no chain state whose best label beats the
    runner-up by more than ``canary_gap_multiple x tie_band`` at every horizon (every state tied,
    as under a reward that is the same for every action). Decided on TRAIN alone, before any fit,
    so that a study that could never pass its gate does not spend its output directory finding out."""
    if select_canary_row(
        population, canonical_chains(population), config.tie_band, gap_multiple=config.canary_gap_multiple
    ):
        return
    raise input_error(
        "freeze_study",
        "train",
        str(path),
        f"a TRAIN population with a chain state whose best label beats the runner-up by more than "
        f"canary_gap_multiple x tie_band ({config.canary_gap_multiple:g} x {config.tie_band:g}) at every horizon",
        "it has nothing the E0 gate can check (`qhlab scenes describe` shows its card): every state's candidates "
        "tie at some horizon. Give the environment a reward that tells actions apart, a longer horizon or other "
        "scenes; or lower tie_band or canary_gap_multiple if the rewards are small",
    )


def _only_architecture_differs(config: QhArchitectureStudyConfig) -> bool:
    base = config.cell_recipe(config.baseline_arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
    for arm in config.arms[1:]:
        other = config.cell_recipe(arm, config.seeds[0], config.broad_updates).model_dump(mode="json")
        changed = {k for k in base if base[k] != other[k]} - {"architecture", "name"}
        if changed:
            raise input_error(
                "freeze_study",
                f"experiment.arms[{arm}]",
                sorted(changed),
                "architecture fields only",
                "a variant alters only the declared architecture",
            )
    return True
