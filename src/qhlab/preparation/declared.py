"""The populations a preparation tool declares, checked against its study before any is drawn.

Owns: ``declared_population`` (what a declared source will be once drawn: its split, horizon and
generator record, read from its preset or from its manifest, without generating anything),
``refuse_unservable`` (a pilot's, a tuning's or an E0 check's populations against the study's
TRAIN and validation and the recipe's horizon: one refusal naming the field before anything is
drawn, labelled or written) and ``declared_unit`` (the reward unit a declared population is
in). Does not own: drawing populations (``qhlab.study.populations``), the identity of a
population distribution (``qhlab.scenes.manifest.generator_identity``) or the freeze's check of
a bound record's populations (``qhlab.study.preparation``), which this check anticipates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qhlab.evidence import input_error, sha256_file
from qhlab.evidence.layout import MANIFEST
from qhlab.scenes.manifest import environment_words, generator_identity, reward_unit
from qhlab.scenes.presets import load_preset

__all__ = ["Declared", "declared_population", "declared_unit", "refuse_unservable", "study_populations", "unit_suffix"]

_SPLIT_WORDS = {"train": "TRAIN", "validation": "validation"}


@dataclass(frozen=True)
class Declared:
    """A population as a config declares it, before it is drawn.

    Attributes:
        field: the config field that names it (``"train.preset"``, ``"validation.path"``).
        value: what that field holds (the preset, or the directory).
        seed: its seed (None for a population named by path whose manifest names none).
        split: the split it is drawn as, or its manifest's.
        horizon: its H (the preset's, or the manifest's).
        generator: its generator record (``expected_generator``'s, or the manifest's).
        manifest_sha256: its manifest's digest (a population named by path; None for a preset).
    """

    field: str
    value: str
    seed: int | None
    split: Any
    horizon: Any
    generator: dict
    manifest_sha256: str | None

    @property
    def identity(self) -> str:
        """Its distribution's identity (``generator_identity``): equal for every draw of one distribution."""
        return generator_identity(self.generator)

    @property
    def environment(self) -> str:
        """The environment it is drawn from, by name (``"puck world"``, ``"CartPole-v1"``)."""
        return environment_words(self.generator).split(":", 1)[0]

    def same_draw(self, other: Declared) -> bool:
        """Whether both name the same scenes: one manifest, or one distribution with one seed."""
        if self.manifest_sha256 is not None and self.manifest_sha256 == other.manifest_sha256:
            return True
        return self.identity == other.identity and self.seed is not None and self.seed == other.seed


def declared_population(source: Any, split: str, *, field: str, call: str, required: bool = True) -> Declared | None:
    """What a declared population will be, read without drawing it.

    A preset is loaded and its generator record computed (``expected_generator``: the environment
    is made, no scene is drawn); a directory's manifest is read as JSON (the population is
    authenticated where it is loaded; this only decides refusals).

    Args:
        source: a ``PopulationSource`` (a preset and seed, or a path).
        split: the split a preset is drawn as ("train" or "validation").
        field: the config table naming it (``"train"``, ``"validation"``).
        call: the command named in a refusal.
        required: whether a directory that holds no manifest is refused (a tool's own population)
            or only left unchecked (None: a study's population it has not made yet).

    Raises:
        QhInputError: a required directory that holds no population, or an unknown preset.
    """
    # Lazy: keeps importing this module free of the population writer's imports.
    from qhlab.scenes.population import expected_generator

    if source.path is not None:
        manifest = Path(source.path) / MANIFEST
        if not manifest.is_file():
            if not required:
                return None
            raise input_error(
                call,
                f"{field}.path",
                source.path,
                "an existing population directory (one `qhlab scenes generate` wrote)",
                "generate it with `qhlab scenes generate`, or name a preset and seed",
            )
        try:
            document = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # its reader refuses it, naming the file, where it is loaded
        generator = document.get("generator") if isinstance(document, dict) else None
        if not isinstance(generator, dict):
            return None
        return Declared(
            f"{field}.path",
            str(source.path),
            generator.get("seed"),
            document.get("split"),
            document.get("horizon"),
            generator,
            sha256_file(manifest),
        )
    preset = load_preset(source.preset, call=call)
    generator = expected_generator(preset, split, source.seed, call=call)
    return Declared(f"{field}.preset", str(source.preset), source.seed, split, preset.horizon, generator, None)


def study_populations(study: Any, *, call: str) -> dict[str, Declared | None]:
    """The study's TRAIN and validation as its config declares them (None for a directory not made yet)."""
    return {
        role: declared_population(getattr(study, role), role, field=f"study {role}", call=call, required=False)
        for role in ("train", "validation")
    }


