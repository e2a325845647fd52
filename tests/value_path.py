"""Follow one value through qhlab, call by call, from the command line to the first optimizer step.

A *stop* is a call of a qhlab function one of whose arguments carries the value: a parameter named
``seed`` holding it, an object whose own attribute ``seed`` (or whose ``recipe``'s) holds it, a
mapping with it under ``"seed"``, an ``(arm, seed)`` cell, or an argv list with ``--seed`` and it.
Following stops at the end of the first optimizer step (a global post-step hook), so the path
ends in the training step that used the value. Nothing here changes what is traced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import qhlab

SOURCE = Path(qhlab.__file__).resolve().parent


@dataclass(frozen=True)
class ValuePath:
    """The stops, in call order: ``[(file relative to the qhlab package, function)]``."""

    stops: list[tuple[str, str]]

    @property
    def files(self) -> list[str]:
        """Every file the value passes through, in the order first reached."""
        return list(dict.fromkeys(file for file, _ in self.stops))

    def entries(self, file: str) -> int:
        """How many times the path enters ``file`` from another file (or starts in it)."""
        previous, count = None, 0
        for current, _ in self.stops:
            if current == file and previous != file:
                count += 1
            previous = current
        return count

    @property
    def returns(self) -> int:
        """How many times the path enters a file it had already left."""
        seen, previous, count = set(), None, 0
        for current, _ in self.stops:
            if current != previous:
                count += current in seen
                seen.add(current)
            previous = current
        return count


def _own(value: Any, key: str) -> Any:
    """``value``'s own attribute or item ``key``, read without running any code of it."""
    if isinstance(value, dict):
        return value.get(key)
    try:
        return vars(value).get(key)
    except TypeError:
        return None


def _is(value: Any, seed: int) -> bool:
    return type(value) is int and value == seed


def carries(name: str, value: Any, seed: int) -> bool:
    """Whether the argument ``name=value`` carries ``seed`` (see the module docstring)."""
    if name == "seed" and _is(value, seed):
        return True
    if _is(_own(value, "seed"), seed) or _is(_own(_own(value, "recipe"), "seed"), seed):
        return True
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and _is(value[1], seed):
        return True
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return any(a == "--seed" and b == str(seed) for a, b in zip(value, value[1:], strict=False))
    return False


def follow(run: Callable[[], Any], seed: int) -> tuple[Any, ValuePath]:
    """Run ``run()`` and follow ``seed`` through qhlab until the first optimizer step ends.

    Returns:
        ``(run()'s result, the path)``.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    stops: list[tuple[str, str]] = []
    done = {"stepped": False}
    prefix = str(SOURCE) + "/"

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or done["stepped"]:
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(prefix):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        local = frame.f_locals
        # A method's own object is not handed the value: it was given it when built (a stop then).
        if any(carries(n, local.get(n), seed) for n in names if n != "self"):
            stops.append((filename[len(prefix) :], code.co_qualname))

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        done["stepped"] = True
        sys.setprofile(None)

    handle = register_optimizer_step_post_hook(stepped)
    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
        handle.remove()
    assert done["stepped"], "the run never reached an optimizer step"
    return result, ValuePath(stops)
