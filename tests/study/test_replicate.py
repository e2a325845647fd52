"""`qhlab study replicate`: a finished study's frozen design on a fresh population pair, and the agreement.

The end-to-end test replicates the session's finished tiny study (TRAIN seed 7, validation 8,
training seeds 0 and 1) on TRAIN 27, validation 28 and training seeds 40 and 41 through the real
command line, checks the record's numbers against
the two reports, verifies it, and forges it once. The refusals run on the same study: they are
refused before anything is written. The agreement test itself is checked on arrays.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from qhlab.cli import main
from qhlab.evidence import QhInputError, canonical_json
from qhlab.statistics.agreement import agreement_distribution, agreement_test
from record_forgery import reseal


def _run(argv: list) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _replicate(study: Path, output: Path, train: int, validation: int, seeds: tuple = ()) -> tuple[int, str, str]:
    return _run(
        ["study", "replicate", study, "--train-seed", train, "--validation-seed", validation, "--output", output]
        + (["--seeds", *seeds] if seeds else [])
    )


# ----------------------------------------------------------------- the agreement test, pure


def test_agreement_test_is_the_chi_square_of_the_z_scores():
    result = agreement_test([0.01, -0.02, 0.0], [0.01, 0.005, 0.002], [0.0, 0.01, 0.0], [0.01, 0.005, 0.0])
    z = [0.01 / math.sqrt(2e-4), -0.03 / math.sqrt(5e-5), 0.0]
    assert result["z"] == pytest.approx(z)
    assert result["statistic"] == pytest.approx(sum(v * v for v in z))
    assert result["dof"] == 3
    assert result["p_value"] == pytest.approx(stats.chi2.sf(sum(v * v for v in z), 3))
    # Equal estimates without uncertainty agree exactly; unequal ones cannot be compared.
    assert agreement_test([0.1], [0.0], [0.1], [0.0])["z"] == [0.0]
    with pytest.raises(QhInputError, match="without uncertainty"):
        agreement_test([0.1], [0.0], [0.2], [0.0])
    with pytest.raises(QhInputError, match="estimates_b=.*one length K"):
        agreement_test([0.1, 0.2], [0.1, 0.1], [0.1], [0.1])
    with pytest.raises(QhInputError, match="se_a=.*>= 0"):
        agreement_test([0.1], [-0.1], [0.1], [0.1])


def test_a_z_from_estimated_standard_errors_is_read_on_students_t():
    # One comparison, each se from two seeds (1 dof): z is t with the Welch dof (2 here, equal ses).
    result = agreement_test([0.01], [0.01], [0.0], [0.01], dof_a=[1.0], dof_b=[1.0])
    z = 0.01 / math.sqrt(2e-4)
    assert result["z"] == pytest.approx([z]) and result["dof_k"] == pytest.approx([2.0])
    assert result["normal_scores"] == pytest.approx([stats.norm.isf(stats.t.sf(z, 2.0))])
    assert result["p_value"] == pytest.approx(2 * stats.t.sf(z, 2.0))
    with pytest.raises(QhInputError, match="dof_a="):
        agreement_test([0.01], [0.01], [0.0], [0.01], dof_a=[0.0])


def test_agreeing_studies_with_two_seed_standard_errors_are_not_rejected_too_often():
    # Each se estimated from two seeds (1 dof), as a study without a pilot states it. Read as normal,
    # the sum of z^2 rejects most agreeing studies; read on Student's t it does not.
    rng = np.random.default_rng(1)
    true = rng.uniform(0.001, 0.01, size=(1000, 12))
    a, b = rng.normal(0.0, true), rng.normal(0.0, true)
    se_a, se_b = (true * np.sqrt(rng.chisquare(1, size=true.shape)) for _ in range(2))
    ones = np.ones(12)
    t_read = [agreement_test(a[i], se_a[i], b[i], se_b[i], dof_a=ones, dof_b=ones)["p_value"] for i in range(1000)]
    normal_read = [agreement_test(a[i], se_a[i], b[i], se_b[i])["p_value"] for i in range(1000)]
    assert sum(p < 0.05 for p in t_read) / 1000 <= 0.05
    assert sum(p < 0.05 for p in normal_read) / 1000 > 0.5


def test_agreeing_studies_are_not_rejected_more_often_than_the_level():
    # Two independent studies of one truth, each with its stated standard error: p is uniform.
    rng = np.random.default_rng(0)
    se = rng.uniform(0.001, 0.01, size=(2000, 12))
    a, b = rng.normal(0.003, se), rng.normal(0.003, se)
    p = [agreement_test(a[i], se[i], b[i], se[i])["p_value"] for i in range(len(se))]
    assert 0.035 < sum(v < 0.05 for v in p) / len(p) < 0.065
    # A shift of 3 standard errors in every comparison is found every time.
    shifted = [agreement_test(a[i], se[i], b[i] + 3 * se[i] * 2**0.5, se[i])["p_value"] for i in range(200)]
    assert max(shifted) < 1e-6


def test_the_sum_of_squares_is_placed_in_its_distribution_under_the_comparisons_correlation():
    se = np.array([0.01, 0.02, 0.005, 0.01])
    independent = np.eye(4)
    placed = agreement_distribution(4.0, se, se, independent, independent, draws=100_000)
    # Uncorrelated comparisons: chi-square(4), whatever their standard errors.
    assert placed["central_90"] == pytest.approx(list(stats.chi2.ppf([0.05, 0.95], 4)), rel=0.02)
    assert placed["percentile"] == pytest.approx(stats.chi2.cdf(4.0, 4), abs=0.005)
    assert placed["eigenvalues"] == pytest.approx([1.0] * 4)
    # Perfectly correlated comparisons are one comparison counted four times: 4 x chi-square(1).
    ones = np.ones((4, 4))
    together = agreement_distribution(4.0, se, se, ones, ones, draws=100_000)
    assert together["eigenvalues"] == pytest.approx([4.0, 0, 0, 0], abs=1e-9)
    assert together["central_90"] == pytest.approx(list(4 * stats.chi2.ppf([0.05, 0.95], 1)), rel=0.03)
    assert together["mean"] == pytest.approx(4.0, rel=0.02)
    # A small sum that chi-square(4) finds unremarkable is far inside the correlated spread, and a
    # sum of 0.2 is below the uncorrelated central 90% but inside the correlated one.
    assert not agreement_distribution(0.2, se, se, independent, independent)["inside_central_90"]
    assert together["inside_central_90"] and agreement_distribution(0.2, se, se, ones, ones)["inside_central_90"]
    # Only one study correlated: the mixture lies between.
    half = agreement_distribution(4.0, se, se, ones, independent, draws=100_000)
    assert 1.0 < half["eigenvalues"][0] < 4.0
    with pytest.raises(QhInputError, match="correlation_b=.*symmetric"):
        agreement_distribution(4.0, se, se, independent, np.full((4, 4), 0.5))
    with pytest.raises(QhInputError, match="correlation_a=.*symmetric"):
        agreement_distribution(4.0, se, se, np.eye(3), independent)
    with pytest.raises(QhInputError, match="draws=10 is not allowed"):
        agreement_distribution(4.0, se, se, independent, independent, draws=10)


# ----------------------------------------------------------------- the command, end to end


@pytest.fixture(scope="module")
def replication(tmp_path_factory, finished_study) -> dict:
    """The session's tiny study replicated on TRAIN 27, validation 28 and training seeds 40 and 41."""
    output = tmp_path_factory.mktemp("replication") / "r"
    code, out, err = _replicate(finished_study["output"], output, 27, 28, seeds=(40, 41))
    assert code == 0, out + err
    return {"output": output, "stdout": out, "original": finished_study["output"]}