def declared_unit(declared: Declared | None) -> str:
    """The unit a declared population's rewards are in ("" where it names none or is unknown)."""
    return "" if declared is None else reward_unit(declared.generator)


def refuse_unservable(
    call: str,
    tool: str,
    populations: dict[str, Declared | None],
    *,
    horizon: int | None,
    horizon_source: str,
    study: dict[str, Declared | None] | None = None,
) -> None:
    """Refuse a tool's population that cannot serve its study, before any population is drawn.

    Each of ``populations`` (by role: ``"train"`` or ``"validation"``) must be of its role's split,
    of the horizon the fits' recipe learns and, when ``study`` is given, of the study's own
    distribution for that role (``generator_identity``, as the freeze compares them); a
    validation must not be the study's validation draw, nor any TRAIN population.

    Args:
        call: the command refusing.
        tool: what the tool makes, in a hint (``"a pilot"``, ``"a tuning"``).
        populations: ``{"train" | "validation": the tool's declared population}`` (None: unknown,
            left to its reader).
        horizon: the H the fits' recipe learns (None: unknown).
        horizon_source: where that H is declared, in words (``"the study's recipe"``).
        study: ``{"train" | "validation": the study's declared population}`` (None for either:
            not known before the study draws it); None: the tool serves no study.

    Raises:
        QhInputError: the first population that cannot serve (its field, value, what is allowed).
    """
    for role, ours in populations.items():
        if ours is None:
            continue
        theirs = (study or {}).get(role)
        if ours.split != role:
            _refuse_split(call, role, ours, study or {})
        # (what is allowed, why this one is not), for the first way the population cannot serve.
        problem = None
        if theirs is not None and ours.environment != theirs.environment:
            problem = (
                _allowed(role, theirs),
                f"it is drawn from {ours.environment}, the study's {_SPLIT_WORDS[role]} population from "
                f"{theirs.environment}; {tool}'s numbers belong to the distribution it measured: "
                + _remedy(role, theirs),
            )
        elif horizon is not None and ours.horizon != horizon:
            problem = (
                f"a population of H={horizon}, the horizon {horizon_source} learns",
                f"it has H={ours.horizon}, and no fit of H={horizon} can be made on it: name a preset of "
                f"H={horizon}" + ("" if theirs is None else f" (the study's is {theirs.value!r})"),
            )
        elif theirs is not None and ours.identity != theirs.identity:
            problem = (
                _allowed(role, theirs),
                f"its environment's options, source or versions, the preset's sizes or its actor differ from the "
                f"study's {_SPLIT_WORDS[role]} population's ({theirs.value!r}); the freeze refuses {tool} of another "
                f"distribution: {_remedy(role, theirs)}",
            )
        if problem is not None:
            raise input_error(call, ours.field, ours.value, *problem)
        if role == "validation" and theirs is not None and ours.same_draw(theirs):
            raise input_error(
                call,
                ours.field,
                ours.value,
                "a tuning population the study never scores on",
                "it is the study's validation population (by content, whatever its path); "
                f"{tool} must not look at held-out scenes: name another seed of {theirs.value!r}",
            )


def _remedy(role: str, theirs: Declared) -> str:
    """What to name instead: the study's own preset with another seed."""
    preset = theirs.value if theirs.field.endswith(".preset") else theirs.generator.get("preset")
    return f"name the study's {_SPLIT_WORDS[role]} preset ({preset!r}) with another seed"


def _allowed(role: str, theirs: Declared) -> str:
    return (
        f"a population of the study's {_SPLIT_WORDS[role]} distribution ({theirs.value!r}: {theirs.environment}, "
        f"H={theirs.horizon})"
    )


def _refuse_split(call: str, role: str, ours: Declared, study: dict[str, Declared | None]) -> None:
    """Refuse a population named by path whose manifest is of another split than its role's."""
    own = study.get("train")
    what = (
        "the study's own TRAIN population"
        if own is not None and role == "validation" and ours.same_draw(own)
        else f"a {_SPLIT_WORDS.get(ours.split, repr(ours.split))} population (its manifest's split is {ours.split!r})"
    )
    raise input_error(
        call,
        ours.field,
        ours.value,
        f"a {_SPLIT_WORDS[role]} population (split {role!r})",
        f"it is {what}, and no fit can use it as its {_SPLIT_WORDS[role]} population: name a preset and seed, or "
        f"a population `qhlab scenes generate` wrote as split {role!r}",
    )


def unit_suffix(unit: str) -> str:
    """What follows a reward-valued number: " m" in the puck world, "" where the reward names no unit."""
    return f" {unit}" if unit else ""
