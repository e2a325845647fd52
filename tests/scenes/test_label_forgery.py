"""Forged labels against the Bellman check and the physics audit.

Every forgery here recomputes the manifest's file digests and re-issues the population receipt,
so digests alone cannot refuse it: only the label checks can.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qhlab.cli import main
from qhlab.evidence import EvidenceError, canonical_json, sha256_file, write_receipt
from qhlab.evidence.layout import POPULATION_FILES
from qhlab.finite_horizon.data import load_population
from qhlab.scenes import cached_population
from qhlab.scenes.audit import audit_population, check_population_labels, check_successors, miss_probability
from qhlab.scenes.bellman import bellman_violations, read_labels
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.records import PopulationGenerationReceipt, PopulationReceipt

STUDY_TEMPLATE = Path(__file__).resolve().parents[1] / "study" / "tiny-study.toml"


def _reseal(population: Path, *, manifest_edit=None) -> None:
    """Re-bind every file digest in the manifest and re-issue the receipt (what a forger does)."""
    manifest = json.loads((population / "manifest.json").read_text())
    for name in POPULATION_FILES:
        manifest["files"][name] = sha256_file(population / name)
    if manifest_edit is not None:
        manifest_edit(manifest)
    (population / "manifest.json").write_bytes(canonical_json(manifest))
    receipt = population / "population.receipt.json"
    body = json.loads(receipt.read_text())["body"]
    receipt.unlink()
    write_receipt(
        receipt, PopulationReceipt, body=body, outputs={n: population / n for n in (*POPULATION_FILES, "manifest.json")}
    )
    generation = population / "generation.receipt.json"
    body = json.loads(generation.read_text())["body"]
    generation.unlink()
    write_receipt(generation, PopulationGenerationReceipt, body=body, inputs={"manifest": population / "manifest.json"})


def _write_labels(population: Path, reward: np.ndarray, q: np.ndarray, labels) -> None:
    """Write rewards [S, K] and labels [S, K, H] (file-order rows) back into candidates.parquet."""
    table = pq.read_table(population / "candidates.parquet")
    row_of = {int(s): i for i, s in enumerate(labels.state_id)}
    rows = [row_of[int(s)] for s in table.column("state_id").to_numpy()]
    cands = table.column("candidate").to_numpy()
    new_reward = [float(reward[r, c]) for r, c in zip(rows, cands)]
    new_q = [[float(v) for v in q[r, c, : labels.horizons[r]]] for r, c in zip(rows, cands)]
    table = table.set_column(table.column_names.index("reward"), "reward", pa.array(new_reward, pa.float64()))
    table = table.set_column(table.column_names.index("q"), "q", pa.array(new_q, pa.list_(pa.float64())))
    pq.write_table(table, population / "candidates.parquet")
    _reseal(population)


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    for f in target.iterdir():
        f.chmod(0o644)
    return target


def swap_forgery(source: Path, target: Path) -> Path:
    """Labels of candidates 0 and 1 of the first chain state swapped (not Bellman-consistent)."""
    population = _copy(source, target)
    labels = read_labels(population, read_manifest(population))
    q = labels.q.copy()
    first = int(np.flatnonzero(labels.step >= 0)[0])
    q[first, [0, 1]] = q[first, [1, 0]]
    _write_labels(population, labels.reward, q, labels)
    return population


def consistent_forgery(source: Path, target: Path, delta: float = 0.01) -> Path:
    """Every successor state's rewards raised by ``delta`` and every label recomputed so that
    Q_1 = r and Q_h = r + max Q_{h-1}(successor) hold exactly: fake physics, true Bellman."""
    population = _copy(source, target)
    labels = read_labels(population, read_manifest(population))
    reward, q = labels.reward.copy(), labels.q.copy()
    leaves = labels.step < 0
    reward[leaves] += delta
    q[leaves] += delta
    for _ in range(q.shape[2]):  # a fixed point: chains are at most H deep in successors
        for row in np.flatnonzero(labels.step >= 0):
            succ = labels.successor[row]
            for h in range(1, labels.horizons[row]):
                q[row, :, h] = reward[row] + np.max(q[succ, :, h - 1], axis=1)
    q[:, :, 0] = np.where(np.isnan(q[:, :, 0]), np.nan, reward)
    _write_labels(population, reward, q, labels)
    return population


@pytest.fixture
def swapped(tiny_train, tmp_path) -> Path:
    return swap_forgery(tiny_train, tmp_path / "swapped")


@pytest.fixture
def consistent(tiny_train, tmp_path) -> Path:
    return consistent_forgery(tiny_train, tmp_path / "consistent")


def test_genuine_labels_are_exactly_bellman_consistent(tiny_train) -> None:
    labels = check_population_labels(tiny_train)
    assert len(bellman_violations(labels.q, labels.reward, labels.successor, labels.horizons)) == 0
    record = audit_population(tiny_train, states=None)
    assert record["result"] == "passed" and record["audited"] == record["chain_states"] == 6
    assert record["scenes_checked"] == 3 and record["simulations"] > 0


def test_bellman_violations_by_hand() -> None:
    # Two rows: a chain row (H=2) whose candidates lead to row 1, a successor row (H-1 = 1).
    reward = np.array([[0.1, 0.2], [0.3, 0.05]])
    q = np.full((2, 2, 2), np.nan)
    q[1, :, 0] = [0.3, 0.05]
    q[0, :, 0] = [0.1, 0.2]
    q[0, :, 1] = [0.1 + 0.3, 0.2 + 0.3]
    successor = np.array([[1, 1], [-1, -1]])
    horizons = np.array([2, 1])
    assert bellman_violations(q, reward, successor, horizons).tolist() == []
    q[0, 1, 1] = np.nextafter(q[0, 1, 1], 1.0)  # one ulp is a violation: the tolerance is 0
    q[1, 0, 0] = 0.31
    assert bellman_violations(q, reward, successor, horizons).tolist() == [[0, 0, 2], [0, 1, 2], [1, 0, 1]]


def test_the_swap_forgery_is_refused_by_load_describe_and_verify(swapped, capsys) -> None:
    with pytest.raises(EvidenceError, match=r"Bellman rule at state_id 0 candidate 0 horizon 1"):
        load_population(swapped, split="train")
    assert main(["scenes", "describe", str(swapped)]) == 2
    err = capsys.readouterr().err
    assert "describe_population" in err and "state_id 0 candidate 0 horizon 1" in err, err
    assert main(["verify", str(swapped)]) == 2
    err = capsys.readouterr().err
    assert "qhlab verify" in err and "state_id 0 candidate 0 horizon 1" in err, err


def test_the_consistent_forgery_passes_bellman_but_not_physics(consistent, capsys) -> None:
    # The forgery is good: digests, counts and every Bellman equation hold.
    check_population_labels(consistent)
    load_population(consistent, split="train")
    assert main(["verify", str(consistent)]) == 0
    capsys.readouterr()
    # Physics does not: every audit names a state, a candidate and a horizon.
    with pytest.raises(EvidenceError, match=r"the environment denies state_id \d+: candidate \d horizon [12]"):
        audit_population(consistent, states=1)
    for argv in (
        ["scenes", "audit", str(consistent)],
        ["scenes", "describe", str(consistent), "--audit", "8"],
        ["verify", str(consistent), "--audit", "8"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "the environment denies state_id" in err and "horizon" in err, (argv, err)


def test_a_forged_scene_is_refused_even_with_true_labels(tiny_train, tmp_path) -> None:
    population = _copy(tiny_train, tmp_path / "heavy")
    table = pq.read_table(population / "scenes.parquet")
    masses = table.column("mass").to_pylist()
    masses[1] = [m * 1.01 for m in masses[1]]
    table = table.set_column(table.column_names.index("mass"), "mass", pa.array(masses, pa.list_(pa.float64())))
    pq.write_table(table, population / "scenes.parquet")
    _reseal(population)
    with pytest.raises(EvidenceError, match=r"scene_index 1 .* is not the scene environment 'puck' draws"):
        audit_population(population, states=1)


def test_lying_counts_are_refused_by_describe(tiny_train, tmp_path, capsys) -> None:
    population = _copy(tiny_train, tmp_path / "liar")

    def lie(manifest: dict) -> None:
        manifest["counts"]["chain_states"] += 1

    _reseal(population, manifest_edit=lie)
    assert main(["scenes", "describe", str(population)]) == 2
    err = capsys.readouterr().err
    assert "counts.chain_states=7 is not allowed; allowed: 6" in err, err


def test_a_planted_cache_entry_is_refused(tiny_train, tmp_path) -> None:
    cache = tmp_path / "cache"
    genuine = cached_population("tiny", "train", 0, cache, workers=1)
    shutil.rmtree(genuine)
    consistent_forgery(tiny_train, genuine)  # tiny_train is (tiny, train, 0): the same key
    with pytest.raises(EvidenceError, match=r"cached_population: .*the environment denies state_id"):
        cached_population("tiny", "train", 0, cache, workers=1)


def test_freeze_refuses_both_forgeries_and_records_its_audit(swapped, consistent, tiny_train, tmp_path, capsys) -> None:
    def config(train: Path, name: str) -> Path:
        text = STUDY_TEMPLATE.read_text().replace(
            'population_cache = "populations"', f'population_cache = "{tmp_path / "cache"}"'
        )
        text = text.replace('[train]\npreset = "tiny"\nseed = 7', f'[train]\npath = "{train}"')
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        return path

    for forged, expected in (
        (swapped, "Bellman rule at state_id 0 candidate 0 horizon 1"),
        (consistent, "the environment denies state_id"),
    ):
        out = tmp_path / f"study-{forged.name}"
        assert main(["study", "freeze", str(config(forged, forged.name)), "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("error:") == 1, err
        assert not out.exists()
    out = tmp_path / "study-genuine"
    assert main(["study", "freeze", str(config(tiny_train, "genuine")), "--output", str(out)]) == 0
    audit = json.loads((out / "freeze.receipt.json").read_text())["body"]["train"]["audit"]
    assert audit["result"] == "passed" and audit["audited"] == 6 and audit["source"].startswith("os.urandom")


def test_miss_probability() -> None:
    assert miss_probability(576, 576, 8) == 0.0
    assert miss_probability(10, 1, 8) == pytest.approx(0.2)
    by_hand = float(np.prod([(518 - i) / (576 - i) for i in range(8)]))  # draws without replacement
    assert miss_probability(576, 58, 8) == pytest.approx(by_hand, rel=1e-12)
    assert miss_probability(576, 58, 8) <= (1 - 58 / 576) ** 8


def _edit_column(population: Path, name: str, column: str, edit) -> None:
    table = pq.read_table(population / name)
    values = table.column(column).to_pylist()
    edit(values)
    table = table.set_column(
        table.column_names.index(column),
        table.schema.field(column),
        pa.array(values, type=table.schema.field(column).type),
    )
    pq.write_table(table, population / name)


def test_structural_forgeries_are_refused_naming_the_state(tiny_train, tmp_path) -> None:
    # A NaN reward (it would hide its parent's labels from the Bellman equations).
    nan = _copy(tiny_train, tmp_path / "nan")
    _edit_column(nan, "candidates.parquet", "reward", lambda v: v.__setitem__(len(v) - 1, float("nan")))
    _reseal(nan)
    with pytest.raises(EvidenceError, match=r"state_id \d+ holds a reward or label that is not a finite number"):
        check_population_labels(nan)
    # A successor state that names another parent than the candidate that leads to it.
    parent = _copy(tiny_train, tmp_path / "parent")
    _edit_column(parent, "states.parquet", "parent_state_id", lambda v: v.__setitem__(6, 3 if v[6] != 3 else 0))
    _reseal(parent)
    with pytest.raises(EvidenceError, match=r"state_id 6 names parent state_id \d+, but state_id \d+ candidate"):
        check_population_labels(parent)


def test_a_dropped_chain_is_refused_by_the_audit(tiny_train, tmp_path) -> None:
    import pyarrow.compute as pc

    population = _copy(tiny_train, tmp_path / "dropped")
    states = pq.read_table(population / "states.parquet")
    keep = pc.not_equal(states.column("chain_id"), 2)
    kept_ids = set(states.filter(keep).column("state_id").to_pylist())
    pq.write_table(states.filter(keep), population / "states.parquet")
    cands = pq.read_table(population / "candidates.parquet")
    pq.write_table(
        cands.filter(pa.array([s in kept_ids for s in cands.column("state_id").to_pylist()])),
        population / "candidates.parquet",
    )

    def counts(manifest: dict) -> None:
        labels = read_labels(population, manifest)
        chain = labels.step >= 0
        manifest["counts"].update(
            chains=2,
            chain_states=int(chain.sum()),
            successor_states=int((~chain).sum()),
            states=len(labels.state_id),
            candidates=int(labels.reward.size),
        )

    _reseal(population, manifest_edit=counts)
    check_population_labels(population)  # what is left is a consistent tree
    with pytest.raises(EvidenceError, match=r"chain ids \[0, 1\]\.\.\. are not the 3 chains 0\.\.2 preset 'tiny'"):
        audit_population(population, states=None)


def moved_successors_forgery(source: Path, target: Path, *, shift: float = 0.01) -> tuple[Path, int]:
    """Puck 0 moved by ``shift`` metres in every successor row (step -1) of one chain state,
    positions and object features changed together; rewards and labels untouched, digests
    resealed. Returns the population and the chain state's id."""
    population = _copy(source, target)
    labels = read_labels(population, read_manifest(population))
    chain_row = int(np.flatnonzero(labels.step >= 0)[-1])
    rows = [int(r) for r in labels.successor[chain_row] if labels.step[r] < 0]
    table = pq.read_table(population / "states.parquet")
    positions, objects = table.column("positions").to_pylist(), table.column("objects").to_pylist()
    for row in rows:
        positions[row][0] += shift
        objects[row][0][0] += shift
    for column, values in (("positions", positions), ("objects", objects)):
        field = table.schema.field(column)
        table = table.set_column(table.column_names.index(column), field, pa.array(values, type=field.type))
    pq.write_table(table, population / "states.parquet")
    _reseal(population)
    return population, int(labels.state_id[chain_row])


