"""The error types every qhlab layer raises, the exit code each maps to, and one message form.

Owns: the exception hierarchy, exit codes, and the one builder of "not allowed" messages
(``input_error``) with the argument checks every layer repeats (``require_instance``, ``require_int``,
``require_number``, ``require_seed`` and ``require_workers`` with their limits). Every refusal reads the same way:
``"<call>: <field>=<value!r> is not allowed; allowed: <...>. HINT: <...>"``.
Does not own: printing (``qhlab.cli``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "MAX_TORCH_THREADS",
    "MAX_WORKERS",
    "POPULATION_SEED_LIMIT",
    "TRAINING_SEED_LIMIT",
    "DigestMismatchError",
    "EvidenceError",
    "LockHeldError",
    "MissingEvidenceError",
    "OrderError",
    "PublishConflictError",
    "QhError",
    "QhInputError",
    "SchemaMismatchError",
    "distinct_seeds",
    "input_error",
    "invalid_fields",
    "require_instance",
    "require_int",
    "require_number",
    "require_seed",
    "require_workers",
    "seed_problem",
    "seed_range",
]

# Every seed that reaches Lightning's seed_everything, numpy's global or legacy seeding (Optuna's
# samplers) is one of [0, 2**32): a larger one fails only once a fit or a sampler starts.
TRAINING_SEED_LIMIT = 2**32
# A population seed is only SeedSequence entropy (qhlab.scenes.sampler), which takes any
# non-negative int; 63 bits keep it a signed 64-bit integer in every file that records it.
POPULATION_SEED_LIMIT = 2**63
# Processes (or Ray tasks) one command runs at once. A pool far beyond the cores only thrashes,
# and an absurd count fails deep inside the pool after populations were drawn.
MAX_WORKERS = 64
# torch intra-op threads of one fit process; torch itself overflows only past a C long.
MAX_TORCH_THREADS = 256


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


def input_error(
    call: str, field: str, value: Any, allowed: str, hint: str, *, error: type[QhInputError] = QhInputError
) -> QhInputError:
    """The one form of a refusal: ``"<call>: <field>=<value!r> is not allowed; allowed: ...; HINT: ..."``.

    Args:
        call: the public call or command refusing (e.g. ``"freeze_study"``).
        field: the field, argument or column (e.g. ``"experiment.arms[0].arm"``).
        value: the offending value (shown with ``repr``).
        allowed: what would be accepted.
        hint: what to do next.
        error: the exception class (``QhInputError`` or an ``EvidenceError`` subclass).

    Returns:
        The exception, for the caller to ``raise``.
    """
    return error(f"{call}: {field}={value!r} is not allowed; allowed: {allowed}. HINT: {hint}")


def invalid_fields(source: str, problems: list[str], hint: str) -> QhInputError:
    """The refusal of a config or file with several bad fields, every one on its own line:
    ``"<source>: N invalid field(s):\n  - <problem>...\nHINT: <hint>"``.

    Args:
        source: the file refusing (e.g. ``"pilot config 'x.toml'"``).
        problems: one line per field, each naming the field, its value and what is allowed.
        hint: what to do next.
    """
    lines = "\n".join(f"  - {p}" for p in problems)
    return QhInputError(f"{source}: {len(problems)} invalid field(s):\n{lines}\nHINT: {hint}")


def require_instance(
    call: str, field: str, value: Any, types: type | tuple[type, ...], *, hint: str, allowed: str | None = None
) -> Any:
    """``value`` when it is an instance of ``types``; else the refusal naming its type.

    Args:
        call, field: the refusing call and its argument.
        value: what was passed.
        types: the accepted class or classes.
        hint: what to do next.
        allowed: what the refusal says is allowed (default: the classes' names, joined by "or").

    Returns:
        ``value`` itself.

    Raises:
        QhInputError: ``value`` is of another type.
    """
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise input_error(call, field, type(value).__name__, allowed or names, hint)
    return value


def require_int(call: str, field: str, value: Any, *, minimum: int | None = None, hint: str) -> int:
    """``value`` as an int, refusing bools, non-integers and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        allowed = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise input_error(call, field, value, allowed, hint)
    return value


def require_number(call: str, field: str, value: Any, *, minimum: float | None = None, hint: str) -> float:
    """``value`` as a finite float, refusing bools, non-numbers, NaN/inf and values below ``minimum``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(float(value))
    if not ok or (minimum is not None and float(value) < minimum):
        allowed = "a finite number" if minimum is None else f"a finite number >= {minimum}"
        raise input_error(call, field, value, allowed, hint)
    return float(value)


def seed_range(limit: int = TRAINING_SEED_LIMIT) -> str:
    """What a seed below ``limit`` is, as a refusal's "allowed:" says it."""
    power = f"2**{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)
    text = f"an integer in [0, {power}), i.e. 0 to {limit - 1}"
    if limit == TRAINING_SEED_LIMIT:
        text += " (Lightning's seed_everything and numpy's seeding take no larger seed)"
    return text


def seed_problem(field: str, value: Any, *, limit: int = TRAINING_SEED_LIMIT) -> str | None:
    """None when ``value`` is a seed below ``limit``; else ``"<field>=<value!r> is not allowed;
    allowed: an integer in [0, 2**32), ..."``, the line a config refusal lists.

    Args:
        field: the field or argument (e.g. ``"seeds[0]"``).
        value: the seed.
        limit: ``TRAINING_SEED_LIMIT`` (a seed that reaches Lightning, torch, numpy or Optuna) or
            ``POPULATION_SEED_LIMIT`` (a population's seed, only qhlab's scene sampler reads it).
    """
    if not isinstance(value, bool) and isinstance(value, int) and 0 <= value < limit:
        return None
    return f"{field}={value!r} is not allowed; allowed: {seed_range(limit)}"


def require_seed(call: str, field: str, value: Any, *, limit: int = TRAINING_SEED_LIMIT, hint: str) -> int:
    """``value`` when ``seed_problem`` finds none; else the refusal naming the call, field, value
    and range (``limit`` as in ``seed_problem``)."""
    if seed_problem(field, value, limit=limit) is not None:
        raise input_error(call, field, value, seed_range(limit), hint)
    return value


def require_workers(call: str, field: str, value: Any, *, hint: str) -> int:
    """``value`` when it is a worker count in [1, ``MAX_WORKERS``]; else the refusal naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise input_error(call, field, value, f"an integer from 1 to {MAX_WORKERS}", hint)
    return value


def distinct_seeds(name: str, seeds: tuple[int, ...], *, limit: int = TRAINING_SEED_LIMIT) -> tuple[int, ...]:
    """``seeds`` when they are distinct seeds below ``limit``; else the ``ValueError`` a config
    validator raises, naming the field ``name``.

    Args:
        name: the field.
        seeds: its seeds.
        limit: ``TRAINING_SEED_LIMIT`` (training seeds, the default) or ``POPULATION_SEED_LIMIT``
            (the seeds of TRAIN draws), as ``qhlab.evidence.seed_problem`` takes them.
    """
    bad = next((s for s in seeds if seed_problem(name, s, limit=limit) is not None), None)
    if bad is not None or len(set(seeds)) != len(seeds):
        why = f" ({bad!r} is out of range)" if bad is not None else " (a seed repeats)"
        raise ValueError(
            f"{name}={list(seeds)!r} is not allowed{why}; allowed: distinct integers >= 0, each one {seed_range(limit)}"
        )
    return seeds
