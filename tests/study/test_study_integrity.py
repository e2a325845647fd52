"""Evidence a study cannot be fooled by, and evidence that travels.

An attempt copied into another cell is refused, field by field; validation must be disjoint
from TRAIN by physical content, not by id; later steps refuse other package versions than the
frozen ones; a study and its populations copied elsewhere verify there.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qhlab.design.study_records import StudyCellReceipt, StudyDevelopmentReceipt
from qhlab.evidence import EvidenceError, QhInputError, canonical_json, read_receipt, sha256_file, write_receipt
from qhlab.evidence.layout import BENCHMARK_DIR, POPULATION_FILES, REPORT_DIR
from qhlab.evidence.source import STUDY_PACKAGES
from qhlab.finite_horizon.studies.architecture_study import admit_canaries, freeze_study, prepare_development, run_fit
from qhlab.scenes.population import SCENE_IDENTITY_COLUMNS
from qhlab.scenes.records import PopulationReceipt
from qhlab.study import authentication, development


def test_freeze_records_versions_and_later_steps_refuse_others(tmp_path, tiny_config, monkeypatch):
    output = tmp_path / "study"
    body = freeze_study(tiny_config, output)
    versions = body["versions"]
    assert set(versions) == {"python", *STUDY_PACKAGES}
    assert versions == authentication.runtime_versions() and versions["torch"] is not None
    changed = {**versions, "pymunk": "0.0.1"}
    monkeypatch.setattr(authentication, "runtime_versions", lambda: changed)
    with pytest.raises(
        EvidenceError,
        match=r"versions\.pymunk='0\.0\.1' is not allowed; allowed: "
        rf"'{versions['pymunk']}', the version the freeze receipt",
    ):
        admit_canaries(tiny_config, output)


def _plant_train_scene(validation: Path, train: Path, row: int) -> int:
    """Give validation scene ``row`` the physical content of TRAIN's first scene, keeping its
    id and index, and re-sign the manifest and receipt so only the content check can object."""
    for f in validation.iterdir():
        f.chmod(0o644)
    table = pq.read_table(validation / "scenes.parquet")
    rows = table.to_pylist()
    donor = pq.read_table(train / "scenes.parquet").to_pylist()[0]
    rows[row].update({k: v for k, v in donor.items() if k not in SCENE_IDENTITY_COLUMNS})
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), validation / "scenes.parquet")
    manifest = json.loads((validation / "manifest.json").read_text())
    manifest["files"]["scenes.parquet"] = sha256_file(validation / "scenes.parquet")
    (validation / "manifest.json").write_bytes(canonical_json(manifest))
    receipt = validation / "population.receipt.json"
    receipt_body = json.loads(receipt.read_text())["body"]
    receipt.unlink()
    write_receipt(
        receipt,
        PopulationReceipt,
        body=receipt_body,
        outputs={n: validation / n for n in (*POPULATION_FILES, "manifest.json")},
    )
    return donor["scene_id"]


def test_validation_sharing_a_train_scene_physically_is_refused(config_writer, tmp_path, population_cache, monkeypatch):
    from qhlab.scenes import cached_population

    train = cached_population("tiny", "train", 7, population_cache, workers=1)
    planted = tmp_path / "planted-validation"
    shutil.copytree(cached_population("tiny", "validation", 8, population_cache, workers=1), planted)
    config = config_writer(
        tmp_path / "cfg",
        population_cache,
        **{'[validation]\npreset = "tiny"\nseed = 8': f'[validation]\npath = "{planted}"'},
    )
    output = tmp_path / "out"
    freeze_study(config, output)
    planted_id = pq.read_table(planted / "scenes.parquet").column("scene_id").to_pylist()[1]
    _plant_train_scene(planted, train, row=1)
    # The E0 gate is not what is tested here: skip its fits.
    monkeypatch.setattr(
        development,
        "authenticate_e0",
        lambda frozen, step: SimpleNamespace(body=SimpleNamespace(passed=True, reason="")),
    )
    # Every load regenerates every scene from the generator, so the planted scene is refused as
    # not the generator's before the scene-sharing check is reached.
    with pytest.raises(
        QhInputError,
        match=rf"scene_index 1 \(scene_id {planted_id}\) is not the scene environment 'puck' draws",
    ):
        prepare_development(config, output)
    assert not (output / "development.receipt.json").exists()


def _copy_foreign_fit(output: Path, *, clear: bool) -> tuple[Path, str]:
    """Copy cell baseline-s0's attempt into cell variant_deep-s1 (emptied first when ``clear``);
    returns the target cell directory and the attempt's name."""
    donor = output / "cells" / "baseline-s0"
    attempt = read_receipt(donor / "cell.receipt.json", StudyCellReceipt).body_record()["attempt"]
    target = output / "cells" / "variant_deep-s1"
    if clear:
        shutil.rmtree(target)
    shutil.copytree(donor / attempt, target / attempt)
    return target, attempt


