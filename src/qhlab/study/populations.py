"""The study's two populations: resolving a declared source, the files a receipt binds, support.

Owns: turning a ``PopulationSource`` into a population directory (a named path, or a preset
generated into / reused from the population cache), the population files a study receipt
binds, and the support record (scenes, states, candidates, K, H) a receipt carries. Does not
own: generating populations (``qhlab.scenes``), reading them (``qhlab.finite_horizon.data``)
or drawing the generation bar (``qhlab.training.terminal``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from qhlab.design.study_config import PopulationSource
from qhlab.evidence import QhInputError, input_error, read_receipt
from qhlab.evidence.layout import GENERATION_RECEIPT, MANIFEST, POPULATION_FILES, STUDY_CALL
from qhlab.execution.user_code import read_source
from qhlab.scenes import cached_population
from qhlab.scenes.environment import Environment, EnvironmentSpec
from qhlab.scenes.gymnasium_ids import registration_origin
from qhlab.scenes.origin import population_origin
from qhlab.scenes.presets import Preset, load_preset
from qhlab.scenes.records import PopulationGenerationReceipt
from qhlab.scenes.sampler import scene_seed
from qhlab.training.terminal import GenerationProgress

__all__ = [
    "environment_source",
    "labelling_record",
    "population_files",
    "population_support",
    "resolve_population",
    "validation_environment",
    "validation_generator",
    "validation_preset",
]


def population_files(path: Path) -> dict[str, Path]:
    """{file name: path} of every file of the population at ``path`` (manifest first)."""
    return {name: path / name for name in (MANIFEST, *POPULATION_FILES)}


def resolve_population(
    source: PopulationSource,
    split: str,
    cache: str,
    *,
    progress: bool,
    executor: Any = None,
    preset: Preset | None = None,
    environment: EnvironmentSpec | None = None,
    call: str = STUDY_CALL,
) -> Path:
    """Generate (or reuse from the cache) a preset population, or return the named path.

    Args:
        source: the declared source (``path``, or ``preset`` and ``seed``).
        split: "train" or "validation".
        cache: the population cache directory (``~`` allowed).
        progress: draw a bar while a preset population is generated.
        executor: where its label chunks run (a ``qhlab.execution.ExecutorChoice``; None: local).
        preset: the preset as frozen (instead of reading ``source.preset`` again).
        environment: the environment as frozen (a TRAIN population's copy of a user environment).
        call: the command a refusal names (a cache that cannot take a new population is refused
            as ``population_cache`` before anything is labelled).
    """
    if source.path is not None:
        path = Path(source.path)
        if not (path / MANIFEST).is_file():
            raise input_error(
                STUDY_CALL,
                f"{split}.path",
                str(path),
                "an existing population directory (one `qhlab scenes generate` wrote)",
                "generate the population there, or name a preset and seed instead",
            )
        return path

    reporter = None
    if progress:
        reporter = GenerationProgress(f"{split} population ({source.preset}, seed {source.seed})")
    try:
        # The step audits the population itself and records that audit in its receipt.
        return cached_population(
            source.preset if preset is None else preset,
            split,
            source.seed,
            Path(cache).expanduser(),
            progress=reporter,
            executor=executor,
            audit=False,
            environment=environment,
            call=call,
            field="population_cache",
        )
    finally:
        if reporter is not None:
            reporter.close()


def labelling_record(path: Path, executor: Any) -> tuple[dict, dict[str, Path]]:
    """How a step's population was labelled: execution evidence for the step's receipt.

    Args:
        path: the population directory.
        executor: the ``ExecutorChoice`` this step would label on (used only if the population
            was not already in the cache).

    Returns:
        (``{"executor": this step's choice, "generation": the population's generation receipt
        body or None}``, ``{"generation_receipt": path}`` to bind when the population has one;
        a population written before generation receipts existed has none).
    """

    receipt = path / GENERATION_RECEIPT
    if not receipt.is_file():
        return {"executor": executor.record(), "generation": None}, {}
    body = read_receipt(receipt, PopulationGenerationReceipt).body_record()
    return {"executor": executor.record(), "generation": body}, {"generation_receipt": receipt}


def population_support(population: Any) -> dict[str, int]:
    """Counts a receipt records: scenes, chain and successor states, chain candidates, K, H."""
    is_chain = population.is_chain.numpy().astype(bool)
    mask = population.candidate_mask.numpy()
    return {
        "scenes": int(np.unique(population.scene_id.numpy()[is_chain]).size),
        "chain_states": int(is_chain.sum()),
        "successor_states": int((~is_chain).sum()),
        "candidates": int(mask[is_chain].sum()),
        "K": int(population.num_candidates),
        "H": int(population.horizon),
    }


def validation_preset(source: PopulationSource, train: Path, train_manifest: dict, *, call: str) -> dict | None:
    """The validation preset as the freeze binds it (None for a population named by path).

    A study's validation is drawn from its TRAIN's environment: the same factory (its options may
    differ), so that a user environment's validation uses the copy frozen in the TRAIN population.

    Raises:
        QhInputError: the validation preset names another environment than TRAIN's.
    """
    if source.preset is None:
        return None
    preset = load_preset(source.preset, call=call)
    train_spec, _ = population_origin(train, train_manifest, call=call)
    if preset.environment.factory != train_spec.factory:
        raise input_error(
            call,
            "validation.preset",
            source.preset,
            f"a preset of TRAIN's environment ({train_spec.factory!r})",
            f"it names environment {preset.environment.factory!r}; a study's validation is drawn from its TRAIN's "
            "environment",
        )
    return preset.record()


def validation_environment(
    frozen_preset: dict, train: Path, train_manifest: dict, *, call: str
) -> tuple[Preset, EnvironmentSpec]:
    """The frozen validation preset, and its environment: TRAIN's (a user environment from the copy
    frozen inside the TRAIN population, never the user's files) with the validation's options."""
    preset = Preset.model_validate(frozen_preset)
    train_spec, _ = population_origin(train, train_manifest, call=call)
    spec = EnvironmentSpec(
        factory=train_spec.factory,
        options=dict(preset.environment.options),
        source=train_spec.source,
        root=train_spec.root,
    )
    return preset, spec


def validation_start_repeats(
    frozen_preset: dict, seed: int, train: Path, train_manifest: dict, *, call: str
) -> list[str]:
    """The study's validation scenes that would start where a TRAIN scene or an earlier validation
    scene does, found before any validation label is drawn: each scene's initial state on TRAIN's
    frozen environment against TRAIN's stored starts.

    Returns:
        One description per repeating scene, in draw order (empty: a held-out validation).
    """
    # Lazy: keeps importing this module free of pyarrow.
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    preset, spec = validation_environment(frozen_preset, train, train_manifest, call=call)
    environment = Environment.make(spec, call=call)
    column = environment.state_column
    table = pq.read_table(train / "states.parquet", columns=["scene_id", "step", column])
    table = table.filter(pc.equal(table["step"], 0))
    starts: dict[bytes, str] = {}
    for scene_id, state in zip(table["scene_id"].to_pylist(), table[column].to_pylist(), strict=True):
        starts.setdefault(np.asarray(state, dtype=np.float64).tobytes(), f"TRAIN scene {scene_id}")
    repeats = []
    for index in range(preset.scenes):
        scene = json.loads(json.dumps(environment.sample_scene(scene_seed("validation", seed, index)), allow_nan=False))
        start = environment.initial_state(scene).tobytes()
        if start in starts:
            repeats.append(f"validation scene {index} starts where {starts[start]} does")
        starts.setdefault(start, f"validation scene {index}")
    return repeats


def validation_generator(frozen_preset: dict, seed: int, train: Path, train_manifest: dict, *, call: str) -> dict:
    """The generator record the study's validation will have, without drawing it: its frozen preset
    on TRAIN's environment (``validation_environment``), so that records made on the study's
    validation distribution are recognised before any scene of it exists."""
    # Lazy: keeps importing this module free of the population writer's imports.
    from qhlab.scenes.population import expected_generator

    preset, environment = validation_environment(frozen_preset, train, train_manifest, call=call)
    return expected_generator(preset, "validation", seed, environment=environment, call=call)


def environment_source(source: PopulationSource, train: Path, train_manifest: dict, *, call: str) -> dict | None:
    """Where TRAIN's user environment was read from, and the digest of the copy frozen in it.

    Returns:
        ``{"original": path of the user's file or package, "sha256": the frozen copy's}``; None for
        a built-in environment or a population named by path (its origin is not the config's).
    """
    spec, _ = population_origin(train, train_manifest, call=call)
    if spec.source is None or source.preset is None:
        return None
    preset = load_preset(source.preset, call=call)
    if spec.builtin:
        # A built-in factory with frozen code: one's own module that registers a Gymnasium task.
        try:
            original = registration_origin(preset.environment.options.get("env_id"), preset.base, call=call)
        except QhInputError:
            original = None
        return {"original": None if original is None else str(original), "sha256": spec.source["sha256"]}
    try:
        located, _ = read_source(preset.environment.factory, preset.base or Path.cwd(), field="environment.factory")
    except ValueError:
        return {"original": None, "sha256": spec.source["sha256"]}
    return {"original": str(located.path), "sha256": spec.source["sha256"]}
