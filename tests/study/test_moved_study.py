"""Study commands on a copied or moved study judge the copy's own bytes.

A cell receipt edited in a copy and resealed (its content digest recomputed) used to pass
``study status`` and ``study run`` while the original existed, because every absolute binding
was re-hashed at the original's paths; with the original gone, every row was "crashed".
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import canonical_json, sha256_bytes

pytestmark = pytest.mark.slow


def _run(argv: list[str]) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _reseal_cell_edit(study: Path) -> Path:
    """Raise baseline-s0's MAE_H in its cell receipt and recompute the receipt's own digest."""
    path = study / "cells" / "baseline-s0" / "cell.receipt.json"
    document = json.loads(path.read_text())
    document["body"]["evaluation"]["mae"][-1] += 0.01
    document.pop("content_sha256")
    document["content_sha256"] = sha256_bytes(canonical_json(document))
    path.chmod(0o644)
    path.write_bytes(canonical_json(document))
    return path


def _states(status_json: str) -> dict[str, str]:
    return {row["row"]: row["state"] for row in json.loads(status_json)["rows"]}


@contextlib.contextmanager
def _away(*paths: Path):
    """The originals out of reach meanwhile (session fixtures: put back for other tests)."""
    for path in paths:
        path.rename(path.with_name(path.name + ".away"))
    try:
        yield
    finally:
        for path in paths:
            path.with_name(path.name + ".away").rename(path)


def test_a_moved_study_runs_its_steps_where_it_is(tmp_path, finished_study, population_cache, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no default population cache to fall back on
    moved, roots = tmp_path / "elsewhere" / "study", tmp_path / "elsewhere" / "populations"
    shutil.copytree(finished_study["output"], moved)
    shutil.copytree(population_cache, roots)
    config = finished_study["config"]
    with _away(finished_study["output"], population_cache):
        code, out, _ = _run(["study", "status", moved, "--populations", roots, "--json"])
        assert code == 0 and set(_states(out).values()) == {"authenticated"}, out
        code, out, err = _run(["study", "run", config, "--output", moved, "--populations", roots])
        assert code == 0 and "every receipt authenticated" in out, out + err
        # Without the roots the populations are named as missing, not silently read elsewhere.
        code, out, err = _run(["study", "run", config, "--output", moved])
        assert code == 2 and "not found" in err and "--populations ROOT" in err, err
        # ... and the guide says so where a user who moves a study reads.
        guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "signing.md").read_text()
        moving = guide.split("## Moving a study", 1)[1].split("\n## ", 1)[0]
        assert "~/.cache/qhlab/populations" in moving and "--populations" in moving
        edited = _reseal_cell_edit(moved)
        code, out, _ = _run(["study", "status", moved, "--populations", roots, "--json"])
        assert code == 0 and _states(out)["report"] == "crashed", out
        assert str(edited) in json.dumps(json.loads(out)["rows"]), out
        code, out, err = _run(["study", "run", config, "--output", moved, "--populations", roots])
        assert code == 2 and str(edited) in err, err


def test_a_resealed_edit_in_a_copy_is_refused_while_the_original_exists(tmp_path, finished_study):
    copy = tmp_path / "copy"
    shutil.copytree(finished_study["output"], copy)
    edited = _reseal_cell_edit(copy)
    code, out, _ = _run(["study", "status", copy, "--json"])
    assert code == 0 and _states(out)["report"] == "crashed", out
    code, out, err = _run(["study", "run", finished_study["config"], "--output", copy])
    assert code == 2 and str(edited) in err and err.count("error:") == 1, err
    # The original is untouched and still authenticates in full.
    code, out, _ = _run(["study", "status", finished_study["output"], "--json"])
    assert set(_states(out).values()) == {"authenticated"}, out
