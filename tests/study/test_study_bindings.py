"""Every fit is bound to its study and to the TRAIN rows it trained on.

A canary fitted on another TRAIN row, or an attempt copied from another study frozen from the
same config, authenticates on its own bytes; only the fit receipt's ``train_rows`` and ``study``
records tell it apart, and adoption compares both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qhlab.evidence import EvidenceError
from qhlab.evidence.layout import BENCHMARK_DIR, CANARY_DIR, CELLS_DIR, DEVELOPMENT_RECEIPT, E0_RECEIPT, REPORT_DIR
from qhlab.finite_horizon.studies.architecture_study import admit_canaries, freeze_study, prepare_development, run_fit

pytestmark = pytest.mark.slow


def _fit_receipt(attempt: Path) -> dict:
    return json.loads((attempt / "fit.receipt.json").read_text())["body"]


def _attempts(cell_dir: Path) -> list[Path]:
    return sorted(p for p in cell_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_fit_receipts_record_rows_and_study_and_cells_record_adoption(finished_study):
    output = finished_study["output"]
    freeze = json.loads((output / "freeze.receipt.json").read_text())["body"]
    assert len(freeze["study_id"]) == 32
    selection = json.loads((output / CANARY_DIR / "selection.json").read_text())["selected"]
    canary = _fit_receipt(_attempts(output / CANARY_DIR / "e0-baseline-s0")[0])
    assert canary["train_rows"]["rows"] == [selection["row"]]
    assert canary["study"]["study_id"] == freeze["study_id"] and canary["study"]["name"] == "tiny-study"
    broad = _fit_receipt(_attempts(output / CELLS_DIR / "baseline-s0")[0])
    assert broad["train_rows"]["rows"] is None and broad["study"] == canary["study"]
    for cell in _attempts(output / CELLS_DIR):  # the cell directories (hidden lock folders aside)
        assert json.loads((cell / "cell.receipt.json").read_text())["body"]["adopted"] is False


def test_a_finished_unrecorded_attempt_is_adopted_and_marked(study_copy, finished_study):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    (output / CELLS_DIR / "variant_deep-s1" / "cell.receipt.json").unlink()
    body = run_fit(finished_study["config"], output, variant="variant_deep", seed=1)
    assert body["adopted"] is True and body["execution"]["adopted_after_restart"] is True


def test_a_canary_trained_on_another_row_is_refused(study_copy, finished_study):
    from qhlab.design.canary import canary_recipe
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe
    from qhlab.study.authentication import authenticate_freeze

    output = study_copy(
        REPORT_DIR, BENCHMARK_DIR, CELLS_DIR, f"{CANARY_DIR}/e0-baseline-s0", f"{CANARY_DIR}/e0-baseline-s1"
    )
    (output / CANARY_DIR / E0_RECEIPT).unlink()
    (output / DEVELOPMENT_RECEIPT).unlink()
    frozen = authenticate_freeze(finished_study["config"], output, "test")
    selected = json.loads((output / CANARY_DIR / "selection.json").read_text())["selected"]["row"]
    recipe, _ = canary_recipe(frozen.recipe("baseline", 0, frozen.config.canary_updates))
    # Everything a forger controls is the canary's, the study identity included; only the row is not.
    fit_recipe(
        FitRequest(
            recipe=recipe,
            profile=frozen.config.profile,
            output=output / CANARY_DIR,
            train=frozen.train_path,
            evaluate=False,
            cell="e0-baseline-s0",
            train_rows=[selected + 1],
            study=frozen.identity,
            progress=False,
            job_type="canary",
            group=frozen.config.name,
        )
    )
    with pytest.raises(
        EvidenceError,
        match=r"run_fit\(canary\): train_rows=.*'rows': \["
        + str(selected + 1)
        + r"\].* is not allowed; allowed: .*'rows': \["
        + str(selected)
        + r"\]",
    ):
        admit_canaries(finished_study["config"], output)
    assert not (output / CANARY_DIR / "e0-baseline-s0" / "cell.receipt.json").exists()
    assert not (output / CANARY_DIR / E0_RECEIPT).exists()


def test_an_attempt_of_another_study_with_the_same_config_is_refused(tmp_path, finished_study):
    config, first = finished_study["config"], finished_study["output"]
    second = tmp_path / "second-study"
    freeze_study(config, second)
    admit_canaries(config, second)
    prepare_development(config, second)
    donor = _attempts(first / CELLS_DIR / "baseline-s0")[0]
    target = second / CELLS_DIR / "baseline-s0"
    target.mkdir(parents=True)
    shutil.copytree(donor, target / donor.name)
    with pytest.raises(
        EvidenceError,
        match=r"run_fit: study=.* is not allowed; allowed: .*the frozen value of "
        r"cell baseline-s0",
    ):
        run_fit(config, second, variant="baseline", seed=0)
    assert not (target / "cell.receipt.json").exists()
