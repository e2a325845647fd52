"""The GPU lane checked in one call, tested here up to the point that needs CUDA.

``scripts/prepare-device-wheels`` refuses bad options, unpinned names and an over-budget folder
(exit 2, one ``error:`` line, nothing written). The slow test prepares the cp311 wheels, builds a
bare venv that holds only the offline node's packages (torch, Lightning, numpy, scipy, pyarrow,
safetensors, matplotlib, rich; no qhlab, pymunk, pydantic or wandb) and runs
``scripts/device-check --dry-run`` with it: the wheels install into the target folder, qhlab
imports from this checkout's ``src``, a cpu-fp32 fit runs from there and the JSON summary
records what ran.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PREPARE = ROOT / "scripts" / "prepare-device-wheels"
CHECK = ROOT / "scripts" / "device-check"
# The offline node's own packages: the venv holds these and what pip installs with them.
NODE_PACKAGES = ("torch==2.13.0", "lightning", "numpy", "scipy", "pyarrow", "safetensors", "matplotlib", "rich")
CUDA_STEPS = ("commission", "cuda-tests", "study-cuda-amp", "study-cpu-fp32", "compare-lanes")


def _clean_env() -> dict:
    """The environment without this test run's venv and import path (the node has neither)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
    return env


def _prepare(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PREPARE), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.parametrize(
    ("args", "named", "allowed"),
    [
        (["--python-version", "3.9"], "--python-version='3.9' is not allowed", "allowed: 3.11, 3.12, 3.13"),
        (["--python-version", "312"], "--python-version='312' is not allowed", "allowed: 3.11, 3.12, 3.13"),
        (["--budget-mib", "61"], "--budget-mib='61' is not allowed", "allowed: a number of MiB > 0 and <= 60"),
        (["--budget-mib", "0"], "--budget-mib='0' is not allowed", "allowed: a number of MiB > 0 and <= 60"),
        (["--budget-mib", "nan"], "--budget-mib='nan' is not allowed", "allowed: a number of MiB > 0 and <= 60"),
    ],
)
def test_prepare_refuses_a_bad_option_and_writes_nothing(tmp_path, args, named, allowed):
    result = _prepare("--output", tmp_path / "wheels", *args)
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1 and len(result.stderr.strip().splitlines()) == 1
    assert named in result.stderr and allowed in result.stderr
    assert result.stdout == ""  # nothing downloaded
    assert list(tmp_path.iterdir()) == []


