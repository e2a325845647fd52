"""What every preparation record shares: its parts' models and reading it against its model.

Owns: the models of the parts the three records (``tuning.json``, ``pilot.json``, ``e0.json``)
have in common (``PopulationIdentity``: a population as a record names it, by path, manifest
digest and the content digest of every scene; ``FitEvidence``: the digests of one fit's state
and receipts; ``StudyReference``; ``MetricPair``); ``ToolRecordFiles``, how a tool publishes
its record and receipt; and ``read_record_file``, which authenticates a record's receipt and
validates the record's JSON against its model, so that a reshaped record is one clear refusal
(exit 2) naming the field, never a traceback. Torch-free. Does not own:
any one record's layout or checks (``tuning_record``, ``pilot_record``, ``e0_record``).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from qhlab.evidence import (
    DigestMismatchError,
    MissingEvidenceError,
    SchemaMismatchError,
    differing_keys,
    input_error,
    publish_json,
    read_receipt,
    sha256_file,
    write_receipt,
)
from qhlab.evidence.envelope import SHA256, Closed, Receipt
from qhlab.evidence.layout import (
    E0_CHECK_RECEIPT,
    E0_CHECK_RECORD,
    EVALUATION_RECEIPT,
    FIT_RECEIPT,
    PILOT_RECEIPT,
    PILOT_RECORD,
    PLAN_RECEIPT,
    PLAN_RECORD,
    RECORD_CONFIG_COPY,
    TUNING_RECEIPT,
    TUNING_RECORD,
)
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.training.records import FitBody, FitReceipt

__all__ = [
    "BACKEND_FIELDS",
    "FitEvidence",
    "MetricPair",
    "PopulationIdentity",
    "StudyReference",
    "ToolBody",
    "ToolRecordFiles",
    "absent_note",
    "check_config_copy",
    "checked_config",
    "close_values",
    "opened_record",
    "read_record_file",
    "recipe_differences",
    "record_path",
    "record_writer",
    "recorded_fit",
]

R = TypeVar("R", bound=Receipt)
C = TypeVar("C", bound=BaseModel)
# A finite number read from JSON (strict: an integer is a number; a boolean or a string is not).
Number = Annotated[float, Field(allow_inf_nan=False)]


class ToolBody(Closed):
    """What every preparation tool's receipt body opens with (``ToolRecordFiles.publish`` writes it).

    Attributes:
        name: the tool run's name (its config's ``name``).
        config_sha256: the digest of its config's identity and the design it served.
    """

    name: str
    config_sha256: str = Field(pattern=SHA256)


class PopulationIdentity(Closed):
    """A population as a record names it.

    Attributes:
        path: where it was read. manifest_sha256: its manifest's digest. preset, split, seed: what
        its generator recorded (None for a population named by path). generator_sha256: its
        generator's identity (``qhlab.scenes.manifest.generator_identity``; None in a record made
        before records held it, which no study binds). scene_digests: the sorted content digest of
        every scene (held-out hygiene compares them, not paths).
    """

    path: str
    manifest_sha256: str = Field(pattern=SHA256)
    preset: str | None
    split: str | None
    seed: int | None
    generator_sha256: Annotated[str, Field(pattern=SHA256)] | None = None
    scene_digests: list[Annotated[str, Field(pattern=SHA256)]]


class FitEvidence(Closed):
    """One fit as a record keeps it: where it is and the digests of what it made.

    Attributes:
        directory: the attempt directory, relative to the record's directory.
        final_state_sha256, fit_receipt_sha256, evaluation_receipt_sha256: its digests.
        observed_updates: optimizer updates it made. wall_seconds: how long it took.
        adopted: whether an interrupted run's finished fit was adopted rather than fitted again.
    """

    directory: str
    final_state_sha256: str = Field(pattern=SHA256)
    fit_receipt_sha256: str = Field(pattern=SHA256)
    evaluation_receipt_sha256: str = Field(pattern=SHA256)
    observed_updates: int
    wall_seconds: Number
    adopted: bool | None = None


class StudyReference(Closed):
    """The study a record serves: its name and the config's path when the record was made."""

    name: str
    path: str


class MetricPair(Closed):
    """One value per metric at H: ``regret`` and ``mae`` (the reward's unit, or degrees of freedom)."""

    regret: Number
    mae: Number


