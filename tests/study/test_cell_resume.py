"""A killed cell resumes from its last segment checkpoint, to the same final state.

A kill after a checkpoint leaves an attempt with its cold initialization and checkpoints but
no fit receipt and no final state. The next ``study run`` continues that segment (as ``qhlab fit
--resume`` does) instead of training from update 0, and the final state is byte-identical to
the uninterrupted fit's.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from qhlab.cli import main

pytestmark = pytest.mark.slow


def test_a_killed_cell_resumes_from_its_last_checkpoint(tmp_path, finished_study) -> None:
    study = tmp_path / "study"
    shutil.copytree(finished_study["output"], study)
    for name in ("report", "benchmarks", "wandb-report"):
        shutil.rmtree(study / name)
    cell = study / "cells" / "baseline-s0"
    original = json.loads((cell / "cell.receipt.json").read_text())["body"]
    (attempt,) = [p for p in cell.iterdir() if p.is_dir()]
    checkpoints = sorted(attempt.glob("segment_checkpoint_u*.receipt.json"))
    assert len(checkpoints) >= 2
    # What a SIGKILL after the second-to-last checkpoint leaves behind.
    for path in [
        cell / "cell.receipt.json",
        *attempt.glob("final_state.*"),
        attempt / "fit.receipt.json",
        attempt / "evaluation.receipt.json",
        attempt / "wandb_attempt.receipt.json",
        *attempt.glob(checkpoints[-1].name.removesuffix(".receipt.json") + ".*"),
    ]:
        path.unlink()
    last = int(checkpoints[-2].name.removeprefix("segment_checkpoint_u").removesuffix(".receipt.json"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["study", "run", str(finished_study["config"]), "--output", str(study)]) == 0
    resumed = json.loads((cell / "cell.receipt.json").read_text())["body"]
    assert resumed["previous_attempts"] == [attempt.name] and resumed["attempt"] != attempt.name
    fit = json.loads((cell / resumed["attempt"] / "fit.receipt.json").read_text())["body"]
    assert fit["lineage"]["kind"] == "resumed" and fit["lineage"]["previous_local_attempt_id"] == attempt.name
    assert fit["segment_start_updates"] == last
    assert resumed["final_state_sha256"] == original["final_state_sha256"]
    assert resumed["evaluation"]["scene_mae"] == original["evaluation"]["scene_mae"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["verify", str(study)]) == 0


def test_an_interrupted_cell_names_the_study_command_not_fits_resume_option(
    study_copy, finished_study, monkeypatch, capsys
) -> None:
    from qhlab.evidence.layout import BENCHMARK_DIR, REPORT_DIR
    from qhlab.finite_horizon import fit
    from qhlab.training.launcher import FitInterrupted

    study = study_copy(REPORT_DIR, BENCHMARK_DIR, "cells/variant_deep-s1")
    segment = study / "cells" / "variant_deep-s1" / "variant_deep-s1-attempt"

    def interrupted(request):
        # What the launcher raises when Ctrl-C stops a fit at a checkpoint.
        message = f"fit interrupted at 5 observed updates. HINT: continue with --resume {segment.name}."
        raise FitInterrupted(message, segment, 5)

    monkeypatch.setattr(fit, "fit_recipe", interrupted)
    argv = ["study", "run-fit", str(finished_study["config"]), "--output", str(study)]
    assert main([*argv, "--variant", "variant_deep", "--seed", "1"]) == 130
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"error: cell variant_deep-s1: fit interrupted at 5 observed updates; segment checkpoint written in {segment}. "
        "HINT: run the same `qhlab study` command again: the cell continues from this checkpoint."
    )
