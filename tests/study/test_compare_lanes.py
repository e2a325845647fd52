"""``qhlab study compare-lanes A B --output DIR --margin M``.

Identical lanes are equivalent with zero differences and drift; a copy whose regret is shifted
by 0.05 m (cell receipts edited and resealed, the report rebuilt on them) is not equivalent;
studies frozen from different decisions, tampered receipts, bad margins and used outputs are
refused with exit 2 and nothing written.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from qhlab.cli import main
from qhlab.evidence import EvidenceError, QhInputError, canonical_json, sha256_bytes
from qhlab.lanes.compare import (
    LANE_FILES,
    compare_lanes,
    decision_differences,
    study_regret_mde,
    tensor_group,
    tost_verdict,
)

SHIFT = 0.05


def _run(argv: list) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _copy(finished_study, target: Path) -> Path:
    shutil.copytree(finished_study["output"], target)
    return target


def _reseal(path: Path, edit) -> None:
    """Edit a receipt's document and recompute its own content digest (as test_moved_study does)."""
    document = json.loads(path.read_text())
    edit(document)
    document.pop("content_sha256")
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    path.chmod(0o644)
    path.write_bytes(canonical_json(document))


def _shifted_copy(finished_study, target: Path) -> Path:
    """A copy whose every cell's per-scene regret (every horizon) is SHIFT higher, its report rebuilt."""
    from qhlab.finite_horizon.studies.architecture_study import report_study

    study = _copy(finished_study, target)

    def shift(document: dict) -> None:
        ev = document["body"]["evaluation"]
        ev["scene_regret"] = [[v + SHIFT for v in row] for row in ev["scene_regret"]]
        ev["regret"] = [v + SHIFT for v in ev["regret"]]

    for path in sorted((study / "cells").glob("*/cell.receipt.json")):
        _reseal(path, shift)
    # The report and benchmark receipts bind the old cell receipts: rebuild the report on the new ones.
    shutil.rmtree(study / "report")
    shutil.rmtree(study / "benchmarks", ignore_errors=True)
    report_study(study / "study-config.toml", study)
    return study


def _reading_copy_as(edit):
    """A ``lanes._read_lane`` that applies ``edit(lane)`` to the lane read from the "copy" directory."""
    from qhlab.lanes import compare as module

    read = module._read_lane

    def reader(directory):
        lane = read(directory)
        if directory.name == "copy":
            edit(lane)
        return lane

    return reader


def _fewer_updates(lane: dict) -> None:
    lane["cells"][("baseline", 0)] = {**lane["cells"][("baseline", 0)], "observed_updates": 29}


# ---------------------------------------------------------------------------------------------
# The pure parts (fast).


def test_tost_verdicts_on_constructed_differences():
    rng = np.random.default_rng(0)
    pilot = dict(seed_sd=0.001, seed_sd_source="constructed", seed_sd_dof=5)
    assert tost_verdict(np.zeros((2, 40)), 0.01, seed_variance=pilot)["verdict"] == "equivalent"
    assert tost_verdict(rng.normal(0.0, 0.002, (2, 40)), 0.01, seed_variance=pilot)["verdict"] == "equivalent"
    shifted = tost_verdict(SHIFT + rng.normal(0.0, 0.002, (2, 40)), 0.01, seed_variance=pilot)
    assert shifted["verdict"] == "not equivalent" and shifted["interval_95"]["low"] > 0.01
    # Too noisy to tell: the 90% interval leaves the margin, the 95% one still straddles it.
    assert tost_verdict(rng.normal(0.0, 0.05, (2, 40)), 0.01, seed_variance=pilot)["verdict"] == "inconclusive"
    assert tost_verdict(np.zeros((2, 5)), 0.01, seed_variance=pilot)["margin"] == 0.01


def test_tost_carries_the_seed_variance():
    """A lane difference of +8 mm on one seed and -8 mm on the other, exact on every scene:
    a scene-only interval sees [0, 0] and calls it equivalent at 1 cm; the seed-aware one
    sees a seed effect of 8 mm (its own two seeds, t with 1 dof) or the pilot's tau."""
    differences = np.stack([np.full(40, 0.008), np.full(40, -0.008)])
    differences += np.random.default_rng(1).normal(0.0, 1e-4, differences.shape)
    own = tost_verdict(differences, 0.01)
    assert own["verdict"] == "inconclusive" and own["interval_90"]["seed_sd"] > 0.01
    assert own["interval_90"]["seed_sd_source"].startswith("study: its own 2 seeds")
    small = tost_verdict(differences, 0.01, seed_variance=dict(seed_sd=0.0005, seed_sd_source="pilot", seed_sd_dof=5))
    assert small["verdict"] == "equivalent" and small["interval_90"]["seed_sd"] == 0.0005
    large = tost_verdict(differences, 0.01, seed_variance=dict(seed_sd=0.02, seed_sd_source="pilot", seed_sd_dof=5))
    assert large["verdict"] == "inconclusive"


