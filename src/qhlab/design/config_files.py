"""The config kit: the one strict TOML reader and the shape every config kind shares.

Owns: ``read_toml`` (a UTF-8 TOML file, its relative paths resolved against its directory),
``read_config`` (the one strict parser: file -> validated model, every invalid field in one
error), ``load_recipe`` (a recipe file -> ``QhRecipe``), ``ConfigForm`` (one config kind: its
model, the call and example its refusals name, its path fields) and the field types every
config repeats (``ConfigName``, ``StudyPath``, ``StrictInt``, ``PlainNumber``, ``Workers``, ``Executor``,
``TorchThreads``, ``FROZEN``), and ``ToolExecution``, the execution fields every preparation
tool's config shares. The science core (``qhlab.finite_horizon``) reads no file of
these: it is handed validated models.

Does not own: the models of each kind (``study_config``, ``tuning_config``, ``pilot_config``,
``plan_config``, ``e0_config``), the pydantic-error formatter (``qhlab.evidence.validation_error``)
or the recipe's own validation (``qhlab.finite_horizon.recipe.validate_recipe``).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError

from qhlab.evidence import MAX_TORCH_THREADS, MAX_WORKERS, QhInputError, input_error, invalid_fields, validation_error
from qhlab.evidence.receipts import DEFAULT_POPULATION_ROOT
from qhlab.finite_horizon.recipe import QhRecipe, validate_recipe

__all__ = [
    "FROZEN",
    "ConfigForm",
    "ConfigName",
    "Executor",
    "PlainNumber",
    "PlainNumeric",
    "StrictInt",
    "StudyPath",
    "ToolExecution",
    "TorchThreads",
    "Workers",
    "load_recipe",
    "read_config",
    "read_toml",
]

M = TypeVar("M", bound=BaseModel)

# A config is a value: frozen, closed to unknown fields, and never NaN or infinite.
FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
# A TOML boolean or float never becomes an integer.
StrictInt = Annotated[int, Strict()]
# A config's name becomes a directory and a W&B group: one safe path component.
ConfigName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# The study config a preparation tool serves: a path, relative to the tool's own config.
StudyPath = Annotated[str, Field(min_length=1)]


def _plain_number(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not allowed; allowed: a number (a TOML boolean is not one)")
    if isinstance(value, str):
        raise ValueError(f"{value!r} is not allowed; allowed: a number (a quoted string is not one)")
    return value


# A config's number: an int or a float, never a boolean or a numeric string (pydantic's lax mode
# would read true as 1.0 and "0.5" as 0.5).
PlainNumber = Annotated[float, BeforeValidator(_plain_number)]
# A number that keeps an integer an int (a search space's bounds).
PlainNumeric = Annotated[float | int, BeforeValidator(_plain_number)]

# Execution fields: where and how widely a tool runs, never what it measures, so no record keeps them.
Workers = Annotated[int, Strict(), Field(ge=1, le=MAX_WORKERS)]
Executor = Literal["local", "ray"]
# Recorded, unlike the two above: the thread count can change a reduction's order, so a fit's last bits.
TorchThreads = Annotated[int, Strict(), Field(ge=1, le=MAX_TORCH_THREADS)]


class ToolExecution(BaseModel):
    """The fields every preparation tool's config (E0 check, pilot, tuning) shares: how it runs its
    fits and where its populations are cached. A tool's model subclasses it and documents them
    in its own docstring, as the config reference reads them there.

    Attributes:
        workers: fits (or draws) at once on the local executor. Not part of the record.
        executor: "local" or "ray". Not part of the record.
        population_cache: cache directory of generated populations.
    """

    model_config = FROZEN

    workers: Workers = 1
    executor: Executor = "local"
    population_cache: str = DEFAULT_POPULATION_ROOT

    def record(self) -> dict[str, Any]:
        """The config as the tool's record keeps it: every field except the execution ones."""
        return self.model_dump(mode="json", exclude={"workers", "executor"})


