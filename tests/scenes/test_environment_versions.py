"""A built-in environment's output changes only with a new version.

A cached population is found by its generator record (the environment's identity and version,
the generator version, preset, split and seed). Environment code that draws or steps otherwise
under the same record would leave earlier cache entries under the same key, which the physics
audit then refuses at freeze. Each built-in tiny preset's files are pinned here with the record
that made them: other files under the same versions fail, naming the version to bump, and a
bumped version fails until its new files are pinned. A host with other engine versions (or
another machine architecture) skips, since its floating point may legitimately differ.
"""

from __future__ import annotations

import json
import platform

import pytest

from qhlab.scenes import generate_population

# preset -> (versions: dotted generator-record field -> value, engine: field -> value, files).
_PINS = {
    "tiny": (
        {"generator_version": 2},
        {
            "pymunk_version": "7.3.1",
            "chipmunk_version": "2.0.1-ade7ed72849e60289eefb7a41e79ae6322fefaf3",
            "machine": "x86_64",
        },
        {
            "candidates.parquet": "33fb100fc464c0fbb1d4decf619cda011c09301fed7789dea922e1367150c973",
            "scenes.parquet": "daf47d565b3a7ab29e2a45c4ec3babcbd127e2c196720e5b01c52419e551681d",
            "states.parquet": "b24eb85e92f132c28f1b7a450444170f3c6ac9e66cfed85f1cd691586544cae1",
        },
    ),
    "tanks-tiny": (
        {"generator_version": 3, "environment.identity.version": "1"},
        {"environment.identity.numpy": "2.4.6", "machine": "x86_64"},
        {
            "candidates.parquet": "52cbe3bd4de345f4f3567177c2aa99c2bce1b3738d0045c3b22c0c90e101e9bd",
            "scenes.parquet": "5a97f43a4214bfe8b760cb03b1fa71100ed67f5b687ca792ea62b210ea9ee6e5",
            "states.parquet": "d476ef168e3194e95a989262f726c4ddb798f9ae34710bd618bbe919c4ddabb8",
        },
    ),
}


def _at(record: dict, dotted: str) -> object:
    if dotted == "machine":
        return platform.machine()
    for key in dotted.split("."):
        record = record[key]
    return record


@pytest.mark.parametrize("preset", sorted(_PINS))
def test_a_built_in_environment_changes_its_output_only_with_a_new_version(tmp_path, preset) -> None:
    versions, engine, files = _PINS[preset]
    manifest = json.loads(
        (generate_population(preset, "train", 7, tmp_path / preset, workers=1) / "manifest.json").read_text()
    )
    record = manifest["generator"]
    here = {field: _at(record, field) for field in engine}
    if here != engine:
        pytest.skip(f"{preset}'s files are pinned under {engine}; this host has {here}")
    now = {field: _at(record, field) for field in versions}
    if now != versions:
        pytest.fail(f"{preset}: versions {now} (pinned {versions}): pin their files, {manifest['files']}")
    assert manifest["files"] == files, (
        f"{preset}: the environment's output changed under the same versions {versions}; bump the "
        "environment's version (its identity) or the generator version, then pin the new files"
    )
