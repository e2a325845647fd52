"""Execution and W&B-attempt policy for the QH research launchers (its public API).

Owns: nothing of its own. It is the public API path of lanes and W&B attempts and re-exports every name
from the module that implements it:

- ``qhlab.training.profiles``: execution lanes, their registry and admission, precision,
  memory accounting and ``execution_policy_source`` (which hashes ``profiles.py`` alone);
- ``qhlab.training.device_checks``: device/dtype checks and MPS fallback capture;
- ``qhlab.training.wandb_attempt``: ``WandbAttempt`` and ``publish_wandb_attempt``;
- ``qhlab.training.lineage``: ``verified_cold_initialization_lineage``.

Does not own: starting a Trainer or creating a W&B run (``qhlab.training.launcher``), the
recipe's scientific fields (``qhlab.finite_horizon.recipe``), or receipts
(``qhlab.evidence``). New code may import from either path; the objects are the same.
"""

from __future__ import annotations

from qhlab.training.device_checks import assert_device_tensors, captured_fallback_operations
from qhlab.training.lineage import ColdInitializationLineage, verified_cold_initialization_lineage
from qhlab.training.profiles import (
    PROFILE_NAMES,
    ProfileRefusedError,
    QhExecutionProfile,
    RuntimeEvidence,
    execution_policy_source,
    execution_profile,
)
from qhlab.training.wandb_attempt import WandbAttempt, publish_wandb_attempt

__all__ = [
    "PROFILE_NAMES",
    "ColdInitializationLineage",
    "ProfileRefusedError",
    "QhExecutionProfile",
    "RuntimeEvidence",
    "WandbAttempt",
    "assert_device_tensors",
    "captured_fallback_operations",
    "execution_policy_source",
    "execution_profile",
    "publish_wandb_attempt",
    "verified_cold_initialization_lineage",
]
