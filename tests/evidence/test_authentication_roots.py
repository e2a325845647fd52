"""``authentication_roots``: a copied directory is judged on its own bytes.

A receipt in a sub-directory binds a file of its directory by absolute path (as a study's
report binds its cell receipts), and a population outside it by absolute path too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from note_receipt import NoteReceipt
from qhlab.evidence import (
    DigestMismatchError,
    MissingEvidenceError,
    authentication_roots,
    locate_population,
    read_receipt,
    write_receipt,
)


@pytest.fixture
def made(tmp_path) -> dict[str, Path]:
    study, population = tmp_path / "made" / "study", tmp_path / "made" / "population"
    (study / "cells" / "c").mkdir(parents=True)
    (study / "report").mkdir()
    population.mkdir(parents=True)
    (population / "manifest.json").write_text('{"name": "p"}')
    (study / "cells" / "c" / "cell.json").write_text('{"mae": 0.05}')
    write_receipt(
        study / "report" / "report.receipt.json",
        NoteReceipt,
        body={},
        inputs={"cell": study / "cells" / "c" / "cell.json", "population": population / "manifest.json"},
    )
    return {"study": study, "population": population}


def _report(study: Path) -> Path:
    return study / "report" / "report.receipt.json"


def test_an_edited_copy_is_refused_though_the_original_is_intact(made, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(made["study"], copy)
    (copy / "cells" / "c" / "cell.json").write_text('{"mae": 0.01}')
    read_receipt(_report(copy), NoteReceipt).record()  # outside: the original vouches (old rule)
    with authentication_roots(copy, original=made["study"]):
        with pytest.raises(DigestMismatchError, match=r"this directory's copy of .*made/study/cells/c/cell\.json"):
            read_receipt(_report(copy), NoteReceipt).record()
    # A nested intact copy under the original's name (cp -r twice) does not vouch for it either.
    shutil.copytree(made["study"], copy / "study")
    with authentication_roots(copy, original=made["study"]):
        with pytest.raises(DigestMismatchError):
            read_receipt(_report(copy), NoteReceipt).record()


def test_a_file_missing_from_the_copy_is_missing(made, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(made["study"], copy)
    (copy / "cells" / "c" / "cell.json").unlink()
    with authentication_roots(copy, original=made["study"]):
        with pytest.raises(MissingEvidenceError, match=r"cell\.json, this directory's copy of .* is missing"):
            read_receipt(_report(copy), NoteReceipt).record()


def test_a_stray_file_never_stands_in_for_a_population(made) -> None:
    study = made["study"]
    (study / "manifest.json").write_text("a stray file named like a population manifest")
    with authentication_roots(study, original=study):
        read_receipt(_report(study), NoteReceipt).record()


def test_moved_directory_and_population_authenticate_where_they_are(made, tmp_path) -> None:
    moved, roots = tmp_path / "elsewhere" / "study", tmp_path / "elsewhere" / "pops"
    shutil.copytree(made["study"], moved)
    shutil.copytree(made["population"], roots / "population")
    shutil.rmtree(made["study"])
    shutil.rmtree(made["population"])
    digest = read_receipt(_report(moved), NoteReceipt, verify_files=False).record()["inputs"]["population"]["sha256"]
    with authentication_roots(moved, [roots], original=made["study"]):
        read_receipt(_report(moved), NoteReceipt).record()
        assert locate_population(made["population"], digest) == roots / "population"
    with authentication_roots(moved, original=made["study"]):
        with pytest.raises(MissingEvidenceError, match=r"population population .* not found .*--populations ROOT"):
            read_receipt(_report(moved), NoteReceipt).record()
