"""A fit job is one value that crosses processes: it pickles, and unpickling it imports no torch."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from qhlab.design.config_files import load_recipe
from qhlab.finite_horizon.fit_job import FitJob

ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path) -> FitJob:
    return FitJob(
        recipe=load_recipe(ROOT / "examples" / "tiny-recipe.toml"),
        profile="cpu-fp32",
        output=str(tmp_path / "fits"),
        cell="c-s0",
        train=str(tmp_path / "train"),
        validation=None,
        torch_threads=2,
        job_type="canary",
        group="g",
        tags=("t",),
        train_rows=(3,),
    )


def test_a_fit_job_unpickles_in_a_fresh_process_without_torch(tmp_path):
    job = _job(tmp_path)
    data = pickle.dumps(job)
    # What a pool or Ray worker does with its task argument, before anything imports torch.
    code = (
        "import pickle, sys; job = pickle.loads(sys.stdin.buffer.read()); "
        "print(job.cell, job.recipe.seed, job.torch_threads, "
        "sorted(m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True).stdout
    assert out.decode().split() == ["c-s0", str(job.recipe.seed), "2", "[]"]
    assert pickle.loads(data) == job


def test_the_jobs_request_carries_the_job_and_what_exists_where_it_runs(tmp_path):
    job = _job(tmp_path)
    request = job.request(progress=False, resume="earlier")
    assert request.recipe == job.recipe and request.profile == "cpu-fp32" and request.cell == "c-s0"
    assert request.output == tmp_path / "fits" and request.train == str(tmp_path / "train")
    # No validation population: a canary, not evaluated; its rows and thread count travel with it.
    assert request.evaluate is False and request.train_rows == [3] and request.torch_threads == 2
    assert (request.job_type, request.group, tuple(request.tags)) == ("canary", "g", ("t",))
    assert request.progress is False and request.resume == "earlier"
    # A study's cell authenticates what it adopts; a preparation fit's job names what it must bind.
    assert job.binds() is None