@pytest.mark.slow
def test_foreign_fit_copied_into_a_cell_is_refused(study_copy, finished_study):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    target, _ = _copy_foreign_fit(output, clear=True)
    with pytest.raises(
        EvidenceError,
        match=r"run_fit: cell='tiny-study-baseline-s0' is not allowed; allowed: "
        r"'tiny-study-variant_deep-s1'",
    ):
        run_fit(finished_study["config"], output, variant="variant_deep", seed=1)
    assert not (target / "cell.receipt.json").exists()


@pytest.mark.slow
def test_report_refuses_a_cell_receipt_made_from_a_foreign_fit(study_copy, finished_study):
    from qhlab.finite_horizon.studies.architecture_study import report_study

    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    target, attempt = _copy_foreign_fit(output, clear=False)
    receipt = target / "cell.receipt.json"
    document = read_receipt(receipt, StudyCellReceipt).record()
    # A re-signed cell receipt whose attempt is the baseline's fit: every digest is consistent.
    inputs = {name: Path(entry["path"]) for name, entry in document["inputs"].items()}
    inputs = {
        name: path if path.is_absolute() else target / attempt / Path(*path.parts[1:]) for name, path in inputs.items()
    }
    receipt.unlink()
    write_receipt(receipt, StudyCellReceipt, body={**document["body"], "attempt": attempt}, inputs=inputs)
    with pytest.raises(EvidenceError, match=r"report_study: cell='tiny-study-baseline-s0' is not allowed"):
        report_study(finished_study["config"], output)


@pytest.mark.slow
def test_moved_study_and_populations_verify_where_they_are(tmp_path, finished_study, population_cache, monkeypatch):
    from qhlab.cli import main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    moved, roots = tmp_path / "elsewhere" / "study", tmp_path / "elsewhere" / "populations"
    shutil.copytree(finished_study["output"], moved)
    shutil.copytree(population_cache, roots)
    originals = [finished_study["output"], population_cache]
    # The originals are out of reach while the copies are verified (put back for other tests).
    for path in originals:
        path.rename(path.with_name(path.name + ".away"))
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["verify", str(moved), "--populations", str(roots)]) == 0, out.getvalue()
        with contextlib.redirect_stderr(io.StringIO()) as err:
            assert main(["verify", str(moved)]) == 2
    finally:
        for path in originals:
            path.with_name(path.name + ".away").rename(path)
    validation = development_manifest_sha256(moved)
    assert f"(manifest sha256 {validation})" in err.getvalue() and "not found" in err.getvalue()


def development_manifest_sha256(study: Path) -> str:
    """The validation manifest digest the development receipt binds (read without its files)."""
    document = read_receipt(study / "development.receipt.json", StudyDevelopmentReceipt, verify_files=False).record()
    return document["body"]["validation"]["manifest_sha256"]


@pytest.mark.slow
def test_other_source_is_refused_except_where_the_report_is_recomputed(finished_study, monkeypatch):
    from qhlab.lanes import compare
    from qhlab.report.records import recompute_report

    output = finished_study["output"]
    other = {"sha256": "0" * 64, "files": 1}
    monkeypatch.setattr(authentication, "source_package_digest", lambda: other)
    monkeypatch.setattr("qhlab.report.records.source_package_digest", lambda: other)
    # A lane comparison reads a study made elsewhere, but never one of other qhlab source.
    with pytest.raises(EvidenceError, match="the qhlab source package has sha256 0000"):
        compare._read_lane(output)
    # A report is accepted from other source when this source rebuilds the same bytes.
    assert recompute_report(output)["cells"] == 10
