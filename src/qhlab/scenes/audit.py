"""Labels that answer to the environment: the Bellman check of every label and the audit.

Owns: every label check of a population in one call (``check_population_labels``: counts,
structure and the Bellman rule from ``bellman``, then the successors), the successor check
(``check_successors``: every chain state's candidates stepped again) and the audit
(``audit_population``), which regenerates every scene from its seed and steps the whole
depth-H tree of chosen chain states again. Does not own: reading the label arrays and the
Bellman rule (``bellman``), authenticating file digests (``manifest.read_manifest``), reading the
tables into arrays (``reader``), making the environment (``environment``, ``origin``) or where
the checks are required (the reader, ``describe``, ``verify``, the study steps and the cache).

Why both. Digests prove the bytes are the ones a manifest names, but a forger who rewrites a
population can recompute every digest. The Bellman check is exact (genuine labels are
computed as ``r + max`` in float64, the same operation repeated here, so the tolerance is 0)
and catches every label that disagrees with the stored rewards and successors. A forgery that
rewrites rewards and labels consistently passes it; the audit catches that, because a
population is a pure function of (environment, its source, preset, split, seed): its scenes
are regenerated exactly, and an audited chain state's candidates, their successors and every
label of both are stepped again through the environment and compared to the bit.

User code. The Bellman check needs no environment code. Stepping does: for a population of a
researcher's own environment it imports the frozen copy inside the population (never the
user's files), and only where the caller says so (``simulate=True``): the study steps and
``qhlab scenes audit`` do, ``qhlab verify`` never does.

Detection: the scenes check covers every scene. A consistent label forgery changes at least
one leaf reward, hence the labels of at least one chain state's tree; if it touches m of the n
chain states, an audit of N states drawn without replacement from OS randomness misses it with
probability C(n - m, N) / C(n, N) <= (1 - m/n)^N (``miss_probability``).
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qhlab.evidence import EvidenceError, QhError, QhInputError, canonical_json
from qhlab.evidence.canonical import differing_keys, dotted
from qhlab.scenes.bellman import LabelArrays, check_bellman, check_counts, check_structure, label_refusal, read_labels
from qhlab.scenes.chains import choose_action
from qhlab.scenes.environment import Environment
from qhlab.scenes.labels import TreeSearch
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.origin import population_origin, user_environment
from qhlab.scenes.presets import Preset
from qhlab.scenes.sampler import actor_seed_sequence, scene_seed

__all__ = [
    "AUDIT_STATES",
    "audit_population",
    "check_population_labels",
    "check_successors",
    "coverage_text",
    "environment_text",
    "miss_probability",
    "stepper",
]

AUDIT_STATES = 8
"""Chain states a study step, the cache and ``qhlab verify --audit`` re-simulate by default."""

RANDOMNESS_SOURCE = "os.urandom (secrets.SystemRandom().sample over chain-state rows)"


def stepper(path: str | os.PathLike, manifest: dict, *, call: str) -> tuple[Environment, Preset]:
    """The environment a population was generated with (a user one imported from the frozen copy
    inside the population, its digests checked first) and its preset."""
    spec, preset = population_origin(path, manifest, call=call)
    return Environment.make(spec, call=call), preset


def check_population_labels(
    path: str | os.PathLike, manifest: dict | None = None, *, call: str = "check_labels", simulate: bool = True
) -> LabelArrays:
    """Authenticate (unless ``manifest`` is given), then check counts, every label's Bellman rule
    and every successor through the environment (``check_successors``).

    Args:
        simulate: step the environment for the successor check. A built-in environment is always
            stepped; a user environment (its frozen copy inside the population) only when True:
            ``qhlab verify`` passes False and says that its successors were not stepped.

    Returns:
        The checked ``LabelArrays``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    manifest = read_manifest(path) if manifest is None else manifest
    try:
        labels = read_labels(path, manifest, call=call)
    except QhError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, pa.ArrowException) as exc:  # nulls, bad types
        raise label_refusal(call, path, f"malformed population ({type(exc).__name__}: {exc})") from None
    scenes = pq.read_metadata(path / "scenes.parquet").num_rows
    check_counts(path, manifest, labels, scenes=scenes, call=call)
    check_structure(path / "candidates.parquet", labels, call=call)
    check_bellman(
        path / "candidates.parquet",
        labels.q,
        labels.reward,
        labels.successor,
        labels.horizons,
        labels.state_id,
        call=call,
    )
    if simulate or not user_environment(manifest):
        check_successors(path, manifest, labels, call=call)
    return labels


