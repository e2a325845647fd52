"""Environments and their populations: exact finite-horizon labels for any environment.

Owns the generic machinery: the environment contract (``environment``), presets as files
(``presets``), the scene and actor seeds of a population (``sampler``), the exact tree search
through an environment's ``step`` (``labels``), actor chains (``chains``), the population format
written (``population``) and read back checked (``reader``: manifest, tables, Bellman and
successor checks, arrays), the label arrays and the exact Bellman rule (``bellman``), the audit
(``audit``), the difficulty card (``difficulty``,
``describe``) and seals in a population cache (``seals``). Two environments are built in: the
puck world (``puck``: pymunk) and the tank network (``tanks``). Does not own: turning a
population into tensors (``qhlab.finite_horizon.data``) or anything torch.

Names are resolved lazily so that label worker processes do not pay for pyarrow.
"""

from __future__ import annotations

import importlib

__all__ = [
    "PRESET_NAMES",
    "cached_population",
    "generate_population",
    "load_preset",
    "read_manifest",
]

_HOME = {
    "PRESET_NAMES": "qhlab.scenes.presets",
    "load_preset": "qhlab.scenes.presets",
    "generate_population": "qhlab.scenes.population",
    "cached_population": "qhlab.scenes.population",
    "read_manifest": "qhlab.scenes.manifest",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'qhlab.scenes' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