def read_record_file(
    directory: str | os.PathLike,
    record_name: str,
    receipt_name: str,
    receipt: type[R],
    model: type[BaseModel],
    summary: Callable[[dict], dict[str, Any]] | None = None,
) -> tuple[dict, R]:
    """A preparation record, authenticated by its receipt and validated against its model.

    Args:
        directory: the record's directory.
        record_name, receipt_name: the record's and its receipt's file names.
        receipt: the receipt's kind.
        model: the record's model.
        summary: what the receipt's body says of the record, from the record: ``{body field:
            value}``; each must equal the body's (None: the body summarises nothing).

    Returns:
        (the record as its JSON holds it, once its model accepted it; the receipt).

    Raises:
        MissingEvidenceError: no receipt.
        EvidenceError: the receipt or a file it binds fails.
        SchemaMismatchError: the record is not JSON, or not in its model's layout (one line naming
            the file, the field and the value).
        DigestMismatchError: the receipt's body summarises another record (``summary``).
    """
    directory = Path(directory)
    document = read_receipt(directory / receipt_name, receipt)
    path = directory / record_name
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaMismatchError(f"qhlab verify: {path} is not a readable JSON record ({exc}).") from None
    try:
        model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or "(the record)"
        value = repr(error.get("input"))[:80]
        raise SchemaMismatchError(
            f"qhlab verify: {path} field {field}={value} is not allowed; allowed: "
            f"{error['msg']} (the layout of a {model.__name__})."
        ) from None
    expected = {} if summary is None else summary(raw)
    differing = sorted(k for k, v in expected.items() if getattr(document.body, k) != v)
    if differing:
        raise DigestMismatchError(
            f"qhlab verify: {directory / receipt_name} and its {record_name} disagree on {', '.join(differing)}."
        )
    return raw, document


@dataclass(frozen=True)
class _RecordKind:
    """One preparation record: its file, its receipt's, its ``kind`` field, in words, and its command."""

    name: str
    receipt: str
    kind: str
    words: str
    command: str


_RECORD_KINDS = {
    "tuning": _RecordKind(TUNING_RECORD, TUNING_RECEIPT, "tuning_record", "a tuning record", "qhlab tune"),
    "pilot": _RecordKind(PILOT_RECORD, PILOT_RECEIPT, "pilot_record", "a pilot record", "qhlab pilot"),
    "e0": _RecordKind(E0_CHECK_RECORD, E0_CHECK_RECEIPT, "e0_record", "an E0 check record", "qhlab e0-check"),
    "plan": _RecordKind(PLAN_RECORD, PLAN_RECEIPT, "plan_record", "a plan record", "qhlab plan"),
}


def record_path(call: str, field: str, value: str | os.PathLike, kind: str) -> Path:
    """The path of the ``kind`` record a field names, or one refusal that says what to name instead.

    Args:
        call: the command refusing.
        field: the field naming the record (``"preparation.pilot"``, ``"pilot"``).
        value: the path it names.
        kind: the record expected: ``"tuning"``, ``"pilot"``, ``"e0"`` or ``"plan"``.

    Returns:
        The path, once it names an existing file of the record's name (its reader authenticates it).

    Raises:
        QhInputError: a directory, another file (saying which record it is when it is one, by its
            name or its ``kind`` field), or no file there; each hint names the file to name.
    """
    expected = _RECORD_KINDS[kind]
    path = Path(value)
    allowed = f"the path of {expected.words} ({expected.name})"
    wanted = f"the {expected.name} that `{expected.command} CONFIG --output DIR` wrote (DIR/{expected.name})"
    if path.is_dir():
        inside = path / expected.name
        hint = (
            f"it is a directory; name the {expected.name} in it: {inside}"
            if inside.is_file()
            else f"it is a directory holding no {expected.name}; name {wanted}"
        )
        raise input_error(call, field, str(value), allowed, hint)
    found = _kind_of(path)
    if path.name != expected.name or (found is not None and found is not expected):
        verb = "is" if path.is_file() else "names"
        if found is not None and found is not expected:
            what = f"it {verb} {found.words} ({found.name}, what `{found.command}` writes), not {expected.words}"
        elif found is expected:
            what = (
                f"it holds {expected.words} but is named {path.name!r}; a record is read from its directory as "
                f"{expected.name}"
            )
        elif any(path.name == k.receipt for k in _RECORD_KINDS.values()):
            owner = next(k for k in _RECORD_KINDS.values() if k.receipt == path.name)
            what = f"it {verb} the receipt of {owner.words}, not {expected.words}"
        else:
            what = f"it is not {expected.words}, whose file is named {expected.name}"
        raise input_error(call, field, str(value), allowed, f"{what}; name {wanted}")
    if not path.is_file():
        raise input_error(
            call,
            field,
            str(value),
            f"an existing {expected.name} ({expected.words})",
            f"no file is there; run `{expected.command} CONFIG --output DIR` and name DIR/{expected.name}",
        )
    return path