def read_toml(
    path: str | Path,
    *,
    call: str,
    field: str,
    example: str,
    relative: tuple[tuple[str, ...], ...] = (),
    toml_files: tuple[tuple[str, ...], ...] = (),
) -> tuple[dict[str, Any], bytes, Path]:
    """Read a UTF-8 TOML file and resolve its relative paths against the file's directory.

    Args:
        path: the file (``~`` expanded).
        call, field: what a refusal names (``"<call>: <field>=<path> is not allowed; ..."``).
        example: the example file a refusal points to.
        relative: key paths (e.g. ``("data", "train")``) whose non-empty string values are
            paths; relative ones become absolute against the file's directory.
        toml_files: key paths whose values are a name or, ending in ``.toml``, a path (a preset).

    Returns:
        (the parsed mapping, the file's exact bytes, the resolved path of the file).

    Raises:
        QhInputError: a missing or unreadable file, or one that is not UTF-8 TOML.
    """
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
        raw = tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise input_error(
            call, field, str(path), "an existing TOML file (this one does not exist)", f"see {example}"
        ) from None
    except OSError as exc:
        raise input_error(
            call, field, str(path), f"a readable file ({exc})", "check the path and permissions"
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise input_error(
            call, field, str(path), f"a UTF-8 TOML file (this one is not valid TOML: {exc})", f"compare with {example}"
        ) from None
    base = path.resolve().parent
    # A name-or-file field (a preset) is a path only when it names a TOML file.
    for keys, suffix in (*((k, None) for k in relative), *((k, ".toml") for k in toml_files)):
        *parents, key = keys
        node: Any = raw
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if not (isinstance(node, dict) and isinstance(node.get(key), str) and node[key]):
            continue
        if suffix is not None and not node[key].endswith(suffix):
            continue
        if "\x00" in node[key]:
            raise input_error(
                call, ".".join(keys), node[key], "a path without NUL characters", f"fix the path in {path}"
            )
        value = Path(node[key]).expanduser()
        node[key] = str(value if value.is_absolute() else (base / value).resolve())
    return raw, data, path.resolve()


def read_config(
    path: str | os.PathLike,
    model: type[M],
    *,
    call: str,
    what: str,
    example: str,
    relative: tuple[tuple[str, ...], ...] = (),
    toml_files: tuple[tuple[str, ...], ...] = (),
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[M, bytes, Path]:
    """Read a config TOML of any kind and validate it completely: the one strict parser.

    Every config kind (a study, a tuning, a pilot, a plan, an E0 check) is a closed, strict
    pydantic model read through here: a TOML boolean or string is never a number, an unknown
    field is refused, and every invalid field is listed in one error before anything is written.

    Args:
        path: the TOML file (``~`` expanded; relative paths inside resolved against its directory).
        model: the config's model.
        call: what a refusal of the file itself names.
        what: the kind of config, for the error's first line (e.g. ``"pilot config"``).
        example: the example file every refusal points to.
        relative: key paths whose values are paths (``read_toml``).
        toml_files: key paths whose values are a name or, ending in ``.toml``, a path (a preset).
        prepare: turns the parsed mapping into the model's input (e.g. flattening a section).

    Returns:
        (the validated config, the file's exact bytes, the resolved path of the file).

    Raises:
        QhInputError: a missing or unreadable file, bad TOML, or every invalid field at once.
    """
    raw, data, resolved = read_toml(
        path, call=call, field="config_path", example=example, relative=relative, toml_files=toml_files
    )
    if prepare is not None:
        raw = prepare(raw)
    try:
        config = model.model_validate(raw)
    except ValidationError as exc:
        source = f"{what} {str(Path(path).expanduser())!r}"
        raise validation_error(exc, source, model, f"compare with {example}.") from None
    return config, data, resolved


@dataclasses.dataclass(frozen=True)
class ConfigForm(Generic[M]):
    """One config kind: what its file is read into, and what every refusal of it names.

    Attributes:
        model: the kind's strict pydantic model.
        call: the command a refusal of the file names (e.g. ``"qhlab pilot"``).
        what: the kind, for an error's first line (e.g. ``"pilot config"``).
        example: the example file every refusal points to.
        relative: key paths whose values are paths, resolved against the file's directory.
        toml_files: key paths whose values are a preset name or a preset file.
        prepare: turns the parsed mapping into the model's input.
    """

    model: type[M]
    call: str
    what: str
    example: str
    relative: tuple[tuple[str, ...], ...] = ()
    toml_files: tuple[tuple[str, ...], ...] = ()
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def read(self, path: str | os.PathLike) -> tuple[M, bytes, Path]:
        """``read_config`` of this kind: (the validated config, its exact bytes, its resolved path).

        Raises:
            QhInputError: a missing or unreadable file, bad TOML, or every invalid field at once.
        """
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        return read_config(path, self.model, **options)

    def invalid(self, path: str | os.PathLike, problems: list[str], hint: str) -> QhInputError:
        """The one error listing ``problems`` (one line each) of this kind's file at ``path``.

        Returns:
            ``"<what> '<path>': N invalid field(s): ..."`` with ``hint`` as its HINT, to raise.
        """
        return invalid_fields(f"{self.what} {str(Path(path).expanduser())!r}", problems, hint)

    def refuse(self, path: str | os.PathLike, problems: list[str], hint: str) -> None:
        """Raise ``invalid`` of ``problems`` when there are any; none: return.

        Raises:
            QhInputError: one error listing every problem.
        """
        if problems:
            raise self.invalid(path, problems, hint)


def load_recipe(path: str | os.PathLike) -> QhRecipe:
    """Read and validate a recipe TOML file.

    Relative ``data.train`` / ``data.validation`` paths are resolved against the TOML file's
    directory (absolute strings in the result). A user arm's builder stays relative: the fit
    resolves it against the file's directory (``FitRequest.source_dir``).

    Args:
        path: the recipe file.

    Returns:
        The validated, frozen recipe.

    Raises:
        QhInputError: unreadable file, invalid TOML, or any invalid field (all listed).
    """
    raw, _, _ = read_toml(
        path,
        call="recipe",
        field="path",
        example="examples/tiny-recipe.toml",
        relative=(("data", "train"), ("data", "validation")),
    )
    return validate_recipe(raw, source=f"recipe {str(Path(path))!r}")
