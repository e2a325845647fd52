"""The scorer's architecture as data: a frozen config, its widths and the registered arms.

Owns: ``EncoderConfig``, ``ArchitectureConfig`` (every check of an arm's structure and sizes,
and its one "not registered" refusal), ``ScorerDims``, the arm registry (``register_arm``,
``ARMS``: each arm's fixed structure and the sizes it declares), the component kinds an arm may
name (``COMPONENT_KINDS``) and ``MAX_ENSEMBLE_MEMBERS``. Torch-free, so that recipes, study
configs and the command line validate an architecture without importing torch.

Does not own: building a module from a config (``qhlab.finite_horizon.scorer``: one builder
per component kind and the composition) or the parts themselves (``components``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from qhlab.evidence import require_int
from qhlab.execution.user_code import parse_entry

__all__ = [
    "ARMS",
    "COMPONENT_KINDS",
    "MAX_ENSEMBLE_MEMBERS",
    "ArchitectureConfig",
    "ArmSpec",
    "EncoderConfig",
    "ScorerDims",
    "register_arm",
]

MAX_ENSEMBLE_MEMBERS = 8
EncoderKind = Literal["attention", "deepsets"]
FusionKind = Literal["concat", "cross_attention"]
ReadoutKind = Literal["local", "global"]
# The kinds each structural field may take; the scorer has one component builder per kind.
COMPONENT_KINDS: dict[str, tuple[str, ...]] = {
    "encoder.kind": get_args(EncoderKind),
    "fusion": get_args(FusionKind),
    "readout": get_args(ReadoutKind),
}


def _without_none(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``data`` less those of ``keys`` whose value is None: a field added later stays out of the
    dumps (and so the recipe digests) of the configs that do not set it."""
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data


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

    kind: EncoderKind | None = None
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
        return _without_none(handler(self), ("kind",))


@dataclass(frozen=True)
class ArmSpec:
    """A registered arm: its builder and the architecture it declares.

    Attributes:
        name: registry key.
        structure: the fixed structural fields of this arm ("encoder.kind", "fusion",
            "readout"); a config that names another value is refused.
        defaults: the free fields this arm declares (e.g. ``{"encoder.depth": 2}``); a study
            applies them over the baseline's sizes. Undeclared sizes follow the baseline.
        builder: `(arch, dims) -> nn.Module`; None: the shared encoder -> fusion -> readout
            composition of ``qhlab.finite_horizon.scorer``.
    """

    name: str
    structure: dict[str, str]
    defaults: dict[str, int]
    builder: Callable[[ArchitectureConfig, ScorerDims], Any] | None = None


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
    ``qhlab.execution.user_code``): it has no structure fields, its sizes (``encoder.width``, ``depth``,
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
        default_factory=dict, max_length=32
    )
    encoder: EncoderConfig
    fusion: FusionKind | None = None
    readout: ReadoutKind | None = None

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
            if not isinstance(value, (bool, int, float, str)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise ValueError(
                    f"options.{key}={value!r} is not allowed; allowed: a scalar a builder reads (a "
                    "boolean, an integer, a finite number or a string)"
                )
        return options

    @field_validator("arm")
    @classmethod
    def _arm_is_registered(cls, arm: str, info: ValidationInfo) -> str:
        return arm if info.data.get("builder") is not None else _arm_spec(arm).name

    @model_validator(mode="after")
    def _arm_and_structure(self) -> ArchitectureConfig:
        if self.builder is None:
            if self.options or self.source_sha256 is not None:
                raise ValueError(
                    "options and source_sha256 are not allowed for a built-in arm; allowed: only with "
                    "builder (a user arm)"
                )
            _check_structure(self)
            return self
        parse_entry(self.builder)
        if self.arm in ARMS:
            raise ValueError(
                f"arm={self.arm!r} with builder={self.builder!r} is not allowed; allowed: a name that is "
                f"not a built-in arm ({', '.join(sorted(ARMS))}), or no builder"
            )
        given = [
            k
            for k, v in (("encoder.kind", self.encoder.kind), ("fusion", self.fusion), ("readout", self.readout))
            if v is not None
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} is not allowed for a user arm (builder={self.builder!r}); allowed: "
                "only sizes (encoder.width, depth, heads) and options: the builder says what it is"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: Any) -> dict[str, Any]:
        # Built-in arms dump exactly their old fields (so their recipe digests stay as they were);
        # a user arm dumps no structure fields.
        data = _without_none(handler(self), ("builder", "source_sha256", "fusion", "readout"))
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
            require_int(
                "ScorerDims",
                name,
                getattr(self, name),
                minimum=1,
                hint="read the widths from a population (population_dims).",
            )


