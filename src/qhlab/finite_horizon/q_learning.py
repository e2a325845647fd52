"""Finite-horizon TD learning rule: pure target/loss/refresh functions and the Lightning glue.

Owns, top to bottom:
* pure functions: `td_targets` (y_1 = r; y_h = r + max_{a'} Q-_{h-1}(s', a')),
  `native_huber_loss` (Huber in native units, summed over horizons, averaged over valid
  candidates), `successor_reward_loss` (the Q_1 head on successor states, y_1 = r),
  `hard_target_update`, `polyak_target_update`, `refresh_target`;
* `QhTDModule` (LightningModule): online scorer, frozen target scorer, AdamW from the recipe,
  target refresh after each *observed* optimizer update (AdamW `state[p]["step"]`, never
  `global_step`: with AMP a skipped step must not refresh the target); under hard refreshes,
  the table of every successor state's bootstrap values, rebuilt after each refresh;

Pure functions: `successor_bootstrap`, `bootstrapped_targets`, `target_table_bytes`.

Does not own: the batches (`batches`: `QhPopulationDataModule`), seeding, cold
initialization, checkpoints and receipts (the fit launcher), reading population files
(`data`), evaluation.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch import Tensor, nn

from qhlab.evidence import QhError, QhInputError
from qhlab.finite_horizon.batches import QhPopulationDataModule
from qhlab.finite_horizon.recipe import HardTargetUpdate, PolyakTargetUpdate, QhRecipe
from qhlab.finite_horizon.scorer import ScorerDims, build_scorer, scorer_members
from qhlab.training.optimizer_state import observed_optimizer_updates

__all__ = [
    "ADAMW_FOREACH",
    "TARGET_TABLE_BUDGET_BYTES",
    "QhTDModule",
    "bootstrapped_targets",
    "hard_target_update",
    "native_huber_loss",
    "polyak_target_update",
    "refresh_target",
    "refuse_oversized_target_table",
    "scheduled_lr",
    "successor_bootstrap",
    "successor_label_loss",
    "successor_reward_loss",
    "target_table_bytes",
    "td_targets",
]


# ----------------------------------------------------------------------- pure TD math


def td_targets(
    reward: Tensor,
    next_q: Tensor,
    next_candidate_mask: Tensor,
    successor_valid: Tensor,
    horizon: int,
) -> Tensor:
    """Finite-horizon TD targets.

    y_1 = r;  y_h = r + max_{a' valid in s'} Q-_{h-1}(s', a')  for h = 2..H.
    The game has no terminal state, and `load_population` refuses a chain-row candidate
    without a successor, so in a loaded population every valid (s, a) bootstraps. The
    masking below serves only padded or synthetic inputs (a masked candidate, whose own
    loss is masked anyway, or a hand-made batch): there a missing successor
    (`successor_valid` False) or a successor without any valid candidate contributes
    nothing after r, so y_h = r for every h.

    Args:
        reward: [B, K] r(s, a).
        next_q: [B, K, K', H'] target-scorer outputs on the successor s' of each (s, a);
            only horizons 1..H-1 (indices 0..H-2) are read, so H' >= H - 1.
        next_candidate_mask: [B, K, K'] bool, valid candidates of s'.
        successor_valid: [B, K] bool, s' exists.
        horizon: H.

    Returns:
        y: [B, K, H], same dtype as `reward`; no gradient flows into `next_q` if the caller
        computed it under no_grad (targets are constants of the loss).
    """
    if horizon < 1:
        raise ValueError(f"td_targets: horizon={horizon!r} is not allowed; allowed: >= 1")
    if horizon == 1:
        return reward.unsqueeze(-1)
    return bootstrapped_targets(reward, successor_bootstrap(next_q, next_candidate_mask, horizon), successor_valid)


def successor_bootstrap(next_q: Tensor, next_candidate_mask: Tensor, horizon: int) -> Tensor:
    """The bootstrap values of successor states: max_{a' valid in s'} Q-_h(s', a') for h = 1..H-1.

    A state without any valid candidate bootstraps nothing (0.0). This is the part of the TD
    target that depends on the target scorer alone, so under a target frozen between hard
    refreshes it is a function of the successor state, computed once per refresh
    (`QhTDModule` keeps it as a table over the population's rows).

    Args:
        next_q: [..., K', H'] target-scorer outputs on successor states, H' >= H - 1.
        next_candidate_mask: [..., K'] bool, valid candidates of each successor.
        horizon: H >= 2.

    Returns:
        [..., H-1] the best target value per successor and horizon 1..H-1, dtype of `next_q`.
    """
    if horizon < 2:
        raise ValueError(f"successor_bootstrap: horizon={horizon!r} is not allowed; allowed: >= 2")
    if next_q.shape[-1] < horizon - 1:
        raise ValueError(
            f"successor_bootstrap: next_q has {next_q.shape[-1]} horizons; allowed: >= horizon - 1 = {horizon - 1}"
        )
    future = next_q[..., : horizon - 1]
    # masked a' can never be the max: -inf before the max, then a state with no valid a' gives 0
    masked = future.masked_fill(~next_candidate_mask.unsqueeze(-1), float("-inf"))
    best = masked.amax(dim=-2)
    return torch.where(next_candidate_mask.any(dim=-1).unsqueeze(-1), best, torch.zeros_like(best))


def bootstrapped_targets(reward: Tensor, bootstrap: Tensor, successor_valid: Tensor) -> Tensor:
    """y_1 = r;  y_h = r + bootstrap_{h-1}(s') for h = 2..H; a missing s' bootstraps nothing.

    Args:
        reward: [B, K] r(s, a).
        bootstrap: [B, K, H-1] `successor_bootstrap` of each candidate's successor state.
        successor_valid: [B, K] bool, s' exists.

    Returns:
        y: [B, K, H], dtype of `reward`.
    """
    best = torch.where(successor_valid.unsqueeze(-1), bootstrap, torch.zeros_like(bootstrap))
    return torch.cat([reward.unsqueeze(-1), reward.unsqueeze(-1) + best.to(reward.dtype)], dim=-1)


def scheduled_lr(lr: float, observed_updates: int, budget: int) -> float:
    """The cosine schedule's learning rate for the update after ``observed_updates`` of ``budget``.

    lr * (1 + cos(pi * u / U)) / 2: ``lr`` at the first update, 0 after the final one.
    """
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(observed_updates, budget) / budget))


def native_huber_loss(q: Tensor, y: Tensor, candidate_mask: Tensor, delta: float) -> Tensor:
    """Huber loss in native units, summed over horizons, averaged over valid candidates.

    Args:
        q: [B, K, H] online predictions.
        y: [B, K, H] targets (constants).
        candidate_mask: [B, K] bool; masked candidates contribute nothing.
        delta: Huber delta (metres): quadratic 0.5 e^2 below it, linear delta (|e| - delta/2) above.

    Returns:
        Scalar loss; 0.0 when the batch has no valid candidate.
    """
    per_horizon = F.huber_loss(q, y, reduction="none", delta=delta)  # [B, K, H]
    per_candidate = per_horizon.sum(dim=-1)
    weights = candidate_mask.to(per_candidate.dtype)
    return (per_candidate * weights).sum() / weights.sum().clamp_min(1.0)


def successor_reward_loss(next_q: Tensor, next_reward: Tensor, next_candidate_mask: Tensor, delta: float) -> Tensor:
    """Native Huber of the Q_1 head on successor states against their pure reward target.

    y_1 = r(s', a') is the finite-horizon target of horizon 1 on any state, so successor
    states (whose own rewards the population carries) are extra, exact Q_1 training rows:
    the TD targets of horizon 2 bootstrap through exactly these Q_1(s', .) values.

    Args:
        next_q: [M, K', H] online predictions on M successor states.
        next_reward: [M, K'] r(s', a').
        next_candidate_mask: [M, K'] bool, valid candidates of s' (False for a missing s').
        delta: Huber delta (metres).

    Returns:
        Scalar loss (`native_huber_loss` on horizon 1); 0.0 when no candidate is valid.
    """
    return native_huber_loss(next_q[..., :1], next_reward.unsqueeze(-1), next_candidate_mask, delta)


def successor_label_loss(next_q: Tensor, next_labels: Tensor, next_candidate_mask: Tensor, delta: float) -> Tensor:
    """Native Huber of the Q_1..Q_{H-1} heads on successor states against their exact labels.

    A successor state carries Q*_1..Q*_{H-1}. Fitting them anchors every value the TD targets
    of its parent bootstrap through; with one training row (the E0 canary) nothing else can.

    Args:
        next_q: [M, K', H] online predictions on M successor states.
        next_labels: [M, K', H] exact labels (horizons 1..H-1 valid; H is ignored).
        next_candidate_mask: [M, K'] bool, valid candidates of s'.
        delta: Huber delta (metres).

    Returns:
        Scalar loss; 0.0 when H == 1 or no candidate is valid.
    """
    if next_q.shape[-1] < 2:
        return next_q.new_zeros(())
    return native_huber_loss(next_q[..., :-1], next_labels[..., :-1], next_candidate_mask, delta)


@torch.no_grad()
def hard_target_update(target: nn.Module, online: nn.Module) -> None:
    """target <- online (parameters and buffers, in place)."""
    for t_param, o_param in zip(target.parameters(), online.parameters(), strict=True):
        t_param.copy_(o_param)
    for t_buf, o_buf in zip(target.buffers(), online.buffers(), strict=True):
        t_buf.copy_(o_buf)


@torch.no_grad()
def polyak_target_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online (parameters); buffers are copied."""
    targets, onlines = list(target.parameters()), list(online.parameters())
    if len(targets) != len(onlines):
        raise ValueError(
            f"polyak_target_update: target has {len(targets)} parameters and online {len(onlines)}; "
            "allowed: two scorers of one architecture"
        )
    # One multi-tensor lerp: each element gets exactly `lerp_`'s arithmetic (bit-identical), but a
    # step of a small scorer no longer pays one Python dispatch per parameter tensor.
    torch._foreach_lerp_(targets, onlines, tau)
    for t_buf, o_buf in zip(target.buffers(), online.buffers(), strict=True):
        t_buf.copy_(o_buf)


def refresh_target(
    target: nn.Module,
    online: nn.Module,
    rule: HardTargetUpdate | PolyakTargetUpdate,
    updates_before: int,
    updates_after: int,
) -> int:
    """Apply the target rule for the optimizer updates observed in (updates_before, updates_after].

    Hard: copy when a multiple of `interval` was crossed (one copy suffices). Polyak: one
    averaging step per observed update.

    Returns:
        The number of refresh operations applied.
    """
    if updates_after <= updates_before:
        return 0
    if isinstance(rule, HardTargetUpdate):
        if updates_after // rule.interval > updates_before // rule.interval:
            hard_target_update(target, online)
            return 1
        return 0
    for _ in range(updates_after - updates_before):
        polyak_target_update(target, online, rule.tau)
    return updates_after - updates_before


# The largest successor-value table a fit may keep: population rows x (H-1) x members float32
# values. The demo's TRAIN population (5,184 rows, H 3, 2 members) needs 83 KB.
TARGET_TABLE_BUDGET_BYTES = 1 << 30

# Successor states per target forward when a table is built: large enough that a build is a
# handful of calls, small enough that one call's activations stay far below the table's budget.
_TABLE_CHUNK = 2048


def target_table_bytes(rows: int, horizon: int, members: int) -> int:
    """Bytes of a successor-value table: ``rows`` population rows x (H-1) horizons x members, float32."""
    return int(rows) * max(int(horizon) - 1, 0) * int(members) * 4


def refuse_oversized_target_table(call: str, recipe: QhRecipe, rows: int) -> None:
    """Refuse a hard-target fit whose successor-value table would exceed `TARGET_TABLE_BUDGET_BYTES`."""
    if not isinstance(recipe.target_update, HardTargetUpdate):
        return
    size = target_table_bytes(rows, recipe.horizon, recipe.ensemble_members)
    if size > TARGET_TABLE_BUDGET_BYTES:
        raise QhInputError(
            f"{call}: a TRAIN population of {rows:,} rows is not allowed with target_update.kind='hard' at "
            f"horizon {recipe.horizon} and {recipe.ensemble_members} member(s): its successor-value table "
            f"would take {size / 2**20:,.0f} MiB; allowed: at most {TARGET_TABLE_BUDGET_BYTES / 2**20:,.0f} MiB "
            f"(rows x (H-1) x members x 4 bytes). HINT: use a smaller population, fewer members, or "
            "target_update.kind='polyak'."
        )


# ------------------------------------------------------------------------ Lightning glue

# AdamW's multi-tensor implementation: torch picks it by default only for CUDA tensors, and on
# CPU it falls back to one Python loop iteration per parameter tensor, which was the largest
# single cost of a small scorer's step. Each element gets the single-tensor loop's arithmetic
# (tests/finite_horizon/test_q_learning.py compares the two bit for bit); `fused=True` would not.
ADAMW_FOREACH = True


# The six scorer inputs of a batch's chain states, in the order a scorer's forward takes them.
_CHAIN_INPUTS = ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")


def _chain_inputs(batch: dict[str, Tensor]) -> tuple[Tensor, ...]:
    """The scorer inputs of a batch's chain states: ``objects`` [B, N, F_o], ``object_mask`` [B, N],
    ``goal`` [B, F_g], ``candidates`` [B, K, F_c], ``candidate_object`` [B, K], ``candidate_mask`` [B, K]."""
    return tuple(batch[name] for name in _CHAIN_INPUTS)


def _flat(x: Tensor) -> Tensor:
    """[B, K, ...] -> [B*K, ...]."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


class QhTDModule(pl.LightningModule):
    """Online + target scorer trained by finite-horizon TD (native Huber, AdamW).

    Loss per update: `native_huber_loss(online(s), td_targets(...))` on the batch's chain
    rows, plus, when `recipe.successor_reward_rows` = m > 0, `successor_reward_loss` of the
    online Q_1 head on the successor states of the first m chain rows (y_1 = r), plus, when
    `recipe.successor_label_rows` = m' > 0, `successor_label_loss` of the Q_1..Q_{H-1} heads on
    the successor states of the first m' chain rows against their exact labels (the canary's
    anchor; the data module must then be built with `successor_labels=True`).

    With `recipe.ensemble_members` = M > 1 the online and target scorers are `QhEnsemble`s:
    member m's loss above is formed from online member m and target member m alone, and the
    update minimises the sum, so each member's gradient is exactly a one-member fit's on the
    same batch (AdamW's state is per parameter; clipping, if any, is per member). The logged
    loss is the members' mean.

    With a hard target rule the target scorer is constant between refreshes, and so is each
    successor state's bootstrap value (`successor_bootstrap`). The module then computes those
    values for every successor state its data module bootstraps through, once at the start of
    training (a resumed fit: from its restored target) and after every refresh, and each
    update reads its batch's values from that table instead of running the target scorer on
    the batch's B x K successor states (fitted Q-iteration's arrangement). The arithmetic is
    the per-batch one's; only the target forward's batch differs (2,048 states per call
    instead of B x K), so values may differ in the last bits where a kernel's summation order
    depends on the batch.

    Args:
        recipe: the (applied) recipe; architecture, optimizer, Huber delta, target rule.
        dims: scorer dims; `dims.horizon` must equal `recipe.horizon`.
        cache_target_values: keep the successor-value table under a hard target rule (the
            default); False runs the target scorer on every batch (benchmarks compare the two).

    Attributes:
        online: the trained scorer.
        target: a frozen copy (requires_grad False, always eval) refreshed by the recipe's rule
            after each observed optimizer update.
        average: None, or (with ``recipe.evaluation.average_decay``) a frozen Polyak average of
            the online weights, one step per observed update; `evaluated` names the one read.
        recipe, dims: as given.
        observed_updates: successful optimizer updates seen so far (from optimizer state).
        target_refreshes: number of refresh operations applied.
        caches_target_values: whether this fit keeps the successor-value table.
        target_values: None, or [M, S, H-1] float32: member m's bootstrap values of population
            row s (rows that no trained chain row reaches stay 0.0).
        target_values_evidence: what the fit receipt records of the table: whether it was
            kept, how many times it was built, its rows and bytes.
    """

    def __init__(self, recipe: QhRecipe, dims: ScorerDims, *, cache_target_values: bool = True) -> None:
        super().__init__()
        if dims.horizon != recipe.horizon:
            raise QhInputError(
                f"QhTDModule: dims.horizon={dims.horizon!r} is not allowed; allowed: "
                f"recipe.horizon={recipe.horizon}. HINT: train on a population whose H matches the recipe."
            )
        self.recipe = recipe
        self.dims = dims
        self.online = build_scorer(
            recipe.architecture, dims, q_head_init=recipe.q_head_init, members=recipe.ensemble_members
        )
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.target.eval()
        # Only a recipe that evaluates averaged weights has them, so every other final state
        # keeps exactly its online.* and target.* tensors.
        self.average = None
        if recipe.evaluation.average_decay is not None:
            self.average = copy.deepcopy(self.online)
            self.average.requires_grad_(False)
            self.average.eval()
        self.observed_updates = 0
        self.target_refreshes = 0
        # H = 1 bootstraps nothing, so there is nothing to cache.
        self.caches_target_values = (
            bool(cache_target_values) and isinstance(recipe.target_update, HardTargetUpdate) and recipe.horizon > 1
        )
        self.target_values: Tensor | None = None
        self.target_values_evidence: dict[str, Any] = {
            "cached": self.caches_target_values,
            "table_builds": 0,
            "successor_states": 0,
            "table_bytes": 0,
        }

    def build_scorer(self) -> nn.Module:
        """A fresh scorer of the same architecture and dims (parameters from torch's RNG)."""
        return build_scorer(
            self.recipe.architecture,
            self.dims,
            q_head_init=self.recipe.q_head_init,
            members=self.recipe.ensemble_members,
        )

    def train(self, mode: bool = True) -> QhTDModule:
        super().train(mode)
        self.target.eval()  # the target is a constant of the loss, never in training mode
        if self.average is not None:
            self.average.eval()
        return self

    @property
    def evaluated(self) -> nn.Module:
        """The scorer that evaluation reads: the Polyak average when the recipe keeps one, else online."""
        return self.online if self.average is None else self.average

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Online q[B, K, H] of a batch's chain states."""
        return self.online(*_chain_inputs(batch))

    @torch.no_grad()
    def td_target(self, batch: dict[str, Tensor], target: nn.Module | None = None) -> Tensor:
        """y[B, K, H] from the target scorer (or the given target member) on the successor states."""
        b, k = batch["reward"].shape
        next_q = (self.target if target is None else target)(
            _flat(batch["next_objects"]),
            _flat(batch["next_object_mask"]),
            _flat(batch["next_goal"]),
            _flat(batch["next_candidates"]),
            _flat(batch["next_candidate_object"]),
            _flat(batch["next_candidate_mask"]),
        ).view(b, k, -1, self.dims.horizon)
        return td_targets(
            batch["reward"],
            next_q.float(),
            batch["next_candidate_mask"],
            batch["successor_valid"],
            self.dims.horizon,
        )

    @torch.no_grad()
    def build_target_values(self, datamodule: QhPopulationDataModule | None = None) -> None:
        """(Re)build `target_values` from the current target scorer over the data module's successor states.

        Runs in the training step's precision context, so a mixed-precision fit's table holds
        what its per-batch target forward would have computed.

        Args:
            datamodule: whose successor states; None reads the running Trainer's.
        """
        trainer = self._trainer
        source = datamodule if datamodule is not None or trainer is None else trainer.datamodule
        if not isinstance(source, QhPopulationDataModule):
            raise QhError(
                f"QhTDModule.build_target_values: datamodule={type(source).__name__!r} is not allowed; allowed: "
                "a QhPopulationDataModule attached to the running Trainer. HINT: fit with "
                "trainer.fit(module, datamodule=QhPopulationDataModule(...)), or cache_target_values=False."
            )
        refuse_oversized_target_table("QhTDModule.build_target_values", self.recipe, source.population_rows)
        rows, states = source.successor_states()
        horizon = self.dims.horizon
        members = scorer_members(self.target)
        table = torch.zeros(len(members), source.population_rows, horizon - 1, dtype=torch.float32, device=self.device)
        context = contextlib.nullcontext() if trainer is None else trainer.precision_plugin.train_step_context()
        with context:
            for start in range(0, rows.numel(), _TABLE_CHUNK):
                chunk = {k: v[start : start + _TABLE_CHUNK].to(self.device) for k, v in states.items()}
                where = rows[start : start + _TABLE_CHUNK].to(self.device)
                for m, target in enumerate(members):
                    q = target(*chunk.values())
                    table[m, where] = successor_bootstrap(q.float(), chunk["candidate_mask"], horizon)
        self.target_values = table
        evidence = self.target_values_evidence
        evidence["table_builds"] += 1
        evidence["successor_states"] = int(rows.numel())
        evidence["table_bytes"] = table.numel() * table.element_size()

    def successor_q(self, batch: dict[str, Tensor], rows: int, online: nn.Module | None = None) -> Tensor:
        """Online q[M, K', H] (or the given online member's) on the successor states of the first
        `rows` chain rows (M = rows*K)."""
        m = min(rows, batch["reward"].shape[0])
        return (self.online if online is None else online)(
            _flat(batch["next_objects"][:m]),
            _flat(batch["next_object_mask"][:m]),
            _flat(batch["next_goal"][:m]),
            _flat(batch["next_candidates"][:m]),
            _flat(batch["next_candidate_object"][:m]),
            _flat(batch["next_candidate_mask"][:m]),
        )

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        pairs = zip(scorer_members(self.online), scorer_members(self.target), strict=True)
        losses = [self._member_loss(batch, online, target, m) for m, (online, target) in enumerate(pairs)]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        if not bool(torch.isfinite(loss)):
            # Stop before the optimizer step: a non-finite update would poison every later
            # state, and the fit must not publish a final state or receipt for it.
            raise QhError(
                f"QhTDModule.training_step: loss={float(loss.detach())!r} at observed update {self.observed_updates} "
                "is not finite. HINT: a batch holds a non-finite value or the fit diverged; lower the "
                "learning rate or regenerate the population."
            )
        # Lightning writes step metrics every `log_every_n_steps` updates; calling `self.log`
        # on the other steps would cost ~10% of a small CPU step for values nobody reads.
        trainer = self._trainer  # None when called outside a fit (then there is nothing to log to)
        if trainer is not None and (self.global_step + 1) % max(trainer.log_every_n_steps, 1) == 0:
            self.log(
                "train/loss",
                loss.detach() / len(losses),
                on_step=True,
                on_epoch=False,
                prog_bar=True,
                batch_size=batch["reward"].shape[0],
            )
        return loss

    @torch.no_grad()
    def member_targets(self, batch: dict[str, Tensor], target: nn.Module, member: int) -> Tensor:
        """y[B, K, H] of ensemble member ``member``: read from `target_values` when the table is
        kept, else from its target scorer ``target`` on the batch's successor states."""
        if self.target_values is None:
            return self.td_target(batch, target)
        successor = batch["successor"]
        values = self.target_values[member].index_select(0, successor.clamp_min(0).flatten())
        return bootstrapped_targets(batch["reward"], values.view(*successor.shape, -1), batch["successor_valid"])

    def _member_loss(self, batch: dict[str, Tensor], online: nn.Module, target: nn.Module, member: int) -> Tensor:
        """One scorer's TD loss on a batch: chain rows, plus the successor rows the recipe asks for."""
        y = self.member_targets(batch, target, member)
        q = online(*_chain_inputs(batch)).float()
        loss = native_huber_loss(q, y, batch["candidate_mask"], self.recipe.huber_delta)
        rows = min(self.recipe.successor_reward_rows, q.shape[0])
        if rows:
            loss = loss + successor_reward_loss(
                self.successor_q(batch, rows, online).float(),
                _flat(batch["next_reward"][:rows]),
                _flat(batch["next_candidate_mask"][:rows]),
                self.recipe.huber_delta,
            )
        anchored = min(self.recipe.successor_label_rows, q.shape[0])
        if anchored:
            if "next_labels" not in batch:
                raise QhInputError(
                    f"QhTDModule.training_step: recipe.successor_label_rows={self.recipe.successor_label_rows!r} "
                    "is not allowed with batches without 'next_labels'; allowed: 0, or a data module built "
                    "with successor_labels=True. HINT: fit_recipe builds it from the recipe."
                )
            loss = loss + successor_label_loss(
                self.successor_q(batch, anchored, online).float(),
                _flat(batch["next_labels"][:anchored]),
                _flat(batch["next_candidate_mask"][:anchored]),
                self.recipe.huber_delta,
            )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = self.recipe.optimizer
        return torch.optim.AdamW(
            self.online.parameters(),
            lr=opt.lr,
            betas=opt.betas,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            foreach=ADAMW_FOREACH,
        )

    def on_fit_start(self) -> None:
        # Both are deliberate here: the target scorer is kept in eval mode, and batches are
        # index_selects over resident tensors, which worker processes would only slow down.
        warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=PossibleUserWarning)
        warnings.filterwarnings("ignore", message=r".*does not have many workers", category=PossibleUserWarning)

    def on_train_start(self) -> None:
        # A resumed fit starts from a loaded optimizer state: count from there.
        self.observed_updates = observed_optimizer_updates(self.optimizers(use_pl_optimizer=False))
        if self.caches_target_values:
            # From the target as it stands: fresh (the cold copy) or restored with the resumed
            # state, which is the one the uninterrupted fit's last refresh made.
            self.build_target_values()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # The schedule is a function of the observed update count alone (read from the
        # optimizer's state), so a resumed segment continues it exactly, with no scheduler state.
        opt = self.recipe.optimizer
        if opt.schedule == "cosine":
            rate = scheduled_lr(opt.lr, self.observed_updates, self.recipe.updates)
            for group in self.optimizers(use_pl_optimizer=False).param_groups:
                group["lr"] = rate

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        norm = self.recipe.optimizer.grad_clip_norm
        if norm is None:
            return
        members = scorer_members(self.online)
        if len(members) == 1:
            self.clip_gradients(optimizer, gradient_clip_val=norm, gradient_clip_algorithm="norm")
            return
        # One global norm would couple the members; each is clipped as its own fit would be.
        for member in members:
            torch.nn.utils.clip_grad_norm_(member.parameters(), norm)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = observed_optimizer_updates(self.optimizers(use_pl_optimizer=False))
        refreshed = refresh_target(self.target, self.online, self.recipe.target_update, self.observed_updates, now)
        self.target_refreshes += refreshed
        if refreshed and self.caches_target_values:
            self.build_target_values()
        if self.average is not None:
            for _ in range(now - self.observed_updates):
                polyak_target_update(self.average, self.online, 1.0 - self.recipe.evaluation.average_decay)
        self.observed_updates = now
