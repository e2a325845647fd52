"""The scorer's parts: encoders, fusions, readouts, and ``QhScorer``, which composes one of each.

Owns: ``AttentionEncoder`` and ``DeepSetsEncoder`` (objects and goal -> per-object and pooled
embeddings), ``ConcatFusion`` and ``CrossAttentionFusion`` (pooled state with each candidate),
``LocalReadout`` and ``GlobalReadout`` (fused embeddings -> Q_1..Q_H), ``Float32Linear`` (a Q head
that leaves an autocast) and ``QhScorer``. Each part's constructor takes the scorer's widths,
``dims`` (``Widths``: a ``qhlab.finite_horizon.architecture.ScorerDims``). Does not own: which parts make an arm,
the architecture config or building a scorer (``scorer``).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "AttentionEncoder",
    "ConcatFusion",
    "CrossAttentionFusion",
    "DeepSetsEncoder",
    "Float32Linear",
    "GlobalReadout",
    "LocalReadout",
    "QhScorer",
    "Widths",
]


class Widths(Protocol):
    """What a part reads of the scorer's widths (``qhlab.finite_horizon.architecture.ScorerDims``)."""

    object_features: int
    goal_features: int
    candidate_features: int
    horizon: int


class Float32Linear(nn.Linear):
    """A Linear layer that computes in float32 under any autocast (a Q head).

    Q values are compared at ``tie_band`` (1 mm), finer than a bf16 output resolves: bf16 keeps
    8 significant bits, a step of 2-4 mm at 0.5-1 m, so on the ``cpu-bf16`` lane the E0 canaries
    of the tiny study ranked candidates 1.5 cm apart as ties. Only the output layer leaves the
    autocast, as mixed-precision practice keeps outputs and losses in float32. Without an
    active autocast (every float32 lane) it is exactly ``nn.Linear``: same parameters, names,
    initialization and arithmetic.
    """

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(device_type=x.device.type, enabled=False):
                return F.linear(x.float(), self.weight, self.bias)
        return super().forward(x)


def _mlp(d_in: int, d_hidden: int, d_out: int, *, float32_out: bool = False) -> nn.Sequential:
    # Built first to last: the order in which layers draw their initial weights from the RNG.
    return nn.Sequential(
        nn.Linear(d_in, d_hidden), nn.GELU(), (Float32Linear if float32_out else nn.Linear)(d_hidden, d_out)
    )


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x[B, N, W] over rows where mask[B, N] is True -> [B, W] (0 if none)."""
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


class _AttentionBlock(nn.Module):
    """Pre-norm transformer block over tokens [B, T, W] with a key mask [B, T]."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_attn = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.mlp = _mlp(width, 2 * width, width)

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm_attn(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        # [B, heads, T, W/heads]; key_mask [B, 1, 1, T] keeps padded objects out of every query
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=key_mask[:, None, None, :],
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm_mlp(x))


