"""Tests for ``qhlab profiles`` (qhlab.cli.profiles)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qhlab.cli import main
from qhlab.training.execution_profile import PROFILE_NAMES

HOST = (platform.system(), platform.machine())
QHLAB = Path(sys.executable).with_name("qhlab")


def _native_cpu_bf16() -> bool:
    """The kernel's CPU flags (not torch) say whether this CPU computes bf16 natively."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16", "amx_tile"))


def _expected_lines() -> list[str]:
    """What this host must print, derived from the host itself rather than from the code."""
    host = f"{HOST[0]} {HOST[1]}"
    lines = []
    for name, system, machine, device in (
        ("cuda-amp", "Linux", "x86_64", "cuda"),
        ("mps-fp32", "Darwin", "arm64", "mps"),
        ("cpu-fp32", "Linux", "x86_64", None),
        ("cpu-bf16", "Linux", "x86_64", "bf16"),
        ("cpu-fp32-darwin-arm64", "Darwin", "arm64", None),
    ):
        needs = (
            f"{system} {machine}"
            + {
                "cuda": " with a CUDA device",
                "mps": " with an MPS device",
                None: "",
                "bf16": " with native CPU bf16 (AVX512-BF16 or AMX)",
            }[device]
        )
        available = {
            "cuda": torch.cuda.is_available(),
            "mps": torch.backends.mps.is_available(),
            None: True,
            "bf16": _native_cpu_bf16(),
        }[device]
        if HOST != (system, machine):
            lines.append(f"{name}: refused: needs {needs}; this host is {host}")
        elif device == "bf16" and not available:
            lines.append(
                f"{name}: refused: needs {needs}; this host has CPU capability "
                f"{torch.backends.cpu.get_cpu_capability()} without AVX512-BF16 or AMX"
            )
        elif not available:
            lines.append(f"{name}: refused: needs {needs}; this host has no {device.upper()} device")
        else:
            lines.append(f"{name}: admitted")
    return lines


def test_profiles_prints_every_lane_and_exits_zero(capsys, monkeypatch) -> None:
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    assert main(["profiles"]) == 0
    assert capsys.readouterr().out.splitlines() == _expected_lines()


@pytest.mark.skipif(
    HOST != ("Linux", "x86_64") or torch.cuda.is_available(), reason="wording for a CPU-only Linux host"
)
def test_profiles_wording_on_a_cpu_only_linux_host(capsys) -> None:
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "cpu-fp32: admitted\n" in out
    assert "cuda-amp: refused: needs Linux x86_64 with a CUDA device; this host has no CUDA device\n" in out


def test_profiles_json_carries_evidence_and_refusals(capsys) -> None:
    assert main(["profiles", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["profile"] for row in rows] == list(PROFILE_NAMES)
    for row, line in zip(rows, _expected_lines()):
        assert row["admitted"] is line.endswith(": admitted")
        if row["admitted"]:
            assert row["evidence"]["profile"] == row["profile"]
            assert row["evidence"]["execution_policy_source"]["owner"] == "src/qhlab/training/profiles.py"
        else:
            assert line.endswith(f"needs {row['needs']}; this host {row['actual']}")


@pytest.mark.skipif(not QHLAB.exists(), reason="console script not installed in this environment")
def test_profiles_console_script_subprocess() -> None:
    result = subprocess.run([str(QHLAB), "profiles"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == _expected_lines()
    assert result.stderr == ""
