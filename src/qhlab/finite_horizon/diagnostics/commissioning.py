"""Observed optimizer milestones for opt-in engineering commissioning (seed 001): the public face.

Owns: the seed module path ``qhlab.finite_horizon.diagnostics.commissioning`` and its names.
Every name is re-exported, unchanged, from the module that implements it:

* ``milestones``: ``QhCommissioningMilestonesConfig``, ``QhCommissioningMilestoneReceipt``,
  ``read_commissioning_milestones``, ``milestone_receipt_path``, ``MILESTONE_KIND``,
  ``MILESTONE_SCHEMA_VERSION``;
* ``milestone_gate``: ``QhCommissioningMilestonesCallback`` (the gate on a live fit);
* ``mps_memory``: ``QhMpsMemoryBudgetCallback``, ``QhMpsMemoryObservation``,
  ``read_mps_memory_observation``, ``MPS_MEMORY_KIND``, ``MPS_MEMORY_RECEIPT``,
  ``MPS_MEMORY_SCHEMA_VERSION``.

Does not own: any behaviour (see those modules), the fit composition
(``qhlab.finite_horizon.fit``) or the ``qhlab commission`` run
(``qhlab.finite_horizon.commission``). These gates inspect successful transactions, never
proxy batch/global-step counts; they do not certify learning quality or replace the
authenticated final fit receipt.
"""

from __future__ import annotations

from qhlab.finite_horizon.diagnostics.milestone_gate import QhCommissioningMilestonesCallback
from qhlab.finite_horizon.diagnostics.milestones import (
    MILESTONE_KIND,
    MILESTONE_SCHEMA_VERSION,
    QhCommissioningMilestoneReceipt,
    QhCommissioningMilestonesConfig,
    milestone_receipt_path,
    read_commissioning_milestones,
)
from qhlab.finite_horizon.diagnostics.mps_memory import (
    MPS_MEMORY_KIND,
    MPS_MEMORY_RECEIPT,
    MPS_MEMORY_SCHEMA_VERSION,
    QhMpsMemoryBudgetCallback,
    QhMpsMemoryObservation,
    read_mps_memory_observation,
)

__all__ = [
    "MILESTONE_KIND",
    "MILESTONE_SCHEMA_VERSION",
    "MPS_MEMORY_KIND",
    "MPS_MEMORY_RECEIPT",
    "MPS_MEMORY_SCHEMA_VERSION",
    "QhCommissioningMilestoneReceipt",
    "QhCommissioningMilestonesCallback",
    "QhCommissioningMilestonesConfig",
    "QhMpsMemoryBudgetCallback",
    "QhMpsMemoryObservation",
    "milestone_receipt_path",
    "read_commissioning_milestones",
    "read_mps_memory_observation",
]
