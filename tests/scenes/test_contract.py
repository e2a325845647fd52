"""The environment contract as a type (``qhlab.scenes.contract``): the built-in environments
satisfy it, and the run-time check refuses by the members the type declares."""

from __future__ import annotations

import types

import pytest

from qhlab.evidence import QhInputError
from qhlab.scenes import gymnasium, puck, tanks
from qhlab.scenes.contract import OPTIONAL_MEMBERS, REQUIRED_METHODS, REQUIRED_SIZES, EnvironmentContract
from qhlab.scenes.environment import Environment, EnvironmentSpec


def test_the_member_lists_are_the_types() -> None:
    assert REQUIRED_SIZES == ("object_features", "goal_features", "candidate_features", "max_objects", "max_candidates")
    assert REQUIRED_METHODS == ("sample_scene", "initial_state", "candidates", "step", "observe")
    assert set(OPTIONAL_MEMBERS) == {
        "feature_names",
        "state_column",
        "reward_unit",
        "reference_candidate",
        "terminal",
        "scene_id",
        "generator_record",
    }


@pytest.mark.parametrize(
    "make, options",
    [(puck.make, {}), (tanks.make, {}), (gymnasium.make, {"env_id": "CartPole-v1"})],
    ids=["puck", "tanks", "gymnasium"],
)
def test_every_builtin_environment_is_the_type(make, options) -> None:
    assert isinstance(make(options), EnvironmentContract)


def test_an_object_without_a_member_is_not_the_type_and_is_refused_by_name() -> None:
    made = tanks.make({})
    members = {name: getattr(made, name) for name in ("identity", *REQUIRED_SIZES, *REQUIRED_METHODS)}
    assert isinstance(types.SimpleNamespace(**members), EnvironmentContract)
    for missing in REQUIRED_METHODS:
        partial = types.SimpleNamespace(**{k: v for k, v in members.items() if k != missing})
        assert not isinstance(partial, EnvironmentContract)
        with pytest.raises(QhInputError, match=rf"{missing} is missing or not callable"):
            Environment._checked(EnvironmentSpec("qhlab.scenes.tanks:make"), partial, "tanks", (), "qhlab test")


def test_the_puck_world_refuses_two_equal_speeds() -> None:
    # Two candidates with one outcome would be a tie by construction in every state.
    puck.make({"candidates": {"speeds": [0.9, 1.5]}})
    with pytest.raises(QhInputError, match=r"options \['candidates'\] are not allowed; allowed: at least one speed, "):
        puck.make({"candidates": {"speeds": [0.9, 0.9]}})
