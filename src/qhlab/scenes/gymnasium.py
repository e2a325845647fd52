"""Gymnasium environments by id: any task with discrete actions whose state qhlab can read and set.

Owns: ``make(options)``, the factory a preset names as ``factory = "qhlab.scenes.gymnasium:make"``
with ``env_id = "CartPole-v1"``; ``make_with_state(options, get_state=..., set_state=...)``, for a
factory of the researcher's own that says how its task's state is read and set; and
``GymnasiumEnvironment``, which puts a Gymnasium task under the environment contract
(``qhlab.scenes.contract``). Does not own: Gymnasium, or labelling
(``labels``, ``chains``).

How a task becomes a qhlab environment (the documented default):

* **The state** qhlab reads and sets is the task's own: ``unwrapped.state`` (classic control:
  CartPole, Acrobot, MountainCar, Pendulum-like tasks with discrete actions) or ``unwrapped.s``
  (toy text: FrozenLake, CliffWalking, Taxi), or what the researcher's own ``get_state(unwrapped)``
  returns and ``set_state(unwrapped, values)`` sets (``make_with_state``: any other task whose
  state can be set, a MuJoCo task's ``qpos`` and ``qvel`` among them), followed by a done flag
  (1.0 once the episode has ended). A state is set before every step, and a task's hidden per-episode memory that would
  make the same (state, action) step differently (CartPole's ``steps_beyond_terminated``) is
  reset first; the determinism probes of generation refuse a task whose step still depends on
  anything else.
* **Episode ends** are terminal states (``terminated``; a time limit's truncation is not an end
  here: the horizon is qhlab's): absorbing, every candidate leads back with reward 0.
* **Observations**: one object whose features are the state's values (a discrete state: its one-hot
  code) and the done flag; the goal is a constant 1.0 (the scorer reads a goal; a task without one
  gives it nothing to tell apart); candidate i is action i, its features the action's one-hot code,
  acting on the object.
* **Options**: ``env_id`` (required), ``kwargs`` (passed to ``gymnasium.make``, e.g.
  ``{ is_slippery = false }``), ``reset`` (passed to ``reset(options=...)``, e.g. CartPole's
  ``{ low = -0.2, high = 0.2 }``; a key the task's reset never reads is refused as a typo),
  ``shaping`` (potential-based shaping on one state value,
  ``{ feature = 3, scale = -1.0, absolute = true }``: r + phi(s') - phi(s) with
  phi(s) = scale * s[feature], or scale * |s[feature]| when ``absolute``; recorded with the
  options). Over qhlab's finite horizon the shaping telescopes: an H-step return becomes the
  task's own plus phi(s_H) - phi(s_0), so the labels are of the task's return with a bonus on the
  last state's potential, which gives a short horizon something to tell apart where the task's
  own reward does not (CartPole's +1 a step). Only over an unbounded horizon would it leave the
  optimal policy unchanged (Ng, Harada and Russell, 1999). ``reward_unit``: the reward's unit,
  printed after every reward-valued number (default: none). Any other option is refused.
* **Identity**: the id, the spec's entry point and version, the kwargs, the versions of
  Gymnasium and numpy, and how the state is read (``unwrapped.state``, ``unwrapped.s`` or the
  researcher's pair, whose file is frozen with the population as any environment of one's own),
  bound in every manifest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from qhlab.evidence import QhInputError

__all__ = ["GymnasiumEnvironment", "make", "make_with_state"]

_OPTIONS = ("env_id", "kwargs", "reset", "shaping", "reward_unit")
_CALL = "qhlab.scenes.gymnasium"


class _ReadKeys(dict):
    """A task's reset options that record which keys the task read (a key it never reads is a typo)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.read: set[str] = set()

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def _all(self) -> None:
        self.read.update(super().keys())

    def keys(self) -> Any:
        self._all()
        return super().keys()

    def items(self) -> Any:
        self._all()
        return super().items()

    def values(self) -> Any:
        self._all()
        return super().values()

    def __iter__(self) -> Any:
        self._all()
        return super().__iter__()


def _refuse(field: str, value: Any, allowed: str, hint: str) -> QhInputError:
    return QhInputError(f"{_CALL}: {field}={value!r} is not allowed; allowed: {allowed}. HINT: {hint}.")


