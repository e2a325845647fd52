"""The cpu-bf16 lane: Lightning bf16-mixed on the CPU, float32 state.

Admitted only where the CPU computes bf16 natively (AVX512-BF16 or AMX, as torch reports it);
elsewhere refused naming the capability found. The lane's fit, commissioning and study tests
need such a CPU and skip with a reason on any other; the refusal and the autocast context are
tested everywhere (torch computes bf16 on any x86 CPU, only slowly).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qhlab.cli import main
from qhlab.evidence import read_receipt
from qhlab.training.execution_profile import ProfileRefusedError, execution_profile
from qhlab.training.records import FitReceipt

NATIVE = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
needs_native_bf16 = pytest.mark.skipif(
    not NATIVE, reason=f"needs a CPU with AVX512-BF16 or AMX; this one has {torch.backends.cpu.get_cpu_capability()}"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(NATIVE, reason="this CPU computes bf16 natively, so cpu-bf16 is admitted here")
def test_cpu_bf16_is_refused_without_native_bf16_naming_the_capability() -> None:
    with pytest.raises(ProfileRefusedError) as info:
        execution_profile("cpu-bf16").admit_runtime()
    capability = torch.backends.cpu.get_cpu_capability()
    assert info.value.needs == "Linux x86_64 with native CPU bf16 (AVX512-BF16 or AMX)"
    assert info.value.actual == f"has CPU capability {capability} without AVX512-BF16 or AMX"
    assert "HINT: use cpu-fp32 here" in str(info.value)


def test_cpu_bf16_autocast_is_the_cpu_bf16_autocast_over_float32_weights() -> None:
    ctx = execution_profile("cpu-bf16").autocast_context()
    assert isinstance(ctx, torch.autocast) and (ctx.device, ctx.fast_dtype) == ("cpu", torch.bfloat16)
    layer = torch.nn.Linear(4, 3)
    with execution_profile("cpu-bf16").autocast_context():
        out = layer(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32


def test_a_bf16_recipe_is_refused_on_other_lanes_by_construction() -> None:
    from qhlab.training.execution_profile import QhExecutionProfile

    with pytest.raises(Exception, match=r"precision='bf16-mixed' is not allowed"):
        QhExecutionProfile("x", "cuda", "cuda", "bf16-mixed", "Linux", "x86_64")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    from qhlab.scenes import generate_population

    root = tmp_path_factory.mktemp("bf16-pops")
    return {
        "train": generate_population("tiny", "train", 0, root / "train", workers=1),
        "validation": generate_population("tiny", "validation", 1, root / "validation", workers=1),
    }


def _fit(tiny, out: Path, profile: str):
    from qhlab.design.config_files import load_recipe
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    return fit_recipe(
        FitRequest(
            recipe=load_recipe(ROOT / "examples" / "tiny-recipe.toml"),
            profile=profile,
            output=out,
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )


@needs_native_bf16
def test_a_cpu_bf16_fit_is_deterministic_differs_from_fp32_and_records_its_precision(tmp_path, tiny) -> None:
    first, second = _fit(tiny, tmp_path / "a", "cpu-bf16"), _fit(tiny, tmp_path / "b", "cpu-bf16")
    fp32 = _fit(tiny, tmp_path / "c", "cpu-fp32")
    assert first.final_state_sha256 == second.final_state_sha256 and first.metrics == second.metrics
    assert first.final_state_sha256 != fp32.final_state_sha256  # the lanes are not secretly the same
    assert first.observed_updates == fp32.observed_updates  # no scaler: no update is skipped
    fit = read_receipt(first.fit_receipt, FitReceipt).body_record()
    assert fit["recipe"]["precision"] == "bf16-mixed" and fit["profile"] == "cpu-bf16"
    device = fit["runtime"]["device"]
    assert device["autocast_dtype"] == "bfloat16" and device["grad_scaler"].startswith("none")
    assert device["avx512_bf16"] or device["amx_tile"]
    assert device["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert main(["verify", str(first.output_directory)]) == 0


@needs_native_bf16
def test_cpu_bf16_commissions(tmp_path, tiny, capsys) -> None:
    code = main(
        [
            "commission",
            str(ROOT / "examples" / "tiny-recipe.toml"),
            "--profile",
            "cpu-bf16",
            "--output",
            str(tmp_path / "commission"),
            "--train",
            str(tiny["train"]),
            "--milestones",
            "1,4",
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr()
    assert main(["verify", str(tmp_path / "commission")]) == 0
