"""A population's labels as arrays, and the exact Bellman rule every label obeys.

Owns: reading a population's label arrays (``read_labels``, ``LabelArrays``), the manifest counts
they must match (``check_counts``), their structure (``check_structure``: rows, candidates,
successors and parents that point where they should), the exact Bellman consistency of every
stored label against the stored rewards and successors (``bellman_violations``,
``check_bellman``) and the refusal of a population that breaks them (``label_refusal``). Needs no
environment code, so ``qhlab verify`` runs it on any population. Does not own: authenticating
file digests (``manifest.read_manifest``), stepping an environment again (``audit``) or reading
the tables into the tensors' arrays (``reader``).

The Bellman check is exact: genuine labels are computed as ``r + max`` in float64, the same
operation repeated here, so the tolerance is 0. It catches every label that disagrees with the
stored rewards and successors; a forgery that rewrites rewards and labels consistently passes
it, which is what ``audit`` is for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qhlab.evidence import EvidenceError

__all__ = [
    "LabelArrays",
    "bellman_violations",
    "check_bellman",
    "check_counts",
    "check_structure",
    "label_refusal",
    "read_labels",
]


@dataclass(frozen=True)
class LabelArrays:
    """A population's labels in file order (S states: chain and successor rows as stored).

    Attributes:
        state_id: [S] int64.
        scene_id: [S] int64.
        chain_id: [S] int64.
        step: [S] int64, -1 for successor rows.
        reward: [S, K] float64 r(s, a); NaN where a state has fewer candidates.
        q: [S, K, H] float64 labels; NaN beyond a row's horizons and its candidates.
        horizons: [S] int64 label horizons (H on chain rows, H-1 on successor rows).
        successor: [S, K] int64 row (index into the arrays) of each candidate's successor, -1 none.
        mask: [S, K] bool, the candidates a state has (0..k-1 of its k).
        parent: [S] int64 row of the chain state a successor row belongs to (-1 on chain rows), or
            None where the reader did not read ``parent_state_id`` (the tensor loader).
    """

    state_id: np.ndarray
    scene_id: np.ndarray
    chain_id: np.ndarray
    step: np.ndarray
    reward: np.ndarray
    q: np.ndarray
    horizons: np.ndarray
    successor: np.ndarray
    mask: np.ndarray
    parent: np.ndarray | None = None


def label_refusal(call: str, where: Path, what: str) -> EvidenceError:
    """The refusal of a population whose labels or their arrays are wrong: where, and what."""
    return EvidenceError(
        f"{call}: {where}: {what}. HINT: a population's labels are exact physics; regenerate it with "
        "`qhlab scenes generate` instead of editing it (a cached one: delete its directory and the next "
        "run makes it again; environment code that changed without a new version is refused this way too)."
    )


def read_labels(path: str | os.PathLike, manifest: dict, *, call: str = "check_labels") -> LabelArrays:
    """Read states.parquet and candidates.parquet into ``LabelArrays`` (authenticate first).

    Raises:
        EvidenceError: a column is missing, an id is unknown, or a state's candidates are not
            0..k-1 each exactly once (k <= K).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    k, big_h = int(manifest["K"]), int(manifest["horizon"])
    states_path, cands_path = path / "states.parquet", path / "candidates.parquet"
    try:
        states = pq.read_table(states_path, columns=["state_id", "scene_id", "chain_id", "step", "parent_state_id"])
        cands = pq.read_table(cands_path, columns=["state_id", "candidate", "reward", "q", "successor_state_id"])
    except Exception as exc:  # pyarrow raises several types for a missing column or a bad file
        raise label_refusal(call, path, f"cannot read the label columns ({exc})") from None
    ints = {name: states.column(name).to_numpy().astype(np.int64) for name in states.column_names}
    state_id, step = ints["state_id"], ints["step"]
    s_rows = len(state_id)
    order = np.argsort(state_id, kind="stable")
    if s_rows and (np.diff(state_id[order]) == 0).any():
        raise label_refusal(call, states_path, "state_id holds duplicates")

    def rows_of(ids: np.ndarray, what: str) -> np.ndarray:
        pos = np.searchsorted(state_id[order], ids)
        pos = np.clip(pos, 0, max(s_rows - 1, 0))
        ok = (s_rows > 0) & (state_id[order][pos] == ids) if s_rows else np.zeros(len(ids), bool)
        if not np.all(ok):
            raise label_refusal(call, cands_path, f"{what}={int(ids[~ok][0])} is not a state_id of {states_path.name}")
        return order[pos]

    c_state = cands.column("state_id").to_numpy().astype(np.int64)
    c_index = cands.column("candidate").to_numpy().astype(np.int64)
    c_row = rows_of(c_state, "state_id")
    if ((c_index < 0) | (c_index >= k)).any():
        raise label_refusal(
            call, cands_path, f"candidate={int(c_index[(c_index < 0) | (c_index >= k)][0])} is outside 0..{k - 1}"
        )
    # The arrays are as wide as the most candidates a state holds, never the declared K alone: a
    # K far above what the environment offers must not size them (a manifest's K is only a bound).
    k = int(c_index.max()) + 1 if c_index.size else 1
    filled = np.zeros((s_rows, k), dtype=np.int64)
    np.add.at(filled, (c_row, c_index), 1)
    counts = filled.sum(axis=1)
    mask = np.arange(k)[None, :] < counts[:, None]
    if (filled != mask).any() or (counts < 1).any():
        row, cand = np.argwhere((filled != mask) | (counts < 1)[:, None])[0]
        raise label_refusal(
            call,
            cands_path,
            f"state_id {int(state_id[row])} candidate {int(cand)} has {int(filled[row, cand])} rows; allowed: "
            "exactly one for each of a state's candidates 0..k-1 (k >= 1), none beyond",
        )
    horizons = np.where(step >= 0, big_h, big_h - 1).astype(np.int64)
    q_col = cands.column("q").combine_chunks()
    lengths = pc.list_value_length(q_col).to_numpy(zero_copy_only=False).astype(np.int64)
    if (lengths != horizons[c_row]).any():
        bad = int(np.argmax(lengths != horizons[c_row]))
        raise label_refusal(
            call,
            cands_path,
            f"state_id {int(c_state[bad])} candidate {int(c_index[bad])} has "
            f"{int(lengths[bad])} labels; allowed: {int(horizons[c_row][bad])} (H on chain states, "
            "H-1 on successors)",
        )
    flat = q_col.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    q = np.full((s_rows, k, big_h), np.nan)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    for h in range(big_h):
        has = lengths > h
        q[c_row[has], c_index[has], h] = flat[offsets[has] + h]
    reward = np.full((s_rows, k), np.nan)
    reward[c_row, c_index] = cands.column("reward").to_numpy().astype(np.float64)
    succ_ids = cands.column("successor_state_id").to_numpy().astype(np.int64)
    successor = np.full((s_rows, k), -1, dtype=np.int64)
    linked = succ_ids != -1
    successor[c_row[linked], c_index[linked]] = rows_of(succ_ids[linked], "successor_state_id")
    parent_ids = ints["parent_state_id"]
    parent = np.full(s_rows, -1, dtype=np.int64)
    has_parent = parent_ids != -1
    parent[has_parent] = rows_of(parent_ids[has_parent], "parent_state_id")
    return LabelArrays(
        state_id=state_id,
        scene_id=ints["scene_id"],
        chain_id=ints["chain_id"],
        step=step,
        reward=reward,
        q=q,
        horizons=horizons,
        successor=successor,
        mask=mask,
        parent=parent,
    )