def test_the_default_margin_is_the_study_regret_mde():
    report = {
        "retention": [{"pooled_margins": {"D_reg": {"mde": 0.003}}}, {"pooled_margins": {"D_reg": {"mde": 0.0041}}}]
    }
    assert study_regret_mde(report) == 0.0041
    with pytest.raises(QhInputError, match="pass --margin"):
        study_regret_mde({"retention": []})


def test_decision_differences_name_every_field_with_both_values():
    a = {
        "profile": "cpu-fp32",
        "workers": 1,
        "tie_band": 0.001,
        "bootstrap": {"seed": 0, "resamples": 999},
        "name": "x",
    }
    b = {
        "profile": "cpu-bf16",
        "workers": 4,
        "tie_band": 0.002,
        "bootstrap": {"seed": 1, "resamples": 999},
        "name": "x",
        "extra": True,
    }
    assert decision_differences(a, b) == [
        "bootstrap.seed (A: 0, B: 1)",
        "extra (A: null, B: true)",
        "tie_band (A: 0.001, B: 0.002)",
    ]
    assert decision_differences(a, {**a, "profile": "cpu-bf16", "workers": 3}) == []


def test_tensor_groups():
    assert tensor_group("online.encoder.blocks.0.qkv.weight") == "online.encoder"
    assert tensor_group("target.members.1.readout.mlp.2.bias") == "target.readout"
    assert tensor_group("optim.12.exp_avg_sq") == "optim.exp_avg_sq"
    assert tensor_group("bias") == "bias"


@pytest.mark.parametrize("margin", ["0", "-0.01", "nan", "inf"])
def test_a_bad_margin_is_refused_before_reading(tmp_path, margin):
    out = tmp_path / "lanes"
    code, _, err = _run(["study", "compare-lanes", tmp_path / "a", tmp_path / "b", "--output", out, "--margin", margin])
    assert code == 2 and "margin=" in err, err
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# On the finished tiny study (slow).


@pytest.mark.slow
def test_a_study_and_its_byte_copy_are_equivalent(tmp_path, finished_study):
    copy = _copy(finished_study, tmp_path / "copy")
    result = compare_lanes(finished_study["output"], copy, tmp_path / "lanes", margin=0.01)
    assert sorted(p.name for p in (tmp_path / "lanes").iterdir()) == sorted(LANE_FILES)
    assert json.loads((tmp_path / "lanes" / "lanes.json").read_text()) == result
    assert len(result["cells"]) == 10 and result["margin"] == 0.01
    for cell in result["cells"]:
        for metric in ("mae_h", "regret_h"):
            d = cell[metric]["difference"]
            assert (d["estimate"], d["low"], d["high"]) == (0.0, 0.0, 0.0), cell
        assert cell["observed_updates"]["A"] == cell["observed_updates"]["B"] == 30
    assert {g["relative_l2"] for d in result["drift"] for g in d["groups"].values()} == {0.0}
    assert {"online.encoder", "target.encoder", "optim.exp_avg"} <= set(result["drift"][0]["groups"])
    assert set(result["summary"]["tost"].values()) == {"equivalent"} and len(result["summary"]["tost"]) == 5
    assert all(r["regret"]["lane_effect"] == 0.0 and r["mae"]["lane_effect"] == 0.0 for r in result["arms"])
    assert all(r[m]["seed_effect_A"] == r[m]["seed_effect_B"] for r in result["arms"] for m in ("mae", "regret"))
    assert all(r["mae"]["seed_effect_A"] > 0 for r in result["arms"])  # the seeds differ; the lanes do not
    assert result["retention"]["agree"] and result["summary"]["checks_passed"]
    assert {v["variant"] for v in result["retention"]["variants"]} == {"variant_cross_attention", "variant_deep"}
    assert "| variant_deep |" in (tmp_path / "lanes" / "lanes.md").read_text()