@pytest.mark.slow
def test_the_replication_record_holds_both_estimates_z_and_the_agreement(replication):
    output, original = replication["output"], replication["original"]
    document = json.loads((output / "replication.json").read_text())
    ours = json.loads((original / "report" / "report.json").read_text())
    theirs = json.loads((output / "study" / "report" / "report.json").read_text())
    assert len(document["comparisons"]) == len(ours["replication"]) == 12
    for row, a in zip(document["comparisons"], ours["replication"]):
        b = next(
            e
            for e in theirs["replication"]
            if (e["arm"], e["against"], e["metric"]) == (a["arm"], a["against"], a["metric"])
        )
        assert (
            row["original"]["estimate"] == a["pooled"]["estimate"]
            and row["replica"]["estimate"] == b["pooled"]["estimate"]
        )
        se = math.hypot(a["pooled"]["se"], b["pooled"]["se"])
        assert row["z"] == pytest.approx((a["pooled"]["estimate"] - b["pooled"]["estimate"]) / se)
        assert row["sign_flipped"] == (a["pooled"]["estimate"] * b["pooled"]["estimate"] < 0)
        # The tiny study has no pilot: each se comes from its two seeds, t(1); z is read on Welch's t.
        assert a["pooled"]["distribution"] == b["pooled"]["distribution"] == "t(1)"
        va, vb = a["pooled"]["se"] ** 2, b["pooled"]["se"] ** 2
        assert row["z_dof"] == pytest.approx((va + vb) ** 2 / (va**2 + vb**2))
        assert row["normal_score"] == pytest.approx(
            math.copysign(stats.norm.isf(stats.t.sf(abs(row["z"]), row["z_dof"])), row["z"]), abs=1e-9
        )
    statistic = sum(r["normal_score"] ** 2 for r in document["comparisons"])
    assert document["agreement"]["statistic"] == pytest.approx(statistic)
    assert document["agreement"]["p_value"] == pytest.approx(stats.chi2.sf(statistic, 12))
    # Without a pilot neither side's se carries the TRAIN draw that a replication changes: said.
    assert len(document["caveats"]) == 2 and all("do not carry the TRAIN draw" in c for c in document["caveats"])
    # The design is the original's; only the population pair is new.
    assert document["design"] == {"identical": True, "differences": []}
    assert document["refused_seeds"] == [7, 8] and document["reused"] == []
    assert (document["replica"]["train"]["seed"], document["replica"]["validation"]["seed"]) == (27, 28)
    assert document["replica"]["train"]["manifest_sha256"] != document["original"]["train"]["manifest_sha256"]
    frozen = {
        name: json.loads((d / "freeze.receipt.json").read_text())["body"]
        for name, d in (("original", original), ("replica", output / "study"))
    }
    # Fresh training seeds: every cell's recipe is the original's but for its seed.
    assert (frozen["original"]["seeds"], frozen["replica"]["seeds"]) == ([0, 1], [40, 41])
    assert document["fresh"] == ["TRAIN", "validation", "training seeds"]
    assert document["training_seeds"] == {"original": [0, 1], "replica": [40, 41]}
    for arm, by_seed in frozen["original"]["recipes"].items():
        assert set(by_seed) == {"0", "1"} and set(frozen["replica"]["recipes"][arm]) == {"40", "41"}
    assert frozen["original"]["study_id"] != frozen["replica"]["study_id"]
    # The sum of squares placed under both reports' scene correlation of the 12 comparisons.
    placed = document["agreement"]["correlated"]
    correlation = np.array(ours["replication_correlation"])
    assert correlation.shape == (12, 12) and np.allclose(np.diag(correlation), 1.0)
    assert (np.abs(correlation[np.triu_indices(12, 1)]) > 0.3).any()  # the comparisons share cells
    again = agreement_distribution(
        statistic,
        [r["original"]["se"] for r in document["comparisons"]],
        [r["replica"]["se"] for r in document["comparisons"]],
        correlation,
        theirs["replication_correlation"],
    )
    assert placed == again and placed["inside_central_90"] == (
        placed["central_90"][0] <= statistic <= placed["central_90"][1]
    )
    # Every variant's conclusion in both studies, and the console's summary.
    assert [c["variant"] for c in document["conclusions"]] == ["variant_cross_attention", "variant_deep"]
    for c in document["conclusions"]:
        q = next(q for q in theirs["question"] if q["variant"] == c["variant"])
        assert c["replica"] == q["decision"] == q["answer"]["decision"]
        assert c["changed"] == (c["original"] != c["replica"])
        assert c["flipped"] == ({c["original"], c["replica"]} == {"retained", "not retained"})
    assert document["changed_conclusions"] == [c["variant"] for c in document["conclusions"] if c["changed"]]
    said = " ".join(replication["stdout"].split())
    assert f"finished: 12 comparisons: t-calibrated sum of z^2 {statistic:.2f} on 12 dof" in said
    markdown = (output / "replication.md").read_text()
    assert markdown.startswith("# Replication of tiny-study") and "chi-square(12)" in markdown
    assert "**Caveat**: the original study's standard errors do not carry the TRAIN draw" in markdown
    assert "Drawn anew: TRAIN, validation, training seeds (training seeds: original [0, 1], replica [40, 41])" in (
        markdown
    )
    assert f"lies at its {placed['percentile']:.1%} point" in markdown


