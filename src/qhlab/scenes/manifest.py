"""A population directory's format: its file names, its manifest, and reading them back authenticated.

Owns: the names (``POPULATION_FILES``, ``MANIFEST``, ``POPULATION_RECEIPT``, ``MANIFEST_KIND``,
``MANIFEST_SCHEMA_VERSION``), ``read_manifest``, which authenticates a population's receipt,
manifest and file digests, ``reward_unit``, the unit its rewards are in, ``environment_words``,
the environment it binds in words, and ``generator_identity``, the one identity of a population's
generator (whatever named it: a built-in preset, a preset file or a directory). The writer
(``population``), the reader (``reader``), the physics audit (``audit``) and the card
(``describe``) all read the format here, and this module imports none of them. Does not own:
writing a population, reading its tables or checking its labels.
"""

from __future__ import annotations

import os
from pathlib import Path

from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    MissingEvidenceError,
    SchemaMismatchError,
    canonical_json,
    read_receipt,
    sha256_bytes,
)
from qhlab.evidence.canonical import read_json_object
from qhlab.evidence.layout import MANIFEST, POPULATION_FILES, POPULATION_RECEIPT
from qhlab.evidence.layout import POPULATION_ENVIRONMENT_DIR as ENVIRONMENT_DIR
from qhlab.scenes.records import PopulationReceipt

__all__ = [
    "ENVIRONMENT_DIR",
    "MANIFEST_KIND",
    "MANIFEST_SCHEMA_VERSION",
    "environment_words",
    "generator_identity",
    "read_manifest",
    "reward_unit",
]

# The layout version of manifest.json (a document of its own; its receipt is PopulationReceipt).
MANIFEST_SCHEMA_VERSION = 1
MANIFEST_KIND = "qhlab.population"


