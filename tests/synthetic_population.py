"""A small random population with the tensor fields of ``qhlab.finite_horizon.data.Population``.

Shared by the unit tests of the learning rule and of commissioning, which need batches
without generating physics. Values are random but seeded; rewards depend on the struck
puck's features so that a scorer has something to learn.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["SyntheticPopulation", "synthetic_population"]


@dataclasses.dataclass(frozen=True)
class SyntheticPopulation:
    """The tensor fields of ``Population`` that training reads (S rows, N pucks, K candidates)."""

    horizon: int
    num_candidates: int
    objects: torch.Tensor
    object_mask: torch.Tensor
    goal: torch.Tensor
    candidates: torch.Tensor
    candidate_object: torch.Tensor
    candidate_mask: torch.Tensor
    reward: torch.Tensor
    q: torch.Tensor
    successor: torch.Tensor
    is_chain: torch.Tensor
    split: str = "train"


def synthetic_population(
    n_chain: int = 6,
    k: int = 4,
    n: int = 3,
    horizon: int = 2,
    seed: int = 0,
    *,
    masked_candidates: bool = True,
) -> SyntheticPopulation:
    """``n_chain`` chain rows, each with ``k`` successor rows (whose own successors are -1).

    Args:
        masked_candidates: mask the last candidate of every fourth row (and drop its
            successor), to exercise candidate masks.
    """
    g = torch.Generator().manual_seed(seed)
    s = n_chain * (1 + k)
    objects = torch.randn(s, n, 4, generator=g)
    object_mask = torch.ones(s, n, dtype=torch.bool)
    object_mask[::3, -1] = False
    objects = objects * object_mask.unsqueeze(-1)
    candidates = torch.randn(s, k, 3, generator=g)
    candidate_object = torch.randint(0, n - 1, (s, k), generator=g)
    candidate_mask = torch.ones(s, k, dtype=torch.bool)
    if masked_candidates:
        candidate_mask[1::4, -1] = False
    struck = torch.gather(objects[..., 0], 1, candidate_object)
    reward = 0.1 * torch.tanh(candidates[..., 0] + struck) * candidate_mask
    successor = torch.full((s, k), -1, dtype=torch.int64)
    successor[:n_chain] = n_chain + torch.arange(n_chain * k).view(n_chain, k)
    successor[:n_chain][~candidate_mask[:n_chain]] = -1
    is_chain = torch.zeros(s, dtype=torch.bool)
    is_chain[:n_chain] = True
    return SyntheticPopulation(
        horizon=horizon,
        num_candidates=k,
        objects=objects,
        object_mask=object_mask,
        goal=torch.randn(s, 2, generator=g),
        candidates=candidates,
        candidate_object=candidate_object,
        candidate_mask=candidate_mask,
        reward=reward,
        q=torch.zeros(s, k, horizon),
        successor=successor,
        is_chain=is_chain,
    )