@pytest.mark.slow
def test_a_shifted_copy_is_not_equivalent(tmp_path, finished_study):
    shifted = _shifted_copy(finished_study, tmp_path / "shifted")
    result = compare_lanes(finished_study["output"], shifted, tmp_path / "lanes", margin=0.01)
    assert set(result["summary"]["tost"].values()) == {"not equivalent"}
    for cell in result["cells"]:
        assert cell["regret_h"]["difference"]["estimate"] == pytest.approx(SHIFT)
        assert cell["mae_h"]["difference"]["estimate"] == 0.0
    assert all(r["regret"]["lane_effect"] == pytest.approx(SHIFT) for r in result["arms"])
    # The final states are the same bytes: only the evaluation moved.
    assert {g["relative_l2"] for d in result["drift"] for g in d["groups"].values()} == {0.0}


@pytest.mark.slow
def test_studies_frozen_from_different_decisions_are_refused(tmp_path, finished_study, population_cache, config_writer):
    config = config_writer(tmp_path / "other-config", population_cache, **{"tie_band = 0.001": "tie_band = 0.002"})
    other = tmp_path / "other"
    code, out, err = _run(["study", "run", config, "--output", other])
    assert code == 0, out + err
    lanes = tmp_path / "lanes"
    code, _, err = _run(
        ["study", "compare-lanes", finished_study["output"], other, "--output", lanes, "--margin", "0.01"]
    )
    assert code == 2 and "tie_band (A: 0.001, B: 0.002)" in err, err
    assert "population_cache (A:" not in err and "profile (A:" not in err and "workers (A:" not in err, err
    assert not lanes.exists()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cells/baseline-s1/cell.receipt.json", "report/report.json"])
def test_a_tampered_study_is_refused_and_nothing_written(tmp_path, finished_study, target):
    copy = _copy(finished_study, tmp_path / "copy")
    path = copy / target
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"regret"', '"regret" ', 1))  # one byte more
    lanes = tmp_path / "lanes"
    code, _, err = _run(
        ["study", "compare-lanes", finished_study["output"], copy, "--output", lanes, "--margin", "0.01"]
    )
    assert code == 2 and err.startswith("error:"), err
    assert not lanes.exists()
    with pytest.raises(EvidenceError):
        compare_lanes(copy, finished_study["output"], lanes, margin=0.01)
    assert not lanes.exists()


