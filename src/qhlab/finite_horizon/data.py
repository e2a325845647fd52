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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qhlab.scenes.reader import read_population

__all__ = ["Population", "load_population"]


@dataclass(frozen=True, eq=False)
class Population:
    """A loaded, authenticated population (S rows: chain states, then successor states).

    Attributes:
        manifest: the authenticated manifest.
        path: the population directory.
        digest: SHA-256 of ``manifest.json`` bytes (the manifest binds every file digest).
        split: ``"train"``, ``"validation"`` or ``"test"``.
        horizon: H.
        num_candidates: K.
        name: population name from the manifest.
        objects: [S, N, F] float32 per-puck features, zero-padded.
        object_mask: [S, N] bool, real pucks.
        goal: [S, G] float32 goal features.
        candidates: [S, K, C] float32 candidate features.
        candidate_object: [S, K] int64 index in N of the struck puck.
        candidate_mask: [S, K] bool, real candidates.
        reward: [S, K] float32 r(s, a), metres.
        q: [S, K, H] float32 exact labels; successor rows hold 1..H-1, 0.0 beyond.
        q_horizons: [S] int64 valid label horizons (H chain rows, H-1 successor rows).
        successor: [S, K] int64 row of the successor state; -1 only on successor rows (the
            loader refuses a chain-row candidate without a successor: no terminal state).
        scene_index: [S] int64 dense 0..n_scenes-1 (scene order of ``scenes.parquet``).
        scene_id: [S] int64.
        state_id: [S] int64.
        chain_id: [S] int64.
        step: [S] int64, -1 for successors.
        is_chain: [S] bool, step >= 0.
    """

    manifest: dict
    path: Path
    digest: str
    split: str
    horizon: int
    num_candidates: int
    name: str
    objects: torch.Tensor
    object_mask: torch.Tensor
    goal: torch.Tensor
    candidates: torch.Tensor
    candidate_object: torch.Tensor
    candidate_mask: torch.Tensor
    reward: torch.Tensor
    q: torch.Tensor
    q_horizons: torch.Tensor
    successor: torch.Tensor
    scene_index: torch.Tensor
    scene_id: torch.Tensor
    state_id: torch.Tensor
    chain_id: torch.Tensor
    step: torch.Tensor
    is_chain: torch.Tensor


def load_population(path: str | os.PathLike, *, split: str, horizon: int | None = None) -> Population:
    """``qhlab.scenes.reader.read_population`` (same arguments, checks and refusals), as tensors.

    Returns:
        The frozen ``Population``: the checked arrays as torch tensors, in the same row order.
    """
    arrays = read_population(path, split=split, horizon=horizon)
    tensor = torch.from_numpy
    return Population(
        manifest=arrays.manifest,
        path=arrays.path,
        digest=arrays.digest,
        split=arrays.split,
        horizon=arrays.horizon,
        num_candidates=arrays.num_candidates,
        name=arrays.name,
        objects=tensor(arrays.objects.astype(np.float32)),
        object_mask=tensor(arrays.object_mask),
        goal=tensor(arrays.goal.astype(np.float32)),
        candidates=tensor(arrays.candidates.astype(np.float32)),
        candidate_object=tensor(arrays.candidate_object),
        candidate_mask=tensor(arrays.candidate_mask),
        reward=tensor(arrays.reward.astype(np.float32)),
        q=tensor(arrays.q.astype(np.float32)),
        q_horizons=tensor(arrays.q_horizons),
        successor=tensor(arrays.successor),
        scene_index=tensor(arrays.scene_index),
        scene_id=tensor(arrays.scene_id),
        state_id=tensor(arrays.state_id),
        chain_id=tensor(arrays.chain_id),
        step=tensor(arrays.step),
        is_chain=tensor(arrays.is_chain),
    )
