"""The QH scorer family: a frozen architecture config, registered arms and their builders.

Owns: `ArchitectureConfig`, `ScorerDims`, the arm registry (`register_arm`, `ARMS`),
`build_scorer` and `QhEnsemble` (M scorers whose Q is their mean; `scorer_members`). A
scorer rates every candidate action of a state with Q_1..Q_H in native units. It is made of
three named submodules so that diagnostics can hook them:

* `encoder`: objects (pucks) and goal -> per-object embeddings [B, N, W] and a pooled state
  embedding [B, W];
* `fusion`: pooled state with each candidate -> fused candidate embeddings [B, K, W];
* `readout`: fused embeddings -> q [B, K, H]; "local" also reads the embedding and the raw
  features of the puck the candidate strikes, "global" reads the fused (pooled-state)
  embedding and the candidate's raw features only.

Arms are registered by name, never subclasses: one `register_arm` call per arm declares its
encoder kind, fusion, readout and default sizes, and its builder (by default the one
composition of the component builders `_ENCODERS`, `_FUSIONS`, `_READOUTS`); adding an arm
is one call. Every arm check (registered name, known kinds, structure of a config) and its
message lives in this module's "arms" section.
Does not own: the parts themselves (`components`), the learning rule (`q_learning`), data
loading (`data`) or the recipe (`recipe`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer,
                      model_validator)
from torch import Tensor, nn

from qhlab.evidence import QhError, require_int
from qhlab.finite_horizon.arm_source import parse_builder, resolve_builder
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

__all__ = [
    "ARMS",
    "ArchitectureConfig",
    "ArmSpec",
    "EncoderConfig",
    "MAX_ENSEMBLE_MEMBERS",
    "QhEnsemble",
    "ScorerDims",
    "build_scorer",
    "register_arm",
    "scorer_members",
]


class EncoderConfig(BaseModel):
    """Object encoder hyper-parameters.

    Attributes:
        kind: "attention" (objects interact through masked self-attention) or "deepsets"
            (no interaction: per-object MLP then masked pooling); None for a user arm, whose
            builder alone says what it is.
        depth: number of encoder blocks.
        width: embedding width W (also the width of fusion and readout).
        heads: attention heads; W must be divisible by it (used by attention encoders and
            by the cross-attention fusion).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    kind: Literal["attention", "deepsets"] | None = None
    depth: int = Field(ge=1, le=16)
    width: int = Field(default=64, ge=8, le=1024)
    heads: int = Field(default=4, ge=1, le=64)

    @model_validator(mode="after")
    def _width_divisible_by_heads(self) -> EncoderConfig:
        if self.width % self.heads != 0:
            raise ValueError(
                f"width={self.width} is not divisible by heads={self.heads}; allowed: a width "
                "that is a multiple of heads"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_kind_of_user_arm(self, handler: Any) -> dict[str, Any]:
        # A user arm has no kind; leaving the key out keeps built-in arms' dumps (and digests) as before.
        data = handler(self)
        if data.get("kind") is None:
            data.pop("kind", None)
        return data


@dataclass(frozen=True)
class ArmSpec:
    """A registered arm: its builder and the architecture it declares.

    Attributes:
        name: registry key.
        builder: `(arch, dims) -> QhScorer`.
        structure: the fixed structural fields of this arm ("encoder.kind", "fusion",
            "readout"); a config that names another value is refused.
        defaults: the free fields this arm declares (e.g. ``{"encoder.depth": 2}``); a study
            applies them over the baseline's sizes. Undeclared sizes follow the baseline.
    """

    name: str
    builder: Callable[[ArchitectureConfig, ScorerDims], nn.Module]
    structure: dict[str, str]
    defaults: dict[str, int]


ARMS: dict[str, ArmSpec] = {}
# The sizes of an arm that declares none and is not sized by a study's baseline.
_GLOBAL_DEFAULTS = {"depth": 1, "width": 64, "heads": 4}


_ARM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ArchitectureConfig(BaseModel):
    """Frozen architecture of one scorer.

    Only `arm` is required for a built-in arm: it fills its structure (encoder kind, fusion,
    readout) and default sizes; a config may override the sizes (depth, width, heads) but not
    the structure, which is what makes an arm an arm.

    A user arm names its ``builder`` (``"file.py:function"`` or ``"package.module:function"``;
    ``arm_source``): it has no structure fields, its sizes (``encoder.width``, ``depth``,
    ``heads``) and ``options`` (extra scalars the builder reads) pass through to the builder,
    and ``source_sha256`` binds the source the builder is imported from (set by the study's
    freeze or by ``qhlab fit`` from the file it names). Validating one never imports it.

    Attributes:
        builder: None for a built-in arm; a user arm's ``"file.py:function"`` or ``"package.module:function"``.
        arm: the arm's name (a registered arm, or any name for a user arm).
        source_sha256: the digest of a user arm's source (set by the freeze or by ``qhlab fit``).
        options: extra scalars a user arm's builder reads (``arch.options``).
        encoder: the encoder's kind and sizes.
        fusion: "concat" or "cross_attention"; filled from a built-in arm, None for a user arm.
        readout: "local" or "global"; filled from a built-in arm, None for a user arm.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    # builder first: the arm's validator reads it (a user arm needs no registration).
    builder: str | None = None
    arm: str = Field(min_length=1, max_length=64, pattern=_ARM_NAME)
    source_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    options: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(
        default_factory=dict, max_length=32)
    encoder: EncoderConfig
    fusion: Literal["concat", "cross_attention"] | None = None
    readout: Literal["local", "global"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_arm(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("builder") is not None:
            filled = dict(data)
            encoder = filled.get("encoder", {})
            if isinstance(encoder, dict):
                filled["encoder"] = {**_GLOBAL_DEFAULTS, **encoder}
            return filled
        arm = data.get("arm")
        # An unknown arm is reported once, by the `arm` field validator; fill the other
        # fields from the baseline so they add no spurious "missing" errors.
        spec = ARMS[arm] if isinstance(arm, str) and arm in ARMS else ARMS["baseline"]
        filled = dict(data)
        encoder = filled.get("encoder", {})
        if isinstance(encoder, dict):
            encoder = dict(encoder)
            encoder.setdefault("kind", spec.structure["encoder.kind"])
            for key in ("depth", "width", "heads"):
                encoder.setdefault(key, spec.defaults.get(f"encoder.{key}", _GLOBAL_DEFAULTS[key]))
            filled["encoder"] = encoder
        filled.setdefault("fusion", spec.structure["fusion"])
        filled.setdefault("readout", spec.structure["readout"])
        return filled

    @field_validator("options")
    @classmethod
    def _scalar_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        for key, value in options.items():
            if not isinstance(value, (bool, int, float, str)) or (isinstance(value, float) and not math.isfinite(value)):
                raise ValueError(f"options.{key}={value!r} is not allowed; allowed: a scalar a builder reads (a "
                                 "boolean, an integer, a finite number or a string)")
        return options

    @field_validator("arm")
    @classmethod
    def _arm_is_registered(cls, arm: str, info: ValidationInfo) -> str:
        return arm if info.data.get("builder") is not None else _arm_spec(arm).name

    @model_validator(mode="after")
    def _arm_and_structure(self) -> ArchitectureConfig:
        if self.builder is None:
            if self.options or self.source_sha256 is not None:
                raise ValueError("options and source_sha256 are not allowed for a built-in arm; allowed: only with "
                                 "builder (a user arm)")
            _check_structure(self)
            return self
        parse_builder(self.builder)
        if self.arm in ARMS:
            raise ValueError(f"arm={self.arm!r} with builder={self.builder!r} is not allowed; allowed: a name that is "
                             f"not a built-in arm ({', '.join(sorted(ARMS))}), or no builder")
        given = [k for k, v in (("encoder.kind", self.encoder.kind), ("fusion", self.fusion),
                                ("readout", self.readout)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} is not allowed for a user arm (builder={self.builder!r}); allowed: "
                             "only sizes (encoder.width, depth, heads) and options: the builder says what it is")
        return self

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: Any) -> dict[str, Any]:
        # Built-in arms dump exactly their old fields (so their recipe digests stay as they were);
        # a user arm dumps no structure fields.
        data = handler(self)
        for key in ("builder", "source_sha256", "fusion", "readout"):
            if data.get(key) is None:
                data.pop(key, None)
        if not data.get("options"):
            data.pop("options", None)
        return data

    @property
    def is_user_arm(self) -> bool:
        """The arm is built by a user builder (``builder``), not by one of qhlab's."""
        return self.builder is not None


@dataclass(frozen=True)
class ScorerDims:
    """Input and output widths of a scorer (read from a population).

    Attributes:
        object_features: F, per-object feature width.
        goal_features: G, goal feature width.
        candidate_features: C, per-candidate feature width.
        horizon: H, number of Q outputs per candidate.
    """

    object_features: int
    goal_features: int
    candidate_features: int
    horizon: int

    def __post_init__(self) -> None:
        for name in ("object_features", "goal_features", "candidate_features", "horizon"):
            require_int("ScorerDims", name, getattr(self, name), minimum=1,
                        hint="read the widths from a population (population_dims).")


# ------------------------------------------------------------------------------- arms

# One builder per component kind. Each receives the validated config and the dims; adding a
# kind is one entry here (and one value in the config's Literal).
_ENCODERS: dict[str, Callable[[ArchitectureConfig, ScorerDims], nn.Module]] = {
    "attention": lambda arch, dims: AttentionEncoder(
        dims, arch.encoder.width, arch.encoder.depth, arch.encoder.heads
    ),
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


def _check_new_arm(name: str, structure: dict[str, str]) -> None:
    """Refuse a second registration of ``name`` or a kind without a component builder."""
    if name in ARMS:
        raise ValueError(f"arm {name!r} is already registered")
    for part, kind in structure.items():
        builders = _KINDS[part]
        if kind not in builders:
            raise ValueError(
                f"arm {name!r}: {part}={kind!r} is not allowed; allowed: {', '.join(sorted(builders))}"
            )


def _arm_spec(arm: str) -> ArmSpec:
    """The registered arm ``arm``, or the one "not registered" refusal naming every arm."""
    if arm not in ARMS:
        raise ValueError(f"arm={arm!r} is not registered; allowed: {', '.join(sorted(ARMS))}, or a user arm that "
                         'names its builder (builder = "arms.py:build_fn")')
    return ARMS[arm]


def _check_structure(arch: ArchitectureConfig) -> None:
    """Refuse a config whose encoder kind, fusion or readout differs from its arm's."""
    actual = {"encoder.kind": arch.encoder.kind, "fusion": arch.fusion, "readout": arch.readout}
    wrong = [
        f"{key}={actual[key]!r} (arm {arch.arm!r} requires {want!r})"
        for key, want in _arm_spec(arch.arm).structure.items()
        if actual[key] != want
    ]
    if wrong:
        raise ValueError(
            "structure does not match the arm: " + "; ".join(wrong)
            + "; allowed: omit these fields or choose the arm that has this structure"
        )


def _compose(arch: ArchitectureConfig, dims: ScorerDims) -> QhScorer:
    """encoder, then fusion, then readout: this order fixes how parameters draw from the RNG."""
    encoder = _ENCODERS[arch.encoder.kind](arch, dims)
    fusion = _FUSIONS[arch.fusion](arch, dims)
    readout = _READOUTS[arch.readout](arch, dims)
    return QhScorer(encoder, fusion, readout, dims)


def register_arm(
    name: str,
    *,
    encoder: str,
    fusion: str,
    readout: str,
    depth: int | None = None,
    width: int | None = None,
    heads: int | None = None,
    builder: Callable[[ArchitectureConfig, ScorerDims], nn.Module] = _compose,
) -> ArmSpec:
    """Register an arm under `name`: its fixed structure, default sizes and builder.

    Args:
        name: registry key, used as `architecture.arm` in recipes.
        encoder, fusion, readout: the arm's structural kinds (fixed for this arm).
        depth, width, heads: the sizes this arm declares (None: it follows the baseline's in a
            study, else depth 1, width 64, heads 4). A declared size is applied, never ignored:
            a study's cell of this arm has it unless the study's arm entry overrides it.
        builder: `(arch, dims) -> nn.Module`; default the shared encoder -> fusion -> readout
            composition, which builds every part from the validated config.

    Returns:
        The registered `ArmSpec`.

    Raises:
        ValueError: the name is already registered, or a kind has no component builder.
    """
    structure = {"encoder.kind": encoder, "fusion": fusion, "readout": readout}
    _check_new_arm(name, structure)
    declared = {"encoder.depth": depth, "encoder.width": width, "encoder.heads": heads}
    ARMS[name] = ArmSpec(name=name, builder=builder, structure=structure,
                         defaults={k: v for k, v in declared.items() if v is not None})
    return ARMS[name]


# The arms of the family; adding an arm is one call.
# Each declares depth 1 (variant_deep 2): a study's baseline depth never deepens a control.
register_arm("baseline", encoder="attention", fusion="concat", readout="local", depth=1)  # the reference
register_arm("control_global_readout",  # never reads the struck puck
             encoder="attention", fusion="concat", readout="global", depth=1)
register_arm("control_no_interaction",  # objects never see each other
             encoder="deepsets", fusion="concat", readout="local", depth=1)
register_arm("variant_cross_attention",  # candidates attend over objects
             encoder="attention", fusion="cross_attention", readout="local", depth=1)
register_arm("variant_deep", encoder="attention", fusion="concat", readout="local", depth=2)  # a deeper encoder


MAX_ENSEMBLE_MEMBERS = 8


class QhEnsemble(nn.Module):
    """M scorers of one architecture whose Q is their mean; the learning rule trains each alone.

    Attributes:
        members: `nn.ModuleList` of M scorers (each with `encoder`, `fusion`, `readout`).
        dims: the members' dims.
    """

    def __init__(self, members: list[nn.Module], dims: ScorerDims) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"QhEnsemble: {len(members)} member(s) is not allowed; allowed: >= 2. "
                             "HINT: one scorer is the plain scorer, not an ensemble")
        self.members = nn.ModuleList(members)
        self.dims = dims

    def forward(self, *inputs: Tensor) -> Tensor:
        """The members' mean q [B, K, H]; ``inputs`` are `QhScorer.forward`'s six tensors, in order."""
        return torch.stack([member(*inputs) for member in self.members]).mean(dim=0)


def scorer_members(scorer: nn.Module) -> list[nn.Module]:
    """The scorers a learning rule trains one by one: an ensemble's members, else [scorer]."""
    return list(scorer.members) if isinstance(scorer, QhEnsemble) else [scorer]


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
        raise ValueError(f"build_scorer: members={members!r} is not allowed; allowed: an int in "
                         f"1..{MAX_ENSEMBLE_MEMBERS}. HINT: 1 is the plain scorer")
    if members > 1:
        return QhEnsemble([build_scorer(arch, dims, q_head_init=q_head_init) for _ in range(members)], dims)
    if arch.is_user_arm:
        return _build_user_arm(arch, dims, q_head_init)
    scorer = _arm_spec(arch.arm).builder(arch, dims)
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


def _build_user_arm(arch: ArchitectureConfig, dims: ScorerDims, q_head_init: str) -> nn.Module:
    """A user arm's module, from the copy of its source provided in this process.

    ``q_head_init="zero"`` zeroes the module's Q head: the last ``nn.Linear`` (in module order)
    whose ``out_features`` is H, drawn as usual first.
    """
    source = resolve_builder(arch.arm, arch.builder, arch.source_sha256)
    scorer = source.builder_function()(arch, dims)
    if not isinstance(scorer, nn.Module):
        raise QhError(f"build_scorer: arm {arch.arm!r}: builder {arch.builder!r} returned {type(scorer).__name__}; "
                      "allowed: a torch.nn.Module. HINT: the builder is build(arch, dims) -> nn.Module.")
    if q_head_init == "zero":
        heads = [m for m in scorer.modules() if isinstance(m, nn.Linear) and m.out_features == dims.horizon]
        if not heads:
            raise QhError(
                f"build_scorer: q_head_init='zero' with arm {arch.arm!r} is not allowed: the module has no nn.Linear "
                f"with out_features={dims.horizon} (H) to zero; allowed: a module whose Q head is such a Linear. "
                "HINT: end the arm with nn.Linear(..., dims.horizon), or use q_head_init='random'."
            )
        with torch.no_grad():
            heads[-1].weight.zero_()
            if heads[-1].bias is not None:
                heads[-1].bias.zero_()
    return scorer
