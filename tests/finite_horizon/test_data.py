"""The population reader: tensors as in docs/ARCHITECTURE.md, and every refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from puck_world import puck_parameters
from qhlab.evidence import (
    DigestMismatchError,
    MissingEvidenceError,
    QhInputError,
    SchemaMismatchError,
    canonical_json,
    sha256_file,
    write_receipt,
)
from qhlab.evidence.layout import POPULATION_FILES
from qhlab.finite_horizon.data import Population, load_population
from qhlab.scenes import generate_population, load_preset
from qhlab.scenes.records import PopulationReceipt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return generate_population("tiny", "train", 0, tmp_path_factory.mktemp("data") / "tiny", workers=1)


@pytest.fixture
def copy(tiny, tmp_path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(tiny, target)
    for f in target.iterdir():
        f.chmod(0o644)
    return target


def _forge_manifest(population: Path, manifest: dict) -> None:
    """Write a manifest and re-issue the receipt, so only the content checks can object."""
    (population / "manifest.json").write_bytes(canonical_json(manifest))
    receipt = population / "population.receipt.json"
    body = json.loads(receipt.read_text())["body"]
    receipt.unlink()
    write_receipt(
        receipt, PopulationReceipt, body=body, outputs={n: population / n for n in (*POPULATION_FILES, "manifest.json")}
    )


def _rewrite(population: Path, name: str, table: pa.Table) -> None:
    """Replace a file AND re-bind its digest, so only the content check can object."""
    pq.write_table(table, population / name)
    manifest = json.loads((population / "manifest.json").read_text())
    manifest["files"][name] = sha256_file(population / name)
    _forge_manifest(population, manifest)


def test_tensors_follow_the_contract(tiny) -> None:
    pop = load_population(tiny, split="train", horizon=2)
    assert isinstance(pop, Population)
    preset = load_preset("tiny")
    manifest = json.loads((tiny / "manifest.json").read_text())
    s, k, h = manifest["counts"]["states"], puck_parameters("tiny").candidates.num_candidates, preset.horizon
    n = manifest["counts"]["max_objects"]
    f, g, c = (len(manifest["features"][x]) for x in ("objects", "goal", "candidates"))
    expect = {
        "objects": ((s, n, f), torch.float32),
        "object_mask": ((s, n), torch.bool),
        "goal": ((s, g), torch.float32),
        "candidates": ((s, k, c), torch.float32),
        "candidate_object": ((s, k), torch.int64),
        "candidate_mask": ((s, k), torch.bool),
        "reward": ((s, k), torch.float32),
        "q": ((s, k, h), torch.float32),
        "q_horizons": ((s,), torch.int64),
        "successor": ((s, k), torch.int64),
        "scene_index": ((s,), torch.int64),
        "scene_id": ((s,), torch.int64),
        "state_id": ((s,), torch.int64),
        "chain_id": ((s,), torch.int64),
        "step": ((s,), torch.int64),
        "is_chain": ((s,), torch.bool),
    }
    for name, (shape, dtype) in expect.items():
        tensor = getattr(pop, name)
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype, name
    assert pop.digest == sha256_file(tiny / "manifest.json")
    assert (pop.split, pop.horizon, pop.num_candidates, pop.name) == ("train", 2, k, "tiny-train-seed0")
    n_chain = manifest["counts"]["chain_states"]
    assert pop.is_chain[:n_chain].all() and not pop.is_chain[n_chain:].any()
    assert (pop.q_horizons == torch.where(pop.is_chain, 2, 1)).all()
    assert (pop.q[~pop.is_chain][..., 1] == 0).all()
    assert pop.scene_index.max().item() == preset.scenes - 1
    # Padding: masked objects are zero; each row's real puck count matches the file.
    assert (pop.objects[~pop.object_mask] == 0).all()
    states = pq.read_table(tiny / "states.parquet").to_pylist()
    row_of = {sid: i for i, sid in enumerate(pop.state_id.tolist())}
    for st in states:
        assert pop.object_mask[row_of[st["state_id"]]].sum().item() == st["num_objects"]
    # Labels round-trip from the stored float64 and successors point at rows.
    for cand in pq.read_table(tiny / "candidates.parquet").to_pylist():
        row = row_of[cand["state_id"]]
        assert pop.q[row, cand["candidate"], : len(cand["q"])].tolist() == pytest.approx(
            np.float32(cand["q"]).tolist(), abs=0
        )
        want = -1 if cand["successor_state_id"] < 0 else row_of[cand["successor_state_id"]]
        assert pop.successor[row, cand["candidate"]].item() == want
        assert pop.candidate_object[row, cand["candidate"]].item() == cand["object"]
    # Bellman on tensors (float32 rounding of float64-exact labels).
    chain = pop.is_chain
    succ = pop.successor[chain]
    best_next = pop.q[succ][..., 0].max(dim=-1).values
    torch.testing.assert_close(pop.q[chain][..., 1], pop.reward[chain] + best_next, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["scenes.parquet", "states.parquet", "candidates.parquet"])
def test_a_changed_byte_in_any_file_is_refused(copy, name) -> None:
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 3] ^= 0x01
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=name):
        load_population(copy, split="train")


@pytest.mark.parametrize("name", ["manifest.json", "population.receipt.json"])
def test_a_changed_manifest_or_receipt_byte_is_refused(copy, name) -> None:
    data = bytearray((copy / name).read_bytes())
    data[data.index(b"tiny")] = ord("T")
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=name):
        load_population(copy, split="train")


def test_a_forged_split_is_refused_as_a_split_mismatch(copy) -> None:
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["split"] = "validation"
    _forge_manifest(copy, manifest)
    with pytest.raises(QhInputError, match="split='validation' is not allowed; allowed: 'train'"):
        load_population(copy, split="train")


def test_a_nan_label_is_refused(copy) -> None:
    table = pq.read_table(copy / "candidates.parquet")
    q = table.column("q").to_pylist()
    q[5] = [q[5][0], float("nan")]
    table = table.set_column(table.column_names.index("q"), "q", pa.array(q, pa.list_(pa.float64())))
    _rewrite(copy, "candidates.parquet", table)
    state_id = table.column("state_id")[5].as_py()
    with pytest.raises(QhInputError, match=rf"column 'q' holds nan \(Q\*_2\) at state_id {state_id}") as info:
        load_population(copy, split="train")
    assert "finite" in str(info.value) and "HINT" in str(info.value)


def test_a_missing_column_is_refused(copy) -> None:
    table = pq.read_table(copy / "candidates.parquet").drop_columns(["reward"])
    _rewrite(copy, "candidates.parquet", table)
    with pytest.raises(SchemaMismatchError, match="candidates.parquet lacks column 'reward'"):
        load_population(copy, split="train")


def test_another_schema_version_is_refused(copy) -> None:
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["schema_version"] = 2
    _forge_manifest(copy, manifest)
    with pytest.raises(SchemaMismatchError, match="schema_version=2 is not allowed; allowed: 1"):
        load_population(copy, split="train")


def test_split_and_horizon_mismatches_are_refused(tiny) -> None:
    with pytest.raises(QhInputError, match="split='train' is not allowed; allowed: 'validation'"):
        load_population(tiny, split="validation")
    with pytest.raises(QhInputError, match="horizon=2 is not allowed; allowed: 3"):
        load_population(tiny, split="train", horizon=3)
    with pytest.raises(QhInputError, match="split='dev'"):
        load_population(tiny, split="dev")


def test_missing_files_are_refused(copy, tmp_path) -> None:
    (copy / "states.parquet").unlink()
    with pytest.raises(MissingEvidenceError, match="states.parquet"):
        load_population(copy, split="train")
    (copy / "population.receipt.json").unlink()
    with pytest.raises(MissingEvidenceError, match="population.receipt.json"):
        load_population(copy, split="train")
    with pytest.raises(MissingEvidenceError, match="manifest.json"):
        load_population(tmp_path / "nowhere", split="train")


def test_bad_shapes_and_ids_are_refused(copy) -> None:
    table = pq.read_table(copy / "candidates.parquet")
    ids = table.column("successor_state_id").to_pylist()
    ids[0] = 10**9
    _rewrite(
        copy,
        "candidates.parquet",
        table.set_column(
            table.column_names.index("successor_state_id"), "successor_state_id", pa.array(ids, pa.int64())
        ),
    )
    with pytest.raises(QhInputError, match="successor_state_id=1000000000"):
        load_population(copy, split="train")
    trimmed = table.slice(0, table.num_rows - 1)
    _rewrite(copy, "candidates.parquet", trimmed)
    with pytest.raises(QhInputError, match="rows="):
        load_population(copy, split="train")


def _set_successor(population: Path, row: int, value: int) -> tuple[int, int]:
    """Set ``successor_state_id`` of one candidates.parquet row, re-binding every digest."""
    table = pq.read_table(population / "candidates.parquet")
    ids = table.column("successor_state_id").to_pylist()
    ids[row] = value
    _rewrite(
        population,
        "candidates.parquet",
        table.set_column(
            table.column_names.index("successor_state_id"), "successor_state_id", pa.array(ids, pa.int64())
        ),
    )
    return table.column("state_id")[row].as_py(), table.column("candidate")[row].as_py()


def _step_of(population: Path) -> dict[int, int]:
    states = pq.read_table(population / "states.parquet").to_pydict()
    return dict(zip(states["state_id"], states["step"]))


def test_a_chain_row_candidate_without_a_successor_is_refused(copy) -> None:
    step = _step_of(copy)
    cands = pq.read_table(copy / "candidates.parquet").column("state_id").to_pylist()
    chain_rows = [i for i, sid in enumerate(cands) if step[sid] >= 0]
    row = chain_rows[len(chain_rows) // 2]
    state_id, candidate = _set_successor(copy, row, -1)
    with pytest.raises(QhInputError) as info:
        load_population(copy, split="train")
    message = str(info.value)
    assert message.startswith(
        f"load_population: {copy / 'candidates.parquet'}: successor_state_id=-1 "
        "is not allowed; allowed: an id of states.parquet for every candidate of a chain state"
    )
    assert f"state_id {state_id} candidate {candidate}" in message
    assert "-1 only on successor rows (step == -1)" in message
    assert "HINT: every chain-row candidate has a successor state (a terminal state's is itself)" in message


def test_successor_rows_keep_their_missing_successors(tiny) -> None:
    # Every successor row of a generated population has -1 successors and loads as such.
    step = _step_of(tiny)
    table = pq.read_table(tiny / "candidates.parquet").to_pydict()
    on_successors = [s for sid, s in zip(table["state_id"], table["successor_state_id"]) if step[sid] < 0]
    assert on_successors and set(on_successors) == {-1}
    pop = load_population(tiny, split="train")
    assert (pop.successor[~pop.is_chain] == -1).all() and (pop.successor[pop.is_chain] >= 0).all()
