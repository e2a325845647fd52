"""Training layer: execution profiles, tensor state files, the Lightning launcher.

Owns: backend/precision policy (``profiles``), W&B attempt identity (``wandb_attempt``),
tensor state files and the cold-initialization artifact (``tensor_state``, ``lineage``), and
the generic fit seam (``launcher`` with ``optimizer_state``, ``callbacks``, ``segments``).
``execution_profile`` is the public API of lanes and W&B attempts and re-exports its names. Does not own: the
QH learning rule, scorer or recipe (``qhlab.finite_horizon``) or receipts
(``qhlab.evidence``). Names resolve lazily so that ``import qhlab.training`` does not import
torch until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "QhExecutionProfile",
    "WandbAttempt",
    "assert_device_tensors",
    "captured_fallback_operations",
    "execution_policy_source",
    "execution_profile",
    "load_tensor_state",
    "publish_wandb_attempt",
    "save_tensor_state",
    "verified_cold_initialization_lineage",
    "write_cold_initialization",
]

# Seed names resolve through the seed path: importing it also binds the submodule
# ``qhlab.training.execution_profile``, which shares its name with the seed function.
_SEED_PATH = "qhlab.training.execution_profile"
_OWNERS = {
    "load_tensor_state": "qhlab.training.tensor_state",
    "save_tensor_state": "qhlab.training.tensor_state",
    "write_cold_initialization": "qhlab.training.tensor_state",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'qhlab.training' has no attribute {name!r}")
    module = importlib.import_module(_OWNERS.get(name, _SEED_PATH))
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