@pytest.mark.slow
def test_verify_recomputes_the_replication_and_refuses_a_resealed_edit(replication, tmp_path):
    code, out, err = _run(["verify", replication["output"]])
    assert code == 0, err
    assert "replication: " in out and "recomputed from both studies (12 comparisons" in out
    assert "point under their correlation" in out and "same design, fresh TRAIN, validation, training seeds" in out
    # Running it again finds the record and runs nothing.
    code, out, _ = _replicate(replication["original"], replication["output"], 27, 28, seeds=(40, 41))
    assert code == 0 and "is complete" in out
    # The same populations on the original's training seeds are another replication's design.
    code, _, err = _replicate(replication["original"], replication["output"], 27, 28)
    assert code == 2 and "holds the design of another replication (replication-config.toml differ)" in err, err
    # A forger edits the agreement and reseals the receipt: the recomputation refuses it.
    forged = _forged(replication["output"], tmp_path / "forged", "replication.json", _p_value_one_half)
    code, _, err = _run(["verify", forged])
    assert code == 2 and "differs from its recomputation from the two studies in agreement" in err
    # The report people read, rewritten and resealed: refused too.
    forged = _forged(replication["output"], tmp_path / "markdown", "replication.md", _no_sign_flips)
    code, _, err = _run(["verify", forged])
    assert code == 2 and "in replication.md" in err
    # The replica's report replaced by the original's (every z 0, p 1), every digest above resealed:
    # the replica's own report receipt does not bind it.
    forged = tmp_path / "swapped"
    shutil.copytree(replication["output"], forged, symlinks=True)
    swapped = forged / "study" / "report" / "report.json"
    swapped.chmod(0o644)
    swapped.write_bytes((replication["original"] / "report" / "report.json").read_bytes())
    reseal(forged / "replication.receipt.json")
    code, _, err = _run(["verify", forged])
    assert code == 2 and "report.json" in err, err


