"""The environment contract, checked: the researcher's own problem, and everything qhlab asks of it.

The contract's type, with each member's documentation, is ``qhlab.scenes.contract``
(``EnvironmentContract`` and ``OptionalMembers``); the member lists this module checks are derived
from it. In short:

An environment supplies only the problem, through a factory ``make(options: dict) -> env`` named
``"my_env.py:make"`` (relative to the preset file that names it) or ``"package.module:make"``.
The env object has:

* ``identity``: a mapping of strings (name, version, engine versions), bound in every manifest;
* ``object_features``, ``goal_features``, ``candidate_features``, ``max_objects``,
  ``max_candidates``: ints (F, G, C, the most objects and candidates a state has);
* ``sample_scene(seed: int) -> dict``: a JSON object, deterministic in ``seed`` (qhlab draws one
  256-bit seed per scene from the population's seed, split and scene index);
* ``initial_state(scene) -> numpy.ndarray``: a 1-D float64 state;
* ``candidates(scene, state) -> int``: how many candidates the state offers (1..max_candidates);
  candidate i is action i;
* ``step(scene, state, action) -> (numpy.ndarray, float)``: the successor state and the reward
  (finite, of magnitude at most ``MAX_REWARD_MAGNITUDE``), deterministic;
* ``observe(scene, state) -> (objects [n, F], goal [G], candidate_features [k, C],
  candidate_object [k])``: float64 / int64 arrays, ``candidate_object`` -1 where a candidate acts
  on no object.

Optional members (the built-in puck world uses them to keep its file layout): ``terminal(scene, state) -> bool`` (an
episode end: a terminal state is absorbing, every candidate leads back to it with reward 0, so the tree search, the
labels and every check treat it alike without the environment stepping it), ``feature_names`` (``{"objects" | "goal"
| "candidates": [(name, unit), ...]}``), ``state_column`` (the states table's name for the state, default
``"state"``), ``reward_unit`` (the unit every reward, label, MAE and regret is in, e.g. ``"m"`` or ``"points"``;
default ``""``: the environment's own reward, unnamed; bound in the manifest and written after every such number
qhlab prints), ``reference_candidate`` (the name of candidate 0 in the difficulty card, default
``"first_candidate"``), ``scene_id(scene, *, split, seed, scene_index) -> int`` and ``generator_record(preset, *,
split, seed) -> dict``.

Owns: ``EnvironmentSpec`` (a factory, its options and, for the researcher's own code, its frozen source),
``Environment`` (an env made from a spec, its checked members, and every call into it: a failure inside the user's
code becomes one error naming the environment, the method, the user's file and line, and each result is checked:
shapes and dtypes, candidate counts, finiteness) and the source of a user environment read for generation
(``read_environment_source``). Does not own: the probes of generation (``probes.check_contract``: determinism, JSON
scenes), importing frozen copies (``qhlab.execution.user_code``), presets (``presets``) or what qhlab does with an
environment (``labels``, ``chains``, ``population``, ``audit``).
"""

from __future__ import annotations

import functools
import math
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qhlab.evidence import QhError, QhInputError, canonical_json, sha256_bytes
from qhlab.execution.user_code import (
    ENTRY_FORMS,
    UNFROZEN_HINT,
    FrozenSource,
    UnfrozenImportError,
    file_digests,
    missing_sibling,
    parse_entry,
    provide,
    read_source,
    source_digest,
    unbound_modules,
)
from qhlab.scenes.contract import REQUIRED_METHODS, REQUIRED_SIZES

__all__ = [
    "BUILTIN_PREFIX",
    "Environment",
    "EnvironmentSpec",
    "UserCodeError",
    "dataclass_options",
    "read_environment_source",
    "sampling_record",
]

# A factory in qhlab's own package is built in: imported from the installed qhlab, never copied.
BUILTIN_PREFIX = "qhlab."
# A unit is printed after every reward-valued number: a word or a symbol, never a sentence.
_MAX_UNIT = 24
_SIZES = REQUIRED_SIZES
_METHODS = REQUIRED_METHODS
_MAX_PADDED = 4096
_FLOAT64 = np.dtype(np.float64)
# The largest reward magnitude one step may return. A label sums up to H <= 8 rewards, the
# report subtracts labels and squares differences, and the scorer trains in float32: with this
# bound every one of those stays finite with room to spare, where a larger (finite) reward
# would overflow only after minutes of labelling. A reward on such a scale is declared in a
# larger unit.
MAX_REWARD_MAGNITUDE = 1e9