@dataclass(frozen=True)
class _Regenerated:
    """A population's scenes as its environment draws them (the stored ones checked against them):
    the environment, the preset, split and seed; per scene_index the scene, its initial state and
    its id; ``index_of`` maps a scene_id to its index."""

    environment: Environment
    preset: Preset
    split: str
    seed: int
    scenes: list
    initial: list
    index_of: dict
    scene_ids: list


def _regenerated_scenes(path: Path, manifest: dict, *, call: str) -> _Regenerated:
    """Draw every scene again from its seed and refuse a stored one that differs.

    Raises:
        EvidenceError: the manifest names no environment this qhlab can make, or a stored scene
            (its content, id or initial state) is not the one drawn for (preset, split, seed, index).
    """
    import json

    import pyarrow.parquet as pq

    environment, preset = stepper(path, manifest, call=call)
    generator = manifest["generator"]
    here = environment.generator_record(
        preset,
        split=generator["split"],
        seed=generator["seed"],
        generator_version=generator.get("generator_version"),
    )
    if canonical_json(here) != canonical_json(generator):
        differences = "; ".join(
            f"{key}: recorded {dotted(generator).get(key)!r}, here {dotted(here).get(key)!r}"
            for key in differing_keys(dotted(generator), dotted(here))[:4]
        )
        raise label_refusal(
            call,
            path / "manifest.json",
            f"its generator record is not the one environment {environment.name!r} gives for preset "
            f"{preset.name!r} ({differences}: another engine or environment version, or an edited record); the "
            "audit can only step again what this environment generates",
        )
    split, seed = generator["split"], generator["seed"]
    table = pq.read_table(path / "scenes.parquet")
    rows = table.to_pylist()
    content = [c for c in table.column_names if c not in ("scene_id", "scene_index")]
    if len(rows) != preset.scenes:
        raise label_refusal(
            call, path / "scenes.parquet", f"{len(rows)} scenes; preset {preset.name!r} draws {preset.scenes}"
        )
    scenes, initial, index_of = [], [], {}
    for index, row in enumerate(rows):
        scene = json.loads(json.dumps(environment.sample_scene(scene_seed(split, seed, index)), allow_nan=False))
        ident = environment.scene_id(scene, split=split, seed=seed, scene_index=index)
        stored = {k: row[k] for k in content}
        if (
            row.get("scene_index") != index
            or canonical_json(stored) != canonical_json(scene)
            or row.get("scene_id") != ident
        ):
            raise label_refusal(
                call,
                path / "scenes.parquet",
                (
                    f"scene_index {index} (scene_id {row.get('scene_id')}) is not the scene environment "
                    f"{environment.name!r} draws for preset {preset.name!r}, split {split!r}, seed {seed}"
                ),
            )
        scenes.append(scene)
        initial.append(environment.initial_state(scene))
        index_of[int(row["scene_id"])] = index
    return _Regenerated(environment, preset, split, seed, scenes, initial, index_of, [int(r["scene_id"]) for r in rows])


def _ragged(table, column: str) -> list[np.ndarray]:
    """A list<double> or list<list<double>> column as one flat float64 array per row."""
    import pyarrow as pa

    array = table.column(column).combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.values
    if pa.types.is_list(values.type):  # rows of per-object lists: the bounds of each row's values
        bounds = values.offsets.to_numpy()[offsets]
        values = values.values
    else:
        bounds = offsets
    flat = values.to_numpy(zero_copy_only=False).astype(np.float64)
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(array))]


