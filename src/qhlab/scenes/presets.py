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


# The fields that tell qhlab's other config kinds apart from a preset (each kind's required ones).
_OTHER_CONFIGS = (
    ("study", ("experiment", "seeds")),
    ("tuning", ("space", "objective")),
    ("pilot", ("study", "seeds")),
    ("E0 check", ("study", "train_seeds")),
    ("plan", ("study", "pilot", "target")),
    ("recipe", ("architecture", "optimizer")),
)


def _refuse_other_config(raw: dict[str, Any], path: Path, call: str) -> None:
    """Refuse a study, tuning, pilot, E0 check, plan or recipe TOML given where a preset file
    belongs, in one line that says where that config's presets are named, instead of listing
    every preset field it lacks."""
    if "environment" in raw:
        return
    kind = next((kind for kind, keys in _OTHER_CONFIGS if all(k in raw for k in keys)), None)
    if kind is None:
        return
    article = "an" if kind[0] in "AEIOU" else "a"
    if kind in ("study", "tuning", "pilot"):
        named = [
            raw[split]["preset"]
            for split in ("train", "validation")
            if isinstance(raw.get(split), dict) and isinstance(raw[split].get("preset"), str)
        ]
        # A preset file named there is relative to the config's directory, as its own loader reads it.
        shown = [n if n in PRESET_NAMES or Path(n).is_absolute() else str(path.parent / n) for n in named]
        where = "its presets are named in [train] preset and [validation] preset"
        where += f"; check one with `qhlab env check {shown[0]}`" if shown else " (it names none: population paths)"
    elif kind == "recipe":
        where = "a recipe names no environment; a study names its presets in [train] preset and [validation] preset"
    else:
        where = (
            f"its study config (study = {raw['study']!r}) names the presets in [train] preset and [validation] preset"
        )
    raise QhInputError(
        f"{call}: preset={str(path)!r} is not allowed; allowed: a preset file (name, scenes, chains_per_scene, "
        f"steps, horizon, [environment]) or a built-in preset's name ({', '.join(PRESET_NAMES)}). HINT: this is "
        f"{article} {kind} config, not a preset; {where}."
    )


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
    _refuse_other_config(raw, path, call)
    try:
        return Preset.model_validate({**raw, "path": str(path)})
    except ValidationError as exc:
        problems = [
            # A missing field's input is the whole document: name the field alone.
            f"{'.'.join(str(p) for p in error['loc']) or '(the file)'} is missing"
            if error["type"] == "missing"
            else f"{'.'.join(str(p) for p in error['loc']) or '(the file)'}={error.get('input')!r}: {error['msg']}"
            for error in exc.errors()
        ]
        raise invalid_fields(
            f"{call}: preset {str(path)!r}",
            problems,
            "compare with a built-in preset (qhlab/scenes/presets/tiny.toml).",
        ) from None