def record_writer(name: str) -> str | None:
    """The command that writes a preparation record of file name ``name`` (``"pilot.json"``:
    ``"qhlab pilot"``), or None for any other name."""
    return next((k.command for k in _RECORD_KINDS.values() if k.name == name), None)


def _kind_of(path: Path) -> _RecordKind | None:
    """The preparation record a file is, by its name, else by its JSON's ``kind`` (None: neither says)."""
    by_name = next((k for k in _RECORD_KINDS.values() if k.name == path.name), None)
    if not path.is_file() or path.suffix != ".json":
        return by_name
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return by_name  # its reader refuses it, naming the file
    declared = document.get("kind") if isinstance(document, dict) else None
    return next((k for k in _RECORD_KINDS.values() if k.kind == declared), by_name)


# Where files lay when the tool ran: resolved in the record, as written in the copy; populations
# are bound by their manifests' digests instead.
_PATH_FIELDS = ("study", "recipe", "population_cache", "pilot", "tuning")


def _comparable(config: dict) -> dict:
    out = {k: v for k, v in config.items() if k not in _PATH_FIELDS}
    if isinstance(out.get("objective"), dict):
        # An "mde" objective's study, a path: its design is what the record binds.
        out["objective"] = {k: v for k, v in out["objective"].items() if k != "study"}
    for role in ("train", "validation"):
        source = out.get(role)
        if isinstance(source, dict):
            out[role] = {
                k: v for k, v in source.items() if k != "path" and not (k == "preset" and str(v).endswith(".toml"))
            }
    return out


def check_config_copy(
    directory: Path, config: dict, model: type[BaseModel], where: str, prepare: Callable[[Any], Any] = lambda raw: raw
) -> None:
    """The record's config is the one its bound ``config.toml`` says, field by field (paths aside).

    A record whose config was edited and resealed, while the copy it binds was not, claims a
    config that never ran.

    Args:
        directory: the record's directory (its ``config.toml`` is the tool's input, bound by the receipt).
        config: the record's ``config``.
        model: the config's model (its ``record()`` is what the record keeps).
        where: the record, for messages.
        prepare: turns the TOML document into the model's input (the tuning's ``[space]`` tables).

    Raises:
        DigestMismatchError: the copy is not a valid config, or a field differs (naming it).
    """
    path = directory / RECORD_CONFIG_COPY
    try:
        copy = model.model_validate(prepare(tomllib.loads(path.read_text(encoding="utf-8")))).record()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValidationError, ValueError) as exc:
        raise DigestMismatchError(f"{where}: its bound {path.name} is not a valid {model.__name__} ({exc}).") from None
    ours, theirs = _comparable(config), _comparable(copy)
    differing = differing_keys(ours, theirs)
    if differing:
        raise DigestMismatchError(
            f"{where}: its config differs from its bound {path.name} in {', '.join(differing)} "
            f"({', '.join(f'{k}={ours.get(k)!r} vs {theirs.get(k)!r}' for k in differing[:3])}). HINT: a record "
            "states the config that ran; rerun the tool instead of editing its record."
        )


def checked_config(record: dict, receipt: Any, model: type[C], digest: Callable[[C, dict], str], where: str) -> C:
    """A record's config, validated again, whose digest with the record's design is the one both
    the record and its receipt name.

    Args:
        record: the record (its ``config``, ``design`` and ``config_sha256``).
        receipt: the receipt's body (its ``config_sha256``).
        model: the config's model.
        digest: ``digest(config, design)``, the tool's digest of what its record depends on.
        where: the record, for messages.

    Raises:
        DigestMismatchError: the config is not valid, or a digest differs.
    """
    try:
        config = model.model_validate(record["config"])
    except ValidationError as exc:
        raise DigestMismatchError(
            f"{where}: its config is not a valid {model.__name__} ({exc.errors()[0]['msg']})."
        ) from None
    recomputed = digest(config, record["design"])
    if not record["config_sha256"] == receipt.config_sha256 == recomputed:
        raise DigestMismatchError(
            f"{where}: the config and design digest to {recomputed}, not the recorded "
            f"{record['config_sha256']} (receipt: {receipt.config_sha256})."
        )
    return config


def opened_record(
    directory: str | os.PathLike,
    read_record: Callable[[Path], dict],
    receipt: tuple[type[Receipt], str],
    record_file: str,
    model: type[C],
    digest: Callable[[C, dict], str],
) -> tuple[dict, Any, str, C]:
    """What every record check starts from: the record, read and authenticated, with its config
    validated again and digested with its design (``checked_config``) and its config copy
    compared (``check_config_copy``).

    Args:
        directory: the record's directory.
        read_record: the tool's reader (authenticates and validates the record).
        receipt: (the receipt's kind, its file name).
        record_file: the record's file name (for messages).
        model, digest: the config's model and the tool's digest of config and design.

    Returns:
        (the record, its receipt's body, the record's name for messages, the config).
    """
    directory = Path(directory)
    record = read_record(directory)
    body = read_receipt(directory / receipt[1], receipt[0]).body
    where = f"qhlab verify: {directory / record_file}"
    config = checked_config(record, body, model, digest, where)
    check_config_copy(directory, record["config"], model, where)
    return record, body, where, config