def test_every_successor_is_re_simulated_on_every_load(tiny_train, tmp_path, capsys) -> None:
    population, state = moved_successors_forgery(tiny_train, tmp_path / "moved")
    labels = read_labels(population, read_manifest(population))
    # Bellman holds (labels untouched), so only physics can refuse it: every load, every row.
    assert len(bellman_violations(labels.q, labels.reward, labels.successor, labels.horizons)) == 0
    denial = (
        rf"the environment denies state_id {state}: candidate \d leads to state_id \d+, "
        "where its state is not where the environment.s step leads"
    )
    with pytest.raises(EvidenceError, match=denial):
        load_population(population, split="train")
    with pytest.raises(EvidenceError, match=denial):
        check_population_labels(population)
    assert main(["verify", str(population)]) == 2  # no --audit: the successor check is not sampled
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"the environment denies state_id {state}" in err, err
    # The genuine population passes, with one simulation per chain-state candidate.
    genuine = read_labels(tiny_train, read_manifest(tiny_train))
    assert (
        check_successors(tiny_train, read_manifest(tiny_train), genuine)["simulations"]
        == int((genuine.step >= 0).sum()) * genuine.reward.shape[1]
    )


def test_verify_and_describe_state_the_audit_coverage(tiny_train, capsys) -> None:
    assert main(["verify", str(tiny_train)]) == 0
    out = capsys.readouterr().out
    assert (
        "every one-step successor stepped again (36 steps) equals its environment's; the depth-H tree of its 6 "
        "chain states was not audited" in out
    ), out
    assert main(["verify", str(tiny_train), "--audit", "2"]) == 0
    out = capsys.readouterr().out
    # C(5, 2) / C(6, 2) = 10 / 15: a one-state forgery of the tree escapes 2 of 6 audited states.
    assert "depth-H tree of 2 of 6 chain states stepped again" in out and "missed with p = 0.667" in out, out
    assert main(["scenes", "describe", str(tiny_train), "--audit", "8"]) == 0
    assert "depth-H tree of 6 of 6 chain states" in capsys.readouterr().out
    # Without --audit it reads: the built-in environment's successors stepped, no tree.
    assert main(["scenes", "describe", str(tiny_train)]) == 0
    assert "every one-step successor stepped again equals its built-in environment's" in capsys.readouterr().out


