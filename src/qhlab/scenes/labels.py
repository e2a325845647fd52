"""Exact finite-horizon labels Q*_1..Q*_H by full tree search through an environment's ``step``.

Owns: expanding states (stepping all candidates of a state), the level-by-level search
that expands every node of the depth-H trees below a set of root states, memoization of
identical states (a chain's next state is a node of the previous state's tree, so its
subtree to depth H-1 is already simulated), and the Bellman recursion

    Q*_1(s, a) = r(s, a),    Q*_h(s, a) = r(s, a) + max_{a' in C(s')} Q*_{h-1}(s', a'),

computed in float64. Does not own: which roots are searched (``chains``) or files
(``population``).

Parallelism is over scenes (``chains``): a search runs in one process over the scenes it is
given. A step is a pure function of (scene, state, action), so labels do not depend on where a
search ran.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from qhlab.scenes.environment import Environment

__all__ = [
    "TreeSearch",
    "expand_state",
]

NodeKey = tuple[int, bytes]
"""(scene index, exact float64 bytes of the state) identifies a search node."""

_MAX_CHUNK_NODES = 256


def expand_state(
    environment: Environment, scene: dict, state: np.ndarray, *, scene_index: int | None = None
) -> list[tuple[np.ndarray, float]]:
    """Step every candidate of one state.

    Args:
        environment: the environment.
        scene: the state's scene.
        state: the state (1-D float64).
        scene_index: the scene's index in its population (named when a step is refused).

    Returns:
        One pair (successor state, reward r(s, a)) per candidate, in candidate order.
    """
    k = environment.candidates(scene, state)
    return [environment.step(scene, state, a, scene_index=scene_index) for a in range(k)]


class TreeSearch:
    """Memoized full tree search over the scenes of one population.

    Nodes are states identified by their exact bytes; each expanded node stores its children
    (one per candidate) and rewards. Values ``V_h(s) = max_a Q*_h(s, a)`` are memoized per node.

    Args:
        scenes: the population's scenes (a node's scene index points here).
        environment: the environment whose ``step`` expands a state.
        on_simulations: called with the number of simulations just finished (progress).
    """

    def __init__(
        self,
        scenes: Sequence[dict] | Mapping[int, dict],
        environment: Environment,
        *,
        on_simulations: Callable[[int], None] | None = None,
    ) -> None:
        self._scenes = scenes
        self._environment = environment
        self._on_simulations = on_simulations
        self._children: dict[NodeKey, tuple[tuple[NodeKey, float], ...]] = {}
        self._values: dict[tuple[NodeKey, int], float] = {}
        self.simulations = 0
        """Simulations actually run (memoized expansions are not rerun)."""

    def node(self, scene_index: int, state: np.ndarray) -> NodeKey:
        """Register a state and return its key."""
        return (scene_index, np.ascontiguousarray(state, dtype=np.float64).tobytes())

    def state(self, key: NodeKey) -> np.ndarray:
        """The state of a node: a read-only view of its key's bytes (a state is never changed in place)."""
        return np.frombuffer(key[1], dtype=np.float64)

    def children(self, key: NodeKey) -> tuple[tuple[NodeKey, float], ...]:
        """The (child key, reward) pairs of an expanded node, one per candidate."""
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
        for key in keys:
            scene = self._scenes[key[0]]
            # A mapping is keyed by population scene index (a refusal names it); a sequence's
            # position is only this search's (the audit searches one scene at a time).
            index = key[0] if isinstance(self._scenes, Mapping) else None
            self._store(key, expand_state(self._environment, scene, self.state(key), scene_index=index))

    def _store(self, key: NodeKey, result: list[tuple[np.ndarray, float]]) -> None:
        scene_index = key[0]
        # A stepped state is a checked 1-D float64 array: its bytes are its node's key.
        self._children[key] = tuple(((scene_index, after.tobytes()), r) for after, r in result)
        self.simulations += len(result)
        if self._on_simulations is not None:
            self._on_simulations(len(result))

    def value(self, key: NodeKey, h: int) -> float:
        """V_h(s) = max_a Q*_h(s, a); V_0 = 0."""
        if h == 0:
            return 0.0
        memo = self._values.get((key, h))
        if memo is None:
            # Python floats are IEEE doubles: r + V is the same float64 sum ``q`` forms.
            memo = max(r + self.value(child, h - 1) for child, r in self._children[key])
            self._values[(key, h)] = memo
        return memo

    def q(self, key: NodeKey, horizon: int) -> np.ndarray:
        """Exact labels of every candidate of an expanded node.

        Returns:
            [k, horizon] float64 (k: the node's candidates): column h-1 holds Q*_h(s, a).
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
        self._values = {k: v for k, v in self._values.items() if k[0] in keep}
