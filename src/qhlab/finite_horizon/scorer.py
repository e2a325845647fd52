"""The QH scorer family as modules: one builder per component kind, their composition, ensembles.

Owns: building a module from a validated ``ArchitectureConfig`` (``build_scorer``: a built-in
arm by the composition of its component builders ``_ENCODERS``, ``_FUSIONS``, ``_READOUTS``, a
user arm from its provided source) and ``QhEnsemble`` (M scorers whose Q is their mean;
``scorer_members``). A scorer rates every candidate action of a state with Q_1..Q_H in native
units. It is made of three named submodules so that diagnostics can hook them:

* `encoder`: objects (pucks) and goal -> per-object embeddings [B, N, W] and a pooled state
  embedding [B, W];
* `fusion`: pooled state with each candidate -> fused candidate embeddings [B, K, W];
* `readout`: fused embeddings -> q [B, K, H]; "local" also reads the embedding and the raw
  features of the puck the candidate strikes, "global" reads the fused (pooled-state)
  embedding and the candidate's raw features only.

Does not own: the architecture as data and the arm registry (``architecture``: torch-free),
the parts themselves (``components``), the learning rule (``q_learning``), data loading
(``data``) or the recipe (``recipe``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from qhlab.evidence import QhError, canonical_json, sha256_bytes
from qhlab.execution.user_code import resolve_entry
from qhlab.finite_horizon.architecture import ARMS, MAX_ENSEMBLE_MEMBERS, ArchitectureConfig, ScorerDims
from qhlab.finite_horizon.components import (
    AttentionEncoder,
    ConcatFusion,
    CrossAttentionFusion,
    DeepSetsEncoder,
    Float32Linear,
    GlobalReadout,
    LocalReadout,
    QhScorer,
)

__all__ = ["ArmContractError", "QhEnsemble", "build_scorer", "scorer_members", "scorer_structure"]


# One builder per component kind. Each receives the validated config and the dims; adding a
# kind is one entry here (and one value in the config's Literal).
_ENCODERS: dict[str, Callable[[ArchitectureConfig, ScorerDims], nn.Module]] = {
    "attention": lambda arch, dims: AttentionEncoder(dims, arch.encoder.width, arch.encoder.depth, arch.encoder.heads),
    "deepsets": lambda arch, dims: DeepSetsEncoder(dims, arch.encoder.width, arch.encoder.depth),
}
_FUSIONS: dict[str, Callable[[ArchitectureConfig, ScorerDims], nn.Module]] = {
    "concat": lambda arch, dims: ConcatFusion(dims, arch.encoder.width),
    "cross_attention": lambda arch, dims: CrossAttentionFusion(dims, arch.encoder.width, arch.encoder.heads),
}
_READOUTS: dict[str, Callable[[ArchitectureConfig, ScorerDims], nn.Module]] = {
    "local": lambda arch, dims: LocalReadout(dims, arch.encoder.width, dims.horizon),
    "global": lambda arch, dims: GlobalReadout(dims, arch.encoder.width, dims.horizon),
}
_KINDS = {"encoder.kind": _ENCODERS, "fusion": _FUSIONS, "readout": _READOUTS}


def _compose(arch: ArchitectureConfig, dims: ScorerDims) -> QhScorer:
    """encoder, then fusion, then readout: this order fixes how parameters draw from the RNG."""
    encoder = _ENCODERS[arch.encoder.kind](arch, dims)
    fusion = _FUSIONS[arch.fusion](arch, dims)
    readout = _READOUTS[arch.readout](arch, dims)
    return QhScorer(encoder, fusion, readout, dims)


class QhEnsemble(nn.Module):
    """M scorers of one architecture whose Q is their mean; the learning rule trains each alone.

    Attributes:
        members: `nn.ModuleList` of M scorers (each with `encoder`, `fusion`, `readout`).
        dims: the members' dims.
    """

    def __init__(self, members: list[nn.Module], dims: ScorerDims) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(
                f"QhEnsemble: {len(members)} member(s) is not allowed; allowed: >= 2. "
                "HINT: one scorer is the plain scorer, not an ensemble"
            )
        self.members = nn.ModuleList(members)
        self.dims = dims

    def forward(self, *inputs: Tensor) -> Tensor:
        """The members' mean q [B, K, H]; ``inputs`` are `QhScorer.forward`'s six tensors, in order."""
        return torch.stack([member(*inputs) for member in self.members]).mean(dim=0)


def scorer_members(scorer: nn.Module) -> list[nn.Module]:
    """The scorers a learning rule trains one by one: an ensemble's members, else [scorer]."""
    return list(scorer.members) if isinstance(scorer, QhEnsemble) else [scorer]


def scorer_structure(scorer: nn.Module) -> dict:
    """What one scorer is made of: its parameters' count and the digest of their layout.

    Args:
        scorer: one scorer (an ensemble's member, or a one-member scorer).

    Returns:
        ``{"parameters": int, "sha256": SHA-256 of the canonical JSON of [[name, shape, dtype],
        ...] in ``named_parameters`` order}``: a freeze records it, and a fit refuses to train a
        scorer whose structure is not the one its freeze recorded.
    """
    layout = [[name, list(p.shape), str(p.dtype)] for name, p in scorer.named_parameters()]
    return {
        "parameters": int(sum(p.numel() for p in scorer.parameters())),
        "sha256": sha256_bytes(canonical_json(layout)),
    }


