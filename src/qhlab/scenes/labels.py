"""Exact finite-horizon labels Q*_1..Q*_H by full tree search over a process pool.

Owns: expanding states (simulating all K candidates of a state), the level-by-level search
that expands every node of the depth-H trees below a set of root states, memoization of
identical states (a chain's next state is a node of the previous state's tree, so its
subtree to depth H-1 is already simulated), and the Bellman recursion

    Q*_1(s, a) = r(s, a),    Q*_h(s, a) = r(s, a) + max_{a' in C(s')} Q*_{h-1}(s', a'),

computed in float64. Does not own: which roots are searched (``chains``) or files
(``population``).

Parallelism: the expansions of one level are independent; they go in chunks to an executor
from the seam (``qhlab.execution``: a local ``spawn`` process pool or Ray tasks, whose
arguments and results travel through Ray's object store). A simulation is a pure function of
(scene, positions, strike), so labels do not depend on the executor, the worker count or the
chunking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Executor

import numpy as np

from qhlab.scenes.candidates import candidate_strikes, reward
from qhlab.scenes.sampler import CandidateLayout
from qhlab.scenes.world import Scene, simulate_strike

__all__ = [
    "TreeSearch",
    "expand_state",
]

NodeKey = tuple[int, bytes]
"""(scene index, exact float64 bytes of the positions [n, 2]) identifies a search node."""

_MAX_CHUNK_NODES = 32


def expand_state(scene: Scene, positions: np.ndarray, layout: CandidateLayout) -> list[tuple[np.ndarray, float]]:
    """Simulate every candidate of one state.

    Args:
        scene: the scene.
        positions: puck centres at rest [n, 2], float64.
        layout: candidate layout (K strikes, speed, goal bonus).

    Returns:
        K pairs (rest positions [n, 2] float64, reward r(s, a) in metres), in candidate order.
    """
    out = []
    for strike in candidate_strikes(scene, positions, layout):
        after = simulate_strike(scene, positions, strike.puck, strike.direction, strike.speed).positions
        out.append((after, reward(scene, positions, after, layout)))
    return out


def _expand_chunk(
    task: tuple[CandidateLayout, list[tuple[Scene, np.ndarray]]],
) -> list[list[tuple[np.ndarray, float]]]:
    layout, nodes = task
    return [expand_state(scene, positions, layout) for scene, positions in nodes]


class TreeSearch:
    """Memoized full tree search over the scenes of one population.

    Nodes are states identified by their exact positions; each expanded node stores its K
    children and rewards. Values ``V_h(s) = max_a Q*_h(s, a)`` are memoized per node.

    Args:
        scenes: the population's scenes (a node's scene index points here).
        layout: candidate layout.
        executor: an executor for expansions (``qhlab.execution.open_executor``), or None to
            expand in this process.
        workers: number of processes (or cluster CPUs) behind ``executor`` (sizes the chunks).
        on_simulations: called with the number of simulations just finished (progress).
    """

    def __init__(
        self,
        scenes: Sequence[Scene],
        layout: CandidateLayout,
        *,
        executor: Executor | None = None,
        workers: int = 1,
        on_simulations: Callable[[int], None] | None = None,
    ) -> None:
        self._scenes = list(scenes)
        self._layout = layout
        self._executor = executor
        self._workers = max(1, workers)
        self._on_simulations = on_simulations
        self._positions: dict[NodeKey, np.ndarray] = {}
        self._children: dict[NodeKey, tuple[tuple[NodeKey, float], ...]] = {}
        self._values: dict[tuple[NodeKey, int], float] = {}
        self.simulations = 0
        """Simulations actually run (memoized expansions are not rerun)."""

    def node(self, scene_index: int, positions: np.ndarray) -> NodeKey:
        """Register a state and return its key."""
        positions = np.ascontiguousarray(positions, dtype=np.float64)
        key = (scene_index, positions.tobytes())
        self._positions.setdefault(key, positions)
        return key

    def positions(self, key: NodeKey) -> np.ndarray:
        """Positions [n, 2] of a node."""
        return self._positions[key]

    def children(self, key: NodeKey) -> tuple[tuple[NodeKey, float], ...]:
        """K (child key, reward) pairs of an expanded node."""
        return self._children[key]

    def expand(self, roots: Iterable[NodeKey], depth: int) -> None:
        """Expand every node of the depth-``depth`` trees below ``roots``, level by level.

        After this, ``q(root, h)`` is available for every root and h <= depth, and for every
        child of a root and h <= depth - 1.
        """
        frontier = list(dict.fromkeys(roots))
        for level in range(depth):
            need = [key for key in frontier if key not in self._children]
            self._expand_nodes(need)
            if level + 1 < depth:
                nxt: dict[NodeKey, None] = {}
                for key in frontier:
                    for child, _ in self._children[key]:
                        nxt[child] = None
                frontier = list(nxt)

    def _expand_nodes(self, keys: list[NodeKey]) -> None:
        if not keys:
            return
        if self._executor is None:
            for key in keys:
                self._store(key, expand_state(self._scenes[key[0]], self._positions[key], self._layout))
            return
        size = max(1, min(_MAX_CHUNK_NODES, math.ceil(len(keys) / (self._workers * 8))))
        chunks = [keys[i : i + size] for i in range(0, len(keys), size)]
        futures = [
            self._executor.submit(
                _expand_chunk,
                (self._layout, [(self._scenes[k[0]], self._positions[k]) for k in chunk]),
            )
            for chunk in chunks
        ]
        for chunk, future in zip(chunks, futures):
            for key, result in zip(chunk, future.result()):
                self._store(key, result)

    def _store(self, key: NodeKey, result: list[tuple[np.ndarray, float]]) -> None:
        scene_index = key[0]
        self._children[key] = tuple((self.node(scene_index, after), r) for after, r in result)
        self.simulations += len(result)
        if self._on_simulations is not None:
            self._on_simulations(len(result))

    def value(self, key: NodeKey, h: int) -> float:
        """V_h(s) = max_a Q*_h(s, a); V_0 = 0."""
        if h == 0:
            return 0.0
        memo = self._values.get((key, h))
        if memo is None:
            memo = float(np.max(self.q(key, h)[:, h - 1]))
            self._values[(key, h)] = memo
        return memo

    def q(self, key: NodeKey, horizon: int) -> np.ndarray:
        """Exact labels of every candidate of an expanded node.

        Returns:
            [K, horizon] float64: column h-1 holds Q*_h(s, a).
        """
        children = self._children[key]
        out = np.empty((len(children), horizon), dtype=np.float64)
        for a, (child, r) in enumerate(children):
            for h in range(1, horizon + 1):
                out[a, h - 1] = r + self.value(child, h - 1)
        return out

    def retain(self, roots: Iterable[NodeKey], depth: int) -> None:
        """Forget every node farther than ``depth`` levels below ``roots`` (frees memory)."""
        keep: dict[Hashable, None] = {}
        expanded: set[NodeKey] = set()
        frontier = list(dict.fromkeys(roots))
        for level in range(depth + 1):
            nxt = []
            for key in frontier:
                if key in keep:
                    continue
                keep[key] = None
                # A node at the boundary loses its children, or a later expand() would walk
                # into forgotten nodes.
                if level < depth and key in self._children:
                    expanded.add(key)
                    nxt.extend(child for child, _ in self._children[key])
            frontier = nxt
        self._children = {k: v for k, v in self._children.items() if k in expanded}
        self._positions = {k: v for k, v in self._positions.items() if k in keep}
        self._values = {k: v for k, v in self._values.items() if k[0] in keep}