def _p_value_one_half(path: Path) -> None:
    document = json.loads(path.read_text())
    document["agreement"]["p_value"] = 0.5
    path.write_bytes(canonical_json(document))


def _no_sign_flips(path: Path) -> None:
    path.write_text(path.read_text().replace("flipped", "same"))


def _forged(original: Path, target: Path, name: str, edit) -> Path:
    """A copy of the replication with one of its outputs edited and its receipt resealed."""
    shutil.copytree(original, target, symlinks=True)
    (target / name).chmod(0o644)
    edit(target / name)
    reseal(target / "replication.receipt.json")
    return target


@pytest.mark.slow
def test_a_replication_on_the_original_populations_is_refused(finished_study, tmp_path):
    for train, validation, said in (
        (7, 28, "train seed 7 is the seed of the study TRAIN"),
        (27, 8, "validation seed 8 is the seed of the study validation"),
        (31, 31, "train and validation share seed 31"),
    ):
        output = tmp_path / f"r{train}-{validation}"
        code, _, err = _replicate(finished_study["output"], output, train, validation)
        assert code == 2 and said in err and "--train-seed/--validation-seed=" in err, err
        assert not output.exists()
    code, _, err = _replicate(finished_study["output"], tmp_path / "neg", -1, 28)
    assert code == 2 and "--train-seed=-1 is not allowed" in err
    for seeds in ((0, 40), (40, 40)):
        code, _, err = _replicate(finished_study["output"], tmp_path / "seeds", 27, 28, seeds=seeds)
        assert code == 2 and f"--seeds={list(seeds)} is not allowed; allowed: two different training seeds" in err
        assert "(refused: [0, 1])" in err and not (tmp_path / "seeds").exists()
    # Inside the original: the sealed study would hold a second study.
    before = sorted(str(p) for p in finished_study["output"].rglob("*"))
    code, _, err = _replicate(finished_study["output"], finished_study["output"] / "rep", 27, 28)
    assert code == 2 and "allowed: a directory outside the original study" in err, err
    assert sorted(str(p) for p in finished_study["output"].rglob("*")) == before


