"""Tests of the generic fit launcher seam (qhlab.training.launcher) with a small real module.

The module here is a genuine LightningModule (a linear regressor trained by AdamW), not a
mock: the seam is generic and must work for any module that returns one AdamW optimizer.
"""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import Literal

import pytest
import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from pydantic import BaseModel, ConfigDict
from torch.utils.data import DataLoader, IterableDataset

from qhlab.evidence import EvidenceError, QhError, QhInputError, read_receipt, source_package_digest, verify_directory
from qhlab.training.callbacks import SegmentCheckpointCallback, UpdateBudgetCallback
from qhlab.training.execution_profile import QhExecutionProfile, WandbAttempt
from qhlab.training.lane_evidence import LaneEvidenceCallback
from qhlab.training.launcher import (
    FitInterrupted,
    LaunchOptions,
    LaunchRequest,
    admit_launch,
    publish_segment,
    start_segment,
    train_segment,
)
from qhlab.training.optimizer_state import observed_optimizer_updates
from qhlab.training.records import FitReceipt
from qhlab.training.segments import load_resume_state
from qhlab.training.tensor_state import load_tensor_state


class _Recipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    seed: int = 3
    updates: int = 12
    lr: float = 0.05
    accelerator: Literal["cpu", "cuda", "mps"] = "cpu"
    devices: Literal[1] = 1
    precision: Literal["32-true", "16-mixed"] = "32-true"


class _Regressor(LightningModule):
    """y = x @ w_true; online learns it, target mirrors online after every update."""

    def __init__(self, recipe: _Recipe) -> None:
        super().__init__()
        self.recipe = recipe
        self.online = torch.nn.Linear(4, 1)
        self.target = torch.nn.Linear(4, 1)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.online(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.target.load_state_dict(self.online.state_dict())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.online.parameters(), lr=self.recipe.lr)


class _Stream(IterableDataset):
    def __init__(self, start_batch: int) -> None:
        self.start_batch = start_batch

    def __iter__(self):
        i = self.start_batch
        while True:  # batch i is a pure function of i, so a resumed stream continues exactly
            g = torch.Generator().manual_seed(1000 + i)
            x = torch.randn(8, 4, generator=g)
            yield x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
            i += 1


class _Data(LightningDataModule):
    def __init__(self, start_batch: int = 0) -> None:
        super().__init__()
        self.start_batch = start_batch

    def train_dataloader(self):
        return DataLoader(_Stream(self.start_batch), batch_size=None)


class _SigintAt(Callback):
    """Send SIGINT to this process once the optimizer has made `at` updates."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.sent = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.sent and observed_optimizer_updates(trainer.optimizers[0]) == self.at:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def _segment(admitted, request: LaunchRequest):
    """The seam's phases in order, the module built in the seeded process, as a fit runs them."""
    segment = start_segment(admitted, request)
    trained = train_segment(segment, _Regressor(admitted.recipe))
    assert publish_segment(trained)["observed_updates"] == trained.observed_updates
    return trained


def _launch(tmp: Path, name: str, *, recipe: _Recipe | None = None, resume=None, callbacks=(), every=None):
    recipe = recipe or _Recipe()
    admitted = admit_launch("cpu-fp32", recipe)
    attempt = WandbAttempt(run_id=name, offline=True, logical_run_id="toy")
    start = resume.start_updates if resume is not None else 0
    return _segment(
        admitted,
        LaunchRequest(
            datamodule=_Data(start),
            update_budget=recipe.updates,
            seed=recipe.seed,
            attempt=attempt,
            directory=tmp / "cell" / name,
            recipe_digest="d" * 64,
            resume=resume,
            options=LaunchOptions(extra_callbacks=callbacks, segment_checkpoint_every=every, progress=False),
        ),
    )


