"""The determinism and contract probes of generation: an environment tried before anything is written.

Owns: ``check_contract`` (each probed scene is a JSON object, the same for the same seed; its
initial state and every successor two steps deep are the same for the same inputs, taken twice,
again in reverse order after every scene was drawn, and, for code qhlab does not pin, each action
repeated to the episode's end from the first scenes and once more in a fresh interpreter;
``observe`` has the declared shapes). Does not own: the contract's members
(``qhlab.scenes.contract``) or the checks of each call's result (``qhlab.scenes.environment``,
which every call goes through).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import struct
from dataclasses import replace

from qhlab.evidence import QhInputError
from qhlab.scenes.environment import Environment, EnvironmentSpec

__all__ = ["check_contract"]


def check_contract(environment: Environment, seeds: tuple[int, ...]) -> dict:
    """The contract checks at generation, on the scenes of ``seeds``: each scene is a JSON object
    and the same for the same seed; its initial state and every successor of it are 1-D, finite
    and the same for the same inputs; ``candidates`` is in range; ``observe`` has the declared
    shapes and dtypes.

    Determinism is probed three ways, since hidden state hides from a single repeat: each step
    is taken twice in a row, two steps deep (a successor's own steps, not only the first); every
    step is then taken again in reverse order after every scene's initial state was drawn (an
    environment that steps by what it remembers of the last scene, or of the last step, rather
    than by the arguments); and, for an environment qhlab does not pin in its own tests (the
    researcher's, a Gymnasium task), each action repeated from the first scenes' starts until the
    episode ends (state left out of a snapshot often shows only there), and everything once more
    in a fresh interpreter (module-level memory, an
    unseeded generator, hash-seed-dependent iteration order).

    Returns:
        ``{"scenes", "steps", "fresh_process", "rollout_steps"}``: how much was checked, whether a
        fresh interpreter stepped it too, and how many steps the rollouts to the episode's end took.

    Raises:
        QhInputError: naming the environment, the method and the cause (nothing is written).
    """
    fresh = not environment.spec.builtin or environment.spec.factory in _THIRD_PARTY_BUILTINS
    probes = _contract_probes(environment, seeds, rollouts=fresh)
    # Every scene's initial state drawn again (the last one is what an env with hidden state
    # would remember), then every step once more, last first.
    for scene, *_ in probes:
        environment.initial_state(scene)
    for scene, state, action, after, reward, _ in reversed(probes):
        again, reward_again = environment.step(scene, state, action)
        if again.tobytes() != after.tobytes() or reward_again != reward:
            raise environment._refuse(
                f"step(scene, state, {action})",
                "returned another successor or reward when stepped again after other scenes and steps (hidden "
                "state: it must step by its arguments alone)",
            )
    if fresh:
        fingerprint = _probe_fingerprint(probes)
        context = multiprocessing.get_context("spawn")
        try:
            with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                elsewhere = pool.submit(_fresh_fingerprint, _travelling(environment), seeds).result()
        except QhInputError as exc:
            raise QhInputError(
                f"environment {environment.name!r}: in a fresh interpreter (the determinism probe): {exc}. HINT: an "
                "environment must be made from its factory and options alone, as every label worker makes it"
            ) from None
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise environment._refuse(
                "make(options)", f"killed a fresh interpreter making it (the determinism probe): {exc}"
            ) from None
        if elsewhere != fingerprint:
            raise environment._refuse(
                "step(scene, state, action)",
                "returned other successors or rewards in a fresh interpreter for the same inputs (hidden state: "
                "module-level memory, an unseeded random generator or hash-seed-dependent order)",
            )
    return {
        "scenes": len(seeds),
        "steps": 3 * len(probes),
        "fresh_process": fresh,
        "rollout_steps": sum(1 for probe in probes if probe[5]),
    }


# Built-in factories whose step is a third party's code (a Gymnasium task), probed in a fresh
# interpreter like the researcher's own. The other built-ins' files are pinned by
# ``tests/scenes/test_environment_versions.py``: their determinism across processes is checked
# there, not at every generation.
_THIRD_PARTY_BUILTINS = ("qhlab.scenes.gymnasium:make",)

# How deep the probes step: the initial state's successors and theirs.
_PROBE_DEPTH = 2
# Rollouts to the episode's end: from the first scenes' initial states, each action repeated until
# the episode ends (or this many steps), every step taken twice. State a snapshot leaves out
# (CartPole's ``steps_beyond_terminated``) often shows only where an episode ends.
_ROLLOUT_SCENES = 2
_ROLLOUT_STEPS = 128


def _stepped_twice(environment: Environment, scene: dict, state, action: int, index: int) -> tuple:
    after, reward = environment.step(scene, state, action, scene_index=index)
    again, reward_again = environment.step(scene, state, action, scene_index=index)
    if after.tobytes() != again.tobytes() or reward != reward_again:
        raise environment._refuse(
            f"step(scene, state, {action})",
            "returned another successor or reward for the same inputs (not deterministic: part of the state is "
            "neither read nor set)",
        )
    environment.observe(scene, after)
    return after, reward


def _contract_probes(environment: Environment, seeds: tuple[int, ...], *, rollouts: bool) -> list[tuple]:
    """Each scene checked and every step probed twice, ``_PROBE_DEPTH`` deep, and (``rollouts``)
    each action repeated to the episode's end from the first ``_ROLLOUT_SCENES`` scenes.

    Returns:
        ``[(scene, state, action, successor, reward, in_a_rollout)]`` in the order they were stepped.
    """
    probes = []
    for index, seed in enumerate(seeds):
        scene = environment.sample_scene(seed)
        try:
            text = json.dumps(scene, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise environment._refuse("sample_scene(seed)", f"returned a scene that is not JSON ({exc})") from None
        if json.dumps(environment.sample_scene(seed), sort_keys=True, allow_nan=False) != text:
            raise environment._refuse(
                "sample_scene(seed)", "returned another scene for the same seed (not deterministic)"
            )
        scene = json.loads(text)  # what the population stores and every later step passes
        state = environment.initial_state(scene)
        if environment.initial_state(scene).tobytes() != state.tobytes():
            raise environment._refuse("initial_state(scene)", "returned another state for the same scene")
        environment.observe(scene, state)
        frontier = [state]
        for _ in range(_PROBE_DEPTH):
            following = []
            for here in frontier:
                for action in range(environment.candidates(scene, here)):
                    after, reward = _stepped_twice(environment, scene, here, action, index)
                    probes.append((scene, here, action, after, reward, False))
                    following.append(after)
            frontier = following
        if not rollouts or index >= _ROLLOUT_SCENES:
            continue
        for action in range(environment.candidates(scene, state)):
            here = state
            for _ in range(_ROLLOUT_STEPS):
                if environment.terminal(scene, here) or action >= environment.candidates(scene, here):
                    break
                after, reward = _stepped_twice(environment, scene, here, action, index)
                probes.append((scene, here, action, after, reward, True))
                here = after
    return probes


def _probe_fingerprint(probes: list[tuple]) -> str:
    """The SHA-256 of every probed successor's bytes and reward, in order."""
    digest = hashlib.sha256()
    for _, _, _, after, reward, _ in probes:
        digest.update(after.tobytes())
        digest.update(struct.pack("<d", reward))
    return digest.hexdigest()


def _travelling(environment: Environment) -> EnvironmentSpec:
    """The environment's spec with its source's bytes, so a fresh interpreter makes the same one."""
    spec = environment.spec
    if spec.source is None or spec.files is not None or environment.source_files is None:
        return spec
    return replace(spec, files=dict(environment.source_files))


def _fresh_fingerprint(spec: EnvironmentSpec, seeds: tuple[int, ...]) -> str:
    """In a fresh interpreter: the environment made from ``spec`` again, probed as ``check_contract`` does."""
    environment = Environment.make(spec, call="generate_population")
    return _probe_fingerprint(_contract_probes(environment, seeds, rollouts=True))