@pytest.mark.slow
def test_a_replica_whose_e0_gate_fails_stops_without_a_record(finished_study, tmp_path):
    # The tiny gate fails on TRAIN seed 80010, one of the 2 in 20 fresh draws where it does.
    output = tmp_path / "r80010"
    code, out, _ = _replicate(finished_study["output"], output, 80010, 80011)
    said = " ".join(out.split())
    assert code == 1 and "replication stopped: the replica's E0 gate failed on TRAIN seed 80010" in said, out
    assert (output / "study" / "canaries" / "e0.receipt.json").is_file()
    assert not (output / "replication.json").exists() and not (output / "replication.receipt.json").exists()


# ----------------------------------------------------------------- what the replica really ran

_HOPPER_STUDY = """name = "hopper-replicated"
profile = "cpu-fp32"
seeds = [0, 1]
canary_updates = 600
broad_updates = 30
tie_band = 0.001
regret_fraction = 0.9
mae_fraction = 1.1
workers = 2
population_cache = "{cache}"

[train]
preset = "hopper-fixed.toml"
seed = 7

[validation]
preset = "hopper.toml"
seed = 8

[bootstrap]
resamples = 199
seed = 0

[experiment.recipe]
name = "hopper"
horizon = 3
batch_size = 8
huber_delta = 0.05
architecture = {{ arm = "baseline", encoder = {{ depth = 1, width = 16, heads = 2 }} }}
optimizer = {{ lr = 3e-3 }}
target_update = {{ kind = "hard", interval = 10 }}

[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "variant_cross_attention"
role = "variant"
control = "control_global_readout"
"""


@pytest.fixture(scope="module")
def surroundings_study(tmp_path_factory):
    """A study of an environment that reads HOPPER_PULL from its surroundings, whose TRAIN preset draws
    one fixed level whatever its seed, run with HOPPER_PULL set."""
    from user_environment import write_hopper

    home = tmp_path_factory.mktemp("surroundings")
    write_hopper(home, scenes=6)
    fixed = (home / "hopper.toml").read_text().replace('name = "hopper"', 'name = "hopper-fixed"')
    (home / "hopper-fixed.toml").write_text(fixed + "fixed_level = true\n")
    (home / "study.toml").write_text(_HOPPER_STUDY.format(cache=home / "pops"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOPPER_PULL", "0.45")
        assert main(["study", "run", str(home / "study.toml"), "--output", str(home / "study")]) == 0
    return home / "study"


def test_a_replica_whose_environment_reads_other_surroundings_is_refused(surroundings_study, tmp_path, monkeypatch):
    monkeypatch.delenv("HOPPER_PULL", raising=False)
    output = tmp_path / "replica"
    code, _, err = _replicate(surroundings_study, output, 27, 28)
    assert code == 2 and err.count("error:") == 1, err
    assert "does not step the same in this process" in err and "an environment variable" in err, err
    assert not output.exists()


def test_a_replica_whose_train_holds_the_originals_scenes_is_refused(surroundings_study, tmp_path, monkeypatch):
    monkeypatch.setenv("HOPPER_PULL", "0.45")
    output = tmp_path / "replica"
    code, _, err = _replicate(surroundings_study, output, 27, 28)
    assert code == 2 and err.count("error:") == 1, err
    # Its six scenes are one level, drawn again whatever the seed: the manifests differ, the content does not.
    assert "the replica's train shares 1 scene with the original's TRAIN (by content)" in err, err
    assert not (output / "study" / "cells").exists()


def test_fresh_seeds_exclude_the_originals_its_pilots_and_its_tunings():
    from qhlab.replication.agreement import refused_training_seeds

    # The committed demo's records, as its freeze binds them: the pilot's layout, the tuning's objective.
    root = Path(__file__).resolve().parents[2] / "examples" / "preparation"
    pilot = json.loads((root / "demo-pilot" / "pilot.json").read_text())
    tuning = json.loads((root / "demo-tune" / "tuning.json").read_text())
    freeze = {
        "seeds": [0, 1],
        "preparation": {"pilot": {"layout": pilot["layout"]}, "tuning": {"objective": tuning["config"]["objective"]}},
    }
    pilot_seeds = {s for entry in pilot["layout"] for s in entry["seeds"]}
    assert set(refused_training_seeds(freeze)) == {0, 1} | pilot_seeds | set(tuning["config"]["objective"]["seeds"])
    assert {2, 7} <= set(refused_training_seeds(freeze)) and 40 not in refused_training_seeds(freeze)
    # Without preparation records, only the study's own.
    assert refused_training_seeds({"seeds": [0, 1]}) == [0, 1]
