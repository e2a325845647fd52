"""A Gymnasium task's whole state as one vector of floats, and exact proof that its step draws nothing that matters.

Owns:

* **Whole-state snapshots** (``Snapshots``): for a task whose state is not a vector of its own
  (MiniGrid's grid, agent position and direction, carried object and step count), the unwrapped
  environment's instance attributes are pickled, every one but what is not state (its spaces,
  spec, render handles and random generator: a step may not draw from it, see below), and
  restored whole before a step, attributes a later step added removed. The bytes travel inside
  qhlab's state vector, packed six to a float (exact below 2**53), behind the task's own
  observation flattened to features. A snapshot is read back naming only the task's own classes,
  containers, numbers and arrays: a forged state in a population file runs no code.
* **Randomness, detected** (``random_steps``): a step is taken with the task's random generator
  replaced by a stand-in that records every draw and gives each at one end of its range (0 and
  the largest float below 1 for ``random``, the first and last element for ``choice``, the bounds
  for ``integers`` and ``uniform``); the episode's reset is drawn at the same end where it can be
  (so that a per-episode coin such as Taxi's fickle passenger lands both ways). A step that
  draws is random, unless the task's transition table gives that state and action one outcome
  and the step returned it at both ends (a toy-text task samples even a one-outcome row). A draw
  the stand-in does not model (``normal``, ...) is random too. A step that draws behind the task's
  generator, from numpy's global generator (``np.random.random``, ...) or Python's ``random``
  module, is random: no seed of the task fixes those, and each step is watched for a change of
  their state. A toy-text task's transition table is read whole: a row with more than one
  outcome is random, at any probability.

Does not own: the environment contract or the option checks (``qhlab.scenes.gymnasium``).
"""

from __future__ import annotations

import io
import pickle
import random
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = [
    "Snapshots",
    "UnsafeSnapshotError",
    "flat_features",
    "flat_size",
    "random_steps",
    "transition_table_randomness",
]

# Instance attributes that are not a task's state: its spaces and spec (fixed), render handles,
# and its random generator (a step that draws from it is refused, so it never matters to a step).
_NOT_STATE = frozenset(
    {
        "action_space",
        "observation_space",
        "spec",
        "metadata",
        "render_mode",
        "reward_range",
        "_np_random",
        "_np_random_seed",
        "window",
        "clock",
        "screen",
        "surf",
        "viewer",
        "isopen",
    }
)
_PICKLE_PROTOCOL = 4
_BYTES_PER_WORD = 6


def _state_value(value: Any) -> Any:
    """A top-level attribute as its snapshot holds it: integer scalars inside a tuple or list as
    Python ints (a step writes ``tuple(numpy_array)``, a reset Python ints: one state, one snapshot)."""
    if isinstance(value, tuple | list) and all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
    ):
        return type(value)(int(v) for v in value)
    return value


# What a snapshot may name besides the task's own classes: plain containers and numbers, and
# numpy's array and scalar reconstruction (never a function that runs anything else).
_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "tuple", "list", "dict", "int", "float", "complex", "bytes", "bytearray", "str", "bool"}
)
_SAFE_NUMPY = frozenset({"_reconstruct", "scalar", "dtype", "ndarray"})


class UnsafeSnapshotError(pickle.UnpicklingError):
    """A snapshot names something other than the task's own classes, containers, numbers and arrays."""