class _Observations:
    """A population's stored observations (state, objects, goal, each candidate's object and features),
    read once, compared with what the environment observes of a state.

    ``check(row, scene, state)`` returns None, or in words what the row stores that the environment
    does not observe: every feature a scorer reads is compared, to the bit.
    """

    def __init__(self, path: Path, environment: Environment, labels: LabelArrays) -> None:
        import pyarrow.parquet as pq

        column = environment.state_column
        table = pq.read_table(path / "states.parquet", columns=["state_id", column, "objects", "goal"])
        if table.column("state_id").to_numpy().astype(np.int64).tolist() != labels.state_id.tolist():
            raise ValueError("its states.parquet rows are not in the order its labels were read in")
        self.states, self.objects, self.goals = (_ragged(table, c) for c in (column, "objects", "goal"))
        candidates = pq.read_table(path / "candidates.parquet", columns=["state_id", "candidate", "object", "features"])
        self.row_of = {
            (int(s), int(c)): i
            for i, (s, c) in enumerate(
                zip(candidates.column("state_id").to_numpy(), candidates.column("candidate").to_numpy())
            )
        }
        self.candidate_object = candidates.column("object").to_numpy().astype(np.int64)
        self.candidate_features = _ragged(candidates, "features")
        self.environment, self.labels = environment, labels

    def check(self, row: int, scene: dict, state: np.ndarray) -> str | None:
        if not _same(self.states[row], state):
            return "its state is not where the environment's step leads"
        objects, goal, features, struck = self.environment.observe(scene, state)
        if not _same(self.objects[row], objects):
            return "its object features are not those of its state"
        if not _same(self.goals[row], goal):
            return "its goal features are not those of its state"
        stored = int(self.labels.mask[row].sum())
        if len(struck) != stored:
            return f"it stores {stored} candidates; the environment offers {len(struck)}"
        sid = int(self.labels.state_id[row])
        for a in range(len(struck)):
            i = self.row_of.get((sid, a))
            if i is None:
                return f"candidate {a} has no row in candidates.parquet"
            if int(self.candidate_object[i]) != int(struck[a]):
                stored = int(self.candidate_object[i])
                return f"candidate {a} acts on object {stored}; the environment's on {int(struck[a])}"
            if not _same(self.candidate_features[i], features[a]):
                return f"candidate {a}'s features are not the environment's"
        return None