class UserCodeError(QhInputError):
    """An exception raised inside a user environment's code, with the user's frames."""


# The states table's own columns, which a state column may not be named; and the difficulty card's
# policies, which the reference candidate's name may not be (its row of the card would be theirs).
_STATE_TABLE_COLUMNS = frozenset(
    {"state_id", "scene_id", "chain_id", "step", "parent_state_id", "num_objects", "objects", "goal"}
)
_CARD_POLICIES = frozenset({"uniform", "fixed_index", "best_fixed_index", "myopic_oracle"})


@dataclass(frozen=True)
class EnvironmentSpec:
    """What makes an environment: its factory, its options and (user code) its frozen source.

    Attributes:
        factory: ``"package.module:make"`` or ``"my_env.py:make"``.
        options: the dict the factory is called with (JSON types).
        source: a user environment's source record ``{"module", "function", "files": {rel:
            sha256}, "sha256"}``; None for a built-in one.
        files: the source's bytes ``{rel: bytes}`` when they travel with the spec (generation,
            a pool or Ray worker); None: read them from ``root``.
        root: the directory holding the source's copy (a population's ``environment/``, or the
            user's directory at generation).
    """

    factory: str
    options: dict = field(default_factory=dict)
    source: dict | None = None
    files: dict[str, bytes] | None = field(default=None, repr=False, compare=False)
    root: str | None = None

    @property
    def builtin(self) -> bool:
        """The factory is qhlab's own (imported from the installed package, never copied)."""
        return self.factory.startswith(BUILTIN_PREFIX)

    @property
    def key(self) -> str:
        """What identifies the environment this spec makes: factory, options and source digest."""
        record = {
            "factory": self.factory,
            "options": self.options,
            "source": None if self.source is None else self.source["sha256"],
        }
        return sha256_bytes(canonical_json(record))

    def record(self) -> dict:
        """The spec as a manifest binds it (the source's file digests, not its bytes)."""
        return {"factory": self.factory, "options": self.options, "source": self.source}


def read_environment_source(factory: str, base: Path | None, *, call: str) -> tuple[dict, dict[str, bytes], Path]:
    """Read a user environment's source from the user's files, for generation.

    Returns:
        (the source record, its bytes ``{rel: bytes}``, the directory they were read below).

    Raises:
        QhInputError: a malformed factory, or a missing or non-Python source.
    """
    try:
        located, files = read_source(factory, base or Path.cwd(), field="environment.factory")
    except ValueError as exc:
        reason = str(exc)
        if not reason.startswith("environment.factory="):  # a malformed entry's reason says it all already
            reason = f"environment.factory={factory!r} is not allowed; allowed: {ENTRY_FORMS} ({reason})"
        raise QhInputError(
            f"{call}: {reason}. HINT: a relative file is found beside the preset file that names it."
        ) from None
    digests = file_digests(files)
    record = {
        "module": located.module,
        "function": located.function,
        "files": digests,
        "sha256": source_digest(digests),
    }
    return record, files, located.path.parent


def _refuse_unfrozen(
    call: str, label: str, spec: EnvironmentSpec, exc: BaseException | None, loaded: list[str]
) -> None:
    """Refuse a source whose import reached for code that is not frozen with it."""
    sibling = None if exc is None else missing_sibling(Path(spec.root or "."), exc)
    if sibling is not None:
        raise QhInputError(
            f"{call}: {label}: its source imports {sibling!r}, a module beside it that is not frozen with it. "
            f"HINT: {UNFROZEN_HINT}."
        )
    unbound = unbound_modules(spec.source["module"], loaded) if spec.source else []
    if unbound:
        name, file = unbound[0]
        raise QhInputError(
            f"{call}: {label}: importing it loaded module {name!r} from {file!r}, which is not in its frozen "
            f"source. HINT: {UNFROZEN_HINT}; installed packages are imported as usual."
        )


