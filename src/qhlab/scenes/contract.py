"""The environment contract as a type: what qhlab asks of the researcher's environment.

Owns: ``EnvironmentContract`` (the members every environment has, a runtime-checkable
``Protocol``), ``OptionalMembers`` (the members an environment may add, each with the default qhlab
uses without it) and the member lists derived from both (``REQUIRED_SIZES``,
``REQUIRED_METHODS``, ``OPTIONAL_MEMBERS``). The built-in environments (``qhlab.scenes.puck``,
``qhlab.scenes.tanks``, ``qhlab.scenes.gymnasium``) declare it as their factory's return type.
Does not own: checking an object against the contract, with one error that names every broken
member (``qhlab.scenes.environment.Environment``), or the checks at generation (determinism,
shapes, finiteness: ``qhlab.scenes.probes.check_contract``).

An environment is made by a factory ``make(options: dict) -> EnvironmentContract`` named in a
preset (``"my_env.py:make"`` relative to the preset file, or ``"package.module:make"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["OPTIONAL_MEMBERS", "REQUIRED_METHODS", "REQUIRED_SIZES", "EnvironmentContract", "OptionalMembers"]


@runtime_checkable
class EnvironmentContract(Protocol):
    """The members every environment has.

    The sizes are ints in [1, 4096] (``max_objects``, ``max_candidates``: every state's arrays are
    padded to them) or [1, 1,000,000] (the feature counts). Every method is deterministic in its
    arguments: qhlab calls them in any order, in any process, as often as it likes, and checks
    this at generation (the same call twice, in reverse order, in a fresh interpreter). A method
    may not keep per-episode memory that changes what a later call returns.

    Attributes:
        identity: strings that name the environment and its engine's versions (non-empty); bound
            in every manifest, so a population records what made its labels.
        object_features: F, the features of one object.
        goal_features: G, the features of the goal (at least 1: a task with no goal returns a
            constant, which costs nothing and keeps the scorer's goal token).
        candidate_features: C, the features of one candidate action.
        max_objects: the most objects a state has.
        max_candidates: the most candidates a state offers.
    """

    identity: Mapping[str, str]
    object_features: int
    goal_features: int
    candidate_features: int
    max_objects: int
    max_candidates: int

    def sample_scene(self, seed: int) -> dict:
        """The scene drawn from ``seed`` (qhlab draws one 256-bit seed per scene from the
        population's seed, split and scene index): a JSON object, the same for the same seed."""
        ...

    def initial_state(self, scene: dict) -> np.ndarray:
        """The scene's first state: a 1-D float64 array ``[S]``."""
        ...

    def candidates(self, scene: dict, state: np.ndarray) -> int:
        """How many candidates ``state`` offers, in [1, max_candidates]; candidate i is action i."""
        ...

    def step(self, scene: dict, state: np.ndarray, action: int) -> tuple[np.ndarray, float]:
        """The successor state ``[S]`` and the finite reward of taking candidate ``action``."""
        ...

    def observe(self, scene: dict, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the scorer sees of ``state``.

        Returns:
            ``(objects [n, F] float64, goal [G] float64, candidate_features [k, C] float64,
            candidate_object [k] int64)``, with n <= max_objects, k = ``candidates(scene,
            state)``, and ``candidate_object[i]`` the object candidate i acts on (-1: none).
        """
        ...


class OptionalMembers(Protocol):
    """The members an environment may add; without one, qhlab uses the default named.

    Attributes:
        feature_names: ``{"objects" | "goal" | "candidates": [(name, unit), ...]}``, one pair per
            feature, printed by ``qhlab scenes describe``; default: ``object_0``, ``goal_0``,
            ``candidate_0``, ..., each of unit ``"1"``.
        state_column: the states table's name for the state (an identifier); default ``"state"``.
        reward_unit: the unit every reward, label, MAE and regret is in (``"m"``, ``"points"``; at
            most 24 printable characters); default ``""``, the environment's own reward, unnamed.
            Bound in the manifest and written after every such number qhlab prints.
        reference_candidate: the difficulty card's name for candidate 0 (an identifier); default
            ``"first_candidate"``.
    """

    feature_names: Mapping[str, list[tuple[str, str]]]
    state_column: str
    reward_unit: str
    reference_candidate: str

    def terminal(self, scene: dict, state: np.ndarray) -> bool:
        """Whether ``state`` ends the episode; default: never. A terminal state is absorbing:
        every candidate leads back to it with reward 0, so the tree search, the labels and every
        check treat it alike without the environment stepping it."""
        ...

    def scene_id(self, scene: dict, *, split: str, seed: int, scene_index: int) -> int:
        """The scene's id, an int in [0, 2**63); default: 62 bits of the digest of the
        environment's identity, the split, seed, scene index and the scene."""
        ...

    def generator_record(self, preset: Any, *, split: str, seed: int) -> dict:
        """The manifest's record of how the population was generated (JSON), in place of qhlab's
        own (the environment, its identity and unit, the preset's parameters and the sampling
        seeds); a user environment's record is bound with its ``reward_unit`` added."""
        ...


def _members(protocol: type, *, methods: bool) -> tuple[str, ...]:
    """The members ``protocol``'s own body declares, in order: its methods, or its attributes."""
    if methods:
        return tuple(name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_"))
    return tuple(protocol.__annotations__)


# Derived from the types above, so that the run-time check and the type cannot drift apart.
REQUIRED_SIZES = tuple(name for name in _members(EnvironmentContract, methods=False) if name != "identity")
REQUIRED_METHODS = _members(EnvironmentContract, methods=True)
OPTIONAL_MEMBERS = (*_members(OptionalMembers, methods=False), *_members(OptionalMembers, methods=True))
