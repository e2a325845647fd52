"""Engineering diagnostics of QH fits: observed commissioning gates and memory guards.

Owns: opt-in commissioning that observes successful optimizer updates, saves CPU
state at declared gates and authenticates it later. ``commissioning`` is the seed module and
re-exports every name from the modules that implement them: ``milestones`` (config, receipt,
file names, reader), ``milestone_gate`` (the Lightning callback on a live fit) and
``mps_memory`` (the live MPS tensor-allocation guard and its observation). Does not own: the
fit composition (``qhlab.finite_horizon.fit``), the ``qhlab commission`` run
(``qhlab.finite_horizon.commission``), learning quality or the final fit receipt.
Names resolve lazily so that importing the package does not import torch or Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "QhCommissioningMilestoneReceipt",
    "QhCommissioningMilestonesCallback",
    "QhCommissioningMilestonesConfig",
    "QhMpsMemoryBudgetCallback",
    "QhMpsMemoryObservation",
    "read_commissioning_milestones",
    "read_mps_memory_observation",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'qhlab.finite_horizon.diagnostics' has no attribute {name!r}")
    return getattr(importlib.import_module("qhlab.finite_horizon.diagnostics.commissioning"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
