"""Shared fixtures of the study tests: one population cache and one finished tiny study per session.

The finished study is produced once, end to end, through the real command line
(`qhlab study run`); tests that mutate it work on copies (``study_copy``), and tests that need
an earlier stage copy it and delete the later steps' directories (receipts only bind what
came before them, so the remainder is exactly the earlier state).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "tiny-study.toml"
EXAMPLES = HERE.parents[1] / "examples"


def write_config(directory: Path, cache: Path, **replace: str) -> Path:
    """A copy of the tiny study config in ``directory`` using ``cache``; ``replace`` swaps whole
    ``key = value`` lines (top-level or table keys), e.g. ``{"[validation]": "..."}``."""
    text = TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tiny-study.toml"
    path.write_text(text)
    return path


def write_byo_config(directory: Path, cache: Path, *, files: dict[str, str] | None = None, **replace: str) -> Path:
    """``examples/byo-study.toml`` and its ``my_arms.py`` in ``directory``, using ``cache``;
    ``files`` are further files written beside them; ``replace`` swaps text as in ``write_config``."""
    text = (
        (EXAMPLES / "byo-study.toml")
        .read_text()
        .replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{cache}"')
    )
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "my_arms.py", directory / "my_arms.py")
    for name, content in (files or {}).items():
        (directory / name).write_text(content)
    path = directory / "byo-study.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def byo_writer():
    """``write_byo_config`` as a fixture."""
    return write_byo_config


@pytest.fixture(scope="session")
def config_writer():
    """``write_config`` as a fixture (test modules here are not a package)."""
    return write_config


@pytest.fixture(scope="session")
def population_cache(tmp_path_factory) -> Path:
    """A session population cache holding the tiny TRAIN (seed 7) and validation (seed 8) sets."""
    from qhlab.scenes import cached_population

    cache = tmp_path_factory.mktemp("population-cache")
    cached_population("tiny", "train", 7, cache, workers=1)
    cached_population("tiny", "validation", 8, cache, workers=1)
    return cache


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory, population_cache) -> Path:
    """The tiny study config, written once per session (its bytes are what a freeze binds)."""
    return write_config(tmp_path_factory.mktemp("config"), population_cache)


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory, tiny_config) -> dict:
    """The tiny study run end to end by `qhlab study run`; returns paths and the printed text."""
    from qhlab.cli import main

    output = tmp_path_factory.mktemp("finished") / "study"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["study", "run", str(tiny_config), "--output", str(output)])
    assert code == 0, buffer.getvalue()
    return {"config": tiny_config, "output": output, "stdout": buffer.getvalue()}


@pytest.fixture
def study_copy(tmp_path, finished_study):
    """``study_copy(*remove)``: a private copy of the finished study without the named parts."""

    def make(*remove: str) -> Path:
        target = tmp_path / f"study-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(finished_study["output"], target)
        for name in remove:
            shutil.rmtree(target / name)
        return target

    return make