def check_counts(
    path: str | os.PathLike, manifest: dict, labels: LabelArrays, *, scenes: int, call: str = "check_labels"
) -> None:
    """Refuse a manifest whose ``counts`` disagree with the files.

    Args:
        scenes: rows of scenes.parquet.

    Raises:
        EvidenceError: naming the count, the recorded and the actual value.
    """
    chain = labels.step >= 0
    actual = {
        "scenes": scenes,
        "chains": int(np.unique(labels.chain_id[chain]).size),
        "chain_states": int(chain.sum()),
        "successor_states": int((~chain).sum()),
        "states": int(len(labels.state_id)),
        "candidates": int(labels.mask.sum()),
    }
    counts = manifest.get("counts")
    for name, value in actual.items():
        recorded = counts.get(name) if isinstance(counts, dict) else None
        if recorded != value:
            raise label_refusal(
                call,
                Path(path) / "manifest.json",
                f"counts.{name}={recorded!r} is not allowed; allowed: {value} (what the files hold)",
            )


def check_structure(where: str | os.PathLike, labels: LabelArrays, *, call: str = "check_labels") -> None:
    """Refuse a population whose states do not form the tree the generator writes.

    Every reward and every label within a row's horizons is finite; chain rows have steps
    0, 1, ... without gaps and one row per (chain, step); every candidate of a chain row has a
    successor in the same scene and chain, which is the chain's next state or a successor row
    (step -1) that no other candidate points at; successor rows have no successors. Without
    this a NaN label, a dropped candidate link or a successor borrowed from another scene would
    hide labels from the Bellman check.

    Raises:
        EvidenceError: naming the state and what is wrong.
    """

    def refuse(row: int, what: str) -> EvidenceError:
        return label_refusal(call, where, f"state_id {int(labels.state_id[row])} {what}")

    s_rows, _, big_h = labels.q.shape
    valid = np.arange(1, big_h + 1)[None, :] <= labels.horizons[:, None]
    bad = ~np.where(labels.mask, np.isfinite(labels.reward), True).all(axis=1) | ~np.where(
        valid[:, None, :] & labels.mask[:, :, None], np.isfinite(labels.q), True
    ).all(axis=(1, 2))
    if bad.any():
        raise refuse(int(np.argmax(bad)), "holds a reward or label that is not a finite number")
    chain = labels.step >= 0
    if (labels.step < -1).any():
        raise refuse(int(np.argmax(labels.step < -1)), f"has step {int(labels.step.min())}; allowed: -1 or >= 0")
    seen: dict[tuple[int, int], int] = {}
    for row in np.flatnonzero(chain):
        key = (int(labels.chain_id[row]), int(labels.step[row]))
        if key in seen:
            raise refuse(
                int(row), f"repeats chain {key[0]} step {key[1]} (also state_id {int(labels.state_id[seen[key]])})"
            )
        seen[key] = int(row)
    for (chain_id, step), row in seen.items():
        if step > 0 and (chain_id, step - 1) not in seen:
            raise refuse(row, f"is step {step} of chain {chain_id}, whose step {step - 1} is missing")
    if (labels.successor[~chain] != -1).any():
        raise refuse(
            int(np.flatnonzero(~chain & (labels.successor != -1).any(axis=1))[0]),
            "is a successor state with successors; allowed: none (leaves of the stored tree)",
        )
    referenced = np.zeros(s_rows, dtype=np.int64)
    for row in np.flatnonzero(chain):
        for a in np.flatnonzero(labels.mask[row]):
            succ = labels.successor[row, a]
            if succ < 0:
                raise refuse(int(row), f"candidate {a} has no successor; every chain-state candidate has one")
            if labels.scene_id[succ] != labels.scene_id[row] or labels.chain_id[succ] != labels.chain_id[row]:
                raise refuse(
                    int(row), f"candidate {a} leads to state_id {int(labels.state_id[succ])} of another scene or chain"
                )
            if labels.step[succ] >= 0 and labels.step[succ] != labels.step[row] + 1:
                raise refuse(
                    int(row),
                    f"candidate {a} leads to chain state {int(labels.state_id[succ])} that is not "
                    "its chain's next step",
                )
            referenced[succ] += 1
            if labels.parent is not None and labels.step[succ] < 0 and labels.parent[succ] != row:
                raise refuse(
                    int(succ),
                    f"names parent state_id {int(labels.state_id[labels.parent[succ]])}, but state_id "
                    f"{int(labels.state_id[row])} candidate {a} leads to it",
                )
    if labels.parent is not None and (labels.parent[chain] != -1).any():
        raise refuse(int(np.flatnonzero(chain & (labels.parent != -1))[0]), "is a chain state with a parent_state_id")
    shared = ~chain & (referenced != 1)
    if shared.any():
        row = int(np.argmax(shared))
        raise refuse(row, f"is a successor state reached by {int(referenced[row])} candidates; allowed: exactly 1")


