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
from qhlab.evidence.layout import POPULATION_FILES
from qhlab.scenes import cached_population
from qhlab.study.authentication import FrozenStudy

pytestmark = pytest.mark.slow

_WATCH: dict = {"prefix": None, "opens": collections.Counter()}


def _hook(event: str, args: tuple) -> None:
    prefix = _WATCH["prefix"]
    if prefix is not None and event == "open" and isinstance(args[0], str) and args[0].startswith(prefix):
        _WATCH["opens"][args[0][len(prefix) :].lstrip("/")] += 1


sys.addaudithook(_hook)  # audit hooks cannot be removed; it counts only while a prefix is set


@contextlib.contextmanager
def _counting(root, monkeypatch):
    studies = []
    init = FrozenStudy.__init__

    def counted(self, *args, **kwargs):
        studies.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(FrozenStudy, "__init__", counted)
    _WATCH["opens"].clear()
    _WATCH["prefix"] = str(root)
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


def _hashes(counts: dict, population) -> dict:
    return {name: counts["opens"].get(f"{population.name}/{name}") for name in POPULATION_FILES}


def test_study_run_authenticates_once(tmp_path, monkeypatch, population_cache, config_writer):
    train = cached_population("tiny", "train", 7, population_cache, workers=1)
    validation = cached_population("tiny", "validation", 8, population_cache, workers=1)
    assert train.parent == validation.parent == population_cache
    config = config_writer(tmp_path / "config", population_cache)
    output = tmp_path / "study"
    with _counting(population_cache, monkeypatch) as fresh:
        _run(config, output)
    # Ten cells and two canaries are fitted, benchmarked and reported on one FrozenStudy: the
    # freeze builds it and no later step authenticates the freeze again.
    assert fresh["studies"] == 1
    # Each TRAIN data file is hashed 4 times, all in freeze: the cache lookup, the load, the
    # physics audit and the receipt's binding; no fit, benchmark or report re-reads it
    # (before: 52 times in this run, 2 per load, 25 loads). Validation alike, in development.
    assert _hashes(fresh, train) == {name: 4 for name in POPULATION_FILES}
    assert _hashes(fresh, validation) == {name: 4 for name in POPULATION_FILES}
    with _counting(population_cache, monkeypatch) as complete:
        _run(config, output)
    # A finished study: one authentication, which re-hashes each TRAIN file once (and
    # validation once, through the development receipt).
    assert complete["studies"] == 1
    assert _hashes(complete, train) == {name: 1 for name in POPULATION_FILES}
    assert _hashes(complete, validation) == {name: 1 for name in POPULATION_FILES}


def test_study_step_authenticates_once(tmp_path, monkeypatch, population_cache, config_writer, finished_study):
    """``qhlab study benchmark`` (a path-based step) over every cell: one authentication in all."""
    import shutil

    train = cached_population("tiny", "train", 7, population_cache, workers=1)
    output = tmp_path / "copy"
    shutil.copytree(finished_study["output"], output)
    shutil.rmtree(output / "benchmarks")
    shutil.rmtree(output / "report")
    with _counting(population_cache, monkeypatch) as counts:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["study", "benchmark", str(finished_study["config"]), "--output", str(output)]) == 0
    assert counts["studies"] == 1
    # The authentication hashes TRAIN once; the ten benchmarks share one loaded Population,
    # which hashes it once more (before: 1 + 2 x 10).
    assert _hashes(counts, train) == {name: 2 for name in POPULATION_FILES}


def _without_cells(finished_study, target, *cells):
    import shutil

    shutil.copytree(finished_study["output"], target)
    for name in ("report", "benchmarks", *(f"cells/{c}" for c in cells)):
        shutil.rmtree(target / name)
    return target


def test_pool_worker_authenticates_once_per_process(tmp_path, monkeypatch, population_cache, finished_study):
    """``qhlab study run``'s pool entry, called twice in one process: one authentication."""
    from qhlab.execution import jobs
    from qhlab.study.run import cell_job

    output = _without_cells(finished_study, tmp_path / "copy", "variant_deep-s0", "variant_deep-s1")
    monkeypatch.setattr(jobs, "_MEMO", {})
    with _counting(population_cache, monkeypatch) as counts:
        first = cell_job(str(finished_study["config"]), str(output), (), "variant_deep", 0)
        second = cell_job(str(finished_study["config"]), str(output), (), "variant_deep", 1)
    assert (first["cell"], second["cell"]) == ("variant_deep-s0", "variant_deep-s1")
    assert counts["studies"] == 1
    assert (output / "cells" / "variant_deep-s1" / "cell.receipt.json").is_file()


def test_kept_receipt_replaced_mid_run_is_refused(tmp_path, finished_study):
    """A receipt authenticated once and kept is re-hashed at each use: replacing it between two
    cells of one process is refused, so no later receipt binds bytes this process never checked."""
    import json

    from qhlab.evidence import EvidenceError
    from qhlab.study.authentication import authenticate_development
    from qhlab.study.cells import fit_cell
    from qhlab.study.study import Study

    output = _without_cells(finished_study, tmp_path / "copy", "variant_deep-s1")
    with Study.open(finished_study["config"], output).authenticated("run_fit") as frozen:
        authenticate_development(frozen, "run_fit")
        path = output / "development.receipt.json"
        path.write_text(json.dumps(json.loads(path.read_text()), indent=1))  # same content, other bytes
        with pytest.raises(EvidenceError, match="changed after it was authenticated in this process"):
            fit_cell(frozen, variant="variant_deep", seed=1, progress=False)
    assert not (output / "cells" / "variant_deep-s1").exists()
