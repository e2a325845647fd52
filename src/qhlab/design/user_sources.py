"""A study design's user sources as they are now in the user's files: read and digested, never imported.

Owns: each user arm's source read from its builder (``user_sources``) and its digest
(``user_source_digests``: what a pilot binds and a freeze compares), the user arms a freeze body
recorded (``family_sources``), what changed in the user's arm, environment and preset files since
a freeze (``source_changes``, ``environment_source_change``, ``preset_file_changes``, said by
``qhlab study run`` and ``status`` and refused by a replication), and a preset file as a freeze
binds it (``preset_file_record``). Does not own: the frozen copies or the arm contract
(``qhlab.study.family``), or parsing, digesting and importing sources
(``qhlab.execution.user_code``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qhlab.design.study_records import StudyFreezeBody
from qhlab.evidence import QhInputError, sha256_bytes
from qhlab.execution.user_code import LocatedSource, file_digests, read_source, source_digest, source_files
from qhlab.scenes.presets import load_preset

__all__ = [
    "arm_refusal",
    "environment_source_change",
    "family_sources",
    "preset_file_changes",
    "preset_file_record",
    "source_changes",
    "user_source_digests",
    "user_sources",
]

_CALL = "freeze_study"


def arm_refusal(arm: str, builder: str | None, cause: str, hint: str) -> QhInputError:
    what = f"arm {arm!r}" + (f" (builder {builder!r})" if builder else "")
    return QhInputError(f"{_CALL}: {what}: {cause}. HINT: {hint}")


def user_sources(config: Any, config_dir: Path) -> Iterator[tuple[str, str, LocatedSource, dict[str, bytes]]]:
    """(arm, builder, where its source is, its bytes) of each user arm, read from the user's files.

    Raises:
        QhInputError: a builder whose source is missing (one line naming the arm).
    """
    for arm in config.arms:
        builder = config.builder(arm)
        if builder is None:
            continue
        try:
            located, files = read_source(builder, config_dir)
        except (ValueError, OSError) as exc:
            raise arm_refusal(
                arm,
                builder,
                str(exc),
                'a builder names a file beside the config ("arms.py:build") or an importable "package.module:build"',
            ) from None
        yield arm, builder, located, files


def user_source_digests(config: Any, config_dir: Path) -> dict[str, str]:
    """``{arm: sha256}`` of each user arm's source as it is now in the user's files (read, never
    imported): what a pilot binds, and what a freeze compares a pilot with.

    Raises:
        QhInputError: a builder whose source is missing (one line naming the arm).
    """
    return {arm: source_digest(file_digests(files)) for arm, _, _, files in user_sources(config, config_dir)}


def family_sources(body: StudyFreezeBody) -> dict[str, dict]:
    """``{arm: source record}`` of a freeze receipt body's user arms."""
    return {a["arm"]: a["source"] for a in body.arms if a.get("source")}


def source_changes(body: StudyFreezeBody) -> dict[str, str]:
    """``{arm: what}`` for each user arm whose original source differs from its frozen copy."""
    changes = {}
    for arm, record in family_sources(body).items():
        original = Path(record["original"])
        try:
            now = source_digest(file_digests(source_files(original)))
        except (OSError, ValueError):
            changes[arm] = f"source {original} is gone since freeze; the frozen copy is used"
            continue
        if now != record["sha256"]:
            changes[arm] = f"source {original} changed since freeze; the frozen copy is used"
    return changes


def environment_source_change(record: dict | None) -> str | None:
    """What changed in a user environment's own source since the freeze (None: nothing, or built in).

    The user's files are only compared, never imported: every step imports the copy frozen in
    the population.
    """
    if not record or not record.get("original"):
        return None
    original = Path(record["original"])
    try:
        now = source_digest(file_digests(source_files(original)))
    except (OSError, ValueError):
        return f"source {original} is gone since freeze; the frozen copy in the population is used"
    if now != record["sha256"]:
        return f"source {original} changed since freeze; the frozen copy in the population is used"
    return None


def preset_file_changes(body: Any) -> list[str]:
    """What changed in the study's preset files since the freeze, in words (empty: nothing).

    The files are only compared: TRAIN is the population the freeze resolved, and the validation
    is drawn from the preset the freeze recorded, whatever the file says now.
    """
    changes = []
    for role, entry in (("train", body.train), ("validation", body.validation)):
        record = entry.get("preset_file")
        if not record:
            continue
        path = Path(record["path"])
        try:
            now = sha256_bytes(path.read_bytes())
        except OSError:
            changes.append(f"{role} preset file {path} is gone since freeze; the study keeps the preset it froze")
            continue
        if now != record["sha256"]:
            changes.append(f"{role} preset file {path} changed since freeze; the study keeps the preset it froze")
    return changes


def preset_file_record(source: Any) -> dict | None:
    """A declared population's preset file as the freeze binds it: ``{"path", "sha256"}`` (None: a
    built-in preset or a population directory)."""
    preset = getattr(source, "preset", None)
    if not isinstance(preset, str) or not preset.endswith(".toml"):
        return None
    path = Path(load_preset(preset, call="freeze_study").path).resolve()
    return {"path": str(path), "sha256": sha256_bytes(path.read_bytes())}
