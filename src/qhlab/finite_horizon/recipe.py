"""The QH recipe: one frozen, fully validated config for a finite-horizon fit.

Owns: `QhRecipe` and its nested models, `validate_recipe` (a parsed mapping -> validated
recipe, every error listed at once in one `QhInputError`) and `recipe_digest`. Scientific
fields (seed, horizon, architecture, optimizer, batch size, Huber delta, target update, update
budget, data, evaluation) never depend on the hardware lane; the backend fields
(`accelerator`, `devices`, `precision`) are changed only by an execution profile's `apply`.

Does not own: reading files (a recipe TOML is read by `qhlab.design.config_files.load_recipe`:
the science core parses no config), profiles (`qhlab.training.execution_profile`), the fit
launcher, or data loading.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from qhlab.evidence import TRAINING_SEED_LIMIT, canonical_json, seed_problem, sha256_bytes, validation_error
from qhlab.finite_horizon.architecture import MAX_ENSEMBLE_MEMBERS, ArchitectureConfig
from qhlab.finite_horizon.budget import MAX_UPDATES

__all__ = [
    "MAX_UPDATES",
    "DataConfig",
    "EvaluationConfig",
    "HardTargetUpdate",
    "OptimizerConfig",
    "PolyakTargetUpdate",
    "QhRecipe",
    "TrainingSeed",
    "recipe_digest",
    "validate_recipe",
]

# strict: a TOML string never becomes a number (huber_delta = "0.05" is refused); ints are
# still accepted for float fields. Tuple fields take TOML/JSON lists via a before-validator.
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


def _training_seed(value: Any, info: ValidationInfo) -> Any:
    """Refuse an out-of-range seed with the shared range's words, not pydantic's bare bound."""
    if isinstance(value, int) and not isinstance(value, bool):
        problem = seed_problem(info.field_name or "seed", value)
        if problem is not None:
            raise ValueError(problem)
    return value


# A seed that reaches Lightning, torch, numpy or Optuna (a recipe's, a study's, a pilot's, a
# bootstrap's): refused at the config, where Lightning would refuse it only once a fit starts.
# The bounds stay on the schema, so the config reference shows them.
TrainingSeed = Annotated[int, Strict(), Field(ge=0, lt=TRAINING_SEED_LIMIT), BeforeValidator(_training_seed)]
# Upper bounds below are sanity bounds, not tuning ranges: native-unit quantities (metres) of a
# 1.2 m table stay under 10, and a learning rate above 10 or an eps above 1 is a typo.


class OptimizerConfig(BaseModel):
    """AdamW hyper-parameters (the only optimizer of the learning rule).

    ``schedule``: "constant" keeps ``lr``; "cosine" decays it as lr * (1 + cos(pi u / U)) / 2
    over the observed updates u of the fit's budget U (``QhRecipe.updates``), ending at 0 at
    the final update, so the final state is not one noisy step among many. ``grad_clip_norm``:
    the largest L2 norm of the gradient per update, over each ensemble member's parameters (None:
    no clipping).

    Attributes:
        kind: the optimizer; only "adamw".
        lr: learning rate (the peak of the cosine schedule).
        weight_decay: AdamW's decoupled weight decay.
        betas: AdamW's moment decays (beta1, beta2).
        eps: AdamW's denominator epsilon.
        schedule: "constant" or "cosine" (to 0 at the final update).
        grad_clip_norm: the largest gradient L2 norm per update, per ensemble member; None: no clipping.
    """

    model_config = _FROZEN

    kind: Literal["adamw"] = "adamw"
    lr: float = Field(gt=0.0, le=10.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=10.0)
    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    schedule: Literal["constant", "cosine"] = "constant"
    grad_clip_norm: float | None = Field(default=None, gt=0.0, le=1e6)

    @field_validator("betas", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: Any) -> Any:
        # TOML and JSON have no tuples; strict mode would refuse the list itself
        return tuple(value) if isinstance(value, list) else value


class HardTargetUpdate(BaseModel):
    """Copy online -> target after every `interval` successful optimizer updates.

    Attributes:
        kind: "hard".
        interval: observed optimizer updates between copies.
    """

    model_config = _FROZEN

    kind: Literal["hard"]
    interval: int = Field(ge=1)


class PolyakTargetUpdate(BaseModel):
    """target <- (1 - tau) * target + tau * online after every successful update.

    Attributes:
        kind: "polyak".
        tau: the online weights' share in each averaging step.
    """

    model_config = _FROZEN

    kind: Literal["polyak"]
    tau: float = Field(gt=0.0, le=1.0)


class DataConfig(BaseModel):
    """Population directories (resolved against the recipe file's directory by `load_recipe`).

    An empty string means "not named by the recipe" (the CLI or a study supplies it).

    Attributes:
        train: the TRAIN population directory, relative to the recipe file.
        validation: the validation population directory, relative to the recipe file.
    """

    model_config = _FROZEN

    train: str = ""
    validation: str = ""


class EvaluationConfig(BaseModel):
    """Evaluation settings.

    ``tie_band``: predictions within it (metres) of the max are ties. ``average_decay``: None
    evaluates the online weights; a decay d evaluates their Polyak average instead,
    a <- d a + (1 - d) online after every observed update (a starts at the cold
    initialization), so the evaluated state is not one noisy step among many.

    Attributes:
        tie_band: metres within which a prediction ties the maximum.
        average_decay: None (evaluate the online weights) or the decay d of their Polyak average.
    """

    model_config = _FROZEN

    tie_band: float = Field(default=1e-3, ge=0.0, le=10.0)
    average_decay: float | None = Field(default=None, gt=0.0, lt=1.0)


class QhRecipe(BaseModel):
    """One frozen QH fit recipe.

    Attributes:
        name: human label (letters, digits, '-', '_', '.').
        seed: global seed of the fit.
        horizon: H, number of horizons learned (must match the population's H).
        architecture: scorer architecture (`architecture.ArchitectureConfig`).
        optimizer: AdamW hyper-parameters.
        batch_size: chain-state rows per update.
        huber_delta: native Huber delta, metres.
        successor_reward_rows: for the first m chain rows of every batch, the successor
            states of their candidates also train the Q_1 head on its pure reward target
            y_1 = r(s', a') (every population row carries its rewards); 0 disables it. More
            reward rows fit Q_1 where the TD targets bootstrap through it; labels Q* are
            never read.
        successor_label_rows: for the first m chain rows of every batch, the successor
            states also fit their Q_1..Q_{H-1} heads to their exact stored labels (a
            supervised anchor, native Huber); 0 (the default) disables it. Broad fits leave it
            at 0; the E0 canary sets it to 1, because its one row's targets bootstrap through
            Q_{h-1} on successors that no TD row of a one-row fit can train.
        q_head_init: "random" (the default: every layer as drawn from the seed) or "zero": the
            readout's last layer starts at zero, so the cold scorer's Q is 0 everywhere. A
            random initial function persists after training where the data do not pin the
            fit down (Chizat et al. 2019, "On lazy training"), which is a seed effect on
            held-out scenes (docs/decisions/demo-recipe.md).
        ensemble_members: M >= 1 scorers of the architecture, drawn one after another from
            the seed. Each member is trained by the learning rule above against its own target
            scorer, on the same batches (its loss and gradients are a one-member fit's); the
            evaluated Q is the members' mean. M = 1 (the default) is the plain scorer. Averaging
            M initializations divides the variance that an initialization alone leaves in the
            fitted function by about M (docs/decisions/demo-recipe.md).
        target_update: hard copy every `interval` updates, or Polyak with `tau`.
        updates: final optimizer-update budget of the fit.
        data: train / validation population paths.
        evaluation: evaluation settings.
        accelerator, devices, precision: backend fields; only an execution profile changes them.
    """

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: TrainingSeed
    horizon: int = Field(ge=1, le=16)
    architecture: ArchitectureConfig
    optimizer: OptimizerConfig
    batch_size: int = Field(ge=1, le=1_000_000)
    huber_delta: float = Field(gt=0.0, le=10.0)
    successor_reward_rows: int = Field(default=0, ge=0, le=1_000_000)
    successor_label_rows: int = Field(default=0, ge=0, le=1_000_000)
    q_head_init: Literal["random", "zero"] = "random"
    ensemble_members: int = Field(default=1, ge=1, le=MAX_ENSEMBLE_MEMBERS)
    target_update: Annotated[HardTargetUpdate | PolyakTargetUpdate, Field(discriminator="kind")]
    updates: int = Field(ge=1, le=MAX_UPDATES)
    data: DataConfig = DataConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    accelerator: Literal["cpu", "cuda", "mps"] = "cpu"
    devices: Literal[1] = 1
    precision: Literal["32-true", "16-mixed", "bf16-mixed"] = "32-true"

    @model_validator(mode="after")
    def _average_forgets_the_initialization(self) -> QhRecipe:
        # The average starts at the cold initialization, which still weighs d^U after U
        # updates: refuse a window that the budget cannot flush below e^-5 (0.7%).
        decay = self.evaluation.average_decay
        if decay is not None and self.updates * (1.0 - decay) < _AVERAGE_FLUSH:
            raise ValueError(
                f"evaluation.average_decay={decay!r} with updates={self.updates} is not allowed; allowed: "
                f"updates x (1 - average_decay) >= {_AVERAGE_FLUSH:g} (here {self.updates * (1.0 - decay):.3g}), "
                f"so the cold initialization weighs at most e^-{_AVERAGE_FLUSH:g} in the evaluated weights. "
                f"HINT: lower average_decay or raise updates"
            )
        return self


_AVERAGE_FLUSH = 5.0


# ------------------------------------------------------- validating


def validate_recipe(raw: dict[str, Any], *, source: str = "recipe") -> QhRecipe:
    """Validate a recipe mapping (already parsed) -> QhRecipe, or one QhInputError."""
    try:
        return QhRecipe.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(
            exc, source, QhRecipe, "fix every listed field (see examples/tiny-recipe.toml for a valid recipe)."
        ) from None


def recipe_digest(recipe: QhRecipe) -> str:
    """SHA-256 (hex) of the canonical JSON of `recipe.model_dump(mode="json")`.

    The digest binds every scientific and backend field; two recipes with the same digest
    describe the same fit.
    """
    return sha256_bytes(canonical_json(recipe.model_dump(mode="json")))
