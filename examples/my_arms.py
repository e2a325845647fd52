"""Two user arms that are not part of qhlab, for `examples/byo-study.toml`.

A builder is `build(arch, dims) -> torch.nn.Module`. `arch` is the arm's resolved
architecture (`arch.encoder.width`, `.depth`, `.heads` follow the baseline unless the study's
entry overrides them; `arch.options` holds the entry's extra keys) and `dims` is
`qhlab.finite_horizon.architecture.ScorerDims`. The module's forward takes the scorer's six inputs
and returns Q [B, K, H]. Draw every parameter from torch's global RNG, so that one seed
gives one initialisation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _struck(x: Tensor, candidate_object: Tensor, candidate_mask: Tensor) -> Tensor:
    """x[B, N, D] of the object each candidate acts on -> [B, K, D] (zeros for a candidate on none)."""
    # Padded candidates may carry any index, and a candidate on no object carries -1: point both
    # at slot 0 so the gather is safe, then zero them.
    acts = candidate_mask & (candidate_object >= 0)
    index = torch.where(acts, candidate_object, torch.zeros_like(candidate_object)).unsqueeze(-1)
    gathered = torch.gather(x, 1, index.expand(-1, -1, x.shape[-1]))
    return torch.where(acts.unsqueeze(-1), gathered, torch.zeros_like(gathered))


class StruckObjectMLP(nn.Module):
    """Q from the struck puck, the goal and the candidate alone: no other puck is ever read."""

    def __init__(self, dims, width: int, depth: int) -> None:
        super().__init__()
        d_in = dims.object_features + dims.goal_features + dims.candidate_features
        layers: list[nn.Module] = [nn.Linear(d_in, width), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.GELU()]
        layers.append(nn.Linear(width, dims.horizon))  # the Q head (zeroed under q_head_init = "zero")
        self.mlp = nn.Sequential(*layers)

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        struck = _struck(objects, candidate_object, candidate_mask)
        g = goal.unsqueeze(1).expand(-1, candidates.shape[1], -1)
        q = self.mlp(torch.cat([struck, g, candidates], dim=-1))
        return q.masked_fill(~candidate_mask.unsqueeze(-1), 0.0)


def build_mlp(arch, dims) -> nn.Module:
    """An MLP over (struck object, goal, candidate): `options.hidden` sets its width."""
    return StruckObjectMLP(dims, int(arch.options.get("hidden", arch.encoder.width)), arch.encoder.depth)


class _MaxPoolEncoder(nn.Module):
    def __init__(self, dims, width: int) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(dims.object_features + dims.goal_features, width), nn.GELU(),
                                   nn.Linear(width, width))

    def forward(self, objects, object_mask, goal):
        g = goal.unsqueeze(1).expand(-1, objects.shape[1], -1)
        per_object = self.embed(torch.cat([objects, g], dim=-1))
        pooled = per_object.masked_fill(~object_mask.unsqueeze(-1), float("-inf")).amax(dim=1)
        # A state without pucks would pool to -inf; populations always hold one, but stay finite.
        return per_object, torch.nan_to_num(pooled, neginf=0.0)


class MaxPoolSets(nn.Module):
    """Deep sets with max pooling; exposes `encoder` and `readout`, so the benchmark times them."""

    def __init__(self, dims, width: int) -> None:
        super().__init__()
        self.encoder = _MaxPoolEncoder(dims, width)
        d_in = 2 * width + dims.candidate_features
        self.readout = nn.Sequential(nn.Linear(d_in, 2 * width), nn.GELU(), nn.Linear(2 * width, dims.horizon))

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        per_object, pooled = self.encoder(objects, object_mask, goal)
        struck = _struck(per_object, candidate_object, candidate_mask)
        state = pooled.unsqueeze(1).expand(-1, candidates.shape[1], -1)
        q = self.readout(torch.cat([state, struck, candidates], dim=-1))
        return q.masked_fill(~candidate_mask.unsqueeze(-1), 0.0)


def build_maxpool_sets(arch, dims) -> nn.Module:
    """Deep sets whose state is the max over pucks (the built-in control pools by the mean)."""
    return MaxPoolSets(dims, arch.encoder.width)