def _shaping(shaping: Any, width: int) -> dict | None:
    """The ``shaping`` option checked: ``{feature, scale, absolute}`` on one of the ``width`` state
    values, or None."""
    if shaping is None:
        return None
    allowed_keys = {"feature", "scale", "absolute"}
    feature = shaping.get("feature") if isinstance(shaping, dict) else None
    scale = shaping.get("scale", 1.0) if isinstance(shaping, dict) else None
    absolute = shaping.get("absolute", False) if isinstance(shaping, dict) else None
    if (
        not isinstance(shaping, dict)
        or set(shaping) - allowed_keys
        or isinstance(feature, bool)
        or not isinstance(feature, int)
        or not 0 <= feature < width
        or isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not np.isfinite(scale)
        or not isinstance(absolute, bool)
    ):
        raise _refuse(
            "shaping",
            shaping,
            f"{{ feature = an index of the state (0..{width - 1}), scale = a finite number, absolute = true | false }}",
            "potential-based shaping on one state value; over an unbounded horizon it leaves the optimal policy "
            "unchanged",
        )
    return {"feature": int(feature), "scale": float(scale), "absolute": absolute}


class GymnasiumEnvironment:
    """A Gymnasium task under the environment contract (see the module docstring)."""

    max_objects = 1
    goal_features = 1
    state_column = "state"
    reference_candidate = "action_0"

    def __init__(
        self,
        options: dict[str, Any],
        *,
        state_access: tuple[Callable[[Any], Any], Callable[[Any, np.ndarray], None]] | None = None,
    ) -> None:
        import gymnasium

        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise _refuse("options", unknown, f"only {', '.join(_OPTIONS)}", "a typo is refused, never ignored")
        env_id = options.get("env_id")
        if not isinstance(env_id, str) or not env_id:
            raise _refuse("env_id", env_id, "a Gymnasium id, e.g. 'CartPole-v1'", "`gymnasium.pprint_registry()`")
        for name in ("kwargs", "reset"):
            if not isinstance(options.get(name, {}), dict):
                raise _refuse(name, options[name], "a table", f"{name} = {{ ... }}")
        self.kwargs, self.reset_options = dict(options.get("kwargs", {})), dict(options.get("reset", {}))
        try:
            gymnasium.spec(env_id)
        except Exception as exc:  # noqa: BLE001  (Gymnasium raises several types for an unknown id)
            raise _refuse("env_id", env_id, "a registered Gymnasium id", f"gymnasium refused it: {exc}") from None
        try:
            made = gymnasium.make(env_id, **self.kwargs)
        except Exception as exc:  # noqa: BLE001  (a task's constructor raises what it raises)
            raise _refuse(
                "kwargs", self.kwargs, f"the keyword arguments {env_id} takes", f"gymnasium.make: {exc}"
            ) from None
        self.unwrapped = made.unwrapped
        space = self.unwrapped.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise _refuse("env_id", env_id, "a task with discrete actions", f"its action space is {space}")
        self.max_candidates = int(space.n)
        recording = _ReadKeys(self.reset_options)
        try:
            self.unwrapped.reset(seed=0, options=recording or None)
        except Exception as exc:  # noqa: BLE001  (a task's reset raises what it raises)
            raise _refuse("reset", self.reset_options, f"the reset options {env_id} takes", f"reset: {exc}") from None
        unread = sorted(set(self.reset_options) - recording.read)
        if unread:
            raise _refuse(
                "reset",
                self.reset_options,
                f"keys {env_id}'s reset reads (it never read {', '.join(map(repr, unread))})",
                "a typo is refused, never ignored; the task's reset(options=...) says which keys it reads",
            )
        self._access = state_access
        if state_access is not None:
            self.kind = "user"
            width = self._read().size
        elif hasattr(self.unwrapped, "state") and self.unwrapped.state is not None:
            self.kind = "state"
            width = int(np.asarray(self.unwrapped.state, dtype=np.float64).size)
        elif hasattr(self.unwrapped, "s"):
            self.kind = "index"
            observations = self.unwrapped.observation_space
            if not isinstance(observations, gymnasium.spaces.Discrete):
                raise _refuse("env_id", env_id, "a toy-text task with discrete states", "its states are not an index")
            width = int(observations.n)
        else:
            raise _refuse(
                "env_id",
                env_id,
                "a task whose state qhlab can read and set (unwrapped.state or unwrapped.s)",
                "write an environment of your own for it (docs/how-to/bring-your-own-environment.md)",
            )
        self.width = width
        self.object_features = width + 1
        self.candidate_features = self.max_candidates
        self.shaping = _shaping(options.get("shaping"), 1 if self.kind == "index" else width)
        self.reward_unit = options.get("reward_unit", "")
        if not isinstance(self.reward_unit, str):
            raise _refuse("reward_unit", self.reward_unit, "a string, e.g. 'points'", 'reward_unit = "points"')
        spec = self.unwrapped.spec or made.spec
        self.identity = {
            "name": env_id,
            "version": "1",
            "gymnasium": gymnasium.__version__,
            "numpy": np.__version__,
            "entry_point": str(getattr(spec, "entry_point", "")),
            "spec_version": str(getattr(spec, "version", "")),
            "kwargs": json.dumps(self.kwargs, sort_keys=True),
            "state": {"state": "unwrapped.state", "index": "unwrapped.s", "user": "get_state/set_state"}[self.kind],
        }
        names = [(f"s{i}", "1") for i in range(width)] + [("done", "1")]
        self.feature_names = {
            "objects": names,
            "goal": [("goal", "1")],
            "candidates": [(f"action_{i}", "1") for i in range(self.max_candidates)],
        }

    # -- the state qhlab reads and sets ---------------------------------------------------------

    def _read(self) -> np.ndarray:
        if self.kind == "user":
            get_state = self._access[0]
            values = np.asarray(get_state(self.unwrapped), dtype=np.float64)
            if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
                raise _refuse(
                    "get_state",
                    f"an array of shape {values.shape}",
                    "a non-empty 1-D array of finite floats",
                    "return the values set_state sets, e.g. np.concatenate([data.qpos, data.qvel])",
                )
            return values.copy()
        if self.kind == "index":
            return np.array([float(int(self.unwrapped.s))], dtype=np.float64)
        return np.asarray(self.unwrapped.state, dtype=np.float64).ravel().copy()

    def _set(self, values: np.ndarray) -> None:
        if self.kind == "user":
            # A read-only copy: a set_state that kept the array and changed it later would change
            # a state qhlab holds.
            frozen = np.array(values, dtype=np.float64)
            frozen.flags.writeable = False
            self._access[1](self.unwrapped, frozen)
            return
        if self.kind == "index":
            self.unwrapped.s = int(values[0])
            return
        self.unwrapped.state = np.array(values, dtype=np.float64)
        # Per-episode memory the same (state, action) would otherwise step differently with.
        if hasattr(self.unwrapped, "steps_beyond_terminated"):
            self.unwrapped.steps_beyond_terminated = None

    # -- the contract -----------------------------------------------------------------------------

    def sample_scene(self, seed: int) -> dict:
        return {"reset_seed": int(seed) % (2**31)}

    def initial_state(self, scene: dict) -> np.ndarray:
        self.unwrapped.reset(seed=int(scene["reset_seed"]), options=self.reset_options or None)
        return np.concatenate([self._read(), [0.0]])

    def terminal(self, scene: dict, state: np.ndarray) -> bool:
        return bool(state[-1] == 1.0)

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        return self.max_candidates

    def step(self, scene: dict, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        self._set(state[:-1])
        _, reward, terminated, _, _ = self.unwrapped.step(int(action))
        after = self._read()
        reward = float(reward)
        if self.shaping is not None:
            reward += self._potential(after) - self._potential(state)
        return np.concatenate([after, [1.0 if terminated else 0.0]]), reward

    def _potential(self, state: np.ndarray) -> float:
        value = float(state[self.shaping["feature"]])
        return self.shaping["scale"] * (abs(value) if self.shaping["absolute"] else value)

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self.kind == "index":
            values = np.zeros(self.width, dtype=np.float64)
            values[int(state[0])] = 1.0
        else:
            values = np.asarray(state[:-1], dtype=np.float64)
        objects = np.concatenate([values, state[-1:]])[None, :]
        goal = np.ones(1, dtype=np.float64)
        actions = np.eye(self.max_candidates, dtype=np.float64)
        return objects, goal, actions, np.zeros(self.max_candidates, dtype=np.int64)


def make(options: dict[str, Any]) -> GymnasiumEnvironment:
    """The factory a preset names: ``factory = "qhlab.scenes.gymnasium:make"``, ``env_id`` among its options."""
    return GymnasiumEnvironment(dict(options))


def make_with_state(
    options: dict[str, Any],
    *,
    get_state: Callable[[Any], Any],
    set_state: Callable[[Any, np.ndarray], None],
) -> GymnasiumEnvironment:
    """A Gymnasium task whose state the researcher's own pair reads and sets.

    Call it from a factory of one's own (``factory = "my_task.py:make"``), so that the file holding
    the pair is frozen with the population like any environment of one's own::

        def make(options):
            return make_with_state(options, get_state=lambda env: env.state, set_state=_set)

    Args:
        options: as ``make``'s (``env_id``, ``kwargs``, ``reset``, ``shaping``, ``reward_unit``).
        get_state: ``get_state(unwrapped) -> [S]``, the task's whole state as a 1-D array of finite
            floats (everything its step depends on: the determinism probes refuse a pair that
            leaves part of it out).
        set_state: ``set_state(unwrapped, values)`` sets what ``get_state`` read (``values`` is
            read-only).

    Raises:
        QhInputError: a bad option, or a pair that is not two callables, or a ``get_state`` that
            returns no 1-D finite array.
    """
    if not callable(get_state) or not callable(set_state):
        raise _refuse(
            "get_state/set_state",
            (get_state, set_state),
            "two callables",
            "get_state(unwrapped) -> array and set_state(unwrapped, values)",
        )
    return GymnasiumEnvironment(dict(options), state_access=(get_state, set_state))
