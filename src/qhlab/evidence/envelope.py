"""The receipt envelope and the one registry of record kinds.

Owns: ``Receipt`` (the envelope every kind shares: kind, schema version, producer, body, bound
files, its own digest), ``BoundFile`` and ``CreatedBy``, the closed-model base every body uses
(``Closed``), and the registry: a kind is registered when its model is defined (``receipt_model``,
``receipt_kinds``), and a record's recomputation when its owner calls ``register_check``
(``record_checks``, which ``qhlab verify`` loops over). Every kind lives beside the code that
owns it, in a module named ``records`` or ``*_record`` below ``qhlab``; ``load_kinds`` imports
them all, so a reader of any receipt knows every kind. Adding a kind is one such module (and
its test). Does not own: the kinds themselves nor authentication (``receipts``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

import qhlab
from qhlab.evidence.errors import SchemaMismatchError

__all__ = [
    "SHA256",
    "BoundFile",
    "Closed",
    "CreatedBy",
    "Json",
    "Receipt",
    "RecordCheck",
    "load_kinds",
    "receipt_kinds",
    "receipt_model",
    "record_checks",
    "register_check",
]

# A hex SHA-256, as every digest field holds it.
SHA256 = r"^[0-9a-f]{64}$"
# A JSON object whose layout its own step checks (nested structures of a body).
Json = dict[str, Any]


class Closed(BaseModel):
    """A closed, strict, immutable JSON object."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BoundFile(Closed):
    """One file a receipt binds.

    Attributes:
        path: relative to the receipt's directory, or absolute (POSIX).
        sha256: hex SHA-256 of the file's exact bytes.
    """

    path: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256)


class CreatedBy(Closed):
    """Which package wrote a receipt.

    Attributes:
        package: always ``"qhlab"``.
        version: the package version that wrote it.
    """

    package: Literal["qhlab"]
    version: str


_MODELS: dict[str, type[Receipt]] = {}


class Receipt(Closed):
    """The envelope every receipt shares; each kind is a subclass with its own ``body`` model.

    A kind is one subclass, ``class FitReceipt(Receipt, kind="fit", version=1)`` with its ``body``
    model, registered by its kind when the class is made. ``read_receipt`` checks a file's kind
    and schema version against the class it names.

    Attributes:
        schema_version: the layout version of this kind's body.
        kind: which step wrote the receipt.
        created_by: the package that wrote it.
        body: the step's facts.
        inputs: files the step read, by name.
        outputs: files the step published, by name.
        content_sha256: SHA-256 of the canonical JSON of every other field.
    """

    schema_version: int
    kind: str
    created_by: CreatedBy
    body: BaseModel
    inputs: dict[str, BoundFile]
    outputs: dict[str, BoundFile]
    content_sha256: str = Field(pattern=SHA256)

    KIND: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 0

    def __init_subclass__(cls, kind: str | None = None, version: int = 1, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

    @classmethod
    def __pydantic_init_subclass__(cls, kind: str | None = None, version: int = 1, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not isinstance(kind, str) or not kind or isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"{cls.__name__}: a receipt kind is declared as class X(Receipt, kind=..., version=N).")
        if kind in _MODELS and _MODELS[kind].__qualname__ != cls.__qualname__:
            raise TypeError(f"{cls.__name__}: kind {kind!r} is already {_MODELS[kind].__name__}.")
        cls.KIND, cls.SCHEMA_VERSION = kind, version
        _MODELS[kind] = cls

    def check_place(self, path: Path) -> None:
        """Refuse a receipt found where its body says it does not belong (``read_receipt`` calls
        this for every receipt it reads, so verify, status and every step agree).

        A kind whose body names its own place (a study cell) overrides this; others have none.

        Raises:
            EvidenceError: the receipt is not where its body places it.
        """

    @classmethod
    def body_model(cls) -> type[BaseModel]:
        """The body's model of this kind."""
        return cls.model_fields["body"].annotation

    def record(self) -> dict[str, Any]:
        """The whole receipt as the JSON object the file holds (a field the file leaves out stays out)."""
        return self.model_dump(exclude_unset=True)

    def body_record(self) -> dict[str, Any]:
        """The body as the JSON object the file holds (a field the file leaves out stays out), for
        the pure functions that compute over records (the report, a lane comparison)."""
        return self.body.model_dump(exclude_unset=True)


def receipt_model(kind: Any) -> type[Receipt]:
    """The model of a registered kind (every kind's module is imported first: ``load_kinds``).

    Raises:
        SchemaMismatchError: ``kind`` is not a registered kind (names the allowed ones).
    """
    if not isinstance(kind, str) or kind not in _MODELS:
        load_kinds()
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise SchemaMismatchError(f"kind={kind!r} is not a receipt kind; allowed: {', '.join(receipt_kinds())}.")
    return model


def receipt_kinds() -> list[str]:
    """Every registered kind, sorted (after ``load_kinds``)."""
    load_kinds()
    return sorted(_MODELS)


@dataclass(frozen=True)
class RecordCheck:
    """What ``qhlab verify`` recomputes for one kind, beyond the digests every receipt gets.

    Attributes:
        kind: the receipt kind it applies to.
        file: the receipt's file name (the record's directory is the receipt's).
        check: ``check(directory) -> summary``: recomputes every claim of the record from what
            it binds and raises an ``EvidenceError`` at the first that does not hold.
        describe: ``describe(directory, summary) -> line``: verify's line for a passed check.
    """

    kind: str
    file: str
    check: Callable[[Path], dict]
    describe: Callable[[Path, dict], str]


_CHECKS: dict[str, RecordCheck] = {}


def register_check(
    receipt: type[Receipt], *, file: str, check: Callable[[Path], dict], describe: Callable[[Path, dict], str]
) -> RecordCheck:
    """Register the recomputation ``qhlab verify`` runs on every receipt of ``receipt``'s kind.

    Raises:
        TypeError: ``receipt`` is not a registered kind, or its kind has a check already.
    """
    kind = receipt.KIND
    if _MODELS.get(kind) is not receipt:
        raise TypeError(f"register_check: {receipt!r} is not a registered receipt kind.")
    if kind in _CHECKS and _CHECKS[kind].check is not check:
        raise TypeError(f"register_check: kind {kind!r} has a check already ({_CHECKS[kind].check.__qualname__}).")
    _CHECKS[kind] = RecordCheck(kind=kind, file=file, check=check, describe=describe)
    return _CHECKS[kind]


def record_checks() -> dict[str, RecordCheck]:
    """Every registered record check by kind (after ``load_kinds``)."""
    load_kinds()
    return dict(sorted(_CHECKS.items()))


_LOADED: list[str] = []


def load_kinds() -> list[str]:
    """Import every module of ``qhlab`` that defines record kinds: each module named ``records``
    or ending in ``_record`` or ``_records``. Packages are walked without importing anything but
    their ``__init__`` (each is light); done once per process.

    Returns:
        The modules imported.
    """
    if not _LOADED:
        for info in pkgutil.walk_packages(qhlab.__path__, prefix="qhlab."):
            leaf = info.name.rsplit(".", 1)[-1]
            if not info.ispkg and (leaf == "records" or leaf.endswith(("_record", "_records"))):
                importlib.import_module(info.name)
                _LOADED.append(info.name)
    return list(_LOADED)
