"""Shared fixtures of the reliability suite: tiny populations, recipes, study config, finished study.

Owns: the session-scoped tiny populations (TRAIN seed 7, validation seed 8), the reliability
recipe and study configs written against them, and the one finished tiny study shared by the
tampering and concurrency tests. Does not own: helpers (``_reliability_support.py``) or any
behaviour under test.

Costs are shared on purpose (CI runs this suite on 2 cores): populations are generated once
per session, and the finished study is the one the crash campaign drove to completion
(``test_reliability_crash.py``), or a fresh ``qhlab study run`` when that campaign could not
finish it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from _reliability_support import CHILD_ENV, REPO, STUDY_TEMPLATE, reliability_recipe, run_to_end

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def source_snapshot(tmp_path_factory) -> Path:
    """Child ``qhlab`` processes import a copy of the package taken at session start.

    Fits and studies bind the source-package digest and refuse to continue on other code; a
    snapshot keeps one session's subprocesses on one digest even while the working tree is
    edited. In CI the tree is static, so the snapshot is byte-identical to it.
    """
    root = tmp_path_factory.mktemp("source-snapshot")
    shutil.copytree(REPO / "src" / "qhlab", root / "qhlab", ignore=shutil.ignore_patterns("__pycache__"))
    CHILD_ENV["PYTHONPATH"] = str(root)
    return root


@pytest.fixture(scope="session")
def rel_populations(tmp_path_factory) -> dict:
    """Tiny TRAIN (seed 7) and validation (seed 8) populations in one session cache."""
    from qhlab.scenes import cached_population

    cache = tmp_path_factory.mktemp("rel-population-cache")
    train = cached_population("tiny", "train", 7, cache, workers=1)
    validation = cached_population("tiny", "validation", 8, cache, workers=1)
    return {"cache": cache, "train": train, "validation": validation}


@pytest.fixture(scope="session")
def recipe_writer(rel_populations) -> Callable[..., Path]:
    """``recipe_writer(directory, updates=40, text=None)``: the reliability recipe as a TOML file."""

    def write(directory: Path, *, updates: int = 40, name: str = "recipe.toml") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(
            reliability_recipe(
                updates=updates, train=rel_populations["train"], validation=rel_populations["validation"]
            )
        )
        return path

    return write


@pytest.fixture(scope="session")
def rel_recipe(tmp_path_factory, recipe_writer) -> Path:
    """A valid 40-update tiny recipe naming the session populations."""
    return recipe_writer(tmp_path_factory.mktemp("rel-recipe"))


@pytest.fixture(scope="session")
def study_config_writer(rel_populations) -> Callable[..., Path]:
    """``study_config_writer(directory, broad_updates=20)``: the reliability study config."""

    def write(directory: Path, *, broad_updates: int = 20) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "rel-study.toml"
        path.write_text(STUDY_TEMPLATE.format(broad_updates=broad_updates, cache=rel_populations["cache"]))
        return path

    return write


@pytest.fixture(scope="session")
def rel_study_config(tmp_path_factory, study_config_writer) -> Path:
    """The reliability study config, written once per session (its bytes are what freeze binds).

    120 broad updates keep a cell running for a second or more after its first segment
    checkpoint, so the crash campaign's kill points land inside the fit they aim at.
    """
    return study_config_writer(tmp_path_factory.mktemp("rel-study-config"), broad_updates=120)


@pytest.fixture(scope="session")
def crash_campaigns(tmp_path_factory, recipe_writer, rel_study_config) -> dict:
    """Both kill campaigns, run once per session (see ``_reliability_crash_campaigns``)."""
    from _reliability_crash_campaigns import run_campaigns

    return run_campaigns(tmp_path_factory.mktemp("crash"), recipe_writer, rel_study_config)


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory, rel_study_config, crash_campaigns) -> dict:
    """A finished, verified tiny study (a private copy). Reuses the crash campaign's study when
    it finished and verified; otherwise runs ``qhlab study run`` once."""
    from qhlab.evidence import verify_directory

    target = tmp_path_factory.mktemp("rel-finished") / "study"
    source = crash_campaigns["study"].root if crash_campaigns["study"].error is None else None
    if source is not None:
        shutil.copytree(source, target, symlinks=True)
        origin = "crash campaign"
    else:
        result = run_to_end(["study", "run", rel_study_config, "--output", target], log=target.parent / "study-run.log")
        assert result.returncode == 0, result.stderr[-3000:]
        origin = "fresh study run"
    verify_directory(target)
    return {"config": rel_study_config, "output": target, "origin": origin}
