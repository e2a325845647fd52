"""What a researcher sees: W&B runs read back from wandb's own files, and a quiet console."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qhlab.design.study_records import StudyCellReceipt
from qhlab.report.render import FIGURES
from wandb_records import read_offline_run

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("GPU available", "Tip", "litlogger", "wandb: WARNING", "DeprecationWarning", "_pytree", "Epoch 0/")


def _run_file(attempt: Path) -> Path:
    (found,) = sorted(attempt.glob("wandb/offline-run-*/run-*.wandb"))
    return found


@pytest.mark.slow
def test_a_cells_offline_wandb_run_carries_config_group_job_type_tags_and_summary(finished_study):
    from qhlab.evidence import read_receipt

    output = finished_study["output"]
    cell = read_receipt(output / "cells" / "variant_deep-s1" / "cell.receipt.json", StudyCellReceipt).body_record()
    attempt = output / "cells" / "variant_deep-s1" / cell["attempt"]
    run = read_offline_run(_run_file(attempt))
    assert run["group"] == "tiny-study" and run["job_type"] == "cell"
    assert run["tags"] == ["variant_deep", "seed-1", "cpu-fp32"]
    recipe = run["config"]["recipe"]
    assert recipe["architecture"]["arm"] == "variant_deep" and recipe["seed"] == 1
    assert recipe["updates"] == 30 and recipe["optimizer"]["lr"] == 3e-3 and recipe["precision"] == "32-true"
    assert run["config"]["recipe_digest"] == cell["fit_recipe_digest"]
    assert run["config"]["lane"]["name"] == "cpu-fp32"
    assert set(run["config"]["populations"]) == {"train", "validation"}
    assert run["config"]["qhlab"]["source_package_sha256"]
    summary = run["summary"]
    assert summary["final_state_sha256"] == cell["final_state_sha256"]
    assert summary["observed_updates"] == 30
    for h, (mae, regret) in enumerate(zip(cell["evaluation"]["mae"], cell["evaluation"]["regret"]), start=1):
        assert summary[f"val_mae_h{h}"] == pytest.approx(mae) and summary[f"val_regret_h{h}"] == pytest.approx(regret)
    canary = read_receipt(output / "canaries" / "e0-baseline-s0" / "cell.receipt.json", StudyCellReceipt).body_record()
    canary_run = read_offline_run(_run_file(output / "canaries" / "e0-baseline-s0" / canary["attempt"]))
    assert canary_run["group"] == "tiny-study" and canary_run["job_type"] == "canary"


@pytest.mark.slow
def test_a_tiny_study_gives_one_report_run_with_tables_and_images(finished_study):
    output = finished_study["output"]
    (run_dir,) = sorted((output / "wandb-report").iterdir())
    (run_file,) = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    run = read_offline_run(run_file)
    assert run["job_type"] == "report" and run["group"] == "tiny-study"
    assert run["summary"]["headline"].startswith("The learned baseline")
    for table in ("cells", "references", "paired", "retention", "family"):
        assert run["summary"][f"report/{table}._type"] == "table-file"
    for image in ("arms", "paired_differences", "learning_curves", "regret_profile"):
        assert run["summary"][f"report/{image}._type"] == "image-file"
    media = run_file.parent / "files" / "media"
    assert len(list(media.glob("images/report/*.png"))) == len(FIGURES) == 4
    (cells_file,) = sorted(media.glob("table/report/cells_*.table.json"))
    table = json.loads(cells_file.read_text())
    report = json.loads((output / "report" / "report.json").read_text())
    assert len(table["data"]) == len(report["cells"]) == 10
    first = dict(zip(table["columns"], table["data"][0]))
    assert (first["arm"], first["seed"]) == (report["cells"][0]["arm"], report["cells"][0]["seed"])
    assert first["regret_2"] == report["cells"][0]["regret"][1]


def _tiny_study_console(tmp_path: Path, population_cache: Path, config_writer, *extra: str) -> str:
    config = config_writer(tmp_path / "cfg", population_cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = subprocess.run(
        [sys.executable, "-m", "qhlab.cli", "study", "run", str(config), "--output", str(tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.slow
def test_study_run_console_is_quiet_by_default_and_verbose_restores_it(tmp_path, population_cache, config_writer):
    quiet = _tiny_study_console(tmp_path / "quiet", population_cache, config_writer)
    assert not [noise for noise in NOISE if noise in quiet], quiet
    assert "1/6 freeze" in quiet and "cell baseline-s0: MAE_H" in quiet and "Report:" in quiet
    loud = _tiny_study_console(tmp_path / "loud", population_cache, config_writer, "--verbose")
    for noise in ("GPU available", "Tip", "litlogger", "_pytree", "Epoch 0/"):
        assert noise in loud, noise
    # The fit's own log keeps Lightning's lines whatever the console showed.
    logs = sorted((tmp_path / "quiet" / "out" / "canaries").glob("*/*/fit.log"))
    assert logs and "GPU available" in logs[0].read_text()
