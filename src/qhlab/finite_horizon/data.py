"""The population as tensors: a checked population (``qhlab.scenes.reader``) -> ``Population``.

Owns: ``load_population`` and the frozen ``Population``, the tensor contract training and
evaluation read (float32 features, rewards and labels; int64 identities; bool masks). Every
check of a population's content (manifest and digests, split and horizon, columns, shapes,
identities, finiteness, Bellman, successor physics) happens in ``qhlab.scenes.reader``, which
this module calls once. Does not own: reading or checking files, generating populations,
batching or evaluation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import numpy as np
import torch

from qhlab.scenes.reader import PopulationFields, read_population

__all__ = ["Population", "load_population"]


@dataclass(frozen=True, eq=False)
class Population(PopulationFields[torch.Tensor]):
    """A loaded, authenticated population as tensors: the tensor contract that training and
    evaluation read.

    Attributes:
        manifest, path, digest, split, horizon, num_candidates, name: as ``PopulationFields``.
        objects, goal, candidates, reward, q: float32 tensors of ``PopulationFields``' shapes
            ([S, N, F], [S, G], [S, K, C], [S, K], [S, K, H]).
        object_mask, candidate_mask, is_chain: bool tensors ([S, N], [S, K], [S]).
        candidate_object, q_horizons, successor, scene_index, scene_id, state_id, chain_id, step:
            int64 tensors ([S, K], [S], [S, K], [S], [S], [S], [S], [S]).
    """


# The fields read in float64 and trained in float32 (every value is checked to fit float32 on read).
_FLOAT32_FIELDS = frozenset({"objects", "goal", "candidates", "reward", "q"})


def load_population(path: str | os.PathLike, *, split: str, horizon: int | None = None) -> Population:
    """``qhlab.scenes.reader.read_population`` (same arguments, checks and refusals), as tensors.

    Returns:
        The frozen ``Population``: the checked arrays as torch tensors, in the same row order.
    """
    arrays = read_population(path, split=split, horizon=horizon)
    values = {}
    for field in fields(arrays):
        value = getattr(arrays, field.name)
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.astype(np.float32) if field.name in _FLOAT32_FIELDS else value)
        values[field.name] = value
    return Population(**values)
