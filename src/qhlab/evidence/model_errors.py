"""The one formatter of a pydantic validation error: every bad field on its own refusal line.

Owns: ``validation_error`` (a ``ValidationError`` of any config or record model -> one
``QhInputError`` that names each field, its value and what is allowed, with the model's own
field names and integer ranges). Does not own: reading files (``qhlab.design.config_files``)
or the models themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, get_args

from pydantic import BaseModel

from qhlab.evidence.errors import QhInputError, invalid_fields

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["validation_error"]


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """Names of the fields of the model reached by following `loc` (for extra-field errors)."""
    current: Any = model
    union: list[type[BaseModel]] = []
    for part in loc[:-1]:
        if union:  # a tuple index, or a discriminated union's tag (e.g. "hard"), is in loc
            tagged = [m for m in union if isinstance(part, int) or part in _kinds(m)]
            current, union = (tagged[0] if tagged else None), []
            if current is None:
                return ""
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return ""
        annotation = fields[part].annotation
        if isinstance(annotation, type):
            current = annotation
        else:
            union = [m for m in get_args(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
            if not union:
                return ""
    fields = getattr(current, "model_fields", None)
    return ", ".join(fields) if fields and not union else ""


def _kinds(model: type[BaseModel]) -> tuple[Any, ...]:
    """The tags of a discriminated union member (its ``kind`` Literal), else ()."""
    kind = model.model_fields.get("kind")
    return get_args(kind.annotation) if kind is not None else ()


def _integer_bounds(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[int, int] | None:
    """``(ge, le)`` of a top-level integer field bounded on both sides (the range to show), else None."""
    if len(loc) != 1 or loc[0] not in model.model_fields:
        return None
    info = model.model_fields[loc[0]]
    if info.annotation is not int:
        return None
    low = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
    high = next((m.le for m in info.metadata if getattr(m, "le", None) is not None), None)
    return None if low is None or high is None else (low, high)


_TYPE_TEXT = {
    "float_type": "a number (TOML float or integer, not a string)",
    "int_type": "an integer (not a string, float or boolean)",
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "tuple_type": "a list of numbers",
    "finite_number": "a finite number (no NaN or infinity)",
}
_BOUND_OPS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _allowed_text(error: dict[str, Any], model: type[BaseModel]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    loc = tuple(error["loc"])
    if kind == "extra_forbidden":
        names = _allowed_fields(model, loc)
        return f"only the known fields ({names})" if names else "only the documented fields"
    bounds = _integer_bounds(model, loc)
    if bounds is not None and kind in {"greater_than_equal", "less_than_equal"}:
        return f"an integer from {bounds[0]} to {bounds[1]}"
    if kind in _BOUND_OPS:
        bound = next(iter(v for k, v in ctx.items() if k in {"gt", "ge", "lt", "le"}), "?")
        return f"a number {_BOUND_OPS[kind]} {bound}"
    if kind in {"union_tag_invalid", "union_tag_not_found"}:
        return f"kind one of {ctx.get('expected_tags', '?')}"
    return _TYPE_TEXT.get(kind, error["msg"])


def validation_error(exc: ValidationError, source: str, model: type[BaseModel], hint: str) -> QhInputError:
    """Turn a pydantic ValidationError into one QhInputError listing every bad field.

    Args:
        exc: the validation error (all field errors).
        source: what was validated (e.g. "recipe 'r.toml'").
        model: the validated model (names the known fields and integer ranges).
        hint: the closing HINT line.

    Returns:
        The error to raise; its message has one line per field:
        `<field.path>=<value!r> is not allowed; allowed: <...> (<pydantic message>)`, or
        `<field.path> is missing; ...`, or `<field.path>: <our validator's message>`.
    """
    lines = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(p) for p in error["loc"]) or "<top level>"
        if error["type"] == "missing":
            lines.append(f"{path} is missing; allowed: a value (this field is required)")
        elif error["type"] in ("value_error", "assertion_error"):
            # our own validators already name the value and what is allowed; one that names its
            # own field by its bare name is given the whole path instead (bootstrap.seed=...)
            message = str(error["msg"]).removeprefix("Value error, ")
            own = f"{error['loc'][-1]}=" if error["loc"] else None
            named = own is not None and message.startswith(own)
            lines.append(f"{path}={message.removeprefix(own)}" if named else f"{path}: {message}")
        else:
            value = error.get("input")
            shown = "{...}" if isinstance(value, dict) and error["type"] != "extra_forbidden" else repr(value)
            allowed = _allowed_text(error, model)
            detail = "" if allowed == error["msg"] else f" ({error['msg']})"
            lines.append(f"{path}={shown} is not allowed; allowed: {allowed}{detail}")
    return invalid_fields(source, lines, hint)