# A fit receipt's recipe holds the lane's backend fields too; a record's recipes do not.
BACKEND_FIELDS = ("accelerator", "devices", "precision")


def recorded_fit(where: str, attempt: Path, fit: dict, label: str) -> tuple[FitReceipt, EvaluationReceipt]:
    """A present fit's fit and evaluation receipts, each refused unless it is the one
    the record binds (``fit["fit_receipt_sha256"]``, ``fit["evaluation_receipt_sha256"]``).

    Args:
        where: the record, for messages.
        attempt: the fit's directory.
        fit: the record's entry of the fit.
        label: the fit, for messages (e.g. ``"trial 3 fit fits/t0002-s2"``).

    Returns:
        (its ``FitReceipt``, its ``EvaluationReceipt``), both authenticated.

    Raises:
        MissingEvidenceError: a receipt is absent.
        DigestMismatchError: a receipt is not the one the record binds.
    """
    for name, key in ((FIT_RECEIPT, "fit_receipt_sha256"), (EVALUATION_RECEIPT, "evaluation_receipt_sha256")):
        if not (attempt / name).is_file():
            raise MissingEvidenceError(f"{where}: {label} has no {name}.")
        if sha256_file(attempt / name) != fit[key]:
            raise DigestMismatchError(f"{where}: {label}/{name} is not the one recorded.")
    fitted = read_receipt(attempt / FIT_RECEIPT, FitReceipt)
    return fitted, read_receipt(attempt / EVALUATION_RECEIPT, EvaluationReceipt)


def recipe_differences(recipe: dict, fitted: FitBody) -> list[str]:
    """The fields of ``recipe`` that the fit's receipt gives otherwise, the lane's backend fields aside."""
    return sorted(k for k in recipe if k not in BACKEND_FIELDS and fitted.recipe.get(k) != recipe[k])


@dataclass(frozen=True)
class ToolRecordFiles:
    """A preparation tool's record and its receipt: how the tool publishes them, how anyone reads them.

    The receipt is published last (its presence marks a finished run). It binds the record, the
    config's copy and ``also``, and its body holds the record's name and config digest with
    ``summary(record)``, which reading checks against the record again.

    Attributes:
        record: the record's file name. receipt: its receipt's file name.
        receipt_kind: the receipt's model. model: the record's model.
        summary: what the receipt's body says of the record, from the record: ``{body field: value}``.
        also: further files the tool publishes in its directory before the receipt, ``{output
            name: file name}`` (a rendering of the record), bound by the receipt too.
    """

    record: str
    receipt: str
    receipt_kind: type[Receipt]
    model: type[BaseModel]
    summary: Callable[[dict], dict[str, Any]]
    also: tuple[tuple[str, str], ...] = ()

    def publish(self, directory: Path, record: dict) -> None:
        """Publish ``record`` in ``directory``, then the receipt binding it, the config's copy and ``also``."""
        publish_json(directory / self.record, record)
        write_receipt(
            directory / self.receipt,
            self.receipt_kind,
            body={"name": record["name"], "config_sha256": record["config_sha256"], **self.summary(record)},
            inputs={"config": directory / RECORD_CONFIG_COPY},
            outputs={"record": directory / self.record, **{k: directory / v for k, v in self.also}},
        )

    def read_record(self, directory: str | os.PathLike) -> dict:
        """The record in ``directory``, authenticated by its receipt (and the files it binds) and
        validated against its model.

        Raises:
            MissingEvidenceError: no receipt.
            EvidenceError: the receipt or a bound file fails, the record is not in its model's
                layout, or the receipt's body summarises another record.
        """
        return read_record_file(directory, self.record, self.receipt, self.receipt_kind, self.model, self.summary)[0]


def absent_note(count: int, what: str) -> str:
    """``qhlab verify``'s note on a record's parts whose directories are absent ("" when none is):
    their recorded values stood in for recomputed ones."""
    return f", {count} {what} absent (their recorded values were used)" if count else ""


def close_values(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal, floats within 1e-9 relative: a value recomputed from a
    record's fits may differ from the recorded one in the last bits where numpy's reductions take
    another order on another CPU; an edited value differs by far more."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close_values(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close_values(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b and type(a) is type(b)
