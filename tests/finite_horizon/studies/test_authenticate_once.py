"""One `qhlab study run` authenticates its study once and hashes TRAIN's files in freeze only.

Counted, not timed: ``FrozenStudy`` constructions (one per authentication of the freeze, or the
freeze itself) and Python-level opens of the TRAIN population's files (``sha256_file`` reads
them with ``open``; pyarrow reads them through its own I/O and is not counted), seen through an
audit hook.
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys

import pytest

from qhlab.cli import main
from qhlab.finite_horizon.studies.architecture.authentication import FrozenStudy
from qhlab.scenes import cached_population
from qhlab.scenes.population import POPULATION_FILES

pytestmark = pytest.mark.slow

_WATCH: dict = {"prefix": None, "opens": collections.Counter()}


def _hook(event: str, args: tuple) -> None:
    prefix = _WATCH["prefix"]
    if prefix is not None and event == "open" and isinstance(args[0], str) and args[0].startswith(prefix):
        _WATCH["opens"][args[0][len(prefix):].lstrip("/")] += 1


sys.addaudithook(_hook)  # audit hooks cannot be removed; it counts only while a prefix is set


@contextlib.contextmanager
def _counting(train, monkeypatch):
    studies = []
    init = FrozenStudy.__init__

    def counted(self, *args, **kwargs):
        studies.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(FrozenStudy, "__init__", counted)
    _WATCH["opens"].clear()
    _WATCH["prefix"] = str(train)
    counts: dict = {}
    try:
        yield counts
    finally:
        _WATCH["prefix"] = None
        counts.update(studies=len(studies), opens=dict(_WATCH["opens"]))
        monkeypatch.setattr(FrozenStudy, "__init__", init)


def _run(config, output) -> None:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["study", "run", str(config), "--output", str(output)])
    assert code == 0, out.getvalue()


def test_study_run_authenticates_once(tmp_path, monkeypatch, population_cache, config_writer):
    train = cached_population("tiny", "train", 7, population_cache, workers=1)
    config = config_writer(tmp_path / "config", population_cache)
    output = tmp_path / "study"
    with _counting(train, monkeypatch) as fresh:
        _run(config, output)
    # Ten cells and two canaries are fitted, benchmarked and reported on one FrozenStudy: the
    # freeze builds it and no later step authenticates the freeze again.
    assert fresh["studies"] == 1
    # Each TRAIN data file is hashed 4 times, all in freeze: the cache lookup, the load, the
    # physics audit and the receipt's binding; no fit, benchmark or report re-reads it
    # (before: 52 times in this run, 2 per load, 25 loads).
    assert {name: fresh["opens"].get(name) for name in POPULATION_FILES} == {name: 4 for name in POPULATION_FILES}
    with _counting(train, monkeypatch) as complete:
        _run(config, output)
    # A finished study: one authentication, which re-hashes each TRAIN file once.
    assert complete["studies"] == 1
    assert {name: complete["opens"].get(name) for name in POPULATION_FILES} == {name: 1 for name in POPULATION_FILES}


def test_study_step_authenticates_once(tmp_path, monkeypatch, population_cache, config_writer, finished_study):
    """``qhlab study benchmark`` (a path-based step) over every cell: one authentication in all."""
    import shutil

    train = cached_population("tiny", "train", 7, population_cache, workers=1)
    output = tmp_path / "copy"
    shutil.copytree(finished_study["output"], output)
    shutil.rmtree(output / "benchmarks")
    shutil.rmtree(output / "report")
    with _counting(train, monkeypatch) as counts:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["study", "benchmark", str(finished_study["config"]), "--output", str(output)]) == 0
    assert counts["studies"] == 1
    # The authentication hashes TRAIN once; the ten benchmarks share one loaded Population,
    # which hashes it once more (before: 1 + 2 x 10).
    assert {name: counts["opens"].get(name) for name in POPULATION_FILES} == {name: 2 for name in POPULATION_FILES}