def _same(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return a.shape == b.shape and bool(np.array_equal(a, b))


def check_successors(
    path: str | os.PathLike, manifest: dict, labels: LabelArrays, *, call: str = "check_labels"
) -> dict:
    """Step every chain state's candidates again and refuse a successor the environment denies.

    Every row, not a sample: from each chain state's stored state (a chain's first state must be
    its scene's initial state), each candidate is stepped once, and the successor row it leads to
    must hold the stepped state; the chain state's stored reward for that candidate must be the
    stepped one; and every chain state and every successor must hold exactly what the environment
    observes of its state: object features, goal features, and each candidate's features and the
    object it acts on (every input a scorer reads). That is one step per chain-state candidate,
    cheap beside the depth-H tree (which ``audit_population`` samples). With Bellman, it leaves a
    forger only the successors' own rewards (and so their labels) to rewrite, which the sampled
    tree audit checks.

    Args:
        path: the population directory (its scenes are drawn again from the manifest).
        manifest: the authenticated manifest.
        labels: the population's labels in file order (``read_labels``).
        call: the caller named in refusals.

    Returns:
        ``{"chain_states": n, "simulations": steps, "seconds": s}``.

    Raises:
        EvidenceError: naming the chain state, the candidate, the successor and what differs.
    """
    started = time.perf_counter()
    path = Path(path)
    regenerated = _regenerated_scenes(path, manifest, call=call)
    environment = regenerated.environment
    chain_rows = np.flatnonzero(labels.step >= 0)

    def deny(row: int, what: str) -> EvidenceError:
        return label_refusal(call, path, f"the environment denies state_id {int(labels.state_id[row])}: {what}")

    simulations = 0
    try:
        stored = _Observations(path, environment, labels)
        for row in chain_rows:
            index = regenerated.index_of[int(labels.scene_id[row])]
            scene = regenerated.scenes[index]
            before = stored.states[row]
            if int(labels.step[row]) == 0 and not np.array_equal(before, regenerated.initial[index]):
                raise deny(int(row), "it is the first state of its chain but not its scene's initial state")
            denied = stored.check(int(row), scene, before)
            if denied is not None:
                raise deny(int(row), denied)
            for a in range(int(labels.mask[row].sum())):
                after, simulated = environment.step(scene, before, a)
                simulations += 1
                succ = int(labels.successor[row, a])
                denied = stored.check(succ, scene, after)
                if denied is not None:
                    raise deny(
                        int(row), f"candidate {a} leads to state_id {int(labels.state_id[succ])}, where {denied}"
                    )
                if labels.reward[row, a] != simulated:
                    raise deny(
                        int(row),
                        f"candidate {a} horizon 1 reward: stored {float(labels.reward[row, a])!r}, "
                        f"stepped {float(simulated)!r}",
                    )
    except QhError:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:  # malformed rows: one clear refusal
        raise label_refusal(call, path, f"malformed population ({type(exc).__name__}: {exc})") from None
    return {
        "chain_states": int(len(chain_rows)),
        "simulations": simulations,
        "seconds": round(time.perf_counter() - started, 3),
    }


def coverage_text(record: dict) -> str:
    """What an audit record covered, in one clause (``describe``, ``scenes audit``, ``verify``).

    Args:
        record: an ``audit_population`` result.
    """
    return (
        f"every one-step successor stepped again ({record['successors_checked']} steps); depth-H tree of "
        f"{record['audited']} of {record['chain_states']} chain states stepped again ({record['simulations']} "
        f"steps): a forgery confined to one chain state's tree is missed with p = "
        f"{record['miss_probability_one_state']:.3f}"
    )


def environment_text(record: dict) -> str:
    """Which environment an audit stepped, in one clause: a user one's frozen copy says so."""
    environment = record.get("environment") or {}
    if environment.get("user_code"):
        return f"environment {environment.get('name')!r}, imported from the frozen copy inside the population"
    return f"built-in environment {environment.get('name')!r}"


def miss_probability(chain_states: int, forged: int, audited: int) -> float:
    """P(an audit of ``audited`` of ``chain_states`` states, drawn without replacement, misses
    all ``forged`` ones) = C(n - m, N) / C(n, N)."""
    if audited > chain_states - forged:
        return 0.0
    return math.comb(chain_states - forged, audited) / math.comb(chain_states, audited)


def audit_population(
    path: str | os.PathLike,
    *,
    states: int | None = AUDIT_STATES,
    rows: list[int] | None = None,
    call: str = "audit_population",
) -> dict:
    """Step a population again through its environment; raise on the first label it denies.

    Checks, in order: the manifest's generator record is the environment's; every scene (its
    content, initial state and id) is the one drawn from its seed; counts, every label's Bellman
    rule and every chain state's successors; then, for each audited chain state: its state (the
    scene's initial one at step 0, else the stepped outcome of its parent's stored action), its
    object, goal and candidate features and objects, and by a full depth-H tree search its rewards
    and labels and each successor's state, rewards and labels. A user environment is imported from
    the frozen copy inside the population.

    Args:
        path: population directory.
        states: how many chain states to draw with OS randomness; None audits every one.
        rows: audit exactly these chain-state ids instead of drawing (tests, ``--state``).
        call: the caller named in refusals.

    Returns:
        ``{"source", "chain_states", "audited", "states" (state ids), "simulations",
        "seconds", "result": "passed", "scenes_checked", "successors_checked" (one-step
        successors stepped again, all of them), "miss_probability_one_state" (of the sampled
        depth-H tree audit, for a forgery confined to one chain state), "environment" (its name
        and whether its code is the user's, imported from the population's frozen copy)}``.

    Raises:
        QhInputError: ``states`` is not a positive integer.
        EvidenceError: naming the state, the candidate, the horizon and both values.
    """

    _check_states_argument(states, call)
    started = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    regenerated = _regenerated_scenes(path, manifest, call=call)
    environment, preset = regenerated.environment, regenerated.preset
    labels = check_population_labels(path, manifest, call=call)
    chain_rows = np.flatnonzero(labels.step >= 0)
    _check_chains(path, labels, preset, regenerated.split, regenerated.seed, regenerated.scene_ids, call=call)
    chosen = _chosen_rows(path, labels, chain_rows, states, rows, call=call)
    stored = _read_observations(path, environment, labels, call=call)
    simulations = _audit_chosen(path, labels, regenerated, stored, chain_rows, chosen, call=call)
    return {
        "source": RANDOMNESS_SOURCE if rows is None else "rows named by the caller",
        "chain_states": int(len(chain_rows)),
        "audited": len(chosen),
        "states": [int(labels.state_id[r]) for r in chosen],
        "scenes_checked": len(regenerated.scenes),
        # Every chain state's one-step successors were stepped again by the label checks.
        "successors_checked": int(labels.mask[chain_rows].sum()),
        # The depth-H tree is sampled: a forgery confined to one chain state's tree is missed
        # with this probability (0 when every chain state was audited).
        "miss_probability_one_state": miss_probability(int(len(chain_rows)), 1, len(chosen)),
        "simulations": simulations,
        "seconds": round(time.perf_counter() - started, 3),
        "result": "passed",
        "environment": {"name": environment.name, "user_code": environment.spec.source is not None},
    }


def _check_states_argument(states: int | None, call: str) -> None:
    """Refuse a ``states`` that is neither an integer >= 1 nor None.

    Raises:
        QhInputError: naming ``call``, the value and what is allowed.
    """
    if states is not None and (isinstance(states, bool) or not isinstance(states, int) or states < 1):
        raise QhInputError(
            f"{call}: states={states!r} is not allowed; allowed: an integer >= 1, or None for "
            "every chain state. HINT: 8 states take a few seconds."
        )


def _chosen_rows(
    path: Path, labels: LabelArrays, chain_rows: np.ndarray, states: int | None, rows: list[int] | None, *, call: str
) -> list[int]:
    """The chain-state rows to audit, in file order.

    Those whose state ids ``rows`` names; else every one when ``states`` is None or covers them
    all; else ``states`` of them drawn without replacement from OS randomness.

    Raises:
        QhInputError: ``rows`` names an id that is not a chain state's.
    """
    if rows is not None:
        wanted = {int(s) for s in rows}
        chosen = [int(r) for r in chain_rows if int(labels.state_id[r]) in wanted]
        if len(chosen) != len(wanted):
            raise QhInputError(
                f"{call}: rows={sorted(wanted)!r} is not allowed; allowed: chain-state ids of "
                f"{path}. HINT: successor states are audited with their parent."
            )
        return chosen
    if states is None or states >= len(chain_rows):
        return [int(r) for r in chain_rows]
    return sorted(secrets.SystemRandom().sample([int(r) for r in chain_rows], states))


def _read_observations(path: Path, environment: Environment, labels: LabelArrays, *, call: str) -> _Observations:
    """The population's stored observations (``_Observations``).

    Raises:
        EvidenceError: a malformed population, in one clear refusal.
    """
    try:
        return _Observations(path, environment, labels)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise label_refusal(call, path, f"malformed population ({type(exc).__name__}: {exc})") from None


def _denier(path: Path, labels: LabelArrays, *, call: str) -> Callable[[int, str], EvidenceError]:
    """A ``deny(row, what)`` that makes the refusal naming the row's state_id and what the environment denies."""

    def deny(row: int, what: str) -> EvidenceError:
        return label_refusal(call, path, f"the environment denies state_id {int(labels.state_id[row])}: {what}")

    return deny


def _audit_chosen(
    path: Path,
    labels: LabelArrays,
    regenerated: _Regenerated,
    stored: _Observations,
    chain_rows: np.ndarray,
    chosen: list[int],
    *,
    call: str,
) -> int:
    """Step every chosen chain state's depth-H tree again and check it; return the simulations taken.

    Raises:
        EvidenceError: the first state, reward or label the environment denies, or a malformed
            population in one clear refusal.
    """
    deny = _denier(path, labels, call=call)
    row_of_chain = {(int(labels.chain_id[r]), int(labels.step[r])): int(r) for r in chain_rows}
    simulations = 0
    try:
        for row in chosen:
            scene_index = regenerated.index_of[int(labels.scene_id[row])]
            state, stepped = _chain_state(row, scene_index, labels, regenerated, stored, row_of_chain, deny)
            simulations += stepped
            simulations += _audit_tree(row, regenerated.scenes[scene_index], state, labels, regenerated, stored, deny)
    except QhError:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:  # malformed rows: one clear refusal
        raise label_refusal(call, path, f"malformed population ({type(exc).__name__}: {exc})") from None
    return simulations


def _chain_state(
    row: int,
    scene_index: int,
    labels: LabelArrays,
    regenerated: _Regenerated,
    stored: _Observations,
    row_of_chain: dict,
    deny: Callable[[int, str], EvidenceError],
) -> tuple[np.ndarray, int]:
    """The state a chain state must hold and the simulations that took (0 or 1).

    At step 0 its scene's initial state; else the outcome of stepping its parent's stored state
    by the one candidate of the parent that leads to it.

    Raises:
        EvidenceError: no earlier chain state leads to it.
    """
    step = int(labels.step[row])
    if step == 0:
        return regenerated.initial[scene_index], 0
    parent = row_of_chain.get((int(labels.chain_id[row]), step - 1))
    taken = [] if parent is None else np.flatnonzero(labels.successor[parent] == row)
    if parent is None or len(taken) != 1:
        raise deny(row, f"it is step {step} of its chain but no earlier chain state leads to it")
    scene = regenerated.scenes[scene_index]
    state, _ = regenerated.environment.step(scene, np.asarray(stored.states[parent], dtype=np.float64), int(taken[0]))
    return state, 1


def _audit_tree(
    row: int,
    scene: dict,
    state: np.ndarray,
    labels: LabelArrays,
    regenerated: _Regenerated,
    stored: _Observations,
    deny: Callable[[int, str], EvidenceError],
) -> int:
    """Check a chain state and its successors against a full depth-H tree search from ``state``.

    Returns:
        The simulations the tree search took.

    Raises:
        EvidenceError: a stored observation, reward or label the tree search denies.
    """
    big_h = regenerated.preset.horizon
    _check_observed(row, scene, state, stored, deny)
    search = TreeSearch([scene], regenerated.environment)
    root = search.node(0, state)
    search.expand([root], big_h)
    _check_tree_labels(row, search, root, big_h, labels, deny)
    for a, (child, _) in enumerate(search.children(root)):
        succ = int(labels.successor[row, a])
        _check_observed(succ, scene, search.state(child), stored, deny)
        _check_tree_labels(succ, search, child, big_h - 1, labels, deny)
    return search.simulations


def _check_observed(
    row: int, scene: dict, state: np.ndarray, stored: _Observations, deny: Callable[[int, str], EvidenceError]
) -> None:
    """Refuse a row whose stored observations are not what the environment observes of ``state``."""
    denied = stored.check(row, scene, state)
    if denied is not None:
        raise deny(row, denied)


def _check_tree_labels(
    row: int, search: TreeSearch, key, horizons: int, labels: LabelArrays, deny: Callable[[int, str], EvidenceError]
) -> None:
    """Refuse a stored reward or Q* label (horizons 1..``horizons``) that the tree search below ``key`` denies."""
    true_q = search.q(key, horizons)
    true_r = np.array([r for _, r in search.children(key)])
    for a in range(len(true_r)):
        if labels.reward[row, a] != true_r[a]:
            raise deny(
                row,
                f"candidate {a} horizon 1 reward: stored {float(labels.reward[row, a])!r}, "
                f"stepped {float(true_r[a])!r}",
            )
        for h in range(horizons):
            if labels.q[row, a, h] != true_q[a, h]:
                raise deny(
                    row,
                    f"candidate {a} horizon {h + 1}: stored Q*_{h + 1} {float(labels.q[row, a, h])!r}, "
                    f"stepped {float(true_q[a, h])!r}",
                )


def _check_chains(
    path: Path, labels: LabelArrays, preset: Preset, split: str, seed: int, scene_ids: list[int], *, call: str
) -> None:
    """Every chain the preset draws is there, whole, and follows its actor's own choices.

    Chain g is chain g % chains_per_scene of scene g // chains_per_scene (``chains.run_chains``);
    its actor stream is replayed on the stored Q*_H of each of its states (checked by Bellman
    and, where audited, by stepping), and the state after each step must be the successor of the
    candidate the actor takes. So a forger can neither drop, add nor re-route a chain.
    """
    chain = labels.step >= 0
    by_chain: dict[int, dict[int, int]] = {}
    for row in np.flatnonzero(chain):
        by_chain.setdefault(int(labels.chain_id[row]), {})[int(labels.step[row])] = int(row)
    per_scene = preset.chains_per_scene
    expected = preset.scenes * per_scene
    if sorted(by_chain) != list(range(expected)):
        raise label_refusal(
            call,
            path / "states.parquet",
            f"chain ids {sorted(by_chain)[:8]}... are not the {expected} chains "
            f"0..{expected - 1} preset {preset.name!r} draws",
        )
    for chain_id, steps in sorted(by_chain.items()):
        scene_index, c = divmod(chain_id, per_scene)
        rows = [steps.get(step) for step in range(preset.steps)]
        if (
            None in rows
            or len(steps) != preset.steps
            or any(int(labels.scene_id[r]) != scene_ids[scene_index] for r in rows)
        ):
            raise label_refusal(
                call,
                path / "states.parquet",
                f"chain {chain_id} does not hold steps 0..{preset.steps - 1} of scene_id {scene_ids[scene_index]}",
            )
        rng = np.random.Generator(np.random.PCG64(actor_seed_sequence(split, seed, scene_index, c)))
        for step, row in enumerate(rows[:-1]):
            valid = labels.mask[row]
            taken = choose_action(preset.actor, labels.q[row, valid, preset.horizon - 1], rng)
            if int(labels.successor[row, taken]) != rows[step + 1]:
                raise label_refusal(
                    call,
                    path,
                    f"the environment denies state_id {int(labels.state_id[rows[step + 1]])}: chain "
                    f"{chain_id} step {step + 1} is not where the declared actor goes (it takes candidate "
                    f"{taken} at state_id {int(labels.state_id[row])})",
                )