class _StateUnpickler(pickle.Unpickler):
    """Unpickles a snapshot naming only what a task's state is made of: a state read back from a
    population file (verify and audit step stored states again) can never run code of its choosing."""

    def __init__(self, data: bytes, packages: frozenset[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.packages = packages

    def find_class(self, module: str, name: str) -> Any:
        top = module.split(".")[0]
        if (module == "builtins" and name in _SAFE_BUILTINS) or (top == "numpy" and name in _SAFE_NUMPY):
            return super().find_class(module, name)
        if module == "copyreg" and name == "_reconstructor":
            return super().find_class(module, name)
        if top in self.packages and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise UnsafeSnapshotError(
            f"a snapshot names {module}.{name}, which is neither a class of the task's own packages "
            f"({', '.join(sorted(self.packages))}) nor a container, number or array"
        )


class Snapshots:
    """Pickled whole states of one unwrapped task, packed into a fixed number of floats.

    Attributes:
        words: how many floats a snapshot takes (its byte count, then the bytes, six per float).
        capacity: the most bytes a snapshot may take.
        packages: the top-level packages whose classes a snapshot may hold (the task class's and
            its bases', e.g. ``minigrid`` and ``gymnasium``).
    """

    def __init__(self, unwrapped: Any) -> None:
        tops = {str(klass.__module__).split(".")[0] for klass in type(unwrapped).__mro__}
        # The standard library's classes (typing.Generic, in every Env's bases) are not a task's state.
        self.packages = frozenset(tops - set(sys.stdlib_module_names) - {"builtins"})
        first = len(self.take(unwrapped))
        # Room for the state to grow (objects carried, cells opened): twice the reset's, and 2 KiB.
        self.capacity = max(2 * first, first + 2048)
        self.words = 1 + -(-self.capacity // _BYTES_PER_WORD)

    @staticmethod
    def _kept(name: str, value: Any) -> bool:
        return name not in _NOT_STATE and not callable(value) and not isinstance(value, types.ModuleType)

    def take(self, unwrapped: Any) -> bytes:
        """The task's whole state (every kept instance attribute, by sorted name) as pickle bytes."""
        state = {k: _state_value(v) for k, v in sorted(vars(unwrapped).items()) if self._kept(k, v)}
        return pickle.dumps(state, protocol=_PICKLE_PROTOCOL)

    def restore(self, unwrapped: Any, data: bytes) -> None:
        """Set the task to the state ``data`` holds; a kept attribute it does not hold is removed."""
        state = _StateUnpickler(data, self.packages).load()
        for name, value in list(vars(unwrapped).items()):
            if name not in state and self._kept(name, value):
                delattr(unwrapped, name)
        vars(unwrapped).update(state)

    def pack(self, data: bytes) -> np.ndarray | None:
        """``data`` as ``[words]`` floats (its length, then the bytes); None: beyond the capacity."""
        if len(data) > self.capacity:
            return None
        raw = np.zeros((self.words - 1) * _BYTES_PER_WORD, dtype=np.uint8)
        raw[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        padded = np.zeros((self.words - 1, 8), dtype=np.uint8)
        padded[:, :_BYTES_PER_WORD] = raw.reshape(-1, _BYTES_PER_WORD)
        return np.concatenate([[float(len(data))], padded.view("<u8").ravel().astype(np.float64)])

    def unpack(self, values: np.ndarray) -> bytes:
        """The bytes ``pack`` packed into ``values`` ``[words]``."""
        length = int(values[0])
        padded = np.asarray(values[1:], dtype=np.float64).astype("<u8").view(np.uint8).reshape(-1, 8)
        return padded[:, :_BYTES_PER_WORD].tobytes()[:length]


# -- observations as features ------------------------------------------------------------------


def _leaves(space: Any) -> list[Any]:
    """The flattenable spaces inside ``space``, in order (a Text space, such as MiniGrid's mission, is not)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaves(sub)]
    if isinstance(space, spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaves(sub)]
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiBinary | spaces.MultiDiscrete):
        return [space]
    return []


def flat_size(space: Any) -> int:
    """How many features an observation of ``space`` flattens to (0: none)."""
    from gymnasium.spaces import utils

    return int(sum(utils.flatdim(leaf) for leaf in _leaves(space)))


def flat_features(space: Any, observation: Any) -> np.ndarray:
    """An observation's flattenable parts as ``[flat_size(space)]`` float64 (a discrete value one-hot)."""
    from gymnasium import spaces
    from gymnasium.spaces import utils

    def walk(sub: Any, value: Any) -> list[np.ndarray]:
        if isinstance(sub, spaces.Dict):
            return [part for key, inner in sub.spaces.items() for part in walk(inner, value[key])]
        if isinstance(sub, spaces.Tuple):
            return [part for inner, v in zip(sub.spaces, value, strict=True) for part in walk(inner, v)]
        if isinstance(sub, spaces.Box | spaces.Discrete | spaces.MultiBinary | spaces.MultiDiscrete):
            return [np.asarray(utils.flatten(sub, value), dtype=np.float64)]
        return []

    parts = walk(space, observation)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


# -- randomness, detected ------------------------------------------------------------------------


class _Unmodelled(Exception):
    """The step drew in a way the stand-in does not model (its outcome cannot be bounded)."""


class _TooManyDraws(Exception):
    """A reset kept drawing at one end (a loop that waits for a free cell): reset it normally."""


class _Ends:
    """A task's random generator replaced: every draw recorded and given at one end of its range."""

    _BUDGET = 256

    def __init__(self, high: bool) -> None:
        self.high = high
        self.draws: list[str] = []

    def _drew(self, name: str) -> None:
        self.draws.append(name)
        if len(self.draws) > self._BUDGET:
            raise _TooManyDraws(name)

    def _shaped(self, value: Any, size: Any) -> Any:
        return value if size is None else np.full(size, value)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        self._drew("random")
        return self._shaped(np.nextafter(1.0, 0.0) if self.high else 0.0, size)

    def integers(
        self, low: Any, high: Any = None, size: Any = None, dtype: Any = np.int64, endpoint: bool = False
    ) -> Any:
        self._drew("integers")
        if high is None:
            low, high = 0, low
        top = high if endpoint else high - 1
        return self._shaped(top if self.high else low, size)

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: Any = None) -> Any:
        self._drew("uniform")
        return self._shaped(np.nextafter(high, low) if self.high else low, size)

    def choice(
        self, a: Any, size: Any = None, replace: bool = True, p: Any = None, axis: int = 0, shuffle: bool = True
    ) -> Any:
        self._drew("choice")
        items = np.arange(a) if isinstance(a, int | np.integer) else np.asarray(a)
        allowed = np.arange(len(items)) if p is None else np.flatnonzero(np.asarray(p) > 0)
        return self._shaped(items[allowed[-1] if self.high else allowed[0]], size)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _Unmodelled(name)


def transition_table_randomness(unwrapped: Any) -> str | None:
    """A toy-text task's transition table read whole.

    Returns:
        A reason (a state and action with more than one outcome, and their probabilities), or None:
        no table, or every row has one outcome.
    """
    table = getattr(unwrapped, "P", None)
    if not isinstance(table, dict):
        return None
    for state, rows in table.items():
        for action, outcomes in rows.items():
            reachable = {(int(s), float(r), bool(d)) for p, s, r, d in outcomes if p > 0}
            if len(reachable) > 1:
                probabilities = ", ".join(f"{p:g}" for p, *_ in outcomes if p > 0)
                return (
                    f"its transition table gives state {state} and action {action} {len(reachable)} different "
                    f"outcomes (its transitions' probabilities: {probabilities})"
                )
    return None


def random_steps(
    unwrapped: Any,
    states: Iterable[np.ndarray],
    actions: int,
    *,
    reset: Callable[[], None] | None,
    set_state: Callable[[np.ndarray], None],
    outcome: Callable[[Any], tuple],
    proven: Callable[[np.ndarray, int, Any], bool] | None = None,
) -> str | None:
    """Each (state, action) stepped at both ends of every draw; the first one that steps differently.

    Args:
        unwrapped: the task (its ``_np_random`` is replaced during each step and restored).
        states: ``[S]`` states, as ``set_state`` takes them.
        actions: how many actions each state has.
        reset: the task's reset with ``seed=None`` (the generator in place is what it draws from),
            taken before each state is set; None: ``set_state`` sets everything a reset does.
        set_state: sets a state.
        outcome: ``outcome(step_result) -> tuple``: what a step's result is compared by.
        proven: ``proven(state, action, step_result)``: the task's transition table gives the state
            and action one outcome and the step returned it (a draw that selects among one outcome,
            as a toy-text task's categorical sample does). None: no draw is harmless.

    Returns:
        A reason naming the state's index, the action and the draws, or None: no step draws in a
        way that changes it.
    """
    real = getattr(unwrapped, "_np_random", None)
    try:
        for index, state in enumerate(states):
            for action in range(actions):
                seen = []
                for high in (False, True):
                    if reset is not None:
                        unwrapped._np_random = _Ends(high)
                        try:
                            reset()
                        except (_TooManyDraws, _Unmodelled):
                            unwrapped._np_random = real
                            reset()
                    set_state(state)
                    ends = _Ends(high)
                    unwrapped._np_random = ends
                    before = _global_generators()
                    try:
                        result = unwrapped.step(action)
                    except (_Unmodelled, _TooManyDraws) as exc:
                        return (
                            f"a step (probed state {index}, action {action}) draws np_random.{exc} from its generator"
                        )
                    behind = [name for name, a, b in zip(_GLOBAL_GENERATORS, before, _global_generators()) if a != b]
                    if behind:
                        return (
                            f"a step (probed state {index}, action {action}) draws from {' and '.join(behind)}, "
                            "which no seed of the task fixes"
                        )
                    seen.append((outcome(result), tuple(ends.draws), result))
                (low, low_draws, result), (high, high_draws, _) = seen
                drawn = ", ".join(sorted(set(low_draws) | set(high_draws)))
                if drawn and low != high:
                    return (
                        f"a step (probed state {index}, action {action}) draws from its random generator "
                        f"(np_random.{drawn}) and steps differently by the draw"
                    )
                if drawn and (proven is None or not proven(state, action, result)):
                    return (
                        f"a step (probed state {index}, action {action}) draws from its random generator "
                        f"(np_random.{drawn}); a draw is harmless only where the task's transition table gives the "
                        "state and action one outcome"
                    )
    finally:
        unwrapped._np_random = real
    return None


# The process-wide generators a step can draw from behind its task's own, as a refusal names them.
_GLOBAL_GENERATORS = ("numpy's global generator (np.random)", "Python's random module")


def _global_generators() -> tuple[bytes, Any]:
    """Where numpy's global generator and Python's ``random`` stand: a draw from either moves it."""
    name, key, position, has_gauss, gauss = np.random.get_state()
    return (key.tobytes() + repr((name, position, has_gauss, gauss)).encode(), random.getstate())
