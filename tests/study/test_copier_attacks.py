"""A copier against ``qhlab verify``: each attack on a real finished study, refused.

A copied study is judged on its own bytes, each bound file at exactly one place: a nested copy
never vouches for a changed file, a symbolic link never hides one, and a stale signature
statement is checked without a key. ``verify`` and ``study status`` agree on every copy.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import canonical_json, sha256_bytes

pytestmark = pytest.mark.slow


def _run(argv: list) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _reseal(path: Path, edit) -> None:
    """Edit a receipt's body and recompute its own content digest (what a copier does)."""
    document = json.loads(path.read_text())
    edit(document["body"])
    document.pop("content_sha256")
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    path.chmod(0o644)
    path.write_bytes(canonical_json(document))


def _states(study: Path) -> dict[str, str]:
    code, out, err = _run(["study", "status", study, "--json"])
    assert code == 0, err
    return {row["row"]: row["state"] for row in json.loads(out)["rows"]}


def _bump_forward(body: dict) -> None:
    body["median_forward_seconds"] = body["median_forward_seconds"] / 2


def test_a_nested_copy_never_vouches_for_a_changed_file(tmp_path, finished_study) -> None:
    original = finished_study["output"]
    copy = tmp_path / "C"
    shutil.copytree(original, copy)
    (copy / original.name / "benchmarks").mkdir(parents=True)
    shutil.copy2(original / "benchmarks" / "baseline-s0.receipt.json", copy / original.name / "benchmarks")
    changed = copy / "benchmarks" / "baseline-s0.receipt.json"
    _reseal(changed, _bump_forward)
    code, _, err = _run(["verify", copy])
    assert code == 2 and err.count("error:") == 1, err
    assert f"({changed}, this directory's copy of {original / 'benchmarks' / 'baseline-s0.receipt.json'})" in err, err
    # study status sees the same change (the report binds the edited receipt): the two agree.
    assert _states(copy)["report"] == "crashed"
    assert set(_states(original).values()) == {"authenticated"}


def test_two_copies_of_one_study_in_one_directory_are_refused_not_chosen(tmp_path, finished_study) -> None:
    original = finished_study["output"]
    copy = tmp_path / "C"
    shutil.copytree(original, copy)
    shutil.copytree(original, copy / original.name)  # cp -a S C; cp -a S C/S
    code, _, err = _run(["verify", copy])
    assert code == 2 and f"{copy} and {copy / original.name} are both copies of files made in {original}" in err, err


def test_a_symlinked_cells_directory_is_refused_by_verify_and_by_every_step(tmp_path, finished_study) -> None:
    study = tmp_path / "S"
    shutil.copytree(finished_study["output"], study)
    elsewhere = tmp_path / "out"
    shutil.move(study / "cells", elsewhere)
    (study / "cells").symlink_to(elsewhere)
    weights = next(elsewhere.glob("baseline-s0/*/final_state.safetensors"))
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    code, _, err = _run(["verify", study])
    assert code == 2 and f"{str(study / 'cells')!r} -> {str(elsewhere)!r}" in err, err
    # A study whose cells/ was linked right after freeze: no step writes through the link.
    fresh = tmp_path / "fresh"
    shutil.copytree(finished_study["output"], fresh)
    for name in ("canaries", "cells", "benchmarks", "report", "wandb-report", "development.receipt.json"):
        target = fresh / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    target = tmp_path / "linked-cells"
    target.mkdir()
    (fresh / "cells").symlink_to(target)
    code, out, err = _run(["study", "run", finished_study["config"], "--output", fresh])
    assert code == 2 and f"{fresh / 'cells'} links to {str(target)!r}" in err, out + err
    assert list(target.iterdir()) == [] and not (fresh / "canaries").exists()


def test_verify_refuses_special_files_and_files_hard_linked_outside(tmp_path, finished_study) -> None:
    study = tmp_path / "S"
    shutil.copytree(finished_study["output"], study)
    fifo = study / "cells" / "x.receipt.json"
    os.mkfifo(fifo)
    code, _, err = _run(["verify", study])
    assert code == 2 and f"{str(fifo)!r} (a FIFO (named pipe))" in err, err
    fifo.unlink()
    outside = tmp_path / "outside.json"
    os.link(study / "report" / "report.json", outside)
    code, _, err = _run(["verify", study])
    assert code == 2 and "1 file(s) hard-linked to a path outside it" in err and "report.json" in err, err
    outside.unlink()
    assert _run(["verify", study])[0] == 0


