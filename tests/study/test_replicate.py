"""`qhlab study replicate`: a finished study's frozen design on a fresh population pair, and the agreement.

The end-to-end test replicates the session's finished tiny study (TRAIN seed 7, validation 8) on
TRAIN 27 and validation 28 through the real command line, checks the record's numbers against
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
from qhlab.evidence import QhInputError, canonical_json, sha256_bytes, sha256_file
from qhlab.statistics.replication import agreement_test


def _run(argv: list) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _replicate(study: Path, output: Path, train: int, validation: int) -> tuple[int, str, str]:
    return _run(
        ["study", "replicate", study, "--train-seed", train, "--validation-seed", validation, "--output", output]
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


# ----------------------------------------------------------------- the command, end to end


@pytest.fixture(scope="module")
def replication(tmp_path_factory, finished_study) -> dict:
    """The session's tiny study replicated on TRAIN 27 and validation 28."""
    output = tmp_path_factory.mktemp("replication") / "r"
    code, out, err = _replicate(finished_study["output"], output, 27, 28)
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
    statistic = sum(r["z"] ** 2 for r in document["comparisons"])
    assert document["agreement"]["statistic"] == pytest.approx(statistic)
    assert document["agreement"]["p_value"] == pytest.approx(stats.chi2.sf(statistic, 12))
    # The design is the original's; only the population pair is new.
    assert document["design"] == {"identical": True, "differences": []}
    assert document["refused_seeds"] == [7, 8] and document["reused"] == []
    assert (document["replica"]["train"]["seed"], document["replica"]["validation"]["seed"]) == (27, 28)
    assert document["replica"]["train"]["manifest_sha256"] != document["original"]["train"]["manifest_sha256"]
    frozen = {
        name: json.loads((d / "freeze.receipt.json").read_text())["body"]
        for name, d in (("original", original), ("replica", output / "study"))
    }
    assert frozen["original"]["recipes"] == frozen["replica"]["recipes"]
    assert frozen["original"]["study_id"] != frozen["replica"]["study_id"]
    # Every variant's conclusion in both studies, and the console's summary.
    assert [c["variant"] for c in document["conclusions"]] == ["variant_cross_attention", "variant_deep"]
    for c in document["conclusions"]:
        q = next(q for q in theirs["question"] if q["variant"] == c["variant"])
        assert c["replica"] == {"decision": q["answer"]["decision"], "verdict": q["verdict"]}
        assert c["answer_changed"] == (c["original"]["decision"] != c["replica"]["decision"])
    assert document["changed_conclusions"] == [
        c["variant"] for c in document["conclusions"] if c["answer_changed"] or c["verdict_changed"]
    ]
    said = " ".join(replication["stdout"].split())
    assert f"finished: 12 comparisons: sum of z^2 {statistic:.2f} on 12 degrees of freedom" in said
    markdown = (output / "replication.md").read_text()
    assert markdown.startswith("# Replication of tiny-study") and "chi-square(12)" in markdown


@pytest.mark.slow
def test_verify_recomputes_the_replication_and_refuses_a_resealed_edit(replication, tmp_path):
    code, out, err = _run(["verify", replication["output"]])
    assert code == 0, err
    assert "replication: " in out and "recomputed from both studies (12 comparisons" in out
    # Running it again finds the record and runs nothing.
    code, out, _ = _replicate(replication["original"], replication["output"], 27, 28)
    assert code == 0 and "is complete" in out
    # A forger edits the agreement and reseals the receipt: the recomputation refuses it.
    forged = tmp_path / "forged"
    shutil.copytree(replication["output"], forged, symlinks=True)
    record = forged / "replication.json"
    document = json.loads(record.read_text())
    document["agreement"]["p_value"] = 0.5
    record.chmod(0o644)
    record.write_bytes(canonical_json(document))
    receipt = forged / "replication.receipt.json"
    sealed = json.loads(receipt.read_text())
    sealed["outputs"]["replication.json"]["sha256"] = sha256_file(record)
    sealed.pop("content_sha256")
    sealed["content_sha256"] = sha256_bytes(canonical_json(sealed))
    receipt.chmod(0o644)
    receipt.write_bytes(canonical_json(sealed))
    code, _, err = _run(["verify", forged])
    assert code == 2 and "differs from its recomputation from the two studies in agreement" in err


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


@pytest.mark.slow
def test_a_replica_whose_e0_gate_fails_stops_without_a_record(finished_study, tmp_path):
    # The tiny gate fails on TRAIN seed 80010, one of the 2 in 20 fresh draws where it does.
    output = tmp_path / "r80010"
    code, out, _ = _replicate(finished_study["output"], output, 80010, 80011)
    said = " ".join(out.split())
    assert code == 1 and "replication stopped: the replica's E0 gate failed on TRAIN seed 80010" in said, out
    assert (output / "study" / "canaries" / "e0.receipt.json").is_file()
    assert not (output / "replication.json").exists() and not (output / "replication.receipt.json").exists()
