"""What made a population, read back from its manifest: its environment and its preset.

Owns: ``population_origin`` (the environment spec, with a user environment's frozen copy inside the
population as its source, and the preset of a population's manifest) and ``user_environment``
(whether a manifest's environment is the researcher's own code, which ``qhlab verify`` never
imports). A puck population records its generator in the puck world's own layout; it is read as
the built-in environment ``qhlab.scenes.puck:make`` with the options its parameters hold. Does not
own: authenticating the manifest (``manifest``) or making the environment (``environment``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from qhlab.evidence import EvidenceError
from qhlab.scenes.environment import EnvironmentSpec
from qhlab.scenes.manifest import ENVIRONMENT_DIR
from qhlab.scenes.presets import Preset

__all__ = ["population_origin", "user_environment"]

# The keys of a puck generator record's parameters that are its preset's, not the world's options.
_PRESET_KEYS = ("name", "scenes", "chains_per_scene", "steps", "horizon", "actor")


def user_environment(manifest: dict) -> bool:
    """Whether the population's environment is user code (its source frozen under ``environment/``)."""
    declared = (manifest.get("generator") or {}).get("environment")
    return isinstance(declared, dict) and declared.get("source") is not None


def population_origin(path: str | os.PathLike, manifest: dict, *, call: str) -> tuple[EnvironmentSpec, Preset]:
    """The environment spec and the preset a population was generated from (authenticate first).

    Raises:
        EvidenceError: the generator record is neither a generic one nor the puck world's.
    """
    path = Path(path)
    generator = manifest.get("generator") or {}
    parameters = generator.get("preset_parameters")
    try:
        if isinstance(generator.get("environment"), dict):
            declared = generator["environment"]
            spec = EnvironmentSpec(
                factory=declared["factory"],
                options=dict(declared["options"]),
                source=declared["source"],
                root=None if declared["source"] is None else str(path / ENVIRONMENT_DIR),
            )
            return spec, Preset.model_validate(parameters)
        if generator.get("engine") == "pymunk" and isinstance(parameters, dict):
            options = {k: v for k, v in parameters.items() if k not in _PRESET_KEYS}
            preset = Preset.model_validate(
                {
                    **{k: parameters[k] for k in _PRESET_KEYS},
                    "environment": {"factory": "qhlab.scenes.puck:make", "options": options},
                }
            )
            return EnvironmentSpec("qhlab.scenes.puck:make", options), preset
    except (KeyError, TypeError, ValidationError) as exc:
        raise EvidenceError(f"{call}: {path / 'manifest.json'}: its generator record is malformed ({exc}).") from None
    raise EvidenceError(
        f"{call}: {path / 'manifest.json'}: its generator record names no environment; allowed: a population this "
        "qhlab generated. HINT: regenerate it with `qhlab scenes generate`."
    )
