"""Seals in a population cache: which study holds a population out as its validation.

Owns: the seal files a study writes into its population cache when it seals its validation
population (``mark_sealed``), and finding them (``seals_of``), so that ``qhlab tune`` refuses
to tune on that population and ``qhlab fit`` warns before scoring on it. A seal is a small
write-once JSON file under ``<cache>/.sealed-validations/<manifest sha256>/``, beside the
cached populations and never inside one, so a population's own files and digests are
untouched. Does not own: the study's development step that seals (``qhlab.finite_horizon``)
or the cache's populations (``population``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qhlab.evidence import PublishConflictError, publish_json, safe_component, sha256_file
from qhlab.evidence.receipts import DEFAULT_POPULATION_ROOT

__all__ = ["SEALS_DIR", "mark_sealed", "seals_of"]

SEALS_DIR = ".sealed-validations"


def mark_sealed(
    cache: str | os.PathLike, manifest_sha256: str, *, study: str, freeze_receipt_sha256: str, path: str | os.PathLike
) -> Path:
    """Record in ``cache`` that ``study`` sealed the population ``manifest_sha256`` as its validation.

    Idempotent: a study that seals again (a resumed run) finds its seal in place.

    Returns:
        The seal file.
    """
    directory = Path(cache).expanduser() / SEALS_DIR / manifest_sha256
    directory.mkdir(parents=True, exist_ok=True)
    name = safe_component(f"{study}-{freeze_receipt_sha256[:16]}.json", field="study", call="mark_sealed")
    seal = directory / name
    try:
        publish_json(
            seal,
            {
                "study": study,
                "freeze_receipt_sha256": freeze_receipt_sha256,
                "manifest_sha256": manifest_sha256,
                "path": str(Path(path).absolute()),
            },
        )
    except PublishConflictError:
        pass
    return seal


def seals_of(population: str | os.PathLike, caches: tuple[str | os.PathLike, ...] = ()) -> list[dict]:
    """The seals of a population directory in ``caches``, the default cache and its own parent.

    Args:
        population: a population directory (its ``manifest.json`` digest is its identity).
        caches: further cache directories to look in.

    Returns:
        ``[{"study", "freeze_receipt_sha256", "manifest_sha256", "path"}]``, one per sealing study.
    """
    manifest = Path(population) / "manifest.json"
    if not manifest.is_file():
        return []
    digest = sha256_file(manifest)
    roots = {Path(c).expanduser().absolute() for c in (*caches, DEFAULT_POPULATION_ROOT)}
    roots.add(Path(population).absolute().parent)
    found = []
    for root in sorted(roots):
        directory = root / SEALS_DIR / digest
        if not directory.is_dir():
            continue
        for seal in sorted(directory.glob("*.json")):
            try:
                found.append(json.loads(seal.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                # An unreadable seal still seals: the population was held out by someone.
                found.append(
                    {
                        "study": seal.stem,
                        "freeze_receipt_sha256": None,
                        "manifest_sha256": digest,
                        "path": str(population),
                    }
                )
    return found