def bellman_violations(q: np.ndarray, reward: np.ndarray, successor: np.ndarray, horizons: np.ndarray) -> np.ndarray:
    """Where stored labels break Q_1 = r and Q_h = r + max_a' Q_{h-1}(s', a'), exactly.

    Args:
        q: [S, K, H] float64 labels (NaN beyond ``horizons``).
        reward: [S, K] float64 rewards.
        successor: [S, K] int64 successor row per candidate, -1 where none is stored.
        horizons: [S] int64 label horizons per row.

    Returns:
        [V, 3] int64 (row, candidate, horizon h in 1..H) of every violation, sorted by row.
        A label whose successor is not stored (a successor row's Q_h, h >= 2) is not
        checkable here; the physics audit checks it.
    """
    s_rows, k, big_h = q.shape
    valid = np.arange(1, big_h + 1)[None, :] <= horizons[:, None]  # [S, H]
    expected = np.full_like(q, np.nan)
    expected[:, :, 0] = reward
    linked = successor >= 0
    safe = np.where(linked, successor, 0)
    # A state's missing candidates (NaN) take no part in its maximum.
    present = ~np.isnan(reward)
    for h in range(2, big_h + 1):
        best = np.max(np.where(present, q[:, :, h - 2], -np.inf), axis=1)  # [S] V_{h-1}(row)
        expected[:, :, h - 1] = np.where(linked, reward + best[safe], np.nan)
    checked = valid[:, None, :] & ~np.isnan(expected)
    # Genuine labels are the same float64 sum, so equality is exact. Non-finite values and
    # missing links are refused by check_structure first, which a caller runs before this.
    bad = checked & ~(q == expected)
    found = np.argwhere(bad)
    found[:, 2] += 1
    return found.astype(np.int64)