def test_observed_updates_come_from_adamw_state():
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    assert observed_optimizer_updates(opt) == 0
    for _ in range(3):
        layer(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert observed_optimizer_updates(opt) == 3
    # a parameter without a gradient keeps its older count; the optimizer made 4 updates
    layer.bias.grad = None
    layer.weight.grad = torch.ones_like(layer.weight)
    opt.step()
    assert observed_optimizer_updates(opt) == 4
    assert int(opt.state[layer.bias]["step"]) == 3


def test_observed_updates_refuse_optimizer_without_step():
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    with pytest.raises(QhError, match="keeps no 'step'"):
        observed_optimizer_updates(opt)


@pytest.mark.parametrize("budget", [0, -3, True, 2.0])
def test_budget_callback_checks_arguments(budget):
    with pytest.raises(QhInputError, match="update_budget=.* is not allowed"):
        UpdateBudgetCallback(budget)


def test_budget_callback_refuses_finished_start():
    with pytest.raises(QhInputError, match="start_updates=5 is not allowed"):
        UpdateBudgetCallback(5, start_updates=5)


def test_checkpoint_callback_checks_arguments(tmp_path):
    with pytest.raises(QhInputError, match="every=0 is not allowed"):
        SegmentCheckpointCallback(tmp_path, every=0, update_budget=5, body={}, inputs={})
    with pytest.raises(QhInputError, match="directory="):
        SegmentCheckpointCallback(tmp_path / "absent", every=1, update_budget=5, body={}, inputs={})


def test_admit_refuses_profile_not_admitted():
    with pytest.raises(QhInputError, match="cuda-amp"):
        admit_launch("cuda-amp", _Recipe())
    with pytest.raises(QhInputError):
        admit_launch("no-such-lane", _Recipe())


def test_launch_publishes_verified_segment(tmp_path):
    result = _launch(tmp_path, "a1", every=5)
    assert result.observed_updates == 12
    names = {p.name for p in result.directory.iterdir()}
    assert {
        "cold_init.safetensors",
        "cold_init.receipt.json",
        "final_state.safetensors",
        "final_state.json",
        "fit.receipt.json",
        "wandb_attempt.receipt.json",
        "wandb",
    } <= names
    assert {"segment_checkpoint_u00000005.receipt.json", "segment_checkpoint_u00000010.receipt.json"} <= names
    assert list((result.directory / "wandb").glob("offline-run-*/run-a1.wandb"))
    fit = read_receipt(result.fit_receipt, FitReceipt).body_record()
    assert fit["observed_updates"] == 12 and fit["update_budget"] == 12
    assert fit["observed_updates_source"] == "optimizer.state[p]['step']"
    assert fit["lineage"] == {"kind": "fresh", "segment": 0}
    assert fit["runtime"]["profile"] == "cpu-fp32"
    assert fit["segment_checkpoints"] == [5, 10]
    tensors, structure = load_tensor_state(result.final_state, expected_sha256=result.final_state_sha256)
    assert structure["observed_updates"] == 12
    assert {int(tensors[f"optim.{i}.step"]) for i in range(2)} == {12}
    assert structure["param_names"] == ["online.weight", "online.bias"]
    assert structure["param_groups"][0]["hyper_parameters"]["lr"] == 0.05
    assert torch.equal(tensors["online.weight"], tensors["target.weight"])
    verified = verify_directory(result.directory)
    assert verified  # every receipt below authenticated


def test_fit_receipt_carries_lane_evidence(tmp_path):
    result = _launch(tmp_path, "l1")
    fit = read_receipt(result.fit_receipt, FitReceipt).body_record()
    checks = fit["lane_checks"]["device_checks"]
    common = {
        "device_type": "cpu",
        "devices": ["cpu"],
        "dtypes": ["float32"],
        "parameters": 4,
        "buffers": 0,
        "passed": True,
    }
    assert {k: checks["fit_start"][k] for k in common} == common
    assert {k: checks["final"][k] for k in common} == common
    # AdamW moments exist at the end only (exp_avg, exp_avg_sq of the online weight and bias)
    assert (checks["fit_start"]["optimizer_state_tensors"], checks["final"]["optimizer_state_tensors"]) == (0, 4)
    assert fit["lane_checks"]["cpu_fallback_operations"]["observed"] is False
    assert fit["memory_accounting"]["cap_enforced"] is False
    assert fit["memory_accounting"]["requested_max_allocated_bytes"] is None
    assert "no per-process allocation cap" in fit["memory_accounting"]["reason"]


def test_resumed_fit_checks_restored_optimizer_state_at_start(tmp_path):
    with pytest.raises(FitInterrupted):
        _launch(tmp_path, "k1", callbacks=[_SigintAt(5)], every=100)
    source = source_package_digest()["sha256"]
    resume = load_resume_state(tmp_path / "cell" / "k1", seed=3, source_package_digest=source, recipe_digest="d" * 64)
    second = _launch(tmp_path, "k2", resume=resume)
    checks = read_receipt(second.fit_receipt, FitReceipt).body_record()["lane_checks"]["device_checks"]
    assert checks["fit_start"]["optimizer_state_tensors"] == 4


def test_memory_ceiling_on_a_cpu_lane_is_refused_at_admission(tmp_path):
    # Admission is the one check, before any segment can write anything.
    with pytest.raises(
        QhInputError, match=r"max_allocated_bytes=1073741824 is not allowed; allowed: None on a 'cpu' lane"
    ):
        admit_launch("cpu-fp32", _Recipe(), max_allocated_bytes=2**30)
    assert admit_launch("cpu-fp32", _Recipe()).max_allocated_bytes is None


def test_unreviewed_mps_fallback_is_refused_and_recorded():
    mps = QhExecutionProfile("mps-test", "mps", "mps", "32-true", "Darwin", "arm64", ("aten::reviewed",))
    lane = LaneEvidenceCallback(mps)
    with pytest.raises(QhError, match="device checks did not run"):
        lane.record()
    lane.fit_start = lane.final = {"passed": True}
    message = "The operator '{}' is not currently supported on the MPS backend and will fall back to run on the CPU."
    with lane.observing_fallbacks():
        warnings.warn(message.format("aten::reviewed"), UserWarning)
    assert lane.record()["cpu_fallback_operations"] == {
        "observed": True,
        "captured": ["aten::reviewed"],
        "allowed": ["aten::reviewed"],
    }
    with lane.observing_fallbacks():
        warnings.warn(message.format("aten::unreviewed"), UserWarning)
    with pytest.raises(
        QhError,
        match=r"MPS operator\(s\) \['aten::unreviewed'\] fell back to the CPU; allowed: "
        r"the reviewed list \['aten::reviewed'\] of profile 'mps-test'",
    ):
        lane.record()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fit_checks_tensors_on_the_device(tmp_path):
    recipe = _Recipe(precision="16-mixed")
    admitted = admit_launch("cuda-amp", recipe)
    result = _segment(
        admitted,
        LaunchRequest(
            datamodule=_Data(),
            update_budget=recipe.updates,
            seed=recipe.seed,
            attempt=WandbAttempt(run_id="c1", offline=True, logical_run_id="toy"),
            directory=tmp_path / "cell" / "c1",
            recipe_digest="d" * 64,
            options=LaunchOptions(progress=False),
        ),
    )
    checks = read_receipt(result.fit_receipt, FitReceipt).body_record()["lane_checks"]["device_checks"]
    assert checks["fit_start"]["devices"] == ["cuda:0"] and checks["final"]["devices"] == ["cuda:0"]
    assert checks["final"]["dtypes"] == ["float32"] and checks["final"]["optimizer_state_tensors"] == 4


def test_same_seed_same_final_state(tmp_path):
    first = _launch(tmp_path, "d1")
    second = _launch(tmp_path, "d2")
    third = _launch(tmp_path, "d3", recipe=_Recipe(seed=4))
    assert first.final_state_sha256 == second.final_state_sha256
    assert first.final_state_sha256 != third.final_state_sha256


def test_sigint_checkpoint_then_resume_matches_uninterrupted(tmp_path):
    reference = _launch(tmp_path, "ref")
    with pytest.raises(FitInterrupted, match="--resume r1"):
        _launch(tmp_path, "r1", callbacks=[_SigintAt(7)], every=100)
    first = tmp_path / "cell" / "r1"
    assert (first / "segment_checkpoint_u00000007.receipt.json").is_file()  # first boundary after SIGINT
    assert not (first / "final_state.safetensors").exists()
    source = source_package_digest()["sha256"]
    resume = load_resume_state(first, seed=3, source_package_digest=source, recipe_digest="d" * 64)
    assert resume.start_updates == 7
    second = _launch(tmp_path, "r2", resume=resume)
    assert second.observed_updates == 12
    fit = read_receipt(second.fit_receipt, FitReceipt).body_record()
    assert fit["lineage"]["kind"] == "resumed"
    assert fit["lineage"]["previous_local_attempt_id"] == "r1"
    assert fit["lineage"]["start_updates"] == 7
    assert fit["lineage"]["cold_initialization"]["seed"] == 3
    # the data stream and the optimizer state continue exactly: same bytes as one long fit
    assert second.final_state_sha256 == reference.final_state_sha256
    assert verify_directory(second.directory)


def test_resume_refusals(tmp_path):
    with pytest.raises(FitInterrupted):
        _launch(tmp_path, "x1", callbacks=[_SigintAt(3)], every=100)
    first = tmp_path / "cell" / "x1"
    source = source_package_digest()["sha256"]
    with pytest.raises(EvidenceError, match="seed=3 but the lineage expects seed=9"):
        load_resume_state(first, seed=9, source_package_digest=source, recipe_digest="d" * 64)
    with pytest.raises(EvidenceError, match="source_package_digest"):
        load_resume_state(first, seed=3, source_package_digest="0" * 64, recipe_digest="d" * 64)
    with pytest.raises(QhInputError, match="recipe_digest="):
        load_resume_state(first, seed=3, source_package_digest=source, recipe_digest="e" * 64)
    done = _launch(tmp_path, "x2")
    with pytest.raises(QhInputError, match="already finished"):
        load_resume_state(done.directory, seed=3, source_package_digest=source, recipe_digest="d" * 64)
    with pytest.raises(EvidenceError, match="does not exist"):
        load_resume_state(tmp_path / "cell" / "nope", seed=3, source_package_digest=source, recipe_digest="d" * 64)


def test_launch_request_refuses_a_receipt_field_the_launcher_writes(tmp_path):
    with pytest.raises(QhInputError, match=r"LaunchRequest: receipt_fields=\['seed'\] is not allowed; allowed: .*HINT"):
        LaunchRequest(
            datamodule=_Data(),
            update_budget=4,
            seed=0,
            attempt=WandbAttempt(run_id="r", offline=True, logical_run_id="toy"),
            directory=tmp_path / "cell",
            recipe_digest="d" * 64,
            receipt_fields={"seed": 1, "study": None},
        )


def test_a_segment_is_seeded_before_its_directory_exists(tmp_path):
    """``start_segment`` writes nothing: a module refused in the seeded process leaves no directory."""
    recipe = _Recipe()
    admitted = admit_launch("cpu-fp32", recipe)
    request = LaunchRequest(
        datamodule=_Data(),
        update_budget=recipe.updates,
        seed=recipe.seed,
        attempt=WandbAttempt(run_id="late", offline=True, logical_run_id="toy"),
        directory=tmp_path / "cell" / "late",
        recipe_digest="d" * 64,
        options=LaunchOptions(progress=False),
    )
    segment = start_segment(admitted, request)
    drawn = torch.rand(3)
    torch.manual_seed(recipe.seed)
    assert torch.equal(torch.rand(3), drawn)  # seeded ...
    assert not (tmp_path / "cell").exists()  # ... and nothing written
    published = train_segment(start_segment(admitted, request), _Regressor(recipe))
    publish_segment(published)
    assert published.directory == segment.directory == tmp_path / "cell" / "late"
    assert verify_directory(published.directory)
