"""Training batches: a population held resident as tensors, cut into seeded batches.

Owns: `QhPopulationDataModule` (LightningDataModule): seeded batches of chain-state rows with
their successor states (`BATCH_KEYS`), gathered by `index_select` from a population held
resident as tensors, and the successor states a hard target's value table covers
(`successor_states`); `population_dims`, a population's scorer dims. Does not own: the learning
rule (`q_learning`), reading population files (`data`), evaluation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from qhlab.evidence import QhInputError
from qhlab.finite_horizon.scorer import ScorerDims

__all__ = ["BATCH_KEYS", "QhPopulationDataModule", "population_dims"]


def population_dims(population: Any) -> ScorerDims:
    """ScorerDims (F, G, C, H) of a `Population`."""
    return ScorerDims(
        object_features=int(population.objects.shape[-1]),
        goal_features=int(population.goal.shape[-1]),
        candidate_features=int(population.candidates.shape[-1]),
        horizon=int(population.horizon),
    )


BATCH_KEYS = (
    "rows",
    "objects",
    "object_mask",
    "goal",
    "candidates",
    "candidate_object",
    "candidate_mask",
    "reward",
    "successor_valid",
    "next_objects",
    "next_object_mask",
    "next_goal",
    "next_candidates",
    "next_candidate_object",
    "next_candidate_mask",
    "next_reward",
    "successor",
)


def _epoch_permutation(seed: int, epoch: int, n: int) -> Tensor:
    """The seeded order of the n chain rows in pass `epoch` (independent of device and history)."""
    derived = int.from_bytes(hashlib.sha256(f"qh-batches:{seed}:{epoch}".encode()).digest()[:8], "little")
    return torch.randperm(n, generator=torch.Generator().manual_seed(derived))


class _BatchStream(IterableDataset):
    """Endless stream of batches: passes over the chain rows in seeded orders, cut into batches."""

    def __init__(self, module: QhPopulationDataModule, start_batch: int) -> None:
        super().__init__()
        self.module = module
        self.start_batch = start_batch

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        m = self.module
        n, size = m.chain_rows.numel(), m.batch_size
        position = self.start_batch * size
        epoch, offset = divmod(position, n)
        order = _epoch_permutation(m.seed, epoch, n)
        while True:
            parts, need = [], size
            while need:
                take = min(need, n - offset)
                parts.append(order[offset : offset + take])
                need -= take
                offset += take
                if offset == n:
                    epoch, offset = epoch + 1, 0
                    order = _epoch_permutation(m.seed, epoch, n)
            yield m.gather(m.chain_rows[torch.cat(parts)])


class QhPopulationDataModule(pl.LightningDataModule):
    """Seeded batches of TRAIN chain-state rows plus their successor states.

    The whole population stays resident as tensors; a batch is a handful of `index_select`s.
    Rows are visited in passes: each pass is a seeded permutation of the chain rows (seed,
    pass index), and batches are consecutive slices of the concatenated passes, so a
    population smaller than a batch simply repeats (the canary case) and batch i is a pure
    function of (seed, i).

    Args:
        train: a `Population` (chain rows are trained on; successor rows are bootstrapped through).
        batch_size: chain rows per batch.
        seed: batch-order seed.
        rows: optional subset of chain rows (e.g. the canary's single row) [R] int64.
        start_batch: index of the first batch produced (a resumed fit continues the stream).
        successor_labels: also gather the successor states' exact labels as `next_labels`
            [B, K, K', H] (for `recipe.successor_label_rows`; off by default, it costs a gather).

    Attributes:
        dims: `ScorerDims` of the population.
        population_rows: S, rows of the population (chain and successor states).
        chain_rows: [R] int64 rows batches are drawn from.
    """

    def __init__(
        self,
        train: Any,
        *,
        batch_size: int,
        seed: int,
        rows: Tensor | None = None,
        start_batch: int = 0,
        successor_labels: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise QhInputError(f"QhPopulationDataModule: batch_size={batch_size!r} is not allowed; allowed: >= 1")
        if start_batch < 0:
            raise QhInputError(f"QhPopulationDataModule: start_batch={start_batch!r} is not allowed; allowed: >= 0")
        self.population = train
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.start_batch = int(start_batch)
        self.dims = population_dims(train)
        chain = torch.nonzero(train.is_chain, as_tuple=False).flatten()
        if rows is not None:
            rows = torch.as_tensor(rows, dtype=torch.int64).flatten()
            in_range = (rows >= 0) & (rows < train.is_chain.numel())
            is_chain = in_range & train.is_chain[rows.clamp(0, train.is_chain.numel() - 1)]
            bad = rows[~is_chain]
            if bad.numel():
                raise QhInputError(
                    f"QhPopulationDataModule: rows={bad.tolist()[:5]!r} is not allowed; allowed: chain "
                    "rows of the population. HINT: successor rows are never trained on directly."
                )
            chain = rows
        if chain.numel() == 0:
            raise QhInputError(
                "QhPopulationDataModule: train has 0 chain rows; allowed: >= 1. "
                "HINT: pass a TRAIN population with at least one chain state."
            )
        self.chain_rows = chain
        p = train
        # contiguous views once, so that every batch is index_select over resident memory
        self._state = {
            "objects": p.objects.contiguous(),
            "object_mask": p.object_mask.contiguous(),
            "goal": p.goal.contiguous(),
            "candidates": p.candidates.contiguous(),
            "candidate_object": p.candidate_object.contiguous(),
            "candidate_mask": p.candidate_mask.contiguous(),
        }
        self._reward = p.reward.contiguous()
        self._successor = p.successor.contiguous()
        self._labels = p.q.contiguous() if successor_labels else None
        self.population_rows = int(p.successor.shape[0])

    def gather(self, rows: Tensor) -> dict[str, Tensor]:
        """Batch dict for chain rows [B] (keys: `BATCH_KEYS`; shapes in ARCHITECTURE.md)."""
        b = rows.numel()
        batch = {name: t.index_select(0, rows) for name, t in self._state.items()}
        successor = self._successor.index_select(0, rows)  # [B, K]
        k = successor.shape[1]
        valid = successor >= 0
        flat = successor.clamp_min(0).flatten()
        for name, t in self._state.items():
            nxt = t.index_select(0, flat)
            batch["next_" + name] = nxt.view(b, k, *nxt.shape[1:])
        # a missing successor has no candidates, so nothing in it can be bootstrapped
        batch["next_candidate_mask"] = batch["next_candidate_mask"] & valid.unsqueeze(-1)
        batch["reward"] = self._reward.index_select(0, rows)
        batch["next_reward"] = self._reward.index_select(0, flat).view(b, k, -1)  # [B, K, K']
        batch["successor_valid"] = valid
        batch["successor"] = successor
        if self._labels is not None:
            batch["next_labels"] = self._labels.index_select(0, flat).view(b, k, *self._labels.shape[1:])
        batch["rows"] = rows
        return batch

    def successor_states(self) -> tuple[Tensor, dict[str, Tensor]]:
        """The successor states that batches of `chain_rows` bootstrap through.

        Returns:
            rows: [U] int64, sorted unique population rows.
            states: the six state tensors of those rows, in the scorer's argument order
                (`objects` [U, N, F], `object_mask`, `goal`, `candidates`, `candidate_object`,
                `candidate_mask` [U, K']).
        """
        successor = self._successor.index_select(0, self.chain_rows)
        rows = torch.unique(successor[successor >= 0])
        return rows, {name: t.index_select(0, rows) for name, t in self._state.items()}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_BatchStream(self, self.start_batch), batch_size=None, num_workers=0)