def build_scorer(
    arch: ArchitectureConfig, dims: ScorerDims, *, q_head_init: str = "random", members: int = 1
) -> nn.Module:
    """Build a fresh scorer of `arch` for `dims` (parameters drawn from torch's global RNG).

    Args:
        arch: validated architecture config.
        dims: input/output widths.
        q_head_init: "random" (every layer as drawn) or "zero": the readout's Q head (its last
            layer) is drawn as usual, then set to zero, so the scorer outputs Q = 0 everywhere
            and every other parameter is what "random" draws.
        members: M in 1..MAX_ENSEMBLE_MEMBERS. 1 builds the plain scorer; M > 1 a `QhEnsemble`
            of M scorers built one after another (member 0 draws exactly what the plain
            scorer draws, member 1 the RNG's next values, ...).

    Returns:
        An `nn.Module` whose forward maps (objects[B,N,F], object_mask[B,N], goal[B,G],
        candidates[B,K,C], candidate_object[B,K], candidate_mask[B,K]) -> q[B,K,H]: with
        M = 1 a scorer with submodules `encoder`, `fusion`, `readout`; with M > 1 a
        `QhEnsemble` of such scorers (`scorer_members` lists them).
    """
    if q_head_init not in ("random", "zero"):
        raise ValueError(f"build_scorer: q_head_init={q_head_init!r} is not allowed; allowed: random, zero")
    if isinstance(members, bool) or not isinstance(members, int) or not 1 <= members <= MAX_ENSEMBLE_MEMBERS:
        raise ValueError(
            f"build_scorer: members={members!r} is not allowed; allowed: an int in "
            f"1..{MAX_ENSEMBLE_MEMBERS}. HINT: 1 is the plain scorer"
        )
    if members > 1:
        return QhEnsemble([build_scorer(arch, dims, q_head_init=q_head_init) for _ in range(members)], dims)
    if arch.is_user_arm:
        return _build_user_arm(arch, dims, q_head_init)
    scorer = (ARMS[arch.arm].builder or _compose)(arch, dims)
    if q_head_init == "zero":
        heads = [m for m in scorer.readout.modules() if isinstance(m, Float32Linear)]
        linears = [m for m in scorer.readout.modules() if isinstance(m, nn.Linear)]
        if len(heads) != 1 or linears[-1] is not heads[0]:
            where = ", not its last Linear" if len(heads) == 1 else ""
            raise ValueError(
                f"build_scorer: q_head_init='zero' with arm={arch.arm!r} is not allowed: its readout has "
                f"{len(heads)} float32 Q head(s){where}; allowed: exactly one Float32Linear, the readout's last "
                "Linear. HINT: end the arm's readout with _mlp(..., float32_out=True), or use q_head_init='random'."
            )
        with torch.no_grad():
            heads[0].weight.zero_()
            heads[0].bias.zero_()
    return scorer


class ArmContractError(QhError):
    """A user arm's builder broke its contract (not a module, no Q head to zero).

    Attributes:
        cause: what is wrong, in words. hint: what to do.
    """

    def __init__(self, where: str, cause: str, hint: str) -> None:
        super().__init__(f"{where}: {cause}. HINT: {hint}.")
        self.cause = cause
        self.hint = hint


def _build_user_arm(arch: ArchitectureConfig, dims: ScorerDims, q_head_init: str) -> nn.Module:
    """A user arm's module, from the copy of its source provided in this process.

    ``q_head_init="zero"`` zeroes the module's Q head: the last ``nn.Linear`` (in module order)
    whose ``out_features`` is H, drawn as usual first.
    """
    source = resolve_entry(f"arm {arch.arm!r}", arch.builder, arch.source_sha256, call="build_scorer")
    scorer = source.entry_function()(arch, dims)
    if not isinstance(scorer, nn.Module):
        raise ArmContractError(
            f"build_scorer: arm {arch.arm!r}: builder {arch.builder!r}",
            f"it returned {type(scorer).__name__}; allowed: a torch.nn.Module",
            "the builder is build(arch, dims) -> nn.Module",
        )
    if q_head_init == "zero":
        heads = [m for m in scorer.modules() if isinstance(m, nn.Linear) and m.out_features == dims.horizon]
        if not heads:
            raise ArmContractError(
                f"build_scorer: arm {arch.arm!r}: builder {arch.builder!r}",
                f"q_head_init='zero' is not allowed: the module has no nn.Linear with out_features={dims.horizon} "
                "(H) to zero; allowed: a module whose Q head is such a Linear",
                "end the arm with nn.Linear(..., dims.horizon), or use q_head_init='random'",
            )
        with torch.no_grad():
            heads[-1].weight.zero_()
            if heads[-1].bias is not None:
                heads[-1].bias.zero_()
    return scorer