def test_keyless_verify_checks_a_stale_signature_statement(tmp_path, finished_study) -> None:
    study = tmp_path / "S"
    shutil.copytree(finished_study["output"], study)
    key = tmp_path / "key.pem"
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key], check=True)
    assert _run(["sign", study, "--private-key", key])[0] == 0
    code, out, _ = _run(["verify", study])
    assert code == 0 and "lists exactly the" in out and "the signature itself was not checked" in out, out
    assert "proves internal consistency" in out and "not origin" in out, out
    # The report's headline flipped and its receipt resealed: consistent, but not what was signed.
    report = study / "report" / "report.receipt.json"
    _reseal(report, lambda body: body["summary"].update(headline="forged"))
    code, _, err = _run(["verify", study])
    assert code == 2 and "does not list the files below" in err and "report/report.receipt.json has sha256" in err, err


def test_verify_of_an_empty_path_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["verify", ""])
    assert code == 2 and "verify: directory='' is not allowed" in err, err


def test_a_part_of_a_copy_is_judged_against_the_copy_it_lies_in(tmp_path, finished_study) -> None:
    original = finished_study["output"]
    copy = tmp_path / "C"
    shutil.copytree(original, copy)
    cell = copy / "cells" / "baseline-s0"
    assert _run(["verify", cell])[0] == 0
    freeze = copy / "freeze.receipt.json"
    _reseal(freeze, lambda body: body["thresholds"].update(tie_band=0.5))  # the original stays intact
    code, _, err = _run(["verify", cell])
    assert code == 2 and f"({freeze}, this directory's copy of {original / 'freeze.receipt.json'})" in err, err


def test_swapped_cell_directories_are_refused_by_verify_status_and_every_step(tmp_path, finished_study) -> None:
    # Two cells of one arm swapped before the benchmarks: each receipt still binds its own files.
    study = tmp_path / "S"
    shutil.copytree(finished_study["output"], study)
    for name in ("benchmarks", "report", "wandb-report"):
        shutil.rmtree(study / name)
    cells = study / "cells"
    (cells / "baseline-s0").rename(cells / "swap")
    (cells / "baseline-s1").rename(cells / "baseline-s0")
    (cells / "swap").rename(cells / "baseline-s1")
    code, _, err = _run(["verify", study])
    assert code == 2 and err.count("error:") == 1, err
    assert "receipt of cell 'baseline-s" in err and "but lies in directory 'baseline-s" in err, err
    states = _states(study)
    assert states["baseline-s0"] == states["baseline-s1"] == "crashed", states
    code, out, err = _run(["study", "run", finished_study["config"], "--output", study])
    assert code == 2 and "but lies in directory" in err, out + err
    assert not (study / "benchmarks").exists() or not any((study / "benchmarks").iterdir())


def test_verify_compares_every_fits_structure_with_the_freeze(tmp_path, finished_study) -> None:
    code, out, err = _run(["verify", finished_study["output"]])
    assert code == 0, err
    # The tiny study: 2 canaries and 5 arms x 2 seeds.
    assert "12 fits trained the scorer structure their freeze recorded" in out, out
    # A fit receipt that claims another structure (resealed, so the check itself must see it; the
    # cell receipt above it would refuse its digest first in a whole verify).
    from qhlab.design.study_records import check_structures
    from qhlab.evidence import DigestMismatchError

    study = tmp_path / "S"
    shutil.copytree(finished_study["output"], study)
    fit = next((study / "cells" / "baseline-s0").glob("*/fit.receipt.json"))
    _reseal(fit, lambda body: body["scorer"]["structure"].update(sha256="0" * 64))
    with pytest.raises(DigestMismatchError, match="not the [0-9a-f]{16} the freeze recorded for arm 'baseline'"):
        check_structures(study)