def _user_frames(exc: BaseException, roots: tuple[str, ...]) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that are in the user's files (below ``roots``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [f for f in frames if any(f.filename.startswith(r) for r in roots)]


@dataclass
class Environment:
    """An environment made from its spec: its checked members and every call into it.

    Attributes:
        spec: what made it.
        env: the object the factory returned.
        name: how messages name it (its identity's ``name``, else its factory).
        identity: its identity, as strings.
        object_features, goal_features, candidate_features, max_objects, max_candidates: its sizes.
        state_column, reference_candidate: its optional layout names (with their defaults).
        reward_unit: the unit of its rewards ("" when it names none).
        source_files: a frozen source as it was imported ``{rel: bytes}`` (None: built in).
    """

    spec: EnvironmentSpec
    env: Any
    name: str
    identity: dict[str, str]
    object_features: int
    goal_features: int
    candidate_features: int
    max_objects: int
    max_candidates: int
    state_column: str = "state"
    reference_candidate: str = "first_candidate"
    reward_unit: str = ""
    source_files: dict[str, bytes] | None = None
    _roots: tuple[str, ...] = ()

    @classmethod
    def make(cls, spec: EnvironmentSpec, *, call: str = "environment") -> Environment:
        """Import the factory (a built-in module, or the frozen copy of the user's source), call it
        with the spec's options and check the members the contract requires.

        Raises:
            QhInputError: a factory that is missing, not callable or raises, or an env object
                without a contract member or with one of the wrong type (one line each).
        """
        label = f"environment {spec.factory!r}"
        try:
            entry = parse_entry(spec.factory, field="environment.factory")
        except ValueError as exc:
            raise QhInputError(f"{call}: {exc}") from None
        roots: tuple[str, ...] = ()
        source = None
        if spec.source is not None:
            root = Path(spec.root or ".")
            source = provide(
                FrozenSource(
                    owner=label,
                    entry=spec.factory,
                    root=root,
                    module=spec.source["module"],
                    function=spec.source["function"],
                    files=dict(spec.source["files"]),
                    preloaded=spec.files,
                )
            )
            roots = (str(root.resolve()) + "/", str(root) + "/")
        if spec.builtin:
            import importlib

            try:
                module = importlib.import_module(entry.module)
            except ImportError as exc:
                raise QhInputError(f"{call}: {label}: no module {entry.module!r} ({exc}).") from None
            factory = getattr(module, entry.function, None)
            if source is not None and callable(factory):
                # A built-in factory with the researcher's frozen code (a Gymnasium task's registration).
                factory = functools.partial(factory, registration=source)
        elif source is None:
            raise QhInputError(f"{call}: {label} is user code without a frozen source record.")
        else:
            before = set(sys.modules)
            try:
                factory = source.entry_function()
            except QhError as exc:
                if "has no callable" in str(exc):
                    factory = None
                else:
                    raise
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed to import
                _refuse_unfrozen(call, label, spec, exc, [])
                raise _user_error(call, label, "import", exc, roots) from None
            _refuse_unfrozen(call, label, spec, None, sorted(set(sys.modules) - before))
            roots += (str(source.origin_root) + "/",)
        if factory is None or not callable(factory):
            raise QhInputError(
                f"{call}: {label}: {entry.function!r} is missing or not callable in {entry.module!r}. HINT: the "
                "factory is make(options: dict) -> env."
            )
        before = set(sys.modules)
        try:
            env = factory(dict(spec.options))
        except QhInputError as exc:
            # A refusal qhlab raised itself (a built-in factory's, or a qhlab helper the user's factory
            # called, such as make_with_state) is the preset's input error, already naming the option,
            # the value and what is allowed: not an error in the user's code.
            if spec.builtin or _raised_by_qhlab(exc):
                raise
            raise _user_error(call, label, "make(options)", exc, roots) from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - one refusal naming the user's line
            raise _user_error(call, label, "make(options)", exc, roots) from None
        if spec.builtin and source is not None:
            _refuse_unfrozen(call, label, spec, None, sorted(set(sys.modules) - before))
        made = cls._checked(spec, env, label, roots, call)
        if source is not None:
            made.source_files = dict(source.preloaded or {})
        return made

    @classmethod
    def _checked(cls, spec: EnvironmentSpec, env: Any, label: str, roots: tuple[str, ...], call: str) -> Environment:
        if isinstance(env, type):
            raise QhInputError(
                f"{call}: {label}: make(options) returned the class {env.__name__!r}; allowed: an environment "
                f"object. HINT: return an instance, e.g. {env.__name__}(options), not the class."
            )
        problems = []
        identity = getattr(env, "identity", None)
        if (
            not isinstance(identity, Mapping)
            or not identity
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in identity.items())
        ):
            problems.append(f"identity={identity!r} (allowed: a non-empty mapping of strings to strings)")
        sizes = {}
        for name in _SIZES:
            value = getattr(env, name, None)
            # Every state's arrays are padded to max_objects and max_candidates: a bound far above
            # what a state holds would size every load and check by it, not by the population.
            limit = _MAX_PADDED if name in ("max_objects", "max_candidates") else 1_000_000
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= int(value) <= limit:
                problems.append(f"{name}={value!r} (allowed: an int in [1, {limit}])")
            else:
                sizes[name] = int(value)
        for name in _METHODS:
            if not callable(getattr(env, name, None)):
                problems.append(f"{name} is missing or not callable")
        state_column = getattr(env, "state_column", "state")
        reference = getattr(env, "reference_candidate", "first_candidate")
        for name, value, taken in (
            ("state_column", state_column, _STATE_TABLE_COLUMNS),
            ("reference_candidate", reference, _CARD_POLICIES),
        ):
            if not isinstance(value, str) or not value.isidentifier():
                problems.append(f"{name}={value!r} (allowed: an identifier)")
            elif value in taken:
                problems.append(f"{name}={value!r} (allowed: an identifier other than {', '.join(sorted(taken))})")
        reward_unit = getattr(env, "reward_unit", "")
        if not isinstance(reward_unit, str) or len(reward_unit) > _MAX_UNIT or not reward_unit.isprintable():
            problems.append(
                f"reward_unit={reward_unit!r} (allowed: a printable string of at most {_MAX_UNIT} characters)"
            )
        if problems:
            raise QhInputError(
                f"{call}: {label}: the object make(options) returned breaks the environment contract: "
                + "; ".join(problems)
                + ". HINT: see the contract in docs/how-to/bring-your-own-environment.md."
            )
        name = identity.get("name", spec.factory)
        return cls(
            spec,
            env,
            name,
            dict(identity),
            **sizes,
            state_column=state_column,
            reference_candidate=reference,
            reward_unit=reward_unit.strip(),
            _roots=roots,
        )

    # -- calls into the environment -------------------------------------------------------------

    def _fail(self, method: str, exc: BaseException) -> UserCodeError:
        return _user_error(None, f"environment {self.name!r}", method, exc, self._roots)

    def sample_scene(self, seed: int) -> dict:
        """The scene drawn for ``seed`` (a JSON object)."""
        try:
            scene = self.env.sample_scene(seed)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail("sample_scene(seed)", exc) from None
        if not isinstance(scene, dict) or not scene:
            raise self._refuse("sample_scene(seed)", f"returned {type(scene).__name__}; allowed: a non-empty dict")
        return scene

    def initial_state(self, scene: dict) -> np.ndarray:
        """The scene's initial state, a 1-D float64 array."""
        try:
            state = self.env.initial_state(scene)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail("initial_state(scene)", exc) from None
        return self._state("initial_state(scene)", state)

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        """How many candidates ``state`` offers, 1..max_candidates."""
        try:
            k = self.env.candidates(scene, state)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail("candidates(scene, state)", exc) from None
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.max_candidates:
            raise self._refuse(
                "candidates(scene, state)", f"returned {k!r}; allowed: an int in 1..{self.max_candidates}"
            )
        return int(k)

    def terminal(self, scene: dict, state: np.ndarray) -> bool:
        """Whether ``state`` ends an episode (False for an environment without ``terminal``)."""
        own = getattr(self.env, "terminal", None)
        if own is None:
            return False
        try:
            found = own(scene, state)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail("terminal(scene, state)", exc) from None
        if not isinstance(found, (bool, np.bool_)):
            raise self._refuse("terminal(scene, state)", f"returned {found!r}; allowed: True or False")
        return bool(found)

    def step(
        self, scene: dict, state: np.ndarray, action: int, *, scene_index: int | None = None
    ) -> tuple[np.ndarray, float]:
        """The successor of ``state`` under ``action`` and its reward; a terminal state is
        absorbing: itself, reward 0, without the environment's ``step``.

        Args:
            scene, state, action: what the environment's own ``step`` is passed.
            scene_index: the scene's index in its population, named in a refusal (None: unknown).

        Raises:
            QhInputError: a successor that is not a finite 1-D float64 array, or a reward that is
                not a number of magnitude at most ``MAX_REWARD_MAGNITUDE``; naming the
                environment, the step and the scene.
        """
        if self.terminal(scene, state):
            return np.array(state, dtype=np.float64), 0.0
        try:
            after, reward = self.env.step(scene, state, action)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail(f"step(scene, state, {action})", exc) from None
        # The tree search calls this for every simulation: the common, valid case is checked in
        # a few type tests, the rest (and every refusal) below.
        if (
            type(after) is np.ndarray
            and type(reward) is float
            and after.dtype == _FLOAT64
            and after.ndim == 1
            and 0 < after.size <= 64
            and -MAX_REWARD_MAGNITUDE <= reward <= MAX_REWARD_MAGNITUDE  # False for NaN too
            and all(map(math.isfinite, after.tolist()))
        ):
            return after, reward
        method = f"step(scene, state, {action})" + ("" if scene_index is None else f" of scene {scene_index}")
        after = self._state(method, after)
        if isinstance(reward, bool) or not isinstance(reward, (int, float, np.floating, np.integer)):
            raise self._refuse(method, f"returned reward {reward!r}; allowed: a number")
        reward = float(reward)
        if not math.isfinite(reward):
            raise self._refuse(method, f"returned reward {reward!r}; allowed: a finite number")
        if abs(reward) > MAX_REWARD_MAGNITUDE:
            raise QhInputError(
                f"environment {self.name!r}: {method} returned reward {reward!r}; allowed: a finite number of "
                f"magnitude at most {MAX_REWARD_MAGNITUDE:g} (a label sums up to H rewards and the scorer trains in "
                "float32, so a larger reward overflows a label). HINT: declare the reward in a larger unit (divide "
                "it, and name the unit in reward_unit); see the environment contract in "
                "docs/how-to/bring-your-own-environment.md."
            )
        return after, reward

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(objects [n, F] float64, goal [G] float64, candidate features [k, C] float64,
        candidate objects [k] int64), checked against the sizes and ``candidates``."""
        method = "observe(scene, state)"
        try:
            out = self.env.observe(scene, state)
            objects, goal, features, struck = out
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise self._fail(method, exc) from None
        k = self.candidates(scene, state)
        checks = (
            ("objects", objects, np.float64, 2, (None, self.object_features)),
            ("goal", goal, np.float64, 1, (self.goal_features,)),
            ("candidate_features", features, np.float64, 2, (k, self.candidate_features)),
            ("candidate_object", struck, np.int64, 1, (k,)),
        )
        for what, value, dtype, ndim, shape in checks:
            if (
                not isinstance(value, np.ndarray)
                or value.dtype != dtype
                or value.ndim != ndim
                or any(want is not None and got != want for got, want in zip(value.shape, shape, strict=True))
            ):
                got = f"{type(value).__name__}" if not isinstance(value, np.ndarray) else f"{value.dtype} {value.shape}"
                want = "x".join("n" if s is None else str(s) for s in shape)
                raise self._refuse(method, f"returned {what} of {got}; allowed: {np.dtype(dtype).name} [{want}]")
        n = objects.shape[0]
        if not 1 <= n <= self.max_objects:
            raise self._refuse(method, f"returned {n} objects; allowed: 1..{self.max_objects}")
        for what, value in (("objects", objects), ("goal", goal), ("candidate_features", features)):
            if not np.isfinite(value).all():
                raise self._refuse(method, f"returned a non-finite value in {what}")
        if ((struck < -1) | (struck >= n)).any():
            raise self._refuse(method, f"returned candidate_object {struck.tolist()}; allowed: -1 or 0..{n - 1}")
        return objects, goal, features, struck

    def _state(self, method: str, state: Any) -> np.ndarray:
        if not isinstance(state, np.ndarray) or state.dtype != np.float64 or state.ndim != 1 or state.size == 0:
            got = type(state).__name__ if not isinstance(state, np.ndarray) else f"{state.dtype} {state.shape}"
            raise self._refuse(method, f"returned a state of {got}; allowed: a non-empty 1-D float64 array")
        # Small states (the common case) are checked in Python: a numpy call costs a cheap step 10%.
        if not (all(map(math.isfinite, state.tolist())) if state.size <= 64 else np.isfinite(state).all()):
            raise self._refuse(method, "returned a state with a non-finite value")
        return state

    def _refuse(self, method: str, what: str) -> QhInputError:
        return QhInputError(
            f"environment {self.name!r}: {method} {what}. HINT: see the environment contract in "
            "docs/how-to/bring-your-own-environment.md."
        )

    # -- optional members, with their defaults ----------------------------------------------------

    def feature_names(self) -> dict[str, list[dict[str, str]]]:
        """``{"objects" | "goal" | "candidates": [{"name", "unit"}, ...]}`` (the env's, else numbered)."""
        declared = getattr(self.env, "feature_names", None)
        sizes = {"objects": self.object_features, "goal": self.goal_features, "candidates": self.candidate_features}
        out = {}
        for part, width in sizes.items():
            names = None if not isinstance(declared, Mapping) else declared.get(part)
            if names is None:
                out[part] = [
                    {"name": f"{part[:-1] if part != 'goal' else part}_{i}", "unit": "1"} for i in range(width)
                ]
            elif len(names) != width or not all(len(n) == 2 and all(isinstance(x, str) for x in n) for n in names):
                raise self._refuse("feature_names", f"[{part!r}] holds {names!r}; allowed: {width} (name, unit) pairs")
            else:
                out[part] = [{"name": n, "unit": u} for n, u in names]
        return out

    def scene_id(self, scene: dict, *, split: str, seed: int, scene_index: int) -> int:
        """A 62-bit id of the scene, bound to its split, seed, index and content (the env's, if it
        declares one)."""
        own = getattr(self.env, "scene_id", None)
        if callable(own):
            try:
                found = own(scene, split=split, seed=seed, scene_index=scene_index)
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                raise self._fail("scene_id(scene, ...)", exc) from None
            if isinstance(found, bool) or not isinstance(found, (int, np.integer)) or not 0 <= int(found) < 2**63:
                raise self._refuse("scene_id(scene, ...)", f"returned {found!r}; allowed: an int in [0, 2**63)")
            return int(found)
        record = {
            "environment": self.identity,
            "split": split,
            "seed": seed,
            "scene_index": scene_index,
            "scene": scene,
        }
        return int(sha256_bytes(canonical_json(record))[:16], 16) >> 2

    def generator_record(self, preset: Any, *, split: str, seed: int, generator_version: int) -> dict:
        """What a manifest records of how its population was generated (the env's, if it declares one)."""
        own = getattr(self.env, "generator_record", None)
        if callable(own):
            try:
                record = own(preset, split=split, seed=seed)
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                raise self._fail("generator_record(preset, ...)", exc) from None
            try:
                canonical_json(record)
            except (TypeError, ValueError, QhError):
                record = None
            if not isinstance(record, dict) or not all(isinstance(k, str) for k in record):
                raise self._refuse(
                    "generator_record(preset, ...)", "returned no JSON object; allowed: a dict of JSON values"
                )
            # A researcher's own record layout still binds the unit its labels are in (the
            # built-in puck world's record binds its engine, whose unit is the metre).
            if not self.spec.builtin:
                record = {**record, "reward_unit": self.reward_unit}
            return record
        return {
            "environment": {**self.spec.record(), "identity": self.identity, "reward_unit": self.reward_unit},
            "generator_version": generator_version,
            "preset_parameters": preset.record(),
            **sampling_record(preset, split=split, seed=seed),
        }


def sampling_record(preset: Any, *, split: str, seed: int) -> dict:
    """What every environment's generator record says of how its population was drawn: the preset,
    the split and seed, the actor and the seed stream of its scenes and chains, and the labels' dtype."""
    return {
        "preset": preset.name,
        "split": split,
        "seed": seed,
        "actor": {
            "kind": preset.actor.kind,
            "epsilon": preset.actor.epsilon,
            "seed_stream": "SeedSequence(seed, spawn_key=(split, scene_index, 1 + chain))",
        },
        "label_dtype": "float64",
    }


def _raised_by_qhlab(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in qhlab's own source (its innermost frame), not in user code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_QHLAB_SOURCE)


_QHLAB_SOURCE = Path(__file__).resolve().parents[1]


def _user_error(call: str | None, label: str, method: str, exc: BaseException, roots: tuple[str, ...]) -> UserCodeError:
    """One error for an exception inside user code: the method, the exception, the user's frames."""
    if isinstance(exc, UnfrozenImportError):
        return UserCodeError(("" if call is None else f"{call}: ") + f"{label}: {method}: {exc}")
    frames = _user_frames(exc, roots) if roots else []
    where = ""
    if frames:
        last = frames[-1]
        # Named below this environment's own root (roots[0]), though an identical copy imported
        # first in this process may be the module that ran: the bytes are the same.
        matched = next(r for r in roots if last.filename.startswith(r))
        filename = roots[0] + last.filename[len(matched) :]
        where = f" at {filename}, line {last.lineno}" + (f": {last.line.strip()}" if last.line else "")
    kind = "exited" if isinstance(exc, SystemExit) else "raised"
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error = UserCodeError(
        ("" if call is None else f"{call}: ")
        + f"{label}: {method} {kind} {text}{where}. HINT: the error is in the environment's own code; "
        "--verbose shows the whole traceback."
    )
    error.__cause__ = exc if not isinstance(exc, SystemExit) else None
    return error


def dataclass_options(cls: type, options: Any, *, what: str, example: str) -> Any:
    """A built-in environment's parameters from a preset's ``[environment.options]``, every value
    checked against the type of its default (numbers are numbers, never booleans or strings;
    lists are lists of them; tables are the nested parameters), every other at its default.

    Args:
        cls: a frozen dataclass whose fields all have defaults.
        options: the options table.
        what: the environment, as refusals name it (``"puck world"``).
        example: a preset file to compare with, for the hint.

    Returns:
        ``cls(**options)``, lists turned into tuples.

    Raises:
        QhInputError: an unknown option, or a value of the wrong type (naming the option).
    """
    if not isinstance(options, dict):
        raise QhInputError(f"{what}: options={options!r} is not allowed; allowed: a table. HINT: see {example}.")
    defaults = cls()
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise QhInputError(
            f"{what}: options {unknown} are not allowed; allowed: {', '.join(sorted(known))}. HINT: see {example}."
        )
    values = {}
    for name, value in options.items():
        default = getattr(defaults, name)
        label = f"{what}: options.{name}={value!r} is not allowed; allowed: "
        if is_dataclass(default):
            values[name] = dataclass_options(type(default), value, what=f"{what}: options.{name}", example=example)
        elif isinstance(default, tuple):
            kind = type(default[0]) if default else float
            if not isinstance(value, (list, tuple)) or not all(_of_kind(v, kind) for v in value):
                raise QhInputError(f"{label}a list of {_KIND_WORDS[kind]}. HINT: see {example}.")
            values[name] = tuple(value)
        elif not _of_kind(value, type(default)):
            raise QhInputError(f"{label}{_KIND_WORDS[type(default)][:-1]}. HINT: see {example}.")
        else:
            values[name] = value
    return cls(**values)


_KIND_WORDS = {float: "numbers", int: "integers", bool: "booleans", str: "strings"}


def _of_kind(value: Any, kind: type) -> bool:
    """A TOML value of a default's kind: a float default takes an int too; a boolean is only a boolean."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)
