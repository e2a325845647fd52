"""Batched, gradient-free scorer predictions over a population's rows (for evaluation).

Owns: `predict_q`. Does not own: metrics (`evaluation`), loading populations (`data`) or
the lane's precision policy (callers pass the profile's `autocast_context`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["predict_q"]


def predict_q(
    scorer: nn.Module,
    population: Any,
    *,
    rows: Tensor | None = None,
    batch_size: int = 1024,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Tensor:
    """Q predictions for the given rows of a population.

    Args:
        scorer: a scorer (forward as in `scorer.QhScorer`); used in eval mode, each submodule's
            mode restored after.
        population: a `Population` (tensor fields as in docs/ARCHITECTURE.md).
        rows: [R] int64 rows to predict; default the chain rows (evaluation rows) in population
            order, i.e. aligned with `population.q[population.is_chain]`.
        batch_size: rows per forward.
        autocast: zero-argument factory of the lane's precision context
            (`profile.autocast_context`); default no autocast.

    Returns:
        q: [R, K, H] float32 on the CPU, no grad.
    """
    if batch_size < 1:
        raise ValueError(f"predict_q: batch_size={batch_size!r} is not allowed; allowed: >= 1")
    if rows is None:
        rows = torch.nonzero(population.is_chain, as_tuple=False).flatten()
    device = next(scorer.parameters()).device
    # Each module's own mode is restored: a builder may keep a part in eval mode while training.
    modes = [(m, m.training) for m in scorer.modules()]
    scorer.eval()
    outputs = []
    try:
        with torch.no_grad():
            for start in range(0, rows.numel(), batch_size):
                index = rows[start : start + batch_size]
                inputs = [
                    getattr(population, name).index_select(0, index).to(device)
                    for name in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")
                ]
                with autocast():
                    q = scorer(*inputs)
                outputs.append(q.float().cpu())
    finally:
        for module, training in modes:
            module.training = training
    if not outputs:
        h = population.horizon
        return torch.zeros(0, population.candidates.shape[1], h)
    return torch.cat(outputs)