def check_bellman(
    where: str | os.PathLike,
    q: np.ndarray,
    reward: np.ndarray,
    successor: np.ndarray,
    horizons: np.ndarray,
    state_id: np.ndarray,
    *,
    call: str = "check_labels",
) -> None:
    """Refuse labels that break the Bellman rule, naming the first state, candidate and horizon.

    Args:
        where: the file named in the refusal (candidates.parquet).
        q, reward, successor, horizons: as in ``bellman_violations``.
        state_id: [S] int64 id of each row.

    Raises:
        EvidenceError: with the number of violations in all.
    """
    found = bellman_violations(q, reward, successor, horizons)
    if not len(found):
        return
    row, cand, h = (int(v) for v in found[0])
    if h == 1:
        rule = f"Q*_1 = r = {float(reward[row, cand])!r}"
    else:
        succ = int(successor[row, cand])
        rule = (
            f"Q*_{h} = r + max Q*_{h - 1}(successor state_id {int(state_id[succ])}) = "
            f"{float(reward[row, cand])!r} + {float(np.nanmax(q[succ, :, h - 2]))!r}"
        )
    raise label_refusal(
        call,
        where,
        (
            f"labels break the Bellman rule at state_id {int(state_id[row])} candidate {cand} horizon {h}: "
            f"stored {float(q[row, cand, h - 1])!r}, but {rule} ({len(found)} violation(s) in all)"
        ),
    )
