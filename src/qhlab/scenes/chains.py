"""Actor chains: walk each scene with the declared actor and collect labelled states.

Owns: running all chains of a population (the chains of a group of scenes in lock-step, one
tree search per group, groups as parallel tasks), the actor's choices, and the labelled rows
(chain states with Q*_1..Q*_H, and every chain state's successor states with Q*_1..Q*_{H-1}).
Does not own: the search (``labels``) or file formats (``population``).

Row order: chain states first (by chain, then step), then successor states (by parent row,
then candidate). A chain state's successor under the action the actor took *is* the next
chain state, so that candidate points at the next chain row instead of a duplicate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from qhlab.evidence import QhInputError
from qhlab.execution import worker_memo
from qhlab.scenes.environment import Environment
from qhlab.scenes.labels import TreeSearch
from qhlab.scenes.presets import ActorSpec, Preset
from qhlab.scenes.sampler import actor_seed_sequence

__all__ = ["StateRow", "choose_action", "run_chains"]


@dataclass
class StateRow:
    """One labelled state of the population.

    Attributes:
        scene_index: index into the population's scenes.
        chain: global chain id (successors carry their parent's chain).
        step: 0-based step in the chain; -1 for successor states.
        state: the state, 1-D float64.
        reward: r(s, a) per candidate [k], float64.
        q: exact labels [k, h] float64 (h = H for chain states, H-1 for successors).
        successor: row index of each candidate's successor [k], -1 where not kept.
        parent: row index of the chain state this successor belongs to (-1 for chain rows).
        observed: the environment's ``observe`` of the state (objects, goal, candidate features,
            candidate objects), made where the row was labelled.
    """

    scene_index: int
    chain: int
    step: int
    state: np.ndarray
    reward: np.ndarray
    q: np.ndarray
    successor: np.ndarray
    parent: int = -1
    observed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


def choose_action(actor: ActorSpec, q_final: np.ndarray, rng: np.random.Generator) -> int:
    """The actor's candidate index.

    Args:
        actor: declared actor.
        q_final: Q*_H of each candidate of the state [k].
        rng: the chain's own actor stream.

    Returns:
        Index in 0..k-1. Greedy ties go to the lowest index.
    """
    k = q_final.shape[0]
    if actor.kind == "uniform":
        return int(rng.integers(k))
    if actor.kind == "epsilon-greedy":
        explore = rng.random() < actor.epsilon
        pick = int(rng.integers(k))
        return pick if explore else int(np.argmax(q_final))
    raise QhInputError(
        f"run_chains: actor.kind={actor.kind!r} is not allowed; allowed: 'uniform', "
        "'epsilon-greedy'. HINT: the actor is part of the preset."
    )


def run_chains(
    environment: Environment,
    scenes: list[dict],
    initial_states: list[np.ndarray],
    preset: Preset,
    split: str,
    seed: int,
    *,
    executor: Executor | None = None,
    workers: int = 1,
    on_simulations: Callable[[int], None] | None = None,
) -> tuple[list[StateRow], int]:
    """Run every chain of the population and return its labelled rows.

    Scenes are independent (a search node is a state of one scene), so groups of scenes are
    labelled as tasks on ``executor``, each with its own tree search, and their rows are merged
    in chain order: the rows do not depend on the executor, the workers or the grouping.

    Args:
        environment: the environment (its spec travels to the workers).
        scenes: the population's scenes.
        initial_states: each scene's initial state.
        preset: sizes (chains per scene, steps, H) and the actor.
        split: the split (selects the actor streams).
        seed: the population seed.
        executor: where scene groups run (``qhlab.execution.open_executor``); None: here.
        workers: processes (or cluster CPUs) behind ``executor`` (sizes the groups).
        on_simulations: called with the number of simulations just finished (progress).

    Returns:
        (chain rows then successor rows, as described in the module docstring; the simulations
        run).
    """
    indices = list(range(len(scenes)))
    if executor is None:
        groups = [
            _label_scenes(
                environment, dict(enumerate(scenes)), initial_states, indices, preset, split, seed, on_simulations
            )
        ]
    else:
        size = max(1, math.ceil(len(indices) / (max(1, workers) * 32)))
        batches = [indices[i : i + size] for i in range(0, len(indices), size)]
        futures = [
            executor.submit(
                _label_task,
                (
                    environment.spec,
                    {i: scenes[i] for i in batch},
                    {i: initial_states[i] for i in batch},
                    batch,
                    preset,
                    split,
                    seed,
                ),
            )
            for batch in batches
        ]
        groups = []
        for future in futures:
            groups.append(future.result())
            if on_simulations is not None:
                on_simulations(groups[-1][2])
    chain_rows = sorted((chain for group in groups for chain in group[0].items()), key=lambda item: item[0])
    pending = [entry for group in groups for entry in group[1]]
    return _number_rows([rows for _, rows in chain_rows], pending), sum(group[2] for group in groups)


def _label_task(task: tuple) -> tuple[dict[int, list[StateRow]], list, int]:
    """One group of scenes labelled in a worker (the environment made once per process)."""
    spec, scenes, initial, batch, preset, split, seed = task
    environment = worker_memo(("environment", spec.key), lambda: Environment.make(spec))
    return _label_scenes(environment, scenes, initial, batch, preset, split, seed, None)


def _label_scenes(
    environment: Environment,
    scenes: dict[int, dict],
    initial_states: Sequence[np.ndarray] | dict[int, np.ndarray],
    batch: list[int],
    preset: Preset,
    split: str,
    seed: int,
    on_simulations: Callable[[int], None] | None,
) -> tuple[dict[int, list[StateRow]], list, int]:
    """The chains of the scenes in ``batch``, in lock-step, by one tree search.

    Returns:
        (``{chain id: its chain rows}``, its successor rows as ``((chain, step), candidate, row)``
        to be numbered, the simulations run).
    """
    search = TreeSearch(scenes, environment, on_simulations=on_simulations)
    horizon = preset.horizon
    chains = []  # (scene_index, chain id, rng)
    current = []
    for scene_index in batch:
        for c in range(preset.chains_per_scene):
            rng = np.random.Generator(np.random.PCG64(actor_seed_sequence(split, seed, scene_index, c)))
            chains.append((scene_index, scene_index * preset.chains_per_scene + c, rng))
            current.append(search.node(scene_index, initial_states[scene_index]))
    chain_rows: dict[int, list[StateRow]] = {chain_id: [] for _, chain_id, _ in chains}
    pending_successors: list[tuple[tuple[int, int], int, StateRow]] = []
    for step in range(preset.steps):
        search.expand(current, horizon)
        nxt = []
        for (scene_index, chain_id, rng), key in zip(chains, current):
            q = search.q(key, horizon)
            children = search.children(key)
            rewards = np.array([r for _, r in children], dtype=np.float64)
            successor = np.full(len(children), -1, dtype=np.int64)
            row = StateRow(scene_index, chain_id, step, search.state(key), rewards, q, successor)
            chain_rows[chain_id].append(row)
            taken = -1
            if step + 1 < preset.steps:
                taken = choose_action(preset.actor, q[:, horizon - 1], rng)
                nxt.append(children[taken][0])
            for a, (child, _) in enumerate(children):
                if a == taken:
                    continue
                child_children = search.children(child) if horizon > 1 else ()
                child_q = search.q(child, horizon - 1) if horizon > 1 else np.zeros((0, 0))
                child_rewards = np.array([r for _, r in child_children], dtype=np.float64)
                pending_successors.append(
                    (
                        (chain_id, step),
                        a,
                        StateRow(
                            scene_index,
                            chain_id,
                            -1,
                            search.state(child),
                            child_rewards,
                            child_q,
                            np.full(len(child_children), -1, dtype=np.int64),
                        ),
                    )
                )
            if taken >= 0:
                row.successor[taken] = -2  # resolved below to the next chain row
        if nxt:
            search.retain(nxt, horizon - 1)
        current = nxt
    # Observed here, in the worker that labelled the rows, rather than one by one after the merge.
    for row in [*(r for rows in chain_rows.values() for r in rows), *(entry[2] for entry in pending_successors)]:
        row.observed = environment.observe(scenes[row.scene_index], row.state)
    return chain_rows, pending_successors, search.simulations


def _number_rows(
    chain_rows: list[list[StateRow]], pending: list[tuple[tuple[int, int], int, StateRow]]
) -> list[StateRow]:
    rows: list[StateRow] = []
    index_of: dict[tuple[int, int], int] = {}
    for per_chain in chain_rows:
        for row in per_chain:
            index_of[(row.chain, row.step)] = len(rows)
            rows.append(row)
    # Rows labelled on Ray come back as read-only views of its object store: numbered on copies.
    for row in (*rows, *(entry[2] for entry in pending)):
        row.successor = row.successor.copy()
    for row in rows:
        taken = np.flatnonzero(row.successor == -2)
        if taken.size:
            row.successor[taken[0]] = index_of[(row.chain, row.step + 1)]
    for (chain_id, step), a, succ in sorted(pending, key=lambda p: (index_of[p[0]], p[1])):
        parent = index_of[(chain_id, step)]
        succ.parent = parent
        rows[parent].successor[a] = len(rows)
        rows.append(succ)
    return rows
