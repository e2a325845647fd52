"""The receipt envelope and the registry of receipt kinds.

Owns: ``Receipt`` (the envelope every kind shares: kind, schema version, producer, body, bound
files, its own digest), ``BoundFile`` and ``CreatedBy``, the closed-model base every body uses,
and the registry (a kind is registered when its model is defined; ``receipt_model``,
``receipt_kinds``). Does not own: the kinds themselves (``records`` and ``preparation_records``,
which ``records`` imports so that every reader knows every kind) nor authentication
(``receipts``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from qhlab.evidence.errors import SchemaMismatchError

__all__ = ["BoundFile", "CreatedBy", "Receipt", "receipt_kinds", "receipt_model"]

_SHA256 = r"^[0-9a-f]{64}$"
_Json = dict[str, Any]


class _Closed(BaseModel):
    """A closed, strict, immutable JSON object."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BoundFile(_Closed):
    """One file a receipt binds.

    Attributes:
        path: relative to the receipt's directory, or absolute (POSIX).
        sha256: hex SHA-256 of the file's exact bytes.
    """

    path: str = Field(min_length=1)
    sha256: str = Field(pattern=_SHA256)


class CreatedBy(_Closed):
    """Which package wrote a receipt.

    Attributes:
        package: always ``"qhlab"``.
        version: the package version that wrote it.
    """

    package: Literal["qhlab"]
    version: str


_MODELS: dict[str, type["Receipt"]] = {}


class Receipt(_Closed):
    """The envelope every receipt shares; each kind is a subclass with its own ``body`` model.

    A subclass declares ``kind: Literal["..."] = "..."`` and ``schema_version: Literal[N] = N``
    and is registered by its kind when the class is made.

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
    content_sha256: str = Field(pattern=_SHA256)

    KIND: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 0

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        kind = cls.model_fields["kind"].default
        version = cls.model_fields["schema_version"].default
        if not isinstance(kind, str) or not isinstance(version, int):
            raise TypeError(f"{cls.__name__}: a receipt kind declares kind and schema_version defaults.")
        if kind in _MODELS and _MODELS[kind].__qualname__ != cls.__qualname__:
            raise TypeError(f"{cls.__name__}: kind {kind!r} is already {_MODELS[kind].__name__}.")
        cls.KIND, cls.SCHEMA_VERSION = kind, version
        _MODELS[kind] = cls

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
    """The model of a registered kind.

    Raises:
        SchemaMismatchError: ``kind`` is not a registered kind (names the allowed ones).
    """
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise SchemaMismatchError(f"kind={kind!r} is not a receipt kind; allowed: {', '.join(receipt_kinds())}.")
    return model


def receipt_kinds() -> list[str]:
    """Every registered kind, sorted."""
    return sorted(_MODELS)