@pytest.mark.slow
def test_a_successor_forgery_beyond_the_sampled_audit_is_always_refused(tmp_path, capsys) -> None:
    """On the bench preset (72 chain states, 8 audited) the tree audit would miss a one-state
    forgery with p = 0.889; the every-successor check refuses it on every run."""
    from qhlab.scenes import generate_population

    genuine = generate_population("bench", "train", 5, tmp_path / "bench", workers=2)
    population, state = moved_successors_forgery(genuine, tmp_path / "forged")
    assert miss_probability(72, 1, 8) == pytest.approx(64 / 72)
    for _ in range(3):
        assert main(["scenes", "describe", str(population)]) == 2
        err = capsys.readouterr().err
        assert f"the environment denies state_id {state}" in err, err
    with pytest.raises(EvidenceError, match=f"the environment denies state_id {state}"):
        load_population(population, split="train")


def _forge_features(source: Path, target: Path, what: str) -> Path:
    """Every goal moved by 1 m, or every candidate's features negated, or every candidate pointed at
    object 0: what a scorer reads, changed in every row (chain and successor), labels and states
    untouched, digests resealed."""
    population = _copy(source, target)
    if what == "goal":
        table = pq.read_table(population / "states.parquet")
        goals = [[v + 1.0 for v in goal] for goal in table.column("goal").to_pylist()]
        field = table.schema.field("goal")
        table = table.set_column(table.column_names.index("goal"), field, pa.array(goals, type=field.type))
        pq.write_table(table, population / "states.parquet")
    else:
        table = pq.read_table(population / "candidates.parquet")
        if what == "features":
            values = [[-v for v in f] for f in table.column("features").to_pylist()]
            column = "features"
        else:
            values = [0 for _ in range(table.num_rows)]
            column = "object"
        field = table.schema.field(column)
        table = table.set_column(table.column_names.index(column), field, pa.array(values, type=field.type))
        pq.write_table(table, population / "candidates.parquet")
    _reseal(population)
    return population


@pytest.mark.parametrize(
    "what, denial",
    [
        ("goal", "its goal features are not those of its state"),
        ("features", r"candidate \d's features are not the environment's"),
        ("object", r"candidate \d acts on object 0; the environment's on"),
    ],
)
def test_every_feature_a_scorer_reads_is_checked_on_every_load(tiny_train, tmp_path, capsys, what, denial) -> None:
    population = _forge_features(tiny_train, tmp_path / what, what)
    labels = read_labels(population, read_manifest(population))
    # Labels, rewards and states are the genuine ones: Bellman holds, only the observation check refuses.
    assert len(bellman_violations(labels.q, labels.reward, labels.successor, labels.horizons)) == 0
    with pytest.raises(EvidenceError, match=denial):
        load_population(population, split="train")
    assert main(["verify", str(population)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and re.search(denial, err), err
