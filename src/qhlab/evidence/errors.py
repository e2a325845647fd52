"""The error types every qhlab layer raises, and the exit code each maps to.

Owns: the exception hierarchy and exit codes. Does not own: message wording (callers name
the field, the value, what is allowed and a HINT) or printing (``qhlab.cli``).
"""

from __future__ import annotations

__all__ = [
    "QhError",
    "QhInputError",
    "EvidenceError",
    "DigestMismatchError",
    "SchemaMismatchError",
    "MissingEvidenceError",
    "PublishConflictError",
    "OrderError",
    "LockHeldError",
]


class QhError(Exception):
    """A runtime failure: a gate failed, a fit diverged. Exit status 1."""

    exit_code = 1


class QhInputError(QhError, ValueError):
    """Bad usage, config, recipe or data. Exit status 2; nothing is written."""

    exit_code = 2


class EvidenceError(QhInputError):
    """An artifact or receipt failed authentication; the message names the file."""


class DigestMismatchError(EvidenceError):
    """The SHA-256 of a file's bytes differs from the digest a receipt binds."""


class SchemaMismatchError(EvidenceError):
    """A receipt or manifest has another schema version or kind than expected."""


class MissingEvidenceError(EvidenceError):
    """A file that a receipt or a step requires does not exist."""


class PublishConflictError(QhInputError):
    """A write-once target already exists."""


class OrderError(QhInputError):
    """A step was asked to run before the steps it depends on."""


class LockHeldError(QhError):
    """Another process holds the writer lock. Exit status 3; names the lock file."""

    exit_code = 3
