"""Presets as files: what sizes and shapes a population, and the environment it is drawn from.

A preset is a TOML file::

    name = "tiny"
    scenes = 3                    # scenes drawn per population
    chains_per_scene = 1          # actor chains started in each scene
    steps = 2                     # chain states per chain
    horizon = 2                   # H, the longest label horizon
    [actor]                       # the declared policy that walks the chains
    kind = "epsilon-greedy"       # or "uniform"
    epsilon = 0.3
    [environment]
    factory = "qhlab.scenes.puck:make"   # or "my_env.py:make", relative to this file
    [environment.options]         # passed to the factory as a dict
    ...

Owns: ``Preset`` (the validated file), ``load_preset`` (a built-in preset's name, or a file) and
``PRESET_NAMES`` (the built-in presets, which ship as files in ``qhlab/scenes/presets/``). Does not
own: loading the environment (``environment``), drawing scenes (``sampler``) or generating a
population (``population``).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from qhlab.evidence import QhInputError, invalid_fields

__all__ = ["BUILTIN_PRESETS", "PRESET_NAMES", "ActorSpec", "EnvironmentDeclaration", "Preset", "load_preset"]

# The built-in presets: one file each, beside this module.
BUILTIN_PRESETS = Path(__file__).resolve().parent / "presets"
PRESET_NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in BUILTIN_PRESETS.glob("*.toml")))

_CLOSED = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
_Int = Annotated[int, Strict()]


class ActorSpec(BaseModel):
    """The declared policy that walks the chains.

    Attributes:
        kind: ``"uniform"`` (each candidate equally likely) or ``"epsilon-greedy"`` (with
            probability ``epsilon`` uniform, otherwise the lowest-index argmax of Q*_H).
        epsilon: exploration probability of ``"epsilon-greedy"``; ignored for ``"uniform"``.
    """

    model_config = _CLOSED

    kind: Literal["uniform", "epsilon-greedy"] = "epsilon-greedy"
    epsilon: float = Field(default=0.3, ge=0.0, le=1.0)


class EnvironmentDeclaration(BaseModel):
    """The environment a preset draws from.

    Attributes:
        factory: ``"package.module:make"`` or ``"my_env.py:make"`` (relative to the preset file).
        options: passed to the factory as one dict (JSON types).
    """

    model_config = _CLOSED

    factory: str = Field(min_length=3, max_length=500)
    options: dict[str, Any] = Field(default_factory=dict)


class Preset(BaseModel):
    """Everything that sizes and shapes a population, except its split and seed.

    Attributes:
        name: the preset's name (a population is named ``<name>-<split>-seed<seed>``).
        scenes: scenes per population.
        chains_per_scene: actor chains started in each scene (from its initial state).
        steps: chain states per chain (a chain takes ``steps - 1`` actions).
        horizon: H, the longest label horizon (successor rows carry 1..H-1, so H >= 2).
        actor: the declared actor.
        environment: the environment's factory and options.
        path: the file it was read from (None for a preset built in Python).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    scenes: _Int = Field(ge=1, le=1_000_000)
    chains_per_scene: _Int = Field(ge=1, le=1000)
    steps: _Int = Field(ge=1, le=1000)
    horizon: _Int = Field(ge=2, le=8)
    actor: ActorSpec = ActorSpec()
    environment: EnvironmentDeclaration
    path: str | None = Field(default=None, exclude=True)

    @property
    def base(self) -> Path | None:
        """The directory a relative ``environment.factory`` file is found in (the preset's)."""
        return None if self.path is None else Path(self.path).parent

    def record(self) -> dict[str, Any]:
        """The preset as plain JSON types (recorded in manifests; the file's path is not part of it)."""
        return self.model_dump(mode="json")


def load_preset(
    name_or_file: str | os.PathLike, *, base: str | os.PathLike | None = None, call: str = "scenes"
) -> Preset:
    """A built-in preset by name, or a preset file.

    Args:
        name_or_file: a built-in preset's name (``PRESET_NAMES``), or the path of a TOML file.
        base: the directory a relative file is found in (a study config's); None: the working
            directory.
        call: what a refusal names.

    Raises:
        QhInputError: an unknown name, a missing or unreadable file, bad TOML, or every invalid
            field at once.
    """
    text = os.fspath(name_or_file)
    if text in PRESET_NAMES:
        path = BUILTIN_PRESETS / f"{text}.toml"
    elif text.endswith(".toml"):
        path = Path(text).expanduser()
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        path = Path(os.path.abspath(path))
    else:
        raise QhInputError(
            f"{call}: preset={text!r} is not allowed; allowed: a built-in preset ({', '.join(PRESET_NAMES)}) or a "
            "preset file (*.toml). HINT: a preset names its environment and sizes a population; see "
            "docs/how-to/bring-your-own-environment.md."
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QhInputError(
            f"{call}: preset={text!r} is not allowed; allowed: an existing file ({path} is not one)"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QhInputError(f"{call}: preset={str(path)!r} is not a readable TOML file ({exc}).") from None
    try:
        return Preset.model_validate({**raw, "path": str(path)})
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in error['loc']) or '(the file)'}={error.get('input')!r}: {error['msg']}"
            for error in exc.errors()
        ]
        raise invalid_fields(
            f"{call}: preset {str(path)!r}",
            problems,
            "compare with a built-in preset (qhlab/scenes/presets/tiny.toml).",
        ) from None
