"""Observed optimizer milestones for opt-in engineering commissioning: the public API.

Owns: the seed module path ``qhlab.finite_horizon.diagnostics.commissioning`` and its names.
Every name is re-exported, unchanged, from the module that implements it:

* ``milestones``: ``QhCommissioningMilestonesConfig``, ``QhCommissioningMilestoneReceipt``,
  ``read_commissioning_milestones`` (and the milestone file names and schema);
* ``milestone_gate``: ``QhCommissioningMilestonesCallback`` (the gate on a live fit);
* ``mps_memory``: ``QhMpsMemoryBudgetCallback``, ``QhMpsMemoryObservation``,
  ``read_mps_memory_observation`` (and the observation's file name and schema).

Does not own: any behaviour (see those modules), the fit composition
(``qhlab.finite_horizon.fit``) or the ``qhlab commission`` run
(``qhlab.finite_horizon.commission``). These gates inspect successful transactions, never
proxy batch/global-step counts; they do not certify learning quality or replace the
authenticated final fit receipt.
"""

from __future__ import annotations

from qhlab.finite_horizon.diagnostics.milestone_gate import QhCommissioningMilestonesCallback
from qhlab.finite_horizon.diagnostics.milestones import (
    QhCommissioningMilestoneReceipt,
    QhCommissioningMilestonesConfig,
    read_commissioning_milestones,
)
from qhlab.finite_horizon.diagnostics.mps_memory import (
    QhMpsMemoryBudgetCallback,
    QhMpsMemoryObservation,
    read_mps_memory_observation,
)

__all__ = [
    "QhCommissioningMilestoneReceipt",
    "QhCommissioningMilestonesCallback",
    "QhCommissioningMilestonesConfig",
    "QhMpsMemoryBudgetCallback",
    "QhMpsMemoryObservation",
    "read_commissioning_milestones",
    "read_mps_memory_observation",
]
