"""Actor chains: walk each scene with the declared actor and collect labelled states.

Owns: running all chains of a population in lock-step (so every search level is one large
parallel batch), the actor's choices, and the labelled rows (chain states with Q*_1..Q*_H,
and every chain state's successor states with Q*_1..Q*_{H-1}). Does not own: the search
(``labels``) or file formats (``population``).

Row order: chain states first (by chain, then step), then successor states (by parent row,
then candidate). A chain state's successor under the action the actor took *is* the next
chain state, so that candidate points at the next chain row instead of a duplicate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qhlab.evidence import QhInputError
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
    """

    scene_index: int
    chain: int
    step: int
    state: np.ndarray
    reward: np.ndarray
    q: np.ndarray
    successor: np.ndarray
    parent: int = -1


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
    search: TreeSearch,
    scenes: list[dict],
    initial_states: list[np.ndarray],
    preset: Preset,
    split: str,
    seed: int,
) -> list[StateRow]:
    """Run every chain of the population and return its labelled rows.

    Args:
        search: the tree search over ``scenes``.
        scenes: the population's scenes.
        initial_states: each scene's initial state.
        preset: sizes (chains per scene, steps, H) and the actor.
        split: the split (selects the actor streams).
        seed: the population seed.

    Returns:
        Chain rows then successor rows, as described in the module docstring.
    """
    horizon = preset.horizon
    chains = []  # (scene_index, chain id, rng)
    current = []
    for scene_index in range(len(scenes)):
        for c in range(preset.chains_per_scene):
            rng = np.random.Generator(np.random.PCG64(actor_seed_sequence(split, seed, scene_index, c)))
            chains.append((scene_index, len(chains), rng))
            current.append(search.node(scene_index, initial_states[scene_index]))
    chain_rows: list[list[StateRow]] = [[] for _ in chains]
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
    return _number_rows(chain_rows, pending_successors)


def _number_rows(
    chain_rows: list[list[StateRow]], pending: list[tuple[tuple[int, int], int, StateRow]]
) -> list[StateRow]:
    rows: list[StateRow] = []
    index_of: dict[tuple[int, int], int] = {}
    for per_chain in chain_rows:
        for row in per_chain:
            index_of[(row.chain, row.step)] = len(rows)
            rows.append(row)
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