def read_manifest(path: str | os.PathLike) -> dict:
    """Authenticate a population directory: its receipt, manifest and every file digest.

    Args:
        path: population directory.

    Returns:
        The manifest (a dict).

    Raises:
        MissingEvidenceError: the directory, receipt, manifest or a bound file is missing.
        SchemaMismatchError: another schema version or kind.
        DigestMismatchError: a file's SHA-256 differs from the receipt or the manifest.
        EvidenceError: the manifest is not valid JSON or lacks fields.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    receipt_path = path / POPULATION_RECEIPT
    if not receipt_path.is_file():
        raise MissingEvidenceError(
            f"load_population: {receipt_path} does not exist. HINT: a population directory holds "
            "manifest.json, population.receipt.json and three Parquet files written by qhlab."
        )
    # The receipt binds the manifest's own bytes too, so any changed byte in any file fails.
    receipt = read_receipt(receipt_path, PopulationReceipt)
    copies = sorted(n for n in receipt.outputs if n.startswith(f"{ENVIRONMENT_DIR}/"))
    expected = {name: name for name in (*POPULATION_FILES, *copies, MANIFEST)}
    if {name: entry.path for name, entry in receipt.outputs.items()} != expected:
        raise EvidenceError(
            f"load_population: {receipt_path} binds {sorted(receipt.outputs)}; allowed: exactly "
            f"{sorted(expected)} in the population directory."
        )
    if not manifest_path.is_file():
        raise MissingEvidenceError(
            f"load_population: {manifest_path} does not exist. HINT: generate the population with "
            "`qhlab scenes generate` or pass a population directory."
        )
    raw, manifest = read_json_object(manifest_path, "load_population")
    version = manifest.get("schema_version")
    if version != MANIFEST_SCHEMA_VERSION:
        raise SchemaMismatchError(
            f"load_population: {manifest_path} field schema_version={version!r} is not allowed; "
            f"allowed: {MANIFEST_SCHEMA_VERSION}. HINT: regenerate the population with this qhlab."
        )
    if manifest.get("kind") != MANIFEST_KIND:
        raise SchemaMismatchError(
            f"load_population: {manifest_path} field kind={manifest.get('kind')!r} is not allowed; "
            f"allowed: {MANIFEST_KIND!r}."
        )
    required = ("name", "split", "horizon", "K", "features", "generator", "counts", "files")
    missing = [k for k in required if k not in manifest]
    if missing:
        raise EvidenceError(f"load_population: {manifest_path} lacks fields {missing}.")
    files = manifest["files"]
    if not isinstance(files, dict) or sorted(files) != sorted((*POPULATION_FILES, *copies)):
        raise EvidenceError(
            f"load_population: {manifest_path} field files={sorted(files) if isinstance(files, dict) else files!r} "
            f"is not allowed; allowed: exactly {list(POPULATION_FILES)} and the environment's source the receipt "
            "binds."
        )
    for name in (*POPULATION_FILES, *copies):
        target = path / name
        # read_receipt above re-hashed every file against the receipt: the manifest must bind
        # the same digests (hashing each file once per load).
        digest = receipt.outputs[name].sha256
        if digest != files[name]:
            raise DigestMismatchError(
                f"load_population: {target} has sha256 {digest}; {manifest_path} binds {files[name]}. "
                "HINT: a population is write-once; regenerate it instead of editing it."
            )
    return manifest


def generator_identity(generator: dict) -> str:
    """The SHA-256 of a manifest's generator record without what does not change a scene's
    distribution: the seed, the preset's name and its number of scenes. What remains is what every
    draw of one population distribution shares (environment, its options, source and engine
    versions, the preset's other sizes and actor, the split), however the population was named,
    and however many scenes it drew (scene i of a draw is the same whatever the count).

    Two populations are draws of one distribution when their identities are equal, and draw the
    same scenes when their seeds are equal too. Records made for one study (a pilot's, a tuning's,
    an E0 check's) are compared with the study's populations this way, and no other.

    Args:
        generator: a manifest's ``generator`` record (or ``expected_generator``'s).
    """
    kept = {k: v for k, v in generator.items() if k not in ("seed", "preset")}
    parameters = kept.get("preset_parameters")
    if isinstance(parameters, dict):
        kept["preset_parameters"] = {k: v for k, v in parameters.items() if k not in ("name", "scenes")}
    return sha256_bytes(canonical_json(kept))


# The built-in puck world's generator record has its own layout (the engine's versions at the top,
# no "environment" entry); its rewards are distances.
_PUCK_UNIT = "m"


def reward_unit(generator: dict) -> str:
    """The unit a population's rewards, labels, MAE and regret are in, as its generator record binds it.

    Args:
        generator: a manifest's ``generator`` record.

    Returns:
        The environment's declared ``reward_unit`` ("" where it names none); "m" for the built-in
        puck world, whose record binds the engine that measures in metres.
    """
    environment = generator.get("environment")
    unit = environment.get("reward_unit") if isinstance(environment, dict) else generator.get("reward_unit")
    if isinstance(unit, str):
        return unit
    return _PUCK_UNIT if "pymunk_version" in generator else ""


def environment_words(generator: dict) -> str:
    """The environment a population's generator record binds, with its versions, in words.

    Args:
        generator: a manifest's ``generator`` record.

    Returns:
        e.g. ``"CartPole-v1: version 1, gymnasium 1.4.0, numpy 2.4.6, ..."`` or ``"puck world: pymunk
        7.3.1, chipmunk ..."``.
    """
    environment = generator.get("environment")
    if isinstance(environment, dict):
        identity = environment.get("identity") or {}
        name = identity.get("name", environment.get("factory", "environment"))
        rest = {k: v for k, v in identity.items() if k != "name"}
    else:
        name = "puck world"
        rest = {
            k.removesuffix("_version"): generator[k]
            for k in sorted(generator)
            if k.endswith("_version") and k != "generator_version"
        }
    return f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(rest.items()))
