"""The pymunk puck benchmark: scenes, candidates, exact finite-horizon labels, populations.

Owns: the population format, written (``population``) and read back checked (``reader``:
manifest, tables, Bellman and successor physics, arrays). Does not own: turning a population
into tensors (``qhlab.finite_horizon.data``) or anything torch.

Names are resolved lazily so that label worker processes (which import
``qhlab.scenes.labels``) do not pay for pyarrow.
"""

from __future__ import annotations

import importlib

__all__ = [
    "GENERATOR_VERSION",
    "PRESETS",
    "cached_population",
    "generate_population",
    "get_preset",
    "read_manifest",
]

_HOME = {
    "GENERATOR_VERSION": "qhlab.scenes.sampler",
    "PRESETS": "qhlab.scenes.sampler",
    "get_preset": "qhlab.scenes.sampler",
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
