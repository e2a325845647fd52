"""A population cache that cannot take a new population is refused by its field before labelling.

Labelling a population takes minutes and would fail only when it publishes into the cache: a
``population_cache`` that is a device, a file, or lies below a file is refused first, as
``population_cache``, with exit 2 and nothing written (no study directory, no population).
"""

from __future__ import annotations

import contextlib
import io
import tomllib
from pathlib import Path

import pytest
import tomli_w

from qhlab.cli import main
from qhlab.evidence import QhInputError
from qhlab.scenes import cached_population

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _study(directory: Path, cache: str) -> Path:
    raw = tomllib.loads((EXAMPLES / "first-study.toml").read_text())
    raw.pop("preparation")
    raw["population_cache"] = cache
    path = directory / "study.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def _command(argv: list[str]) -> tuple[int, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize(
    "cache, in_the_way",
    [
        ("/dev/null", "'/dev/null' is not a directory"),
        ("a-file", "a-file' is a file"),
        ("a-file/below", "a-file' is a file"),
    ],
    ids=["a device", "a file", "below a file"],
)
def test_a_freeze_refuses_a_cache_that_cannot_hold_a_population_before_labelling(tmp_path, cache, in_the_way) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    config = _study(tmp_path, cache)
    code, text = _command(["study", "freeze", str(config), "--output", str(tmp_path / "study")])
    assert code == 2 and text.count("error:") == 1 and "Traceback" not in text, text
    shown = cache if cache.startswith("/") else str(tmp_path / cache)
    assert f"freeze_study: population_cache={shown!r} is not allowed" in text, text
    assert in_the_way in text and "HINT: name a writable directory" in text, text
    # Refused before the TRAIN population was labelled, and nothing was written.
    assert "simulations" not in text and "disk must have free space" not in text, text
    assert not (tmp_path / "study").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "study.toml"]


def test_a_pilot_refuses_the_same_cache_by_its_field(tmp_path) -> None:
    study = _study(tmp_path, "pops")
    raw = tomllib.loads(study.read_text())
    raw["preparation"] = {"pilot_layout": {"draws": [7], "seeds": [[2, 3]]}}
    study.write_text(tomli_w.dumps(raw))
    pilot = {
        "name": "cache-pilot",
        "study": "study.toml",
        "seeds": [2, 3],
        "population_cache": "/dev/null",
        "train": {"preset": "tiny", "seed": 7},
        "validation": {"preset": "tiny", "seed": 9},
    }
    (tmp_path / "pilot.toml").write_text(tomli_w.dumps(pilot))
    code, text = _command(["pilot", str(tmp_path / "pilot.toml"), "--output", str(tmp_path / "out")])
    assert code == 2 and text.count("error:") == 1, text
    # Named by the command that was run, not by the study it prepares.
    assert "error: qhlab pilot: population_cache='/dev/null' is not allowed" in text, text
    assert "simulations" not in text and not (tmp_path / "out").exists()


def test_cached_population_names_its_cache_argument(tmp_path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(
        QhInputError, match=r"^cached_population: cache_root='.*a-file' is not allowed; allowed: a directory"
    ):
        cached_population("tiny", "train", 0, tmp_path / "a-file", workers=1)
    with pytest.raises(QhInputError, match=r"^run: population_cache='.*below' is not allowed; .*a-file' is a file"):
        cached_population(
            "tiny", "train", 0, tmp_path / "a-file" / "below", workers=1, call="run", field="population_cache"
        )
