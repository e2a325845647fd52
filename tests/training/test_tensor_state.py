"""Tests for qhlab.training.tensor_state and the cold-initialization lineage check."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
import torch

from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    MissingEvidenceError,
    PublishConflictError,
    QhInputError,
    SchemaMismatchError,
    read_receipt,
    sha256_file,
    source_package_digest,
)
from qhlab.training.execution_profile import ColdInitializationLineage, verified_cold_initialization_lineage
from qhlab.training.records import ColdInitializationReceipt
from qhlab.training.tensor_state import load_tensor_state, save_tensor_state, write_cold_initialization

SOURCE = "ab" * 32


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 3, generator=generator)
    return {
        "encoder.weight": weight,
        "encoder.weight_t": weight.t(),  # a non-contiguous view sharing weight's storage
        "encoder.bias": torch.zeros(4),
        "half": torch.randn(2, 2, generator=generator).half(),
        "bf16": torch.randn(3, generator=generator).bfloat16(),
        "step": torch.tensor(12, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 5),
    }


def _flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_round_trip_is_exact_in_dtype_shape_and_value(tmp_path: Path) -> None:
    tensors = _tensors()
    path = tmp_path / "state.safetensors"
    structure = {"param_groups": [{"lr": 0.001, "params": ["encoder.weight", "encoder.bias"]}], "step": 12}
    digest = save_tensor_state(path, tensors, structure)
    assert digest == sha256_file(path)
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["state_sha256"] == digest and record["state_file"] == "state.safetensors"
    assert record["tensors"]["half"] == {"dtype": "float16", "shape": [2, 2]}
    assert record["tensors"]["step"] == {"dtype": "int64", "shape": []}
    assert record["tensors"]["encoder.weight_t"] == {"dtype": "float32", "shape": [3, 4]}
    loaded, loaded_structure = load_tensor_state(path, expected_sha256=digest)
    assert loaded_structure == structure
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert torch.equal(loaded[name], tensor), name
    # safetensors framing: 8-byte little-endian header length, then a JSON header (no pickle)
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert json.loads(path.read_bytes()[8 : 8 + header_length])["half"]["dtype"] == "F16"


def test_save_is_write_once_and_validates_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "state.safetensors"
    save_tensor_state(path, {"w": torch.ones(2)}, {})
    with pytest.raises(PublishConflictError, match="state.safetensors"):
        save_tensor_state(path, {"w": torch.zeros(2)}, {})
    other = tmp_path / "other.safetensors"
    other.with_suffix(".json").write_text("{}")
    with pytest.raises(PublishConflictError, match="other.json"):
        save_tensor_state(other, {"w": torch.zeros(2)}, {})
    assert not other.exists()
    bad_cases = [
        (tmp_path / "a.pt", {"w": torch.ones(1)}, {}, "path="),
        (tmp_path / "b.safetensors", {"w": [1.0]}, {}, "tensors\\['w'\\]='list'"),
        (tmp_path / "c.safetensors", {"": torch.ones(1)}, {}, "tensor name=''"),
        (tmp_path / "d.safetensors", {"w": torch.ones(1)}, {"lr": float("nan")}, "structure"),
        (tmp_path / "e.safetensors", [torch.ones(1)], {}, "tensors='list'"),
    ]
    for target, tensors, structure, match in bad_cases:
        with pytest.raises(QhInputError, match=match):
            save_tensor_state(target, tensors, structure)
        assert not target.exists() and not target.with_suffix(".json").exists()


def test_load_rejects_tampering_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "state.safetensors"
    digest = save_tensor_state(path, {"w": torch.arange(6.0).reshape(2, 3)}, {"note": "x"})
    with pytest.raises(DigestMismatchError, match="expected_sha256"):
        load_tensor_state(path, expected_sha256="0" * 64)
    # a changed structure record (shape) with the same digest is caught by the dtype/shape check
    record = json.loads(path.with_suffix(".json").read_text())
    record["tensors"]["w"]["shape"] = [3, 2]
    path.with_suffix(".json").write_text(json.dumps(record))
    with pytest.raises(SchemaMismatchError, match="differs"):
        load_tensor_state(path, expected_sha256=digest)
    record["tensors"]["w"]["shape"] = [2, 3]
    path.with_suffix(".json").write_text(json.dumps(record))
    assert load_tensor_state(path, expected_sha256=digest)[1] == {"note": "x"}
    _flip_byte(path)
    with pytest.raises(DigestMismatchError, match="state.safetensors"):
        load_tensor_state(path)
    path.with_suffix(".json").unlink()
    with pytest.raises(MissingEvidenceError, match="state.json"):
        load_tensor_state(path)


def test_load_refuses_a_pickle_file_even_with_a_matching_record(tmp_path: Path) -> None:
    path = tmp_path / "evil.safetensors"
    torch.save({"w": torch.ones(2)}, path)  # a pickle archive under a safetensors name
    path.with_suffix(".json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "format": "safetensors",
                "state_file": path.name,
                "state_sha256": sha256_file(path),
                "tensors": {"w": {"dtype": "float32", "shape": [2]}},
                "structure": {},
            }
        )
    )
    with pytest.raises(EvidenceError, match="not a valid safetensors file"):
        load_tensor_state(path)


# -- cold initialization ----------------------------------------------------------------------


def _cold(tmp_path: Path, **overrides) -> Path:
    kwargs = dict(seed=7, source_package_digest=SOURCE, structure={"arm": "baseline"})
    kwargs.update(overrides)
    return write_cold_initialization(tmp_path / "lineage", _tensors(), **kwargs)


def test_cold_initialization_artifact_layout_and_lineage(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    directory = tmp_path / "lineage"
    assert state == directory / "cold_init.safetensors"
    assert sorted(p.name for p in directory.iterdir()) == [
        "cold_init.json",
        "cold_init.receipt.json",
        "cold_init.safetensors",
    ]
    receipt = read_receipt(directory / "cold_init.receipt.json", ColdInitializationReceipt).record()
    assert receipt["body"] == {
        "seed": 7,
        "source_package_digest": SOURCE,
        "state_sha256": sha256_file(state),
        "tensor_count": 8,
    }
    assert set(receipt["outputs"]) == {"state", "structure"}
    lineage = verified_cold_initialization_lineage(state, source_package_digest=SOURCE, seed=7)
    assert lineage == ColdInitializationLineage(
        path=state,
        sha256=sha256_file(state),
        seed=7,
        source_package_digest=SOURCE,
        receipt_path=directory / "cold_init.receipt.json",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        lineage.seed = 8  # type: ignore[misc]
    # the directory names the same artifact
    assert verified_cold_initialization_lineage(directory, source_package_digest=SOURCE, seed=7) == lineage
    with pytest.raises(PublishConflictError, match="cold_init"):
        _cold(tmp_path)


def test_cold_initialization_accepts_the_source_package_digest_dict(tmp_path: Path) -> None:
    digest = source_package_digest()
    state = _cold(tmp_path, source_package_digest=digest)
    lineage = verified_cold_initialization_lineage(state, source_package_digest=digest["sha256"], seed=7)
    assert lineage.source_package_digest == digest["sha256"]


def test_lineage_rejects_a_flipped_byte_in_the_state(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    _flip_byte(state, offset=-3)
    with pytest.raises(DigestMismatchError, match="cold_init.safetensors"):
        verified_cold_initialization_lineage(state, source_package_digest=SOURCE, seed=7)


def test_lineage_rejects_a_wrong_seed(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    with pytest.raises(EvidenceError, match="seed=7 but the lineage expects seed=8"):
        verified_cold_initialization_lineage(state, source_package_digest=SOURCE, seed=8)


def test_lineage_rejects_a_wrong_source_digest(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    with pytest.raises(EvidenceError, match="source_package_digest"):
        verified_cold_initialization_lineage(state, source_package_digest="cd" * 32, seed=7)


def test_lineage_rejects_a_missing_receipt(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    (state.parent / "cold_init.receipt.json").unlink()
    with pytest.raises(MissingEvidenceError, match="cold_init.receipt.json"):
        verified_cold_initialization_lineage(state, source_package_digest=SOURCE, seed=7)


def test_lineage_rejects_a_tampered_structure_file(tmp_path: Path) -> None:
    state = _cold(tmp_path)
    structure = state.with_suffix(".json")
    structure.write_bytes(structure.read_bytes().replace(b"baseline", b"baselinf"))
    with pytest.raises(DigestMismatchError, match="cold_init.json"):
        verified_cold_initialization_lineage(state, source_package_digest=SOURCE, seed=7)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"seed": -1}, "seed=-1"),
        ({"seed": True}, "seed=True"),
        ({"source_package_digest": "abc"}, "source_package_digest='abc'"),
        ({"source_package_digest": "AB" * 32}, "source_package_digest"),
    ],
)
def test_cold_initialization_validates_inputs_and_writes_nothing(tmp_path: Path, overrides: dict, match: str) -> None:
    with pytest.raises(QhInputError, match=match):
        _cold(tmp_path, **overrides)
    assert not (tmp_path / "lineage").exists()
