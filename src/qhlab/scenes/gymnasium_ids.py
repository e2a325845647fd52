"""Gymnasium task ids: which task an ``env_id`` names, what must be imported to make it, and what binds it.

An ``env_id`` is Gymnasium's own: ``"CartPole-v1"`` (a task Gymnasium ships) or
``"module:TaskId-vN"`` (a task that importing ``module`` registers, as ``gymnasium.make`` reads
it). The module is one of two kinds, and nothing it brings in stays unbound:

* **an installed distribution's** (``"minigrid:MiniGrid-Empty-5x5-v0"``): imported from the
  installed package, whose distribution name and version are bound in the task's identity, so
  that ``verify``, ``scenes audit`` and a study's freeze name a different installed version;
* **the researcher's own** (a ``my_tasks.py`` or ``my_tasks/`` package beside the preset, or on
  ``sys.path`` outside the installed library directories): its source is read
  (``registration_source``), frozen into the population and bound by digest as a factory of one's
  own is, and only the frozen copy is ever imported (``registered_task``); a string entry point
  into the module resolves inside that copy.

Owns: ``TaskId`` and ``parse_task_id``, ``distribution`` (the installed distribution of a module),
``registration_source`` and ``registered_task``. Does not own: making and stepping the task
(``qhlab.scenes.gymnasium``), or freezing and importing copies (``qhlab.execution.user_code``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qhlab.evidence import QhInputError
from qhlab.execution.user_code import (
    EntrySpec,
    FrozenSource,
    LocatedSource,
    file_digests,
    is_installed,
    locate_source,
    source_digest,
    source_files,
)

__all__ = [
    "TaskId",
    "distribution",
    "parse_task_id",
    "registered_task",
    "registration_origin",
    "registration_source",
]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ID_FORMS = "a Gymnasium id ('CartPole-v1'), or 'module:TaskId-vN' for a task that importing module registers"


@dataclass(frozen=True)
class TaskId:
    """An ``env_id`` parsed.

    Attributes:
        text: the id as written.
        module: the module whose import registers the task (None: a task Gymnasium ships).
        task: the registered id.
    """

    text: str
    module: str | None
    task: str


def _refuse(call: str, value: Any, allowed: str, hint: str) -> QhInputError:
    return QhInputError(f"{call}: env_id={value!r} is not allowed; allowed: {allowed}. HINT: {hint}.")


def parse_task_id(env_id: Any, *, call: str) -> TaskId:
    """``"TaskId-vN"`` or ``"module:TaskId-vN"``, parsed.

    Raises:
        QhInputError: not a string, empty, or a malformed module part.
    """
    if not isinstance(env_id, str) or not env_id.strip() or env_id != env_id.strip():
        raise _refuse(call, env_id, _ID_FORMS, "`gymnasium.pprint_registry()` lists the ids Gymnasium ships")
    module, colon, task = env_id.rpartition(":")
    if not colon:
        return TaskId(env_id, None, env_id)
    if not _MODULE.match(module) or not task:
        raise _refuse(call, env_id, _ID_FORMS, "the part before ':' is the dotted module that registers the task")
    return TaskId(env_id, module, task)


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution(module: str) -> tuple[str, str] | None:
    """The installed distribution that provides ``module``, and its version.

    Returns:
        ``(name, version)``, or None when the module is no installed distribution's (the
        researcher's own code, beside the preset or on ``sys.path``).
    """
    top = module.split(".")[0]
    names = _distributions().get(top)
    if not names:
        return None
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    origin = None if found is None else (found.origin or next(iter(found.submodule_search_locations or []), None))
    if origin is None or not is_installed(origin):
        return None
    name = sorted(names)[0]
    return name, importlib.metadata.version(name)


def _located_registration(env_id: Any, base: Path | None, call: str) -> LocatedSource | None:
    """Where the researcher's own module that registers ``env_id``'s task is (None: not one's own)."""
    if not isinstance(env_id, str):
        return None
    parsed = parse_task_id(env_id, call=call)
    if parsed.module is None or distribution(parsed.module) is not None:
        return None
    entry = EntrySpec(text=env_id, module=parsed.module, function="", is_file=False)
    try:
        return locate_source(entry, base or Path.cwd())
    except ValueError as exc:
        raise _refuse(
            call,
            env_id,
            "a module that registers the task: an installed distribution's, or one's own beside the preset",
            f"{exc}; `pip install` the package that registers it, or put {parsed.module.split('.')[0]}.py "
            "beside the preset",
        ) from None


def registration_source(env_id: Any, base: Path | None, *, call: str) -> tuple[dict, dict[str, bytes], Path] | None:
    """The researcher's own module that registers the task an ``env_id`` names, read for a freeze.

    Args:
        env_id: the preset's ``env_id`` option.
        base: the directory of the preset naming it (a module beside it is found first).

    Returns:
        ``(source record, {rel: bytes}, root)`` as ``read_environment_source`` gives them (the
        record's ``function`` is empty: the module is imported for its registration), or None for
        a task Gymnasium ships or an installed distribution registers.

    Raises:
        QhInputError: a module that is neither installed nor found beside the preset or on ``sys.path``.
    """
    located = _located_registration(env_id, base, call)
    if located is None:
        return None
    try:
        files = source_files(located.path)
    except ValueError as exc:
        raise _refuse(call, env_id, "a module of code", str(exc)) from None
    digests = file_digests(files)
    record = {"module": located.module, "function": "", "files": digests, "sha256": source_digest(digests)}
    return record, files, located.path.parent


def registration_origin(env_id: Any, base: Path | None, *, call: str) -> Path | None:
    """The file or package of one's own registration module, as the user's files hold it now (None:
    the task is not one's own). A freeze compares it with the copy frozen in the population."""
    located = _located_registration(env_id, base, call)
    return None if located is None else located.path


# What each frozen registration module registered when it was imported: ``{module name: {id: spec}}``.
# A frozen copy is imported once per digest in a process, so its registrations are captured there.
_REGISTERED: dict[str, dict[str, Any]] = {}


def registered_task(parsed: TaskId, registration: FrozenSource | None, *, call: str) -> tuple[Any, dict[str, str]]:
    """The Gymnasium spec ``parsed`` names, with every import it needs made, and what binds it.

    Args:
        parsed: the id.
        registration: the frozen copy of the researcher's own registration module (None: the
            task is Gymnasium's own or an installed distribution's).

    Returns:
        ``(spec, identity)``: the ``gymnasium.envs.registration.EnvSpec`` to make (a string entry
        point into one's own module resolved to the frozen copy's callable), and the identity
        keys that bind where it came from (``package``: ``"name version"`` of a distribution,
        ``registration``: the frozen module's digest).

    Raises:
        QhInputError: an id nothing registers, a module that fails to import, a plain id a
            package registered (it must be named as ``package:id``), or own code that is not frozen.
    """
    import gymnasium

    if parsed.module is None:
        try:
            spec = gymnasium.spec(parsed.task)
        except Exception as exc:  # noqa: BLE001  (Gymnasium raises several types for an unknown id)
            raise _refuse(
                call,
                parsed.text,
                "a registered Gymnasium id",
                f"gymnasium refused it ({exc}); a task a package registers (MiniGrid, Miniworld) or one of your "
                "own is named 'module:TaskId-vN', e.g. 'minigrid:MiniGrid-Empty-5x5-v0'",
            ) from None
        owner = str(spec.entry_point).split(":")[0].split(".")[0] if isinstance(spec.entry_point, str) else ""
        if owner != "gymnasium":
            # Registered by a module imported earlier in this process: a fresh process would not know it.
            raise _refuse(
                call,
                parsed.text,
                "an id Gymnasium itself registers, or 'module:TaskId-vN'",
                f"{parsed.task!r} is registered by {owner or 'code outside Gymnasium'}; name it as "
                f"'{owner or 'module'}:{parsed.task}' so that every process imports what registers it",
            )
        return spec, {}
    if registration is not None:
        return _frozen_task(parsed, registration, gymnasium, call)
    found = distribution(parsed.module)
    if found is None:
        raise _refuse(
            call,
            parsed.text,
            "a module of an installed distribution, or one's own module frozen with the population",
            f"module {parsed.module!r} is not installed; qhlab imports one's own module only from its frozen copy "
            "(name it in a preset, beside which it lies)",
        )
    try:
        importlib.import_module(parsed.module)
    except Exception as exc:  # noqa: BLE001  (a package's import raises what it raises)
        raise _refuse(
            call, parsed.text, "a module that imports", f"importing {parsed.module!r} failed: {exc}"
        ) from None
    try:
        spec = gymnasium.spec(parsed.task)
    except Exception as exc:  # noqa: BLE001
        raise _refuse(
            call,
            parsed.text,
            f"a task that importing {parsed.module!r} registers",
            f"gymnasium refused {parsed.task!r} ({exc})",
        ) from None
    return spec, {"package": f"{found[0]} {found[1]}"}


def _frozen_task(parsed: TaskId, registration: FrozenSource, gymnasium: Any, call: str) -> tuple[Any, dict[str, str]]:
    """The task a frozen copy of one's own module registered, its entry point resolved in the copy."""
    key = f"{registration.sha256}:{registration.module}"
    if key not in _REGISTERED:
        before = dict(gymnasium.registry)
        registration.import_module()
        _REGISTERED[key] = {name: spec for name, spec in gymnasium.registry.items() if before.get(name) is not spec}
    registered = _REGISTERED[key]
    spec = registered.get(parsed.task)
    if spec is None:
        raise _refuse(
            call,
            parsed.text,
            f"a task module {parsed.module!r} registers (it registers {', '.join(sorted(registered)) or 'none'})",
            "gymnasium.register(id=..., entry_point=...) at the module's top level",
        )
    entry = spec.entry_point
    if isinstance(entry, str):
        target, _, name = entry.partition(":")
        top = parsed.module.split(".")[0]
        if target.split(".")[0] == top:
            prefix = _copy_prefix(registration)
            entry = getattr(importlib.import_module(prefix + target), name, None)
            if not callable(entry):
                raise _refuse(
                    call,
                    parsed.text,
                    "a task whose entry point is in its module",
                    f"{spec.entry_point!r} names nothing callable in the frozen copy",
                )
        elif distribution(target) is None:
            raise _refuse(
                call,
                parsed.text,
                "an entry point in the registering module or an installed package",
                f"{spec.entry_point!r} names module {target!r}, which is neither frozen nor installed; put the "
                "task's class in the module that registers it",
            )
    spec = dataclasses.replace(spec, entry_point=entry)
    return spec, {"registration": registration.sha256}


def _copy_prefix(registration: FrozenSource) -> str:
    """The name prefix the copy's modules are imported under (``_qhlab_user_<digest>_``)."""
    module = registration.import_module()
    return module.__name__[: len(module.__name__) - len(registration.module)]
