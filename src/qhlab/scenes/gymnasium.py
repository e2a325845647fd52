"""Gymnasium environments by id: any deterministic task with discrete actions.

Owns: ``make(options)``, the factory a preset names as ``factory = "qhlab.scenes.gymnasium:make"``
with ``env_id = "CartPole-v1"`` (or ``"minigrid:MiniGrid-Empty-5x5-v0"``, ``"my_tasks:Task-v0"``:
resolved and bound by ``gymnasium_ids``); ``make_with_state(options, get_state=..., set_state=...)``, for a
factory of the researcher's own that says how its task's state is read and set; and
``GymnasiumEnvironment``, which puts a Gymnasium task under the environment contract
(``qhlab.scenes.contract``), with the refusals of options that cannot serve a study (a render
mode, ``gymnasium.make``'s own keywords, shaping without coordinates, a random step). Does not own:
Gymnasium, task ids (``gymnasium_ids``), whole-state snapshots and the randomness probe
(``gymnasium_state``), or labelling (``labels``, ``chains``).

How a task becomes a qhlab environment (the documented default):

* **The state** qhlab reads and sets is the task's own: ``unwrapped.state`` (classic control:
  CartPole, Acrobot, MountainCar, Pendulum-like tasks with discrete actions) or ``unwrapped.s``
  (toy text: FrozenLake, CliffWalking, Taxi), or what the researcher's own ``get_state(unwrapped)``
  returns and ``set_state(unwrapped, values)`` sets (``make_with_state``: any other task whose
  state can be set, a MuJoCo task's ``qpos`` and ``qvel`` among them), or, for a task with none
  of these, a whole-state snapshot (``gymnasium_state.Snapshots``: its observation's features,
  then the pickled instance attributes), followed by a done flag (1.0 once the episode has
  ended). A state is set before every step, and a task's hidden per-episode memory that would
  make the same (state, action) step differently (CartPole's ``steps_beyond_terminated``) is
  reset first; the determinism probes of generation refuse a task whose step still depends on
  anything else, and a task whose step draws from its random generator is refused when it is
  made (``gymnasium_state.random_steps``), naming the keyword that makes it deterministic.
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
  Gymnasium and numpy, a third-party task's package and version, one's own registration
  module's digest, and how the state is read (``unwrapped.state``, ``unwrapped.s`` or the
  researcher's pair, whose file is frozen with the population as any environment of one's own),
  bound in every manifest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from qhlab.evidence import QhInputError
from qhlab.execution.user_code import FrozenSource
from qhlab.scenes.environment import MAX_REWARD_MAGNITUDE
from qhlab.scenes.gymnasium_ids import parse_task_id, registered_task
from qhlab.scenes.gymnasium_state import Snapshots, flat_features, flat_size, random_steps, transition_table_randomness

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


def _shaping(shaping: Any, width: int, kind: str) -> dict | None:
    """The ``shaping`` option checked: ``{feature, scale, absolute}`` on one of the ``width`` state
    values of a state with coordinates, or None."""
    if shaping is None:
        return None
    if kind in ("index", "snapshot"):
        raise _refuse(
            "shaping",
            shaping,
            "shaping on a state with coordinates (unwrapped.state, or a state pair of one's own)",
            f"this task's state is {_STATE_WORDS[kind]}: it has no coordinate for a potential to read",
        )
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
        or abs(scale) > MAX_REWARD_MAGNITUDE
        or not isinstance(absolute, bool)
    ):
        raise _refuse(
            "shaping",
            shaping,
            f"{{ feature = an index of the state (0..{width - 1}), scale = a finite number of magnitude at most "
            f"{MAX_REWARD_MAGNITUDE:g}, absolute = true | false }}",
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
        registration: FrozenSource | None = None,
    ) -> None:
        import gymnasium

        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise _refuse("options", unknown, f"only {', '.join(_OPTIONS)}", "a typo is refused, never ignored")
        task = parse_task_id(options.get("env_id"), call=_CALL)
        env_id = task.text
        for name in ("kwargs", "reset"):
            if not isinstance(options.get(name, {}), dict):
                raise _refuse(name, options[name], "a table", f"{name} = {{ ... }}")
        self.kwargs, self.reset_options = dict(options.get("kwargs", {})), dict(options.get("reset", {}))
        _refuse_study_kwargs(self.kwargs)
        spec, bound = registered_task(task, registration, call=_CALL)
        _refuse_kwarg_types(gymnasium, spec, self.kwargs, env_id)
        made = _make(gymnasium, spec, env_id, self.kwargs)
        self.unwrapped = made.unwrapped
        space = self.unwrapped.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise _refuse("env_id", env_id, "a task with discrete actions", f"its action space is {space}")
        self.max_candidates = int(space.n)
        recording = _ReadKeys(self.reset_options)
        try:
            observation, _ = self.unwrapped.reset(seed=0, options=recording or None)
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
        self._snapshots: Snapshots | None = None
        self.features = 0
        if state_access is not None:
            self.kind = "user"
            width = self._read().size
        elif getattr(self.unwrapped, "state", None) is not None:
            self.kind = "state"
            width = int(np.asarray(self.unwrapped.state, dtype=np.float64).size)
        elif hasattr(self.unwrapped, "s") and isinstance(self.unwrapped.observation_space, gymnasium.spaces.Discrete):
            self.kind = "index"
            width = int(self.unwrapped.observation_space.n)
        else:
            self.kind = "snapshot"
            self.features = flat_size(self.unwrapped.observation_space)
            self._snapshots = Snapshots(self.unwrapped)
            self._observation = flat_features(self.unwrapped.observation_space, observation)
            width = self.features + self._snapshots.words
        self.width = width
        self.object_features = (self.features if self.kind == "snapshot" else width) + 1
        self.candidate_features = self.max_candidates
        self.shaping = _shaping(options.get("shaping"), width if self.kind in ("state", "user") else 0, self.kind)
        self.reward_unit = options.get("reward_unit", "")
        if not isinstance(self.reward_unit, str):
            raise _refuse("reward_unit", self.reward_unit, "a string, e.g. 'points'", 'reward_unit = "points"')
        self.episode_limit = _episode_limit(spec, self.kwargs, self.unwrapped)
        self._refuse_randomness(gymnasium, spec, env_id)
        self.identity = {
            "name": env_id,
            "version": "1",
            "gymnasium": gymnasium.__version__,
            "numpy": np.__version__,
            "entry_point": _entry_point_words(spec.entry_point),
            "spec_version": str(getattr(spec, "version", "")),
            "kwargs": json.dumps(self.kwargs, sort_keys=True),
            "state": _STATE_WORDS[self.kind],
            **bound,
        }
        if self.kind == "snapshot":
            names = [(f"o{i}", "1") for i in range(self.features)] + [("done", "1")]
        else:
            names = [(f"s{i}", "1") for i in range(width)] + [("done", "1")]
        self.feature_names = {
            "objects": names,
            "goal": [("goal", "1")],
            "candidates": [(f"action_{i}", "1") for i in range(self.max_candidates)],
        }

    # -- randomness, refused ----------------------------------------------------------------------

    def _probe_states(self) -> list[np.ndarray]:
        """The states the randomness probe steps: every state of a discrete task (up to 4096), else
        four resets' initial states and their successors."""
        if self.kind == "index" and self.width <= _MAX_ENUMERATED:
            return [np.array([float(s)]) for s in range(self.width)]
        states = []
        for seed in range(4):
            start = self.initial_state({"reset_seed": seed})
            states.append(start[:-1])
            for action in range(self.max_candidates):
                after, _ = self._raw_step(start, action)
                states.append(after[:-1])
        return states

    def _randomness(self) -> str | None:
        """Why the task's step is random (``gymnasium_state``), or None."""
        reason = transition_table_randomness(self.unwrapped)
        if reason is not None:
            return reason
        return random_steps(
            self.unwrapped,
            self._probe_states(),
            self.max_candidates,
            # A snapshot restores the whole state a reset left: only a partial state can keep a reset's coin.
            reset=None if self.kind == "snapshot" else self._reset_unseeded,
            set_state=self._set,
            outcome=lambda result: (self._read().tobytes(), float(result[1]), bool(result[2])),
            proven=self._table_gives if self.kind == "index" else None,
        )

    def _table_gives(self, state: np.ndarray, action: int, result: Any) -> bool:
        """The transition table gives (state, action) one outcome, and ``result`` (a step's) is it."""
        table = getattr(self.unwrapped, "P", None)
        row = table.get(int(state[0]), {}).get(action) if isinstance(table, dict) else None
        outcomes = {(int(s), float(r), bool(d)) for p, s, r, d in row or () if p > 0}
        return outcomes == {(int(result[0]), float(result[1]), bool(result[2]))}

    def _reset_unseeded(self) -> None:
        self.unwrapped.reset(seed=None, options=self.reset_options or None)

    def _refuse_randomness(self, gymnasium: Any, spec: Any, env_id: str) -> None:
        reason = self._randomness()
        if reason is None:
            return
        fix = self._deterministic_option(gymnasium, spec)
        hint = (
            f"kwargs = {{ {fix} = false }} makes it deterministic"
            if fix
            else "no option of the task makes it deterministic: write an environment of your own for it"
        )
        with_kwargs = f" (kwargs {json.dumps(self.kwargs, sort_keys=True)})" if self.kwargs else ""
        raise QhInputError(
            f"{_CALL}: env_id={env_id!r}{with_kwargs} is not allowed; allowed: a task whose step is deterministic "
            f"(qhlab's labels are exact returns of one deterministic step). HINT: {reason}; {hint}."
        )

    def _deterministic_option(self, gymnasium: Any, spec: Any) -> str | None:
        """A boolean keyword of the task's constructor that is on and, turned off, leaves no step random."""
        import inspect

        constructor = spec.entry_point if callable(spec.entry_point) else type(self.unwrapped)
        try:
            parameters = inspect.signature(constructor).parameters
        except (TypeError, ValueError):
            return None
        settings = {**dict(spec.kwargs or {}), **self.kwargs}
        original = self.unwrapped
        try:
            for name, parameter in parameters.items():
                if settings.get(name, parameter.default) is not True:
                    continue
                try:
                    self.unwrapped = gymnasium.make(spec, **{**self.kwargs, name: False}).unwrapped
                    self.unwrapped.reset(seed=0, options=self.reset_options or None)
                    if self._randomness() is None:
                        return name
                except Exception:  # noqa: BLE001, S112  (a keyword the task refuses off is no fix)
                    continue
        finally:
            self.unwrapped = original
        return None

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
        if self.kind == "snapshot":
            data = self._snapshots.take(self.unwrapped)
            packed = self._snapshots.pack(data)
            if packed is None:
                raise _refuse(
                    "env_id",
                    self.identity_name,
                    f"a task whose whole state stays within {self._snapshots.capacity} bytes (twice its reset's, "
                    "and 2 KiB)",
                    f"a state grew to {len(data)} bytes; give qhlab a state pair of your own (make_with_state)",
                )
            return np.concatenate([self._observation, packed])
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
        if self.kind == "snapshot":
            self._snapshots.restore(self.unwrapped, self._snapshots.unpack(values[self.features :]))
            self._observation = np.array(values[: self.features], dtype=np.float64)
            return
        self.unwrapped.state = np.array(values, dtype=np.float64)
        # Per-episode memory the same (state, action) would otherwise step differently with.
        if hasattr(self.unwrapped, "steps_beyond_terminated"):
            self.unwrapped.steps_beyond_terminated = None

    @property
    def identity_name(self) -> str:
        return str(getattr(getattr(self.unwrapped, "spec", None), "id", "") or "the task")

    def _raw_step(self, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        """The task's own step from ``state`` (done flag last), before shaping."""
        self._set(state[:-1])
        observation, reward, terminated, _, _ = self.unwrapped.step(int(action))
        if self.kind == "snapshot":
            self._observation = flat_features(self.unwrapped.observation_space, observation)
        return np.concatenate([self._read(), [1.0 if terminated else 0.0]]), float(reward)

    # -- the contract -----------------------------------------------------------------------------

    def sample_scene(self, seed: int) -> dict:
        return {"reset_seed": int(seed) % (2**31)}

    def initial_state(self, scene: dict) -> np.ndarray:
        observation, _ = self.unwrapped.reset(seed=int(scene["reset_seed"]), options=self.reset_options or None)
        if self.kind == "snapshot":
            self._observation = flat_features(self.unwrapped.observation_space, observation)
        return np.concatenate([self._read(), [0.0]])

    def terminal(self, scene: dict, state: np.ndarray) -> bool:
        return bool(state[-1] == 1.0)

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        return self.max_candidates

    def step(self, scene: dict, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        after, reward = self._raw_step(state, action)
        if self.shaping is not None:
            reward += self._potential(after) - self._potential(state)
        return after, reward

    def _potential(self, state: np.ndarray) -> float:
        value = float(state[self.shaping["feature"]])
        return self.shaping["scale"] * (abs(value) if self.shaping["absolute"] else value)

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self.kind == "index":
            values = np.zeros(self.width, dtype=np.float64)
            values[int(state[0])] = 1.0
        elif self.kind == "snapshot":
            values = np.asarray(state[: self.features], dtype=np.float64)
        else:
            values = np.asarray(state[:-1], dtype=np.float64)
        objects = np.concatenate([values, state[-1:]])[None, :]
        goal = np.ones(1, dtype=np.float64)
        actions = np.eye(self.max_candidates, dtype=np.float64)
        return objects, goal, actions, np.zeros(self.max_candidates, dtype=np.int64)


# -- the task made, and options that cannot serve a study -------------------------------------------

_STATE_WORDS = {
    "state": "unwrapped.state",
    "index": "unwrapped.s",
    "user": "get_state/set_state",
    "snapshot": "whole-state snapshot",
}
# A discrete task's randomness probe steps every state up to this many.
_MAX_ENUMERATED = 4096
# Keywords of gymnasium.make that qhlab decides itself, or that cannot serve a study.
_MAKE_KEYWORDS = ("max_episode_steps", "autoreset", "apply_api_compatibility", "disable_env_checker")


def _refuse_study_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse a render mode (it draws every step: a window, 1000x the step's time) and
    ``gymnasium.make``'s own keywords (qhlab steps the unwrapped task and its horizon is qhlab's)."""
    mode = kwargs.get("render_mode")
    if "render_mode" in kwargs and mode is not None:
        raise _refuse(
            "kwargs.render_mode",
            mode,
            "no render mode (leave it out)",
            "qhlab steps the task hundreds of thousands of times; rendering each step opens windows and slows it a "
            "thousandfold",
        )
    for name in _MAKE_KEYWORDS:
        if name in kwargs:
            raise _refuse(
                f"kwargs.{name}",
                kwargs[name],
                "the task's own keyword arguments only",
                f"{name} is gymnasium.make's, not the task's: qhlab steps the unwrapped task, and an episode's "
                "length is the preset's horizon",
            )


def _make(gymnasium: Any, spec: Any, env_id: str, kwargs: dict[str, Any]) -> Any:
    """``gymnasium.make(spec, **kwargs)``; a failure blamed on the missing extra, or on the one keyword it is."""
    try:
        return gymnasium.make(spec, **kwargs)
    except gymnasium.error.DependencyNotInstalled as exc:
        raise _refuse(
            "env_id", env_id, "a task whose dependencies are installed", f"{env_id} needs an extra: {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001  (a task's constructor raises what it raises)
        cause = f"{type(exc).__name__}: {exc}"
        for name in kwargs:
            try:
                gymnasium.make(spec, **{k: v for k, v in kwargs.items() if k != name})
            except Exception:  # noqa: BLE001, S112  (still failing without it: not this keyword)
                continue
            raise _refuse(
                f"kwargs.{name}",
                kwargs[name],
                f"a value {env_id}'s constructor accepts (it raised {cause})",
                f"see the task's documentation for {name}",
            ) from None
        raise _refuse("kwargs", kwargs, f"the keyword arguments {env_id} takes", f"making it raised {cause}") from None


def _refuse_kwarg_types(gymnasium: Any, spec: Any, kwargs: dict[str, Any], env_id: str) -> None:
    """Refuse a keyword whose value is not of its default's type (the registered one, else the
    constructor's), before the task is made with it (a constructor takes ``is_slippery = "no"`` as
    true, silently): a bool for a bool, an int for an int, a number for a float, a string for a
    string. Keywords whose default is None or that the signature does not name are the task's."""
    import inspect

    try:
        creator = spec.entry_point
        if not callable(creator):
            creator = gymnasium.envs.registration.load_env_creator(creator)
        parameters = inspect.signature(creator).parameters
    except Exception:  # noqa: BLE001  (an entry point that does not load is refused when it is made)
        return
    registered = dict(spec.kwargs or {})
    kinds = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"))
    for name, value in kwargs.items():
        parameter = parameters.get(name)
        default = registered.get(name, None if parameter is None else parameter.default)
        for kind, words in kinds:
            if isinstance(default, kind):
                if kind is float:
                    fits = isinstance(value, int | float) and not isinstance(value, bool)
                elif kind is int:
                    fits = isinstance(value, int) and not isinstance(value, bool)
                else:
                    fits = isinstance(value, kind)
                if not fits:
                    raise _refuse(
                        f"kwargs.{name}",
                        value,
                        f"{words}, as {env_id}'s default {default!r} is",
                        "a value of another type is taken by the task without a word (a non-empty string is true)",
                    )
                break


def _episode_limit(spec: Any, kwargs: dict[str, Any], unwrapped: Any) -> int | None:
    """The task's own episode limit: its spec's ``max_episode_steps``, or a step limit it keeps itself."""
    limits = [getattr(spec, "max_episode_steps", None), getattr(unwrapped, "max_steps", None)]
    limits = [int(v) for v in limits if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return min(limits) if limits else None


def _entry_point_words(entry: Any) -> str:
    """An entry point as the identity binds it (a callable by its module and name)."""
    if callable(entry):
        module = str(getattr(entry, "__module__", ""))
        # A frozen copy's module name carries its digest: the identity names the module as written.
        if module.startswith("_qhlab_user_"):
            module = module.split("_", 4)[-1]
        return f"{module}:{getattr(entry, '__qualname__', getattr(entry, '__name__', ''))}"
    return str(entry)


def make(options: dict[str, Any], *, registration: FrozenSource | None = None) -> GymnasiumEnvironment:
    """The factory a preset names: ``factory = "qhlab.scenes.gymnasium:make"``, ``env_id`` among its options.

    Args:
        options: the preset's options (see the module docstring).
        registration: the frozen copy of the researcher's own module that registers the task
            (``env_id = "my_tasks:MyTask-v0"``); qhlab passes it when the population freezes one.
    """
    return GymnasiumEnvironment(dict(options), registration=registration)


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