class AttentionEncoder(nn.Module):
    """Objects interact through masked self-attention; the goal is an always-valid token.

    forward(objects[B,N,F], object_mask[B,N], goal[B,G]) -> (per_object[B,N,W], state[B,W]).
    """

    def __init__(self, dims: Widths, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.embed_object = nn.Linear(dims.object_features, width)
        self.embed_goal = nn.Linear(dims.goal_features, width)
        self.blocks = nn.ModuleList(_AttentionBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.pool = nn.Linear(2 * width, width)

    def forward(self, objects: Tensor, object_mask: Tensor, goal: Tensor) -> tuple[Tensor, Tensor]:
        goal_token = self.embed_goal(goal).unsqueeze(1)
        tokens = torch.cat([goal_token, self.embed_object(objects)], dim=1)
        # The goal token is always valid, so no query row ever has an empty key set.
        key_mask = torch.cat([object_mask.new_ones(object_mask.shape[0], 1), object_mask], dim=1)
        for block in self.blocks:
            tokens = block(tokens, key_mask)
        tokens = self.norm(tokens)
        per_object = tokens[:, 1:] * object_mask.unsqueeze(-1).to(tokens.dtype)
        state = self.pool(torch.cat([tokens[:, 0], _masked_mean(per_object, object_mask)], dim=-1))
        return per_object, state


class DeepSetsEncoder(nn.Module):
    """No object interaction: per-object MLP of (object, goal), masked mean pooling.

    forward(objects[B,N,F], object_mask[B,N], goal[B,G]) -> (per_object[B,N,W], state[B,W]).
    """

    def __init__(self, dims: Widths, width: int, depth: int) -> None:
        super().__init__()
        self.embed_object = nn.Linear(dims.object_features, width)
        self.embed_goal = nn.Linear(dims.goal_features, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), _mlp(width, 2 * width, width)) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.pool = nn.Linear(2 * width, width)

    def forward(self, objects: Tensor, object_mask: Tensor, goal: Tensor) -> tuple[Tensor, Tensor]:
        goal_embedding = self.embed_goal(goal)
        x = self.embed_object(objects) + goal_embedding.unsqueeze(1)
        for block in self.blocks:
            x = x + block(x)
        per_object = self.norm(x) * object_mask.unsqueeze(-1).to(x.dtype)
        state = self.pool(torch.cat([goal_embedding, _masked_mean(per_object, object_mask)], dim=-1))
        return per_object, state


class ConcatFusion(nn.Module):
    """fused[B,K,W] = MLP([state, embed(candidate)])."""

    def __init__(self, dims: Widths, width: int) -> None:
        super().__init__()
        self.embed_candidate = nn.Linear(dims.candidate_features, width)
        self.mlp = _mlp(2 * width, 2 * width, width)

    def forward(self, state: Tensor, per_object: Tensor, object_mask: Tensor, candidates: Tensor) -> Tensor:
        c = self.embed_candidate(candidates)
        s = state.unsqueeze(1).expand(-1, c.shape[1], -1)
        return self.mlp(torch.cat([s, c], dim=-1))


class CrossAttentionFusion(nn.Module):
    """Each candidate attends over the (masked) objects; fused = MLP([state, cand, attended])."""

    def __init__(self, dims: Widths, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed_candidate = nn.Linear(dims.candidate_features, width)
        self.query = nn.Linear(width, width)
        self.key_value = nn.Linear(width, 2 * width)
        self.mlp = _mlp(3 * width, 2 * width, width)

    def forward(self, state: Tensor, per_object: Tensor, object_mask: Tensor, candidates: Tensor) -> Tensor:
        c = self.embed_candidate(candidates)
        b, k, w = c.shape
        n = per_object.shape[1]
        hd = w // self.heads
        q = self.query(c).view(b, k, self.heads, hd).transpose(1, 2)
        key, value = self.key_value(per_object).view(b, n, 2, self.heads, hd).unbind(2)
        # A state with no valid object would give an empty key set; let such rows see all
        # (zeroed) slots instead of producing NaN. Populations always have >= 1 puck.
        mask = object_mask | ~object_mask.any(dim=1, keepdim=True)
        attended = F.scaled_dot_product_attention(
            q, key.transpose(1, 2), value.transpose(1, 2), attn_mask=mask[:, None, None, :]
        )
        attended = attended.transpose(1, 2).reshape(b, k, w)
        s = state.unsqueeze(1).expand(-1, k, -1)
        return self.mlp(torch.cat([s, c, attended], dim=-1))


class LocalReadout(nn.Module):
    """q[B,K,H] = MLP([fused, struck embedding, struck raw features, candidate raw features]).

    "Local" means the readout reads the object the candidate acts on: its encoder embedding
    and, through a skip connection around the encoder, its raw features. With the
    candidate's own raw features this lets the readout form the geometry of a strike
    directly instead of only through the encoder and fusion (measured on the demo
    populations: the skip path is what brings MAE_3 under half the constant's).
    """

    def __init__(self, dims: Widths, width: int, horizon: int) -> None:
        super().__init__()
        d_in = 2 * width + dims.object_features + dims.candidate_features
        self.mlp = _mlp(d_in, 2 * width, horizon, float32_out=True)

    def forward(
        self, fused: Tensor, per_object: Tensor, candidate_object: Tensor, objects: Tensor, candidates: Tensor
    ) -> Tensor:
        # A candidate that acts on no object (-1) reads zeros where a struck object's embedding and
        # features would be; for an environment whose candidates all act on one (the puck world)
        # this is the plain gather, bit for bit.
        acts = (candidate_object >= 0).unsqueeze(-1)
        index = candidate_object.clamp(min=0).unsqueeze(-1)
        struck = torch.gather(per_object, 1, index.expand(-1, -1, per_object.shape[-1]))
        struck_raw = torch.gather(objects, 1, index.expand(-1, -1, objects.shape[-1]))
        struck = torch.where(acts, struck, torch.zeros_like(struck))
        struck_raw = torch.where(acts, struck_raw, torch.zeros_like(struck_raw))
        return self.mlp(torch.cat([fused, struck, struck_raw, candidates], dim=-1))


class GlobalReadout(nn.Module):
    """q[B,K,H] = MLP([fused, candidate raw]): never reads any puck's embedding or features.

    The candidate's raw features (direction, speed, strikes-target flag) carry no puck
    state, so this is the local readout minus exactly the object-specific inputs.
    """

    def __init__(self, dims: Widths, width: int, horizon: int) -> None:
        super().__init__()
        self.mlp = _mlp(width + dims.candidate_features, 2 * width, horizon, float32_out=True)

    def forward(
        self, fused: Tensor, per_object: Tensor, candidate_object: Tensor, objects: Tensor, candidates: Tensor
    ) -> Tensor:
        return self.mlp(torch.cat([fused, candidates], dim=-1))


class QhScorer(nn.Module):
    """encoder -> fusion -> readout; see the module docstring for the contract."""

    def __init__(self, encoder: nn.Module, fusion: nn.Module, readout: nn.Module, dims: Widths) -> None:
        super().__init__()
        self.encoder = encoder
        self.fusion = fusion
        self.readout = readout
        self.dims = dims

    def forward(
        self,
        objects: Tensor,
        object_mask: Tensor,
        goal: Tensor,
        candidates: Tensor,
        candidate_object: Tensor,
        candidate_mask: Tensor,
    ) -> Tensor:
        """Rate every candidate.

        Args:
            objects: [B, N, F] float, zero-padded object features.
            object_mask: [B, N] bool, real objects.
            goal: [B, G] float.
            candidates: [B, K, C] float.
            candidate_object: [B, K] int64, index in N of the struck object.
            candidate_mask: [B, K] bool, real candidates.

        Returns:
            q: [B, K, H] float; masked candidates hold 0.0 (finite, never selected by the
            learning rule or evaluation, which mask them).
        """
        per_object, state = self.encoder(objects, object_mask, goal)
        fused = self.fusion(state, per_object, object_mask, candidates)
        # Padded candidates may carry any index; point them at slot 0 so the gather is safe.
        struck = torch.where(candidate_mask, candidate_object, torch.zeros_like(candidate_object))
        q = self.readout(fused, per_object, struck, objects, candidates)
        return q.masked_fill(~candidate_mask.unsqueeze(-1), 0.0)
