"""The seeds of a population: one per scene, one per actor chain, from disjoint split streams.

Owns: the splits and the seeds qhlab hands an environment: ``scene_seed`` (a scene's seed, a
256-bit integer that a ``SeedSequence`` of the population's seed, split and scene index
generates, which the environment's ``sample_scene`` draws its scene from) and
``actor_seed_sequence`` (the actor's own stream for one chain). Splits draw from disjoint spawn
keys, so TRAIN and VALIDATION never share a scene seed. Does not own: what a scene is (the
environment), chains (``chains``) or labels (``labels``).
"""

from __future__ import annotations

import numpy as np

from qhlab.evidence import POPULATION_SEED_LIMIT, QhInputError, require_seed

__all__ = ["GENERATOR_VERSION", "SPLITS", "actor_seed_sequence", "scene_seed", "scene_seed_sequence"]

GENERATOR_VERSION = 3
"""The version of qhlab's generic generation (seeds, chains, labels, files) recorded in the
manifest of a population of a user environment. Bumped whenever a change changes an output."""

SPLITS = ("train", "validation", "test")
# Disjoint SeedSequence spawn keys per split: the first key element separates the streams.
_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


def _check_split_seed(split: str, seed: int) -> None:
    if split not in _SPLIT_CODE:
        raise QhInputError(
            f"scenes: split={split!r} is not allowed; allowed: {', '.join(SPLITS)}. "
            "HINT: the split selects a disjoint random stream."
        )
    require_seed("scenes", "seed", seed, limit=POPULATION_SEED_LIMIT, hint="pass a non-negative integer.")


def scene_seed_sequence(split: str, seed: int, scene_index: int) -> np.random.SeedSequence:
    """The random stream of one scene (its parameters and initial state)."""
    _check_split_seed(split, seed)
    return np.random.SeedSequence(entropy=seed, spawn_key=(_SPLIT_CODE[split], scene_index, 0))


def scene_seed(split: str, seed: int, scene_index: int) -> int:
    """The seed ``sample_scene`` draws scene ``scene_index`` of a population from: the 256 bits
    (four 64-bit words, little-endian) that ``scene_seed_sequence`` generates.

    An environment may seed any generator with it (``numpy.random.default_rng(seed)``).
    """
    words = scene_seed_sequence(split, seed, scene_index).generate_state(4, np.uint64)
    return int.from_bytes(words.astype("<u8").tobytes(), "little")


def actor_seed_sequence(split: str, seed: int, scene_index: int, chain: int) -> np.random.SeedSequence:
    """The actor's own random stream for one chain (independent of the scene's stream)."""
    _check_split_seed(split, seed)
    return np.random.SeedSequence(entropy=seed, spawn_key=(_SPLIT_CODE[split], scene_index, 1 + chain))
