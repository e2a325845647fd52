"""Population writer: determinism, disjoint splits, Bellman consistency, chains, cache, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pymunk
import pytest

from puck_world import puck_parameters
from qhlab.cli import main
from qhlab.evidence import DigestMismatchError, PublishConflictError, QhInputError, sha256_file, verify_directory
from qhlab.evidence.layout import POPULATION_FILES
from qhlab.scenes import PRESET_NAMES, cached_population, generate_population, load_preset, read_manifest
from qhlab.scenes.population import planned_simulations
from qhlab.scenes.records import PopulationGenerationReceipt

FILES = (*POPULATION_FILES, "manifest.json", "population.receipt.json")


def _rows(path: Path, name: str) -> list[dict]:
    return pq.read_table(path / name).to_pylist()


def test_same_arguments_give_byte_identical_files_whatever_the_workers(tiny_train, tmp_path) -> None:
    again = generate_population("tiny", "train", 0, tmp_path / "again", workers=2)
    for name in FILES:
        assert (again / name).read_bytes() == (tiny_train / name).read_bytes(), name


def test_the_tank_network_gives_byte_identical_files_whatever_the_workers(tmp_path) -> None:
    one = generate_population("tanks-tiny", "train", 2, tmp_path / "one", workers=1)
    two = generate_population("tanks-tiny", "train", 2, tmp_path / "two", workers=2)
    for name in ("scenes.parquet", "states.parquet", "candidates.parquet", "manifest.json"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def test_generation_receipt_says_which_executor_ran_where(tiny_train) -> None:
    from qhlab.evidence import read_receipt

    document = read_receipt(tiny_train / "generation.receipt.json", PopulationGenerationReceipt).record()
    body = document["body"]
    assert body["executor"] == "local" and body["ray_address"] is None and body["processes"] == 1
    assert body["driver"]["pid"] > 0 and body["driver"]["hostname"]
    assert document["inputs"]["manifest"]["sha256"] == sha256_file(tiny_train / "manifest.json")


def test_another_seed_gives_other_scenes(tiny_train, tmp_path) -> None:
    other = generate_population("tiny", "train", 1, tmp_path / "seed1", workers=1)
    for name in POPULATION_FILES:
        assert sha256_file(other / name) != sha256_file(tiny_train / name)
    ids0 = {r["scene_id"] for r in _rows(tiny_train, "scenes.parquet")}
    ids1 = {r["scene_id"] for r in _rows(other, "scenes.parquet")}
    assert ids0.isdisjoint(ids1)


def test_train_and_validation_share_no_scene(tiny_train, tmp_path) -> None:
    validation = generate_population("tiny", "validation", 0, tmp_path / "val", workers=1)
    train_scenes = _rows(tiny_train, "scenes.parquet")
    val_scenes = _rows(validation, "scenes.parquet")
    assert {r["scene_id"] for r in train_scenes}.isdisjoint({r["scene_id"] for r in val_scenes})
    content = lambda r: (tuple(r["radius"]), tuple(r["mass"]), tuple(r["friction"]), r["goal_x"], r["goal_y"])  # noqa: E731
    assert {content(r) for r in train_scenes}.isdisjoint({content(r) for r in val_scenes})
    assert json.loads((validation / "manifest.json").read_text())["split"] == "validation"


def test_manifest_records_engine_counts_and_digests(tiny_train) -> None:
    manifest = read_manifest(tiny_train)
    preset = load_preset("tiny")
    generator = manifest["generator"]
    assert generator["engine"] == "pymunk"
    assert generator["pymunk_version"] == "7.3.1"
    assert generator["chipmunk_version"] == pymunk.chipmunk_version
    assert generator["preset"] == "tiny" and generator["seed"] == 0 and generator["split"] == "train"
    assert generator["actor"]["kind"] == preset.actor.kind
    counts = manifest["counts"]
    k = puck_parameters("tiny").candidates.num_candidates
    chains = preset.scenes * preset.chains_per_scene
    assert counts["scenes"] == preset.scenes
    assert counts["chain_states"] == chains * preset.steps
    # Every chain state keeps its K successors, except the one that is the next chain state.
    assert counts["successor_states"] == chains * preset.steps * k - chains * (preset.steps - 1)
    assert counts["candidates"] == counts["states"] * k
    # Memoization: later chain states only simulate the last level of their tree.
    assert counts["simulations"] <= planned_simulations(preset, k)
    assert counts["simulations"] < chains * preset.steps * sum(k**h for h in range(1, preset.horizon + 1))
    for name in POPULATION_FILES:
        assert manifest["files"][name] == sha256_file(tiny_train / name)
    assert [f["name"] for f in manifest["features"]["objects"]][:2] == ["x", "y"]
    assert all(set(f) == {"name", "unit"} for group in manifest["features"].values() for f in group)
    # The receipt makes the population verifiable by `qhlab verify`.
    result = verify_directory(tiny_train)
    assert sorted(r["kind"] for r in result["receipts"]) == ["population", "population_generation"]
    assert result["unbound_files"] == []


def test_bellman_consistency_with_the_stored_floats(tiny_train) -> None:
    horizon = read_manifest(tiny_train)["horizon"]
    states = {r["state_id"]: r for r in _rows(tiny_train, "states.parquet")}
    by_state: dict[int, list[dict]] = {}
    for row in _rows(tiny_train, "candidates.parquet"):
        by_state.setdefault(row["state_id"], []).append(row)
    checked = 0
    for state_id, state in states.items():
        cands = sorted(by_state[state_id], key=lambda r: r["candidate"])
        expected = horizon if state["step"] >= 0 else horizon - 1
        for cand in cands:
            assert len(cand["q"]) == expected
            assert cand["q"][0] == cand["reward"]
        if state["step"] < 0:
            continue
        for cand in cands:
            succ = cand["successor_state_id"]
            assert succ >= 0, "every candidate of a chain state keeps its successor"
            succ_cands = by_state[succ]
            for h in range(2, horizon + 1):
                best = max(c["q"][h - 2] for c in succ_cands)
                assert cand["q"][h - 1] == cand["reward"] + best
                checked += 1
    assert checked == sum(1 for s in states.values() if s["step"] >= 0) * puck_parameters(
        "tiny"
    ).candidates.num_candidates * (horizon - 1)


def test_chains_follow_the_actor_and_link_successors(tiny_train) -> None:
    preset = load_preset("tiny")
    states = _rows(tiny_train, "states.parquet")
    cands = _rows(tiny_train, "candidates.parquet")
    chain_rows = [s for s in states if s["step"] >= 0]
    successor_rows = [s for s in states if s["step"] < 0]
    assert states[: len(chain_rows)] == chain_rows, "chain rows come first"
    by_id = {s["state_id"]: s for s in states}
    for s in successor_rows:
        parent = by_id[s["parent_state_id"]]
        assert parent["step"] >= 0 and parent["chain_id"] == s["chain_id"]
    for s in chain_rows:
        own = [c for c in cands if c["state_id"] == s["state_id"]]
        targets = [by_id[c["successor_state_id"]] for c in own]
        next_chain = [t for t in targets if t["step"] >= 0]
        if s["step"] + 1 < preset.steps:
            assert len(next_chain) == 1
            assert next_chain[0]["chain_id"] == s["chain_id"] and next_chain[0]["step"] == s["step"] + 1
        else:
            assert next_chain == []
        # The struck puck of target strikes is 0; nearest-other strikes name another puck.
        assert [c["object"] == 0 for c in own] == [True] * 4 + [False] * 2


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path) -> None:
    for kwargs, field in (
        ({"preset": "huge", "split": "train", "seed": 0}, "preset='huge'"),
        ({"preset": "tiny", "split": "dev", "seed": 0}, "split='dev'"),
        ({"preset": "tiny", "split": "train", "seed": -1}, "seed=-1"),
    ):
        with pytest.raises(QhInputError, match=field) as info:
            generate_population(out=tmp_path / "x", workers=1, **kwargs)
        assert "HINT" in str(info.value)
    with pytest.raises(QhInputError, match="workers=0"):
        generate_population("tiny", "train", 0, tmp_path / "x", workers=0)
    assert list(tmp_path.iterdir()) == []


def test_population_is_write_once(tiny_train) -> None:
    before = {name: sha256_file(tiny_train / name) for name in FILES}
    with pytest.raises(PublishConflictError, match="already exists"):
        generate_population("tiny", "train", 0, tiny_train, workers=1)
    assert before == {name: sha256_file(tiny_train / name) for name in FILES}


def test_cache_reuses_an_authenticated_population_and_refuses_a_tampered_one(tmp_path, monkeypatch) -> None:
    first = cached_population("tiny", "train", 0, tmp_path, workers=1)
    assert first.parent == tmp_path and first.name.startswith("tiny-train-seed0-")
    import qhlab.scenes.population as population

    def _must_not_generate(*args, **kwargs):
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(population, "generate_population", _must_not_generate)
    assert cached_population("tiny", "train", 0, tmp_path) == first
    other = tmp_path / "elsewhere"
    monkeypatch.undo()
    assert cached_population("tiny", "train", 1, other, workers=1).name != first.name
    data = bytearray((first / "states.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (first / "states.parquet").chmod(0o644)
    (first / "states.parquet").write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="states.parquet"):
        cached_population("tiny", "train", 0, tmp_path)


def test_cli_generates_and_refuses(tmp_path, capsys) -> None:
    out = tmp_path / "pop"
    argv = [
        "scenes",
        "generate",
        "--preset",
        "tiny",
        "--split",
        "train",
        "--seed",
        "3",
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["scenes"] == load_preset("tiny").scenes and summary["split"] == "train"
    assert read_manifest(out)["generator"]["seed"] == 3
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err
    bad = tmp_path / "bad"
    assert (
        main(
            [
                "scenes",
                "generate",
                "--preset",
                "nope",
                "--split",
                "train",
                "--seed",
                "0",
                "--out",
                str(bad),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "preset='nope'" in err and "tiny" in err
    assert not bad.exists()


def test_presets_are_sized_as_documented() -> None:
    presets = {name: load_preset(name) for name in PRESET_NAMES if not name.startswith("tanks")}
    assert presets["demo-validation"].scenes >= 40
    for name in ("demo-train", "demo-validation"):
        assert presets[name].horizon == 3 and puck_parameters(name).candidates.num_candidates == 8
    assert presets["tiny"].horizon == 2
    # As documented beside the presets: TRAIN 192 chains of 3 labelled steps; validation 480 scenes
    # (four times 120, to halve the scene part of a paired difference's SE), so
    # validation now has more labelled chain states (960) than TRAIN (576).
    sizes = {n: p.scenes * p.chains_per_scene * p.steps for n, p in presets.items()}
    assert (sizes["demo-train"], sizes["demo-validation"]) == (576, 960)
    assert all(planned_simulations(presets[n], puck_parameters(n).candidates.num_candidates) > 0 for n in presets)
    tanks = load_preset("tanks-tiny")
    assert (tanks.horizon, tanks.environment.factory) == (3, "qhlab.scenes.tanks:make")
    assert load_preset("tanks-bench").horizon == 4  # the deepest built-in tree: H up to 4


def test_preset_files_are_validated_field_by_field(tmp_path) -> None:
    base = (Path(load_preset("tiny").path)).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(base.replace("horizon = 2", "horizon = 1").replace("steps = 2", "steps = 0"))
    with pytest.raises(QhInputError) as info:
        load_preset(bad)
    text = str(info.value)
    assert "2 invalid field(s)" in text and "horizon=1" in text and "steps=0" in text and "HINT" in text
    bad.write_text(base.replace('kind = "epsilon-greedy"', 'kind = "greedy"'))
    with pytest.raises(QhInputError, match=r"actor.kind='greedy'"):
        load_preset(bad)
    bad.write_text("extra = 1\n" + base)
    with pytest.raises(QhInputError, match=r"extra=1"):
        load_preset(bad)
    with pytest.raises(QhInputError, match=r"preset='missing.toml'.*an existing file"):
        load_preset("missing.toml", base=tmp_path)
    bad.write_text("name = [")
    with pytest.raises(QhInputError, match="not a readable TOML file"):
        load_preset(bad)
    with pytest.raises(QhInputError, match=r"preset='huge'.*tiny"):
        load_preset("huge")