@pytest.mark.slow
def test_the_command_writes_the_four_files_which_verify(tmp_path, finished_study):
    copy = _copy(finished_study, tmp_path / "copy")
    lanes = tmp_path / "lanes"
    code, out, err = _run(
        ["study", "compare-lanes", finished_study["output"], copy, "--output", lanes, "--margin", "0.01"]
    )
    assert code == 0, out + err
    assert sorted(p.name for p in lanes.iterdir()) == sorted(LANE_FILES)
    assert "equivalent at margin 0.01" in out and "checks passed" in out, out
    assert (lanes / "lanes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = _run(["verify", lanes])
    assert code == 0, out + err
    # Write-once: the same output again is refused and left as it was.
    code, _, err = _run(
        ["study", "compare-lanes", finished_study["output"], copy, "--output", lanes, "--margin", "0.01"]
    )
    assert code == 2 and "output=" in err, err
    assert sorted(p.name for p in lanes.iterdir()) == sorted(LANE_FILES)


@pytest.mark.slow
def test_unequal_observed_updates_are_a_failed_check(tmp_path, finished_study):
    from qhlab.lanes import compare as module

    copy = _copy(finished_study, tmp_path / "copy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_read_lane", _reading_copy_as(_fewer_updates))
        result = compare_lanes(finished_study["output"], copy, tmp_path / "lanes", margin=0.01)
    check = next(c for c in result["checks"] if c["check"].startswith("observed updates"))
    assert not check["passed"] and "baseline-s0" in check["detail"] and not result["summary"]["checks_passed"]


@pytest.mark.slow
def test_studies_made_under_other_package_versions_are_compared_not_refused(tmp_path, finished_study):
    """Another lane is often another machine: its versions are reported; a running step still refuses them."""
    from qhlab.finite_horizon.studies.architecture_study import report_study
    from qhlab.study import authentication

    real = authentication.runtime_versions
    copy = _copy(finished_study, tmp_path / "copy")
    with pytest.MonkeyPatch.context() as patch:
        node = {**real(), "torch": "2.11.0+cu130"}
        patch.setattr(authentication, "runtime_versions", lambda: node)
        patch.setattr("qhlab.lanes.compare.runtime_versions", lambda: node)
        result = compare_lanes(finished_study["output"], copy, tmp_path / "lanes", margin=0.01)
        with pytest.raises(EvidenceError, match=r"versions\.torch='2\.11\.0\+cu130' is not allowed"):
            report_study(copy / "study-config.toml", copy)
    assert (
        result["lanes"]["A"]["versions"]
        == result["lanes"]["B"]["versions"]
        == {k: v for k, v in real().items() if k in result["lanes"]["A"]["versions"]}
    )
    assert result["versions_differ"] == [] and result["summary"]["checks_passed"]
    assert result["compared_under"]["torch"] == "2.11.0+cu130"  # the process that compared
    assert "Package versions that differ between the lanes: none." in (tmp_path / "lanes" / "lanes.md").read_text()


@pytest.mark.slow
def test_differing_lane_versions_are_listed(tmp_path, finished_study):
    from qhlab.lanes import compare as module

    def node_versions(lane):
        lane["versions"] = {**lane["versions"], "torch": "2.11.0+cu130", "lightning": "2.6.6"}

    copy = _copy(finished_study, tmp_path / "copy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_read_lane", _reading_copy_as(node_versions))
        result = compare_lanes(finished_study["output"], copy, tmp_path / "lanes", margin=0.01)
    assert result["versions_differ"] == sorted(
        {"torch"} | ({"lightning"} if result["lanes"]["A"]["versions"].get("lightning") != "2.6.6" else set())
    )
    text = (tmp_path / "lanes" / "lanes.md").read_text()
    assert f"torch {result['lanes']['A']['versions']['torch']} / 2.11.0+cu130" in text


@pytest.mark.slow
def test_moved_populations_are_found_under_populations_and_a_failed_check_exits_1(
    tmp_path, finished_study, monkeypatch
):
    from qhlab.lanes import compare as module

    copy = _copy(finished_study, tmp_path / "copy")
    populations = [
        Path(json.loads((copy / name).read_text())["body"][split]["path"])
        for name, split in (("freeze.receipt.json", "train"), ("development.receipt.json", "validation"))
    ]
    for population in populations:  # as on another machine: not at the recorded paths, not in the cache
        shutil.copytree(population, tmp_path / "moved" / population.name)
        population.rename(population.with_name(population.name + ".away"))
    monkeypatch.setattr("qhlab.evidence.receipts.DEFAULT_POPULATION_ROOT", str(tmp_path / "empty-cache"))
    try:
        code, _, err = _run(
            [
                "study",
                "compare-lanes",
                finished_study["output"],
                copy,
                "--output",
                tmp_path / "lanes-missing",
                "--margin",
                "0.01",
            ]
        )
        assert code == 2 and not (tmp_path / "lanes-missing").exists(), err
        code, out, err = _run(
            [
                "study",
                "compare-lanes",
                finished_study["output"],
                copy,
                "--output",
                tmp_path / "lanes",
                "--margin",
                "0.01",
                "--populations",
                tmp_path / "moved",
            ]
        )
        assert code == 0, out + err
        monkeypatch.setattr(module, "_read_lane", _reading_copy_as(_fewer_updates))
        code, out, err = _run(
            [
                "study",
                "compare-lanes",
                finished_study["output"],
                copy,
                "--output",
                tmp_path / "lanes-failed",
                "--margin",
                "0.01",
                "--populations",
                tmp_path / "moved",
            ]
        )
        assert code == 1 and "checks FAILED" in out, out + err
        assert sorted(p.name for p in (tmp_path / "lanes-failed").iterdir()) == sorted(LANE_FILES)
    finally:
        for population in populations:
            population.with_name(population.name + ".away").rename(population)


@pytest.mark.skipif(
    not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()),
    reason=f"cpu-bf16 needs a CPU with AVX512-BF16 or AMX; this one has {torch.backends.cpu.get_cpu_capability()}",
)
@pytest.mark.slow
def test_the_tiny_study_on_cpu_bf16_compares_with_cpu_fp32(
    tmp_path, finished_study, population_cache, config_writer
) -> None:
    """The two-lane test: the same tiny study on cpu-fp32 (A) and cpu-bf16 (B)."""
    config = config_writer(
        tmp_path / "bf16-config", population_cache, **{'profile = "cpu-fp32"': 'profile = "cpu-bf16"'}
    )
    assert main(["study", "run", str(config), "--output", str(tmp_path / "bf16")]) == 0
    code = main(
        [
            "study",
            "compare-lanes",
            str(finished_study["output"]),
            str(tmp_path / "bf16"),
            "--output",
            str(tmp_path / "lanes"),
            "--margin",
            "0.01",
        ]
    )
    lanes = json.loads((tmp_path / "lanes" / "lanes.json").read_text())
    assert code in (0, 1) and lanes["lanes"]["B"]["profile"] == "cpu-bf16"
    assert all(c["observed_updates"]["A"] == c["observed_updates"]["B"] for c in lanes["cells"])
    assert any(g["relative_l2"] > 0 for d in lanes["drift"] for g in d["groups"].values())
