"""Tests for qhlab.training.execution_profile: profiles, W&B attempts, device checks.

Seed names are imported from the seed path; ``qhlab.training.profiles`` is named only where
the test is about which module the policy digest covers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import math
import platform
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from qhlab.evidence import (
    LockHeldError,
    MissingEvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    canonical_json,
    read_receipt,
    sha256_file,
)
from qhlab.training import device_checks, lineage, profiles, tensor_state, wandb_attempt
from qhlab.training import execution_profile as ep_module
from qhlab.training.device_checks import device_check_record
from qhlab.training.execution_profile import (
    PROFILE_NAMES,
    ProfileRefusedError,
    QhExecutionProfile,
    WandbAttempt,
    assert_device_tensors,
    captured_fallback_operations,
    execution_policy_source,
    execution_profile,
    publish_wandb_attempt,
    verified_cold_initialization_lineage,
)
from qhlab.training.records import WandbAttemptReceipt

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = (platform.system(), platform.machine())
P = inspect.Parameter
E = inspect.Parameter.empty
PK, KO = P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY

# -- seed signatures --------------------------------------------------------------------------

_PROFILE = QhExecutionProfile("sig", "cpu", "cpu", "32-true", "Linux", "x86_64")
_ATTEMPT = WandbAttempt("sig")
SEED_SIGNATURES = {
    "QhExecutionProfile": (
        QhExecutionProfile,
        [
            ("name", PK, E),
            ("accelerator", PK, E),
            ("device_type", PK, E),
            ("precision", PK, E),
            ("expected_system", PK, E),
            ("expected_machine", PK, E),
            ("allowed_cpu_fallback_operations", PK, ()),
        ],
    ),
    "QhExecutionProfile.apply": (_PROFILE.apply, [("config", PK, E)]),
    "QhExecutionProfile.admit_runtime": (_PROFILE.admit_runtime, []),
    "QhExecutionProfile.autocast_context": (_PROFILE.autocast_context, []),
    "QhExecutionProfile.prepare_memory_accounting": (
        _PROFILE.prepare_memory_accounting,
        [("max_allocated_bytes", PK, E)],
    ),
    "QhExecutionProfile.memory_evidence": (_PROFILE.memory_evidence, []),
    "WandbAttempt": (
        WandbAttempt,
        [
            ("run_id", PK, E),
            ("resume", PK, False),
            ("offline", PK, False),
            ("logical_run_id", PK, None),
            ("local_attempt_id", PK, None),
        ],
    ),
    "WandbAttempt.apply": (_ATTEMPT.apply, [("config", PK, E)]),
    "WandbAttempt.evidence": (_ATTEMPT.evidence, []),
    "WandbAttempt.output_directory": (_ATTEMPT.output_directory, [("output_root", PK, E), ("cell", PK, E)]),
    "WandbAttempt.local_writer_lock": (_ATTEMPT.local_writer_lock, [("output_root", PK, E)]),
    "assert_device_tensors": (assert_device_tensors, [("module", PK, E), ("device_type", PK, E), ("gradients", KO, E)]),
    "captured_fallback_operations": (captured_fallback_operations, []),
    "execution_policy_source": (execution_policy_source, [("source_root", PK, None)]),
    "execution_profile": (execution_profile, [("name", PK, E)]),
    "publish_wandb_attempt": (
        publish_wandb_attempt,
        [("attempt", PK, E), ("result_path", PK, E), ("files", PK, E), ("metrics", PK, E)],
    ),
    "verified_cold_initialization_lineage": (
        verified_cold_initialization_lineage,
        [("path", PK, E), ("source_package_digest", KO, E), ("seed", KO, E)],
    ),
}


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_signature_matches_seed(name: str) -> None:
    target, expected = SEED_SIGNATURES[name]
    actual = [(p.name, p.kind, p.default) for p in inspect.signature(target).parameters.values()]
    assert actual == expected


@pytest.mark.parametrize("name", sorted(n for n in SEED_SIGNATURES if "." in n or n[0].islower()))
def test_seed_functions_and_methods_are_fully_annotated(name: str) -> None:
    signature = inspect.signature(SEED_SIGNATURES[name][0])
    missing = [p.name for p in signature.parameters.values() if p.annotation is E]
    assert missing == [], f"{name}: parameters without a type hint: {missing}"
    assert signature.return_annotation is not inspect.Signature.empty, f"{name}: no return type hint"


def test_seed_classes_are_frozen_dataclasses_and_property_exists() -> None:
    assert dataclasses.is_dataclass(QhExecutionProfile) and QhExecutionProfile.__dataclass_params__.frozen
    assert dataclasses.is_dataclass(WandbAttempt) and WandbAttempt.__dataclass_params__.frozen
    assert isinstance(inspect.getattr_static(WandbAttempt, "resolved_local_attempt_id"), property)
    with pytest.raises(dataclasses.FrozenInstanceError):
        _PROFILE.precision = "16-mixed"  # type: ignore[misc]


def test_package_exports_seed_names_lazily() -> None:
    import qhlab.training as training

    for name in ("QhExecutionProfile", "WandbAttempt", "execution_profile", "save_tensor_state"):
        assert name in training.__all__
    for name in training.__all__:
        # The lazy package name and its owning module give one object; the seed submodule
        # ``execution_profile`` shadows the seed function of the same name on the package.
        if name == "execution_profile":
            expected = ep_module
        else:
            expected = getattr(ep_module, name) if name in ep_module.__all__ else getattr(tensor_state, name)
        assert getattr(training, name) is expected, name
    with pytest.raises(AttributeError):
        training.not_a_name  # noqa: B018


def test_seed_path_reexports_the_implementing_modules() -> None:
    owners = {
        profiles: (
            "PROFILE_NAMES",
            "ProfileRefusedError",
            "QhExecutionProfile",
            "RuntimeEvidence",
            "execution_policy_source",
            "execution_profile",
        ),
        device_checks: ("assert_device_tensors", "captured_fallback_operations"),
        wandb_attempt: ("WandbAttempt", "publish_wandb_attempt"),
        lineage: ("ColdInitializationLineage", "verified_cold_initialization_lineage"),
    }
    assert sorted(n for names in owners.values() for n in names) == sorted(ep_module.__all__)
    for module, names in owners.items():
        for name in names:
            assert getattr(ep_module, name) is getattr(module, name), name


# -- registry ---------------------------------------------------------------------------------


def test_registry_is_closed_and_exact() -> None:
    assert PROFILE_NAMES == ("cuda-amp", "mps-fp32", "cpu-fp32", "cpu-bf16", "cpu-fp32-darwin-arm64")
    rows = {n: dataclasses.astuple(execution_profile(n)) for n in PROFILE_NAMES}
    assert rows == {
        "cuda-amp": ("cuda-amp", "cuda", "cuda", "16-mixed", "Linux", "x86_64", ()),
        "mps-fp32": ("mps-fp32", "mps", "mps", "32-true", "Darwin", "arm64", ()),
        "cpu-fp32": ("cpu-fp32", "cpu", "cpu", "32-true", "Linux", "x86_64", ()),
        "cpu-bf16": ("cpu-bf16", "cpu", "cpu", "bf16-mixed", "Linux", "x86_64", ()),
        "cpu-fp32-darwin-arm64": ("cpu-fp32-darwin-arm64", "cpu", "cpu", "32-true", "Darwin", "arm64", ()),
    }
    assert execution_profile("cpu-fp32") is execution_profile("cpu-fp32")


@pytest.mark.parametrize("bad", ["cuda", "CPU-FP32", "", None, "mps-fp16"])
def test_unknown_profile_lists_valid_names(bad) -> None:
    with pytest.raises(QhInputError) as info:
        execution_profile(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in PROFILE_NAMES:
        assert name in message
    assert "HINT" in message


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("accelerator", {"accelerator": "tpu"}),
        ("precision", {"precision": "bf16-true"}),
        ("device_type", {"device_type": "xla"}),
        ("allowed_cpu_fallback_operations", {"allowed_cpu_fallback_operations": ("index_put",)}),
        ("allowed_cpu_fallback_operations", {"allowed_cpu_fallback_operations": "aten::x"}),
    ],
)
def test_profile_construction_is_validated(field: str, kwargs: dict) -> None:
    base = dict(
        name="x",
        accelerator="cpu",
        device_type="cpu",
        precision="32-true",
        expected_system="Linux",
        expected_machine="x86_64",
    )
    base.update(kwargs)
    with pytest.raises(QhInputError, match=field):
        QhExecutionProfile(**base)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"accelerator": "mps", "device_type": "mps", "precision": "16-mixed"},
            r"precision='16-mixed' is not allowed; allowed: '32-true' on an mps lane",
        ),
        (
            {"accelerator": "cuda", "device_type": "cuda", "precision": "bf16-mixed"},
            r"precision='bf16-mixed' is not allowed; allowed: '16-mixed' or '32-true' on a 'cuda' lane",
        ),
        ({"accelerator": "mps", "device_type": "mps", "precision": "bf16-mixed"}, r"precision='bf16-mixed'"),
        ({"accelerator": "cuda", "device_type": "cpu"}, r"device_type='cpu' is not allowed; allowed: 'cuda'"),
        ({"accelerator": "cpu", "device_type": "mps"}, r"device_type='mps' is not allowed; allowed: 'cpu'"),
        (
            {"allowed_cpu_fallback_operations": ("aten::foo",)},
            r"allowed_cpu_fallback_operations=\('aten::foo',\) is not allowed; allowed: \(\) on a 'cpu' lane",
        ),
        (
            {
                "accelerator": "cuda",
                "device_type": "cuda",
                "precision": "16-mixed",
                "allowed_cpu_fallback_operations": ("aten::foo",),
            },
            r"\(\) on a 'cuda' lane",
        ),
    ],
)
def test_profile_parts_must_agree(kwargs: dict, message: str) -> None:
    base = dict(
        name="x",
        accelerator="cpu",
        device_type="cpu",
        precision="32-true",
        expected_system="Linux",
        expected_machine="x86_64",
    )
    base.update(kwargs)
    with pytest.raises(QhInputError, match=r"QhExecutionProfile: .*" + message + r".*HINT"):
        QhExecutionProfile(**base)


def test_mps_lane_may_list_reviewed_fallback_operations() -> None:
    profile = QhExecutionProfile("m", "mps", "mps", "32-true", "Darwin", "arm64", ("aten::foo",))
    assert profile.allowed_cpu_fallback_operations == ("aten::foo",)


@pytest.mark.parametrize("name", ["cpu-fp32", "cpu-bf16", "cpu-fp32-darwin-arm64", "mps-fp32"])
def test_memory_ceiling_is_refused_where_it_cannot_be_enforced(name: str) -> None:
    profile = execution_profile(name)
    assert profile.check_memory_ceiling(None) is None
    with pytest.raises(
        QhInputError,
        match=r"max_allocated_bytes=1073741824 is not allowed; allowed: None on a "
        r"'(cpu|mps)' lane \(only CUDA lanes enforce a ceiling\)\. HINT: drop",
    ):
        profile.check_memory_ceiling(2**30)
    assert execution_profile("cuda-amp").check_memory_ceiling(2**30) == 2**30
    with pytest.raises(QhInputError, match="max_allocated_bytes=0 is not allowed"):
        execution_profile("cuda-amp").check_memory_ceiling(0)


# -- apply ------------------------------------------------------------------------------------


class _Optimizer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01


class _Recipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    seed: int
    horizon: int
    batch_size: int
    max_updates: int
    gradient_clip: float | None
    tags: tuple[str, ...]
    optimizer: _Optimizer
    population: str
    accelerator: Literal["cpu", "cuda", "mps"]
    devices: int
    precision: Literal["32-true", "16-mixed", "bf16-mixed"]


def _recipe() -> _Recipe:
    return _Recipe(
        name="qh-small",
        seed=17,
        horizon=3,
        batch_size=64,
        max_updates=500,
        gradient_clip=1.0,
        tags=("study", "paired"),
        optimizer=_Optimizer(lr=3e-4),
        population="pop/train",
        accelerator="cpu",
        devices=4,
        precision="32-true",
    )


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_apply_changes_only_backend_fields(name: str) -> None:
    profile = execution_profile(name)
    recipe = _recipe()
    applied = profile.apply(recipe)
    assert type(applied) is _Recipe
    assert (applied.accelerator, applied.devices, applied.precision) == (profile.accelerator, 1, profile.precision)
    for field in _Recipe.model_fields:
        if field not in ("accelerator", "devices", "precision"):
            assert getattr(applied, field) == getattr(recipe, field), field
    # the input is untouched and the result is still frozen
    assert (recipe.accelerator, recipe.devices, recipe.precision) == ("cpu", 4, "32-true")
    with pytest.raises(ValidationError):
        applied.seed = 1  # type: ignore[misc]


def test_apply_revalidates_with_the_recipe_model() -> None:
    class _Fp32Only(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        seed: int
        accelerator: str
        devices: int
        precision: Literal["32-true"]

    config = _Fp32Only(seed=1, accelerator="cpu", devices=1, precision="32-true")
    assert execution_profile("cpu-fp32").apply(config) == config
    with pytest.raises(QhInputError, match="16-mixed"):
        execution_profile("cuda-amp").apply(config)


def test_apply_refuses_config_without_backend_fields() -> None:
    class _NoBackend(BaseModel):
        model_config = ConfigDict(frozen=True)
        seed: int
        accelerator: str

    with pytest.raises(QhInputError, match="devices, precision"):
        execution_profile("cpu-fp32").apply(_NoBackend(seed=1, accelerator="cpu"))
    with pytest.raises(QhInputError, match="pydantic model"):
        execution_profile("cpu-fp32").apply({"accelerator": "cpu", "devices": 1, "precision": "32-true"})


# -- admission --------------------------------------------------------------------------------


def _admissible(profile: QhExecutionProfile) -> bool:
    if HOST != (profile.expected_system, profile.expected_machine):
        return False
    if profile.device_type == "cuda":
        return torch.cuda.is_available()
    if profile.device_type == "mps":
        return torch.backends.mps.is_available()
    if profile.precision == "bf16-mixed":  # from the kernel's CPU flags, not from torch
        flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
        return any(f in flags for f in ("avx512_bf16", "amx_bf16", "amx_tile"))
    return True


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_admit_runtime_matches_the_real_host(name: str, monkeypatch) -> None:
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    profile = execution_profile(name)
    if not _admissible(profile):
        with pytest.raises(ProfileRefusedError) as info:
            profile.admit_runtime()
        message = str(info.value)
        assert f"expected {profile.expected_system} {profile.expected_machine}" in message
        if HOST != (profile.expected_system, profile.expected_machine):
            assert f"this host is {HOST[0]} {HOST[1]}" in message
        elif profile.precision == "bf16-mixed":
            assert f"has CPU capability {torch.backends.cpu.get_cpu_capability()} without AVX512-BF16 or AMX" in message
        else:
            assert f"has no {profile.device_type.upper()} device" in message
        assert info.value.exit_code == 2
        return
    evidence = profile.admit_runtime()
    assert (evidence.profile, evidence.precision, evidence.device_type) == (
        name,
        profile.precision,
        profile.device_type,
    )
    assert evidence.versions["torch"] == torch.__version__
    assert evidence.versions["python"] == platform.python_version()
    assert evidence.versions["lightning"].startswith("2.6")
    assert evidence.host["system"] == HOST[0] and evidence.host["machine"] == HOST[1]
    assert evidence.host["node_sha256"] == hashlib.sha256(platform.node().encode()).hexdigest()
    assert platform.node() not in json.dumps(evidence.as_dict()) or not platform.node()
    assert evidence.float32_matmul_precision == torch.get_float32_matmul_precision()
    lane_policy = Path(profiles.__file__).read_bytes()
    assert dict(evidence.execution_policy_source) == {
        "owner": "src/qhlab/training/profiles.py",
        "sha256": hashlib.sha256(lane_policy).hexdigest(),
        "schema_version": "1",
    }
    assert set(evidence.environment) == {
        "PYTORCH_ENABLE_MPS_FALLBACK",
        "CUDA_VISIBLE_DEVICES",
        "CUBLAS_WORKSPACE_CONFIG",
    }
    if profile.precision == "bf16-mixed":
        assert evidence.device["autocast_dtype"] == "bfloat16" and evidence.device["grad_scaler"].startswith("none")
        assert evidence.device["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if profile.device_type == "cuda":
        assert list(evidence.device["capability"]) == list(torch.cuda.get_device_capability(0))
        assert evidence.device["name"] == torch.cuda.get_device_name(0)


@pytest.mark.skipif(HOST != ("Linux", "x86_64"), reason="cpu-fp32 admits Linux x86_64 only")
def test_cpu_evidence_is_frozen_json_and_records_environment(monkeypatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    evidence = execution_profile("cpu-fp32").admit_runtime()
    assert evidence.environment["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert evidence.environment["CUDA_VISIBLE_DEVICES"] is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        evidence.profile = "cuda-amp"  # type: ignore[misc]
    with pytest.raises(TypeError):
        evidence.environment["CUBLAS_WORKSPACE_CONFIG"] = "x"  # type: ignore[index]
    data = evidence.as_dict()
    assert json.loads(canonical_json(data)) == data
    assert data["allowed_cpu_fallback_operations"] == []
    assert data["execution_policy_source"]["owner"] == "src/qhlab/training/profiles.py"


@pytest.mark.skipif(
    not (HOST == ("Darwin", "arm64") and torch.backends.mps.is_available()), reason="needs an Apple-silicon MPS host"
)
def test_mps_fallback_environment_is_refused_while_no_op_is_reviewed(monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    with pytest.raises(ProfileRefusedError, match="PYTORCH_ENABLE_MPS_FALLBACK"):
        execution_profile("mps-fp32").admit_runtime()
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "0")
    assert execution_profile("mps-fp32").admit_runtime().environment["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"


# -- precision and memory ---------------------------------------------------------------------


def test_autocast_context_per_precision() -> None:
    assert isinstance(execution_profile("cpu-fp32").autocast_context(), contextlib.nullcontext)
    with warnings.catch_warnings():
        # torch warns that autocast is disabled when CUDA is absent; the context is still built
        warnings.simplefilter("ignore", UserWarning)
        ctx = execution_profile("cuda-amp").autocast_context()
    assert isinstance(ctx, torch.autocast)
    assert (ctx.device, ctx.fast_dtype) == ("cuda", torch.float16)
    # the FP32 context really leaves matmuls in float32
    with execution_profile("cpu-fp32").autocast_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


@pytest.mark.parametrize("name", ["cpu-fp32", "cpu-fp32-darwin-arm64"])
def test_cpu_memory_accounting_records_no_cap(name: str) -> None:
    profile = execution_profile(name)
    record = profile.prepare_memory_accounting(2**30)
    assert record["cap_enforced"] is False and record["peak_stats_reset"] is False
    assert record["requested_max_allocated_bytes"] == 2**30
    assert "no per-process allocation cap" in record["reason"]
    evidence = profile.memory_evidence()
    assert set(evidence) == {"max_rss_bytes"}
    # a process that imported torch holds far more than 50 MB; KiB would be under that
    assert evidence["max_rss_bytes"] > 50 * 2**20
    _ = torch.ones(64 * 2**20 // 4).add_(1)  # touch 64 MiB
    assert profile.memory_evidence()["max_rss_bytes"] >= evidence["max_rss_bytes"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1GB"])
def test_memory_cap_is_validated(bad) -> None:
    with pytest.raises(QhInputError, match="max_allocated_bytes"):
        execution_profile("cpu-fp32").prepare_memory_accounting(bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_memory_accounting_sets_fraction_and_resets_peaks() -> None:
    profile = execution_profile("cuda-amp")
    total = torch.cuda.get_device_properties(0).total_memory
    previous_fraction = torch.cuda.get_per_process_memory_fraction(0)
    try:
        record = profile.prepare_memory_accounting(total // 4)
        assert record["cap_enforced"] is True and record["peak_stats_reset"] is True
        assert math.isclose(record["memory_fraction"], (total // 4) / total)
        assert math.isclose(torch.cuda.get_per_process_memory_fraction(0), (total // 4) / total)
        x = torch.empty(32 * 2**20, device="cuda")
        evidence = profile.memory_evidence()
        assert set(evidence) == {"peak_allocated_bytes", "peak_reserved_bytes"}
        assert evidence["peak_allocated_bytes"] >= x.numel() * 4
        with pytest.raises(QhInputError, match="max_allocated_bytes"):
            profile.prepare_memory_accounting(total * 2)
        with pytest.raises(QhInputError, match=f"allowed: at most the device's {total} bytes"):
            profile.check_memory_ceiling(total * 2)  # at admission, before anything is written
        # The fraction is process-wide: a later fit without a cap runs uncapped, and says so.
        record = profile.prepare_memory_accounting(None)
        assert record["cap_enforced"] is False and record["memory_fraction"] == 1.0
        assert torch.cuda.get_per_process_memory_fraction(0) == 1.0
    finally:
        # The cap is process-wide: later CUDA tests in this process must not inherit it.
        torch.cuda.set_per_process_memory_fraction(previous_fraction, 0)


@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an MPS device")
def test_mps_memory_accounting_records_current_values() -> None:
    profile = execution_profile("mps-fp32")
    record = profile.prepare_memory_accounting(2**30)
    assert record["cap_enforced"] is False and record["cache_emptied"] is True
    assert set(profile.memory_evidence()) == {"current_allocated_bytes", "driver_allocated_bytes"}


# -- device tensors ---------------------------------------------------------------------------


class _Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.good = torch.nn.Linear(3, 2)
        self.wide = torch.nn.Linear(3, 2).double()
        self.halved = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
        self.frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        self.register_buffer("scale64", torch.ones(2, dtype=torch.float64))
        self.register_buffer("mask16", torch.ones(2, dtype=torch.float16))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ok_buffer", torch.ones(2))


def test_device_check_record_counts_module_and_optimizer_state() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    record = device_check_record(module, "cpu", optimizer=optimizer)
    assert record == {
        "device_type": "cpu",
        "devices": ["cpu"],
        "dtypes": ["float32", "int64"],
        "parameters": 4,
        "buffers": 3,
        "optimizer_state_tensors": 0,
        "optimizer_step_counters": "not checked (torch keeps state['step'] on the CPU)",
        "passed": True,
    }
    module(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    assert device_check_record(module, "cpu", optimizer=optimizer)["optimizer_state_tensors"] == 8
    optimizer.state[module[0].weight]["exp_avg"] = optimizer.state[module[0].weight]["exp_avg"].double()
    with pytest.raises(
        QhError,
        match=r"device_check_record: 1 tensor\(s\) are not float32 on 'cpu': "
        r"optimizer state 0\.weight\.exp_avg: dtype=float64 device=cpu",
    ):
        device_check_record(module, "cpu", optimizer=optimizer)
    with pytest.raises(QhError, match=r"assert_device_tensors: 7 tensor\(s\) are not float32 on 'cuda'"):
        device_check_record(module, "cuda")


def test_assert_device_tensors_lists_every_offender() -> None:
    module = _Mixed()
    module.good(torch.ones(1, 3)).sum().backward()  # only good.* get gradients
    with pytest.raises(QhError) as info:
        assert_device_tensors(module, "cpu", gradients=True)
    message = str(info.value)
    assert not isinstance(info.value, QhInputError)
    expected = [
        "parameter wide.weight: dtype=float64 device=cpu",
        "parameter wide.bias: dtype=float64 device=cpu",
        "parameter halved: dtype=float16 device=cpu",
        "buffer scale64: dtype=float64 device=cpu",
        "buffer mask16: dtype=float16 device=cpu",
        "gradient wide.weight: missing",
        "gradient wide.bias: missing",
        "gradient halved: missing",
    ]
    for item in expected:
        assert item in message
    assert "8 tensor(s)" in message
    for ok in ("good.weight", "good.bias", "frozen", "count", "ok_buffer"):
        assert ok not in message
    # without gradients only the dtype offenders remain
    with pytest.raises(QhError, match=r"5 tensor\(s\)"):
        assert_device_tensors(module, "cpu", gradients=False)


def test_assert_device_tensors_passes_fp32_with_gradients_and_flags_wrong_gradient_dtype() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    module(torch.randn(5, 3)).sum().backward()
    assert assert_device_tensors(module, "cpu", gradients=True) is None
    module[0].bias.grad_dtype = None  # torch 2.13 otherwise forbids a gradient of another dtype
    module[0].bias.grad = module[0].bias.grad.double()
    with pytest.raises(QhError, match=r"gradient 0\.bias: dtype=float64 device=cpu"):
        assert_device_tensors(module, "cpu", gradients=True)


def test_assert_device_tensors_rejects_cpu_state_when_an_accelerator_was_requested() -> None:
    module = torch.nn.Linear(2, 2)
    with pytest.raises(QhError) as info:
        assert_device_tensors(module, "cuda", gradients=False)
    assert "parameter weight: dtype=float32 device=cpu" in str(info.value)
    assert "parameter bias: dtype=float32 device=cpu" in str(info.value)
    with pytest.raises(QhInputError, match="device_type"):
        assert_device_tensors(module, "gpu", gradients=False)
    with pytest.raises(QhInputError, match="gradients"):
        assert_device_tensors(module, "cpu", gradients="yes")


# -- fallback capture -------------------------------------------------------------------------


def _fallback_message(op: str) -> str:
    return (
        f"The operator '{op}' is not currently supported on the MPS backend and will fall back to run on "
        "the CPU. This may have performance implications. (Triggered internally at "
        "/pytorch/aten/src/ATen/mps/MPSFallback.mm:14.)"
    )


def test_captured_fallback_operations_collects_names_and_passes_others_through() -> None:
    torch.set_warn_always(False)
    with pytest.warns(UserWarning) as recorded:
        with captured_fallback_operations() as ops:
            assert torch.is_warn_always_enabled()
            warnings.warn(_fallback_message("aten::_linalg_solve_ex.result"), UserWarning)
            warnings.warn("unrelated long-fit warning", UserWarning)
            warnings.warn(_fallback_message("aten::index_put_"), UserWarning)
            warnings.warn(_fallback_message("aten::_linalg_solve_ex.result"), UserWarning)
    assert ops == ["aten::_linalg_solve_ex.result", "aten::index_put_"]
    assert [str(w.message) for w in recorded] == ["unrelated long-fit warning"]
    assert torch.is_warn_always_enabled() is False


def test_captured_fallback_operations_sees_warnings_filtered_or_seen_before() -> None:
    with pytest.warns(UserWarning, match="seen_before"):  # outside the context: passes through
        warnings.warn(_fallback_message("aten::seen_before"), UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with captured_fallback_operations() as ops:
            warnings.warn(_fallback_message("aten::seen_before"), UserWarning)
            warnings.warn("ignored by the outer filter", UserWarning)
    assert ops == ["aten::seen_before"]


def test_captured_fallback_operations_restores_warn_always_on_error() -> None:
    torch.set_warn_always(True)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with captured_fallback_operations():
                raise RuntimeError("boom")
        assert torch.is_warn_always_enabled() is True
    finally:
        torch.set_warn_always(False)


# -- policy source ----------------------------------------------------------------------------


def test_execution_policy_source_binds_lane_policy_bytes_only(tmp_path: Path) -> None:
    source = execution_policy_source()
    module_path = Path(profiles.__file__)
    assert source == {
        "owner": "src/qhlab/training/profiles.py",
        "sha256": hashlib.sha256(module_path.read_bytes()).hexdigest(),
        "schema_version": "1",
    }
    assert execution_policy_source(REPO_ROOT) == source
    # A producer checkout is read at the lane-policy path; W&B, lineage, device checks and the seed facade
    # are not policy, so a checkout holding other bytes there keeps the same digest.
    training_dir = tmp_path / "src/qhlab/training"
    training_dir.mkdir(parents=True)
    copy = training_dir / "profiles.py"
    copy.write_bytes(module_path.read_bytes())
    for other_module in (ep_module, wandb_attempt, lineage, device_checks):
        (training_dir / Path(other_module.__file__).name).write_bytes(b"# not policy\n")
    assert execution_policy_source(tmp_path) == source
    copy.write_bytes(module_path.read_bytes() + b"# changed policy\n")
    other = execution_policy_source(tmp_path)
    assert other["owner"] == source["owner"] and other["sha256"] == sha256_file(copy) != source["sha256"]
    legacy_only = tmp_path / "legacy"
    (legacy_only / "src/qhlab/training").mkdir(parents=True)
    (legacy_only / "src/qhlab/training/execution_profile.py").write_bytes(module_path.read_bytes())
    with pytest.raises(MissingEvidenceError, match="source_root"):
        execution_policy_source(legacy_only)
    with pytest.raises(MissingEvidenceError, match="source_root"):
        execution_policy_source(tmp_path / "empty")


# -- W&B attempts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"run_id": ""}, "run_id"),
        ({"run_id": "a/b"}, "run_id"),
        ({"run_id": "x" * 65}, "run_id"),
        ({"run_id": "run id"}, "run_id"),
        ({"run_id": 7}, "run_id"),
        ({"run_id": "r1", "resume": "yes"}, "resume"),
        ({"run_id": "r1", "offline": 1}, "offline"),
        ({"run_id": "r1", "resume": True, "offline": True, "local_attempt_id": "a2"}, "resume=True with offline=True"),
        ({"run_id": "r1", "resume": True}, "local_attempt_id=None"),
        ({"run_id": "r1", "resume": True, "local_attempt_id": "r1"}, "local_attempt_id='r1'"),
        ({"run_id": "r1", "logical_run_id": "../up"}, "logical_run_id"),
        ({"run_id": "r1", "local_attempt_id": "a.b"}, "local_attempt_id"),
    ],
)
def test_wandb_attempt_rejects_bad_input_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(QhInputError) as info:
        WandbAttempt(**kwargs)
    assert field in str(info.value)
    assert info.value.exit_code == 2


def test_wandb_attempt_identity_and_apply() -> None:
    fresh = WandbAttempt("run-1")
    assert (fresh.logical_run_id, fresh.resolved_local_attempt_id) == ("run-1", "run-1")
    base = {"project": "qhlab", "name": "fit", "tags": ["a"], "save_dir": "/tmp/x"}
    assert fresh.apply(base) == {**base, "id": "run-1", "resume": "never", "mode": "online", "group": "run-1"}
    assert base == {"project": "qhlab", "name": "fit", "tags": ["a"], "save_dir": "/tmp/x"}

    resumed = WandbAttempt("run-1", resume=True, local_attempt_id="run-1-r2")
    assert resumed.resolved_local_attempt_id == "run-1-r2"
    assert resumed.apply({})["resume"] == "must" and resumed.apply({})["id"] == "run-1"

    segment = WandbAttempt("seg-2", offline=True, logical_run_id="lineage")
    assert segment.apply({"project": "p"}) == {
        "project": "p",
        "id": "seg-2",
        "resume": "never",
        "mode": "offline",
        "group": "lineage",
    }
    for key in ("id", "version", "resume", "mode", "group", "offline"):
        with pytest.raises(QhInputError, match=key):
            segment.apply({key: "x"})


def test_wandb_attempt_evidence_never_claims_cloud_for_offline() -> None:
    segment = WandbAttempt("seg-2", offline=True, logical_run_id="lineage")
    evidence = segment.evidence()
    assert evidence["cloud_publication"] == "not published (offline segment)"
    assert evidence["mode"] == "offline" and evidence["links"]["logical_run_id"] == "lineage"
    assert json.loads(canonical_json(evidence)) == evidence
    online = WandbAttempt("run-1", resume=True, local_attempt_id="r2").evidence()
    assert online["resume"] == "must" and "not published" not in online["cloud_publication"]
    assert online["local_attempt_id"] == "r2"


def test_output_directory_is_fresh_and_refuses_existing_or_unsafe(tmp_path: Path) -> None:
    resumed = WandbAttempt("run-1", resume=True, local_attempt_id="run-1-r2")
    path = resumed.output_directory(tmp_path, "cell-a")
    assert path == tmp_path / "cell-a" / "run-1-r2"
    assert not path.exists()
    path.mkdir(parents=True)
    with pytest.raises(PublishConflictError, match="run-1-r2"):
        resumed.output_directory(tmp_path, "cell-a")
    for cell in ("..", "a/b", "", ".hidden", "x" * 65, 3):
        with pytest.raises(QhInputError, match="cell"):
            resumed.output_directory(tmp_path, cell)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell-a"]


def test_writer_lock_held_by_another_process_fails_at_once(tmp_path: Path) -> None:
    helper = Path(__file__).with_name("_lock_holder.py")
    release = tmp_path / "release"
    lock_path = tmp_path / ".locks" / "lineage-7.lock"
    holder = subprocess.Popen(
        [sys.executable, str(helper), "hold", str(tmp_path), "lineage-7", str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    contender = subprocess.Popen(
        [sys.executable, str(helper), "contend", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def contend(logical: str) -> list[str]:
        contender.stdin.write(logical + "\n")
        contender.stdin.flush()
        return contender.stdout.readline().strip().split(" ", 3)

    try:
        assert holder.stdout.readline().strip() == f"held {lock_path}", holder.stderr.read()
        outcome, seconds, exit_code, message = contend("lineage-7")
        assert (outcome, exit_code) == ("refused", str(LockHeldError.exit_code))
        assert str(lock_path) in message
        assert float(seconds) < 0.5  # non-blocking: fails at once instead of waiting for the holder
        assert contend("lineage-8")[0] == "acquired"  # another logical run is independent
        release.touch()
        assert holder.wait(timeout=30) == 0
        assert contend("lineage-7")[0] == "acquired"  # free again once the holder released it
    finally:
        for proc in (holder, contender):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- publish_wandb_attempt --------------------------------------------------------------------


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch) -> Path:
    directory = tmp_path / "wandb-home"
    directory.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(directory))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(directory / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(directory / "cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(directory / "data"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return directory


def _artifacts(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "final.safetensors").write_bytes(b"\x00\x01state")
    (directory / "eval.json").write_text('{"mae": 0.25}\n')
    return {"final_state": directory / "final.safetensors", "evaluation": directory / "eval.json"}


def test_offline_publish_without_active_run_writes_closing_record(tmp_path: Path, wandb_offline: Path) -> None:
    import wandb

    assert wandb.run is None
    attempt = WandbAttempt("seg-3", offline=True, logical_run_id="lineage")
    files = _artifacts(tmp_path / "out")
    result = tmp_path / "out" / "wandb_attempt.receipt.json"
    body = publish_wandb_attempt(attempt, result, files, {"mae": 0.25, "updates": 500})
    document = read_receipt(result, WandbAttemptReceipt).record()
    assert document["body"] == body
    assert body["files"] == {name: sha256_file(path) for name, path in files.items()}
    assert body["metrics"] == {"mae": 0.25, "updates": 500.0}
    assert body["links"] == {"logical_run_id": "lineage"}
    assert body["publication"]["cloud_publication"] == "not published (offline segment)"
    assert body["publication"]["local_wandb_run"] is None
    assert document["inputs"]["final_state"] == {
        "path": "final.safetensors",
        "sha256": sha256_file(files["final_state"]),
    }
    with pytest.raises(PublishConflictError):
        publish_wandb_attempt(attempt, result, files, {"mae": 0.25})


@pytest.mark.parametrize(
    ("metrics", "files_key", "match"),
    [
        ({"mae": float("nan")}, None, "metrics\\['mae'\\]=nan"),
        ({"mae": float("inf")}, None, "metrics\\['mae'\\]=inf"),
        ({"mae": True}, None, "metrics\\['mae'\\]=True"),
        ({"mae": "0.2"}, None, "metrics\\['mae'\\]"),
        ({"mae": 0.2}, "../escape", "files key"),
        ({"mae": 0.2}, "missing", "files\\['missing'\\]"),
    ],
)
def test_publish_refuses_bad_metrics_and_files_writing_nothing(
    tmp_path: Path, wandb_offline: Path, metrics: dict, files_key: str | None, match: str
) -> None:
    attempt = WandbAttempt("seg-4", offline=True)
    files = _artifacts(tmp_path / "out")
    if files_key == "missing":
        files["missing"] = tmp_path / "out" / "nope.bin"
    elif files_key:
        files[files_key] = files["evaluation"]
    result = tmp_path / "out" / "attempt.receipt.json"
    with pytest.raises(QhInputError, match=match):
        publish_wandb_attempt(attempt, result, files, metrics)
    assert not result.exists()
    with pytest.raises(QhInputError, match="receipt.json"):
        publish_wandb_attempt(attempt, tmp_path / "out" / "attempt.json", files, {"mae": 0.2})


def test_online_publish_requires_an_active_online_run(tmp_path: Path, wandb_offline: Path) -> None:
    import wandb

    assert wandb.run is None
    files = _artifacts(tmp_path / "out")
    result = tmp_path / "out" / "attempt.receipt.json"
    with pytest.raises(QhError, match="no active wandb run"):
        publish_wandb_attempt(WandbAttempt("run-9"), result, files, {"mae": 0.1})
    assert not result.exists()


def test_real_offline_wandb_run_uses_attempt_identity_and_closes_segment(tmp_path: Path, wandb_offline: Path) -> None:
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    attempt = WandbAttempt("seg-0005", offline=True, logical_run_id="lineage-b")
    save_dir = tmp_path / "runs"
    save_dir.mkdir()
    logger = WandbLogger(**attempt.apply({"project": "qhlab-tests", "name": "segment"}), save_dir=str(save_dir))
    try:
        run = logger.experiment
        assert run.id == "seg-0005" and run.offline and run.group == "lineage-b"
        run_dir = Path(run.dir).parent
        assert run_dir.name.startswith("offline-run-") and run_dir.name.endswith("-seg-0005")
        assert save_dir in run_dir.parents
        logger.log_metrics({"train/loss": 0.5}, step=1)
        files = _artifacts(tmp_path / "out")
        result = tmp_path / "out" / "wandb_attempt.receipt.json"
        # an online attempt must not be published through an offline run
        with pytest.raises(QhInputError, match="offline"):
            publish_wandb_attempt(WandbAttempt("seg-0005"), result, files, {"mae": 0.2})
        with pytest.raises(QhInputError, match="seg-0005"):
            publish_wandb_attempt(WandbAttempt("other", offline=True), result, files, {"mae": 0.2})
        assert not result.exists()
        body = publish_wandb_attempt(attempt, result, files, {"mae": 0.2, "regret": 0.05})
        assert body["publication"]["cloud_publication"] == "not published (offline segment)"
        assert body["publication"]["local_wandb_run"]["id"] == "seg-0005"
        assert body["attempt"]["cloud_publication"] == "not published (offline segment)"
        assert read_receipt(result, WandbAttemptReceipt).body_record() == body
        assert run.summary["mae"] == 0.2 and run.summary["regret"] == 0.05
    finally:
        wandb.finish()
    assert wandb.run is None
    assert (run_dir / "run-seg-0005.wandb").is_file()  # the local segment `wandb sync` can upload