def test_prepare_refuses_a_wheel_without_a_pin_and_a_foreign_folder(tmp_path):
    pins = tmp_path / "constraints.txt"
    pins.write_text(
        "".join(
            line + "\n"
            for line in (ROOT / "constraints.txt").read_text().splitlines()
            if not line.lower().startswith("pymunk==")
        )
    )
    result = _prepare("--output", tmp_path / "wheels", "--constraints", pins)
    assert result.returncode == 2 and result.stderr.count("error:") == 1
    assert "wheel='pymunk' is not allowed; allowed: a name pinned in constraints.txt" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["constraints.txt"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a wheel")
    result = _prepare("--output", foreign)
    assert result.returncode == 2 and "--output=" in result.stderr and "MANIFEST.json" in result.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_device_check_without_wheels_records_the_failure_and_skips_what_needs_them(tmp_path):
    work = tmp_path / "work"
    result = subprocess.run(
        [sys.executable, str(CHECK), "--dry-run", "--wheels", tmp_path / "none", "--work", work],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((work / "device-check.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert summary["ok"] is False and "install" in summary["failed"]
    assert steps["install"]["status"] == "failed" and "MANIFEST.json" in steps["install"]["error"]
    assert steps["import"]["status"] == "skipped" and "needs install" in steps["import"]["reason"]
    assert steps["fit"]["status"] == "skipped"
    assert all(steps[name]["reason"] == "dry run: needs a CUDA device" for name in CUDA_STEPS)
    assert f"summary {work / 'device-check.json'}" in result.stdout


@pytest.mark.parametrize("args", [["--budget-seconds", "5"], ["--memory-ceiling-bytes", "10"]])
def test_device_check_refuses_bad_options(tmp_path, args):
    result = subprocess.run(
        [sys.executable, str(CHECK), "--work", tmp_path / "work", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2 and f"{args[0]}={args[1]} is not allowed" in result.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_dry_run_in_a_bare_venv_of_the_node_packages(tmp_path):
    python311 = shutil.which("python3.11", path=_clean_env()["PATH"])
    if python311 is None:
        pytest.skip("needs python3.11 (the Makefile's Python) to build the bare venv")
    wheels = tmp_path / "wheels"
    prepared = _prepare("--python-version", "3.11", "--output", wheels)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    manifest = json.loads((wheels / "MANIFEST.json").read_text())
    assert manifest["python_tag"] == "cp311" and manifest["total_bytes"] <= 60 * 2**20
    assert sorted(p.name for p in wheels.glob("*.whl")) == sorted(w["file"] for w in manifest["wheels"])
    names = {w["name"] for w in manifest["wheels"]}
    assert {"pymunk", "pydantic", "wandb", "pytest"} <= names and not names & {"torch", "ray", "model-signing"}

    # Over budget, from the folder just prepared (no index): refused, nothing written, the folder kept.
    again = _prepare(
        "--python-version",
        "3.11",
        "--output",
        tmp_path / "small",
        "--budget-mib",
        "1",
        "--no-index",
        "--find-links",
        wheels,
    )
    assert again.returncode == 2 and again.stderr.count("error:") == 1
    assert "--budget-mib='1' is not allowed; allowed: a number of MiB >=" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]

    node = tmp_path / "node"
    env = _clean_env()
    subprocess.run([python311, "-m", "venv", node], check=True, env=env, timeout=300)
    python = node / "bin" / "python"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            "-c",
            ROOT / "constraints.txt",
            *NODE_PACKAGES,
        ],
        check=True,
        env=env,
        timeout=900,
    )
    probe = "import importlib.util as u; print([m for m in ('qhlab', 'pymunk', 'pydantic', 'wandb') if u.find_spec(m)])"
    assert (
        subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
        ).stdout.strip()
        == "[]"
    )

    work = tmp_path / "work"
    result = subprocess.run(
        [python, CHECK, "--dry-run", "--wheels", wheels, "--work", work],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((work / "device-check.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert summary["schema"] == "qhlab-device-check/1" and summary["mode"] == "dry-run" and summary["ok"] is True
    assert summary["python"] == str(python)
    for step in summary["steps"]:
        assert step["status"] in ("passed", "skipped"), step
        if isinstance(step.get("command"), list):
            assert {"timeout_s", "exit_code", "seconds", "log"} <= set(step) and 0 < step["timeout_s"] <= 450

    # The wheels went into the target folder, only those the node lacks.
    site = work / "site"
    installed = {w["name"] for w in summary["wheels"]["install"]}
    assert {"pymunk", "cffi", "pydantic", "pydantic_core", "wandb", "protobuf", "pytest"} <= installed
    assert "typing_extensions" not in installed  # the venv's (torch's) 4.16 satisfies pydantic
    assert summary["wheels"]["unmet_requirements"] == []
    assert len(list(site.glob("*.dist-info"))) == len(installed) == steps["install"]["key"]["installed"]
    assert not list((node / "lib").glob("python3.11/site-packages/pymunk*"))  # nothing into the node's Python

    # qhlab from src, the wheels' packages from the target folder; ray and model_signing stay unimported.
    imported = steps["import"]["key"]
    assert Path(imported["qhlab_file"]) == (ROOT / "src" / "qhlab" / "__init__.py").resolve()
    for module in ("pymunk", "pydantic", "wandb"):
        assert Path(imported["modules"][module]).is_relative_to(site.resolve())
    assert Path(imported["modules"]["torch"]).is_relative_to(node.resolve())
    assert imported["lazy_imported"] == []
    assert steps["profiles"]["key"]["lanes"]["cpu-fp32"] == "admitted"

    # The CPU fit ran from there: its receipt exists and its numbers are in the summary.
    fit = steps["fit"]["key"]
    receipt = Path(fit["fit_receipt"])
    assert receipt.is_file() and receipt.is_relative_to(work)
    assert fit["profile"] == "cpu-fp32" and fit["observed_updates"] == fit["update_budget"] == 40
    assert all(math.isfinite(fit["metrics"][k]) for k in ("val_mae_h1", "val_mae_h2", "val_regret_h2"))
    assert fit["lazy_imported"] == []
    assert all(steps[name]["status"] == "skipped" for name in CUDA_STEPS)

    # The versions that ran: the node's, recorded by the summary and by the fit receipt.
    assert summary["node"]["torch"] == summary["ran_versions"]["torch"] and summary["node"]["cuda_available"] is False
    assert summary["ran_versions"]["pymunk"] == "7.3.1" and summary["ran_versions"]["python"].startswith("3.11")
    assert json.loads(receipt.read_text())["body"]["runtime"]["versions"] == fit["runtime_versions"]
    assert fit["runtime_versions"] == {k: summary["ran_versions"][k] for k in ("python", "torch", "lightning")}
    assert isinstance(summary["versions_differing_from_constraints"], dict)
    assert steps["receipts"]["status"] == "passed"
    assert steps["receipts"]["key"]["recorded"]["fit"] == fit["runtime_versions"]