# ------------------------------------------------------------------------------- arms


def _check_new_arm(name: str, structure: dict[str, str]) -> None:
    """Refuse a second registration of ``name`` or a kind the architecture does not know."""
    if name in ARMS:
        raise ValueError(f"arm {name!r} is already registered")
    for part, kind in structure.items():
        if kind not in COMPONENT_KINDS[part]:
            raise ValueError(
                f"arm {name!r}: {part}={kind!r} is not allowed; allowed: {', '.join(sorted(COMPONENT_KINDS[part]))}"
            )


def _arm_spec(arm: str) -> ArmSpec:
    """The registered arm ``arm``, or the one "not registered" refusal naming every arm."""
    if arm not in ARMS:
        raise ValueError(
            f"arm={arm!r} is not registered; allowed: {', '.join(sorted(ARMS))}, or a user arm that "
            'names its builder (builder = "arms.py:build_fn")'
        )
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
            "structure does not match the arm: "
            + "; ".join(wrong)
            + "; allowed: omit these fields or choose the arm that has this structure"
        )


def register_arm(
    name: str,
    *,
    encoder: str,
    fusion: str,
    readout: str,
    depth: int | None = None,
    width: int | None = None,
    heads: int | None = None,
    builder: Callable[[ArchitectureConfig, ScorerDims], Any] | None = None,
) -> ArmSpec:
    """Register an arm under `name`: its fixed structure, default sizes and builder.

    Args:
        name: registry key, used as `architecture.arm` in recipes.
        encoder, fusion, readout: the arm's structural kinds (fixed for this arm).
        depth, width, heads: the sizes this arm declares (None: it follows the baseline's in a
            study, else depth 1, width 64, heads 4). A declared size is applied, never ignored:
            a study's cell of this arm has it unless the study's arm entry overrides it.
        builder: `(arch, dims) -> nn.Module`; None (the default): the shared encoder -> fusion ->
            readout composition of ``qhlab.finite_horizon.scorer``, which builds every part from the
            validated config.

    Returns:
        The registered `ArmSpec`.

    Raises:
        ValueError: the name is already registered, or a kind has no component builder.
    """
    structure = {"encoder.kind": encoder, "fusion": fusion, "readout": readout}
    _check_new_arm(name, structure)
    declared = {"encoder.depth": depth, "encoder.width": width, "encoder.heads": heads}
    ARMS[name] = ArmSpec(
        name=name, structure=structure, builder=builder, defaults={k: v for k, v in declared.items() if v is not None}
    )
    return ARMS[name]


# The arms of the family; adding an arm is one call.
# Each declares depth 1 (variant_deep 2): a study's baseline depth never deepens a control.
register_arm("baseline", encoder="attention", fusion="concat", readout="local", depth=1)  # the reference
register_arm(
    "control_global_readout",  # never reads the struck puck
    encoder="attention",
    fusion="concat",
    readout="global",
    depth=1,
)
register_arm(
    "control_no_interaction",  # objects never see each other
    encoder="deepsets",
    fusion="concat",
    readout="local",
    depth=1,
)
register_arm(
    "variant_cross_attention",  # candidates attend over objects
    encoder="attention",
    fusion="cross_attention",
    readout="local",
    depth=1,
)
register_arm("variant_deep", encoder="attention", fusion="concat", readout="local", depth=2)  # a deeper encoder
