"""Commissioning gates: signatures, observed counting, gate failures, readers, memory guard.

Fast tests fit the real ``QhTDModule`` on a small synthetic population (a private shim with
the tensor fields of the ``Population`` contract, as in ``test_q_learning.py``) with a bare
Lightning ``Trainer``; the end-to-end ``qhlab commission`` runs on the ``tiny`` preset are
marked slow.
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import typing
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import Callback

from qhlab.design.config_files import load_recipe
from qhlab.evidence import (
    EvidenceError,
    MissingEvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    verify_directory,
)
from qhlab.evidence.layout import MPS_MEMORY_RECEIPT
from qhlab.finite_horizon.batches import QhPopulationDataModule, population_dims
from qhlab.finite_horizon.diagnostics import commissioning as cm
from qhlab.finite_horizon.diagnostics.commissioning import (
    QhCommissioningMilestoneReceipt,
    QhCommissioningMilestonesCallback,
    QhCommissioningMilestonesConfig,
    QhMpsMemoryBudgetCallback,
    QhMpsMemoryObservation,
    read_commissioning_milestones,
    read_mps_memory_observation,
)
from qhlab.finite_horizon.diagnostics.mps_memory import allow_injected_sampler_evidence
from qhlab.finite_horizon.q_learning import QhTDModule
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.finite_horizon.records import CommissioningRunReceipt
from qhlab.training.optimizer_state import observed_optimizer_updates
from qhlab.training.records import FitReceipt
from qhlab.training.tensor_state import load_tensor_state
from synthetic_population import synthetic_population
from tiny_recipe import TINY_RECIPE

CONTEXT = ("recipe:" + "a" * 64, "source:" + "b" * 64, "population:train:" + "c" * 64)


# ------------------------------------------------------------------ seed signatures


_POSITIONAL, _KEYWORD, _REQUIRED = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.empty,
)
# (name, kind, default) of every seed parameter, in order (``self`` of methods left out).
SEED_CALLABLES = {
    "QhCommissioningMilestonesCallback": (("config", _POSITIONAL, _REQUIRED), ("output_dir", _POSITIONAL, _REQUIRED)),
    "QhCommissioningMilestonesCallback.on_fit_end": (
        ("trainer", _POSITIONAL, _REQUIRED),
        ("pl_module", _POSITIONAL, _REQUIRED),
    ),
    "QhMpsMemoryBudgetCallback": (
        ("max_allocated_bytes", _POSITIONAL, _REQUIRED),
        ("output_dir", _POSITIONAL, _REQUIRED),
    ),
    "read_commissioning_milestones": (("config", _POSITIONAL, _REQUIRED), ("output_dir", _POSITIONAL, _REQUIRED)),
    "read_mps_memory_observation": (
        ("output_dir", _POSITIONAL, _REQUIRED),
        ("max_allocated_bytes", _KEYWORD, _REQUIRED),
    ),
}
SEED_ATTRIBUTES = {
    "QhCommissioningMilestoneReceipt": (
        "schema_version",
        "successful_optimizer_updates",
        "expected_device",
        "context_ids",
        "state_filename",
        "state_sha256",
        "strict_reload",
        "optimizer_evidence",
        "memory_observation",
    ),
    "QhCommissioningMilestonesConfig": ("milestones", "expected_device", "max_allocated_bytes", "context_ids"),
    "QhMpsMemoryObservation": (
        "schema_version",
        "sampling_scope",
        "sample_count",
        "current_allocated_bytes",
        "driver_allocated_bytes",
        "max_sampled_current_allocated_bytes",
        "max_sampled_driver_allocated_bytes",
        "max_allocated_bytes",
        "within_live_tensor_budget",
    ),
}


def _seed_callable(qualname: str):
    obj = cm
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("qualname", sorted(SEED_CALLABLES))
def test_signature_equals_seed(qualname: str) -> None:
    parameters = inspect.signature(_seed_callable(qualname)).parameters.values()
    actual = tuple((p.name, p.kind, p.default) for p in parameters if p.name != "self")
    assert actual == SEED_CALLABLES[qualname]


@pytest.mark.parametrize("qualname", sorted(SEED_CALLABLES))
def test_seed_callables_are_fully_annotated(qualname: str) -> None:
    obj = _seed_callable(qualname)
    function = obj.__init__ if inspect.isclass(obj) else obj
    hints = typing.get_type_hints(function)
    assert {name for name, _, _ in SEED_CALLABLES[qualname]} | {"return"} <= set(hints), hints


@pytest.mark.parametrize("name", sorted(SEED_ATTRIBUTES))
def test_record_attributes_equal_seed(name: str) -> None:
    cls = getattr(cm, name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert tuple(f.name for f in dataclasses.fields(cls)) == SEED_ATTRIBUTES[name]


def test_seed_module_is_the_one_home_of_every_seed_name() -> None:
    import qhlab.finite_horizon.diagnostics as pkg

    seed_names = set(SEED_ATTRIBUTES) | {n.split(".")[0] for n in SEED_CALLABLES}
    assert seed_names == set(cm.__all__)
    # No re-export shim: the package names none of them, so there is one import path.
    assert pkg.__all__ == [] and not any(hasattr(pkg, n) for n in seed_names)


# ------------------------------------------------------------------ config validation


def test_config_normalizes_and_validates() -> None:
    config = QhCommissioningMilestonesConfig(milestones=[1, 5, 20], expected_device="cpu", context_ids=list(CONTEXT))
    assert config.milestones == (1, 5, 20) and config.context_ids == CONTEXT and config.max_allocated_bytes is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.milestones = (2,)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"milestones": (5, 5)}, "milestones=(5, 5)"),
        ({"milestones": (3, 1)}, "milestones=(3, 1)"),
        ({"milestones": (0, 2)}, "milestones=(0, 2)"),
        ({"milestones": ()}, "milestones=()"),
        ({"milestones": (1, True)}, "milestones=(1, True)"),
        ({"milestones": "1,2"}, "milestones='1,2'"),
        ({"expected_device": "tpu"}, "expected_device='tpu'"),
        ({"max_allocated_bytes": 0}, "max_allocated_bytes=0"),
        ({"max_allocated_bytes": 1.5}, "max_allocated_bytes=1.5"),
        ({"context_ids": ()}, "context_ids=()"),
        ({"context_ids": ("ok", "")}, "context_ids=('ok', '')"),
        ({"context_ids": "recipe"}, "context_ids='recipe'"),
    ],
)
def test_config_refuses_bad_fields(update: dict, field: str) -> None:
    raw = {"milestones": (1, 5), "expected_device": "cpu", "context_ids": CONTEXT, **update}
    with pytest.raises(QhInputError) as info:
        QhCommissioningMilestonesConfig(**raw)
    assert field in str(info.value) and "allowed:" in str(info.value) and "HINT" in str(info.value)


# ------------------------------------------------------------------ fits on a synthetic population


POPULATION = synthetic_population(n_chain=8, masked_candidates=False)
RECIPE = QhRecipe.model_validate(
    {
        "name": "commission-test",
        "seed": 3,
        "horizon": 2,
        "batch_size": 4,
        "huber_delta": 0.05,
        "updates": 20,
        "architecture": {"arm": "baseline", "encoder": {"width": 16, "heads": 2}},
        "optimizer": {"lr": 3e-3},
        "target_update": {"kind": "hard", "interval": 5},
    }
)


def _config(milestones=(1, 5, 20), **update) -> QhCommissioningMilestonesConfig:
    return QhCommissioningMilestonesConfig(
        **{"milestones": milestones, "expected_device": "cpu", "context_ids": CONTEXT, **update}
    )


def _fit(
    callbacks: list[Callback],
    *,
    max_steps: int = 20,
    module_cls: type[QhTDModule] = QhTDModule,
    accelerator: str = "cpu",
):
    pl.seed_everything(RECIPE.seed, workers=True, verbose=False)
    module = module_cls(RECIPE, population_dims(POPULATION))
    datamodule = QhPopulationDataModule(POPULATION, batch_size=RECIPE.batch_size, seed=RECIPE.seed)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        deterministic=True if accelerator == "cpu" else "warn",
        callbacks=callbacks,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, datamodule=datamodule)
    return module, trainer


def _training_state(module: QhTDModule, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
    state = {f"module.{k}": v.clone() for k, v in module.state_dict().items()}
    for i, s in trainer.optimizers[0].state_dict()["state"].items():
        state.update({f"optim.{i}.{k}": v.clone() for k, v in s.items()})
    return state


@pytest.fixture(scope="module")
def commissioned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One gated fit (milestones 1, 5, 20) and its evidence directory, shared read-only."""
    out = tmp_path_factory.mktemp("commissioned") / "milestones"
    gate = QhCommissioningMilestonesCallback(_config(), out)
    module, trainer = _fit([gate])
    return {
        "out": out,
        "gate": gate,
        "state": _training_state(module, trainer),
        "rng": torch.get_rng_state().clone(),
        "module": module,
    }


def test_gated_fit_writes_three_authenticated_milestones(commissioned: dict) -> None:
    out = commissioned["out"]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"milestone_u{m:08d}.{suffix}" for m in (1, 5, 20) for suffix in ("safetensors", "json", "receipt.json")
    )
    receipts = read_commissioning_milestones(_config(), out)
    assert [r.successful_optimizer_updates for r in receipts] == [1, 5, 20]
    assert receipts == tuple(commissioned["gate"].receipts)
    for receipt in receipts:
        assert isinstance(receipt, QhCommissioningMilestoneReceipt)
        assert receipt.schema_version == 1 and receipt.strict_reload is True
        assert receipt.expected_device == "cpu" and receipt.context_ids == CONTEXT
        assert receipt.memory_observation is None
        ev = receipt.optimizer_evidence
        assert ev["parameter_steps"] == [receipt.successful_optimizer_updates]
        assert ev["residency"] == {"online": ["cpu"], "target": ["cpu"], "gradient": ["cpu"], "moment": ["cpu"]}
        assert ev["dtypes"]["moment"] == ["float32"] and ev["finite"] is True
        n_params = len(list(commissioned["module"].online.parameters()))
        assert ev["tensor_counts"]["gradient"] == n_params and ev["tensor_counts"]["moment"] == 2 * n_params
        tensors, structure = load_tensor_state(out / receipt.state_filename, expected_sha256=receipt.state_sha256)
        assert structure["successful_optimizer_updates"] == receipt.successful_optimizer_updates
        assert {k.split(".")[0] for k in tensors} == {"online", "target", "grad", "optim"}
    assert verify_directory(out)["unbound_files"] == []


def test_final_milestone_state_equals_the_live_state(commissioned: dict) -> None:
    receipt = read_commissioning_milestones(_config(), commissioned["out"])[-1]
    tensors, _ = load_tensor_state(commissioned["out"] / receipt.state_filename)
    live = commissioned["state"]
    # The gate at 20 ran before the module's own batch-end hook refreshed the target for
    # update 20, so compare the online scorer and the optimizer moments.
    for key, value in tensors.items():
        if key.startswith("online."):
            assert torch.equal(value, live[f"module.{key}"]), key
        elif key.startswith("optim."):
            assert torch.equal(value, live[key]), key


def test_gates_leave_training_bit_identical(commissioned: dict) -> None:
    module, trainer = _fit([])
    plain = _training_state(module, trainer)
    gated = commissioned["state"]
    assert plain.keys() == gated.keys()
    assert all(torch.equal(plain[k], gated[k]) for k in plain)
    assert torch.equal(torch.get_rng_state(), commissioned["rng"])


def test_rebuilding_a_scorer_would_move_the_rng_without_fork() -> None:
    # Control for the test above: build_scorer() draws from the global RNG, so a gate that
    # did not fork it would change the training RNG stream.
    module = QhTDModule(RECIPE, population_dims(POPULATION))
    before = torch.get_rng_state().clone()
    module.build_scorer()
    assert not torch.equal(before, torch.get_rng_state())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")
def test_cuda_gates_observe_device_state_and_keep_the_rng(tmp_path: Path) -> None:
    config = _config(expected_device="cuda")
    _fit([])
    plain_rng = (torch.get_rng_state().clone(), torch.cuda.get_rng_state().clone())
    _fit([QhCommissioningMilestonesCallback(config, tmp_path / "m")], accelerator="gpu")
    receipts = read_commissioning_milestones(config, tmp_path / "m")
    assert [r.successful_optimizer_updates for r in receipts] == [1, 5, 20]
    assert all(set(r.optimizer_evidence["residency"]["moment"]) == {"cuda:0"} for r in receipts)
    assert torch.equal(torch.get_rng_state(), plain_rng[0]) and torch.equal(torch.cuda.get_rng_state(), plain_rng[1])


# ------------------------------------------------------------------ tampering


def _tamper_copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("gate", [1, 5, 20])
@pytest.mark.parametrize("suffix", ["safetensors", "json", "receipt.json"])
def test_one_changed_byte_is_refused_naming_the_file(
    commissioned: dict, tmp_path: Path, gate: int, suffix: str
) -> None:
    out = _tamper_copy(commissioned["out"], tmp_path)
    target = out / f"milestone_u{gate:08d}.{suffix}"
    _flip_byte(target)
    with pytest.raises(EvidenceError) as info:
        read_commissioning_milestones(_config(), out)
    assert target.name in str(info.value)


def test_deleted_milestone_is_refused(commissioned: dict, tmp_path: Path) -> None:
    out = _tamper_copy(commissioned["out"], tmp_path)
    (out / "milestone_u00000005.receipt.json").unlink()
    with pytest.raises(MissingEvidenceError, match=r"milestone_u00000005\.receipt\.json"):
        read_commissioning_milestones(_config(), out)


def test_edited_context_ids_are_refused(commissioned: dict, tmp_path: Path) -> None:
    with pytest.raises(EvidenceError, match=r"milestone_u00000001\.receipt\.json.*context_ids"):
        read_commissioning_milestones(
            _config(context_ids=CONTEXT[:2] + ("population:train:" + "d" * 64,)), commissioned["out"]
        )
    out = _tamper_copy(commissioned["out"], tmp_path)
    receipt = out / "milestone_u00000020.receipt.json"
    receipt.write_text(receipt.read_text().replace(CONTEXT[0], "recipe:" + "e" * 64))
    with pytest.raises(EvidenceError, match=r"milestone_u00000020\.receipt\.json"):
        read_commissioning_milestones(_config(), out)


def test_undeclared_or_differently_declared_milestones_are_refused(commissioned: dict) -> None:
    with pytest.raises(EvidenceError, match=r"milestone_u00000020\.receipt\.json.*does not declare"):
        read_commissioning_milestones(_config(milestones=(1, 5)), commissioned["out"])
    with pytest.raises(EvidenceError, match=r"milestone_u00000001\.receipt\.json.*engineering_budget"):
        read_commissioning_milestones(_config(milestones=(1, 5, 20, 40)), commissioned["out"])
    with pytest.raises(EvidenceError, match=r"expected_device='cpu'"):
        read_commissioning_milestones(_config(expected_device="cuda"), commissioned["out"])


# ------------------------------------------------------------------ gate failures


class _Poison(Callback):
    """Put a NaN into a live online parameter, its gradient or its AdamW moment when the update count reaches ``at``."""

    def __init__(self, at: int, where: str) -> None:
        self.at, self.where, self.fired = at, where, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.fired and observed_optimizer_updates(trainer.optimizers[0]) == self.at:
            self.fired = True
            param = next(pl_module.online.parameters())
            target = {
                "parameter": param,
                "gradient": param.grad,
                "moment": trainer.optimizers[0].state[param]["exp_avg"],
            }[self.where]
            with torch.no_grad():
                target.view(-1)[0] = float("nan")


@pytest.mark.parametrize(
    ("where", "at", "named"),
    [("parameter", 5, "online."), ("gradient", 5, "grad.online."), ("moment", 4, "optim.0.exp_avg")],
)
def test_nan_fails_the_gate_and_stops_the_fit(tmp_path: Path, where: str, at: int, named: str) -> None:
    out = tmp_path / "m"
    gate = QhCommissioningMilestonesCallback(_config(), out)
    # The poison callback runs before the gate: a parameter or gradient poisoned right after
    # update 5 is seen by the gate at 5; a moment poisoned after update 4 propagates into the
    # parameters at update 5 (the loss of batch 5 is still finite, so the module does not stop).
    with pytest.raises(QhError, match=rf"successful_optimizer_updates=5 failed: .*NaN or Inf: .*{named}") as info:
        _fit([_Poison(at, where), gate])
    assert not isinstance(info.value, QhInputError)
    assert [r.successful_optimizer_updates for r in gate.receipts] == [1]
    assert (out / "milestone_u00000001.receipt.json").is_file()
    assert not list(out.glob("milestone_u00000005*")) and not list(out.glob("milestone_u00000020*"))


def test_fit_ending_before_the_last_milestone_fails_at_fit_end(tmp_path: Path) -> None:
    gate = QhCommissioningMilestonesCallback(_config(milestones=(1, 5, 50)), tmp_path / "m")
    with pytest.raises(
        QhError, match=r"ended at 12 successful optimizer updates; milestones \[50\] were never observed"
    ):
        _fit([gate], max_steps=12)
    assert [r.successful_optimizer_updates for r in gate.receipts] == [1, 5]
    with pytest.raises(MissingEvidenceError, match=r"milestone_u00000050\.receipt\.json"):
        read_commissioning_milestones(_config(milestones=(1, 5, 50)), tmp_path / "m")


def test_setup_refusals(tmp_path: Path) -> None:
    with pytest.raises(QhInputError, match=r"device='cpu' is not allowed; allowed: expected_device='cuda'"):
        _fit([QhCommissioningMilestonesCallback(_config(expected_device="cuda"), tmp_path / "a")])
    assert not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "milestone_u00000005.receipt.json").write_text("{}")
    with pytest.raises(PublishConflictError, match=r"milestone_u00000005\.receipt\.json already exists"):
        _fit([QhCommissioningMilestonesCallback(_config(), tmp_path / "b")])
    with pytest.raises(QhInputError, match="QhMpsMemoryBudgetCallback of the same budget placed before"):
        _fit([QhCommissioningMilestonesCallback(_config(max_allocated_bytes=10**9), tmp_path / "c")])
    with pytest.raises(QhInputError, match=r"config=\{'milestones': \(1,\)\} is not allowed"):
        QhCommissioningMilestonesCallback({"milestones": (1,)}, tmp_path / "d")


# ------------------------------------------------------------------ skipped optimizer steps


class _ScaledModule(QhTDModule):
    """QH module stepping through a real ``torch.amp.GradScaler`` that sees a forced inf on some batches.

    Lightning still runs ``optimizer_step`` (and advances ``global_step``) on those batches;
    the scaler skips ``AdamW.step``, so the optimizer's own step count does not advance.
    """

    skip_batches = frozenset({1, 3, 4, 9})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=10_000)
        self.skipped = 0

    def training_step(self, batch, batch_idx):
        return self.scaler.scale(super().training_step(batch, batch_idx))

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        optimizer_closure()
        inner = optimizer.optimizer
        if batch_idx in self.skip_batches:
            with torch.no_grad():
                next(self.online.parameters()).grad.view(-1)[0] = float("inf")
            self.skipped += 1
        self.scaler.step(inner)
        self.scaler.update()


def test_receipts_sit_at_observed_updates_not_batches_or_global_step(tmp_path: Path) -> None:
    out = tmp_path / "m"
    gate = QhCommissioningMilestonesCallback(_config(milestones=(1, 5, 10)), out)
    module, trainer = _fit([gate], max_steps=40, module_cls=_ScaledModule)
    assert module.skipped == 4 and module.scaler.get_scale() < 1.0  # the scaler really skipped
    assert observed_optimizer_updates(trainer.optimizers[0]) == 10
    assert trainer.global_step == 14  # Lightning counted the skipped steps too
    receipts = read_commissioning_milestones(_config(milestones=(1, 5, 10)), out)
    assert [r.successful_optimizer_updates for r in receipts] == [1, 5, 10]
    # batch 0 -> update 1; batches 1, 3, 4, 9 skipped: update 5 at batch 7, update 10 at batch 13
    assert [r.optimizer_evidence["trainer_global_step_not_used"] for r in receipts] == [1, 8, 14]
    for receipt in receipts:
        _, structure = load_tensor_state(out / receipt.state_filename)
        assert set(structure["steps"].values()) == {receipt.successful_optimizer_updates}


# ------------------------------------------------------------------ MPS memory guard (injected sampler)


def _sampler(values: list[tuple[int, int]]):
    stream = iter(values)
    return lambda: next(stream)


def test_memory_guard_records_sampled_maxima_and_count(tmp_path: Path) -> None:
    samples = [(100 + 10 * (i % 7), 5000 - i) for i in range(20)]
    guard = QhMpsMemoryBudgetCallback.with_sampler(1000, tmp_path / "mem", sampler=_sampler(samples))
    _fit([guard])
    with allow_injected_sampler_evidence():
        observation = read_mps_memory_observation(tmp_path / "mem", max_allocated_bytes=1000)
    assert observation == guard.observation()
    assert observation.sample_count == 20
    assert (observation.current_allocated_bytes, observation.driver_allocated_bytes) == samples[-1]
    assert observation.max_sampled_current_allocated_bytes == 160
    assert observation.max_sampled_driver_allocated_bytes == 5000
    assert observation.within_live_tensor_budget is True
    assert observation.sampling_scope.endswith("injected_sampler")
    with (
        allow_injected_sampler_evidence(),
        pytest.raises(EvidenceError, match=r"mps_memory_observation\.receipt\.json binds max_allocated_bytes=1000"),
    ):
        read_mps_memory_observation(tmp_path / "mem", max_allocated_bytes=2000)
    receipt = tmp_path / "mem" / MPS_MEMORY_RECEIPT
    receipt.chmod(0o644)
    receipt.write_text(receipt.read_text().replace('"sample_count": 20', '"sample_count": 21'))
    with (
        allow_injected_sampler_evidence(),
        pytest.raises(EvidenceError, match=r"mps_memory_observation\.receipt\.json"),
    ):
        read_mps_memory_observation(tmp_path / "mem", max_allocated_bytes=1000)


def test_memory_guard_fails_over_budget_and_records_the_breach(tmp_path: Path) -> None:
    samples = [(100, 200), (900, 950), (1001, 1200)] + [(10, 10)] * 20
    guard = QhMpsMemoryBudgetCallback.with_sampler(1000, tmp_path / "mem", sampler=_sampler(samples))
    with pytest.raises(QhError, match=r"current_allocated_bytes=1001 exceeds max_allocated_bytes=1000 at sample 3"):
        _fit([guard])
    assert guard.sample_count == 3
    observation = guard.observation()
    assert observation.within_live_tensor_budget is False and observation.max_sampled_driver_allocated_bytes == 1200
    with (
        allow_injected_sampler_evidence(),
        pytest.raises(EvidenceError, match=r"mps_memory_observation\.receipt\.json records a sampled live-tensor"),
    ):
        read_mps_memory_observation(tmp_path / "mem", max_allocated_bytes=1000)


def test_memory_guard_refuses_a_non_mps_run_at_setup(tmp_path: Path) -> None:
    with pytest.raises(QhInputError, match=r"QhMpsMemoryBudgetCallback: device='cpu' is not allowed; allowed: mps"):
        _fit([QhMpsMemoryBudgetCallback(1000, tmp_path / "mem")])
    assert not (tmp_path / "mem").exists()
    with pytest.raises(QhInputError, match="max_allocated_bytes=0 is not allowed"):
        QhMpsMemoryBudgetCallback(0, tmp_path)


def test_milestone_receipts_carry_the_memory_observation(tmp_path: Path) -> None:
    budget = 10**9
    samples = [(1000 + i, 2000 + i) for i in range(20)]
    guard = QhMpsMemoryBudgetCallback.with_sampler(budget, tmp_path / "m", sampler=_sampler(samples))
    config = _config(max_allocated_bytes=budget)
    _fit([guard, QhCommissioningMilestonesCallback(config, tmp_path / "m")])
    # Both readers refuse an injected sampler's evidence outside the test-only context.
    injected = r"sampling_scope='callback_instance_train_batch_end:injected_sampler' is not allowed"
    with pytest.raises(EvidenceError, match=r"mps_memory_observation\.receipt\.json: " + injected):
        read_mps_memory_observation(tmp_path / "m", max_allocated_bytes=budget)
    with pytest.raises(EvidenceError, match=r"milestone_u00000001\.receipt\.json: " + injected):
        read_commissioning_milestones(config, tmp_path / "m")
    with allow_injected_sampler_evidence():
        receipts = read_commissioning_milestones(config, tmp_path / "m")
        assert read_mps_memory_observation(tmp_path / "m", max_allocated_bytes=budget).sample_count == 20
    assert [r.memory_observation.sample_count for r in receipts] == [1, 5, 20]
    assert [r.memory_observation.current_allocated_bytes for r in receipts] == [1000, 1004, 1019]
    with pytest.raises(EvidenceError, match=r"milestone_u00000001\.receipt\.json: engineering_budget"):
        read_commissioning_milestones(_config(), tmp_path / "m")
    # The context ends with its block: outside it the reader refuses again.
    with pytest.raises(EvidenceError, match=injected):
        read_mps_memory_observation(tmp_path / "m", max_allocated_bytes=budget)


def test_observation_record_refuses_inconsistent_values() -> None:
    good = dict(
        sampling_scope="callback_instance_train_batch_end:torch.mps",
        sample_count=2,
        current_allocated_bytes=5,
        driver_allocated_bytes=7,
        max_sampled_current_allocated_bytes=6,
        max_sampled_driver_allocated_bytes=7,
        max_allocated_bytes=10,
        within_live_tensor_budget=True,
    )
    assert QhMpsMemoryObservation(**good).schema_version == 1
    for bad, text in (
        ({"sample_count": 0}, "sample_count=0"),
        ({"current_allocated_bytes": 9}, "current_allocated_bytes exceeds"),
        ({"within_live_tensor_budget": False}, "within_live_tensor_budget=False disagrees"),
        ({"sampling_scope": "peak"}, "sampling_scope='peak'"),
    ):
        with pytest.raises(QhInputError, match=text):
            QhMpsMemoryObservation(**{**good, **bad})


# ------------------------------------------------------------------ `qhlab commission` end to end (slow)


@pytest.fixture(scope="module")
def tiny_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qhlab.scenes import generate_population

    return generate_population("tiny", "train", 0, tmp_path_factory.mktemp("tiny") / "train-0", workers=1)


def _commission(tiny_train: Path, out: Path, *extra: str, milestones: str = "1,5,20") -> int:
    from qhlab.cli import main

    return main(
        [
            "commission",
            str(TINY_RECIPE),
            "--profile",
            "cpu-fp32",
            "--milestones",
            milestones,
            "--output",
            str(out),
            "--train",
            str(tiny_train),
            "--no-progress",
            *extra,
        ]
    )


def _cli_config(out: Path) -> QhCommissioningMilestonesConfig:
    import json

    body = json.loads((out / "commission.receipt.json").read_text())["body"]
    return QhCommissioningMilestonesConfig(
        milestones=tuple(body["milestones"]),
        expected_device=body["expected_device"],
        max_allocated_bytes=body["max_allocated_bytes"],
        context_ids=tuple(body["context_ids"]),
    )


@pytest.mark.slow
def test_cli_commission_writes_three_gates_that_verify(tiny_train: Path, tmp_path: Path, capsys) -> None:
    import json

    from qhlab.cli import main
    from qhlab.evidence import read_receipt, sha256_file, source_package_digest

    out = tmp_path / "commission"
    assert _commission(tiny_train, out) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [m["successful_optimizer_updates"] for m in printed["milestones"]] == [1, 5, 20]
    assert printed["observed_updates"] == 20
    assert sorted(p.name for p in out.glob("milestone_u*.receipt.json")) == [
        "milestone_u00000001.receipt.json",
        "milestone_u00000005.receipt.json",
        "milestone_u00000020.receipt.json",
    ]
    assert len(list(out.glob("milestone_u*.safetensors"))) == 3
    config = _cli_config(out)
    receipts = read_commissioning_milestones(config, out)
    assert [r.successful_optimizer_updates for r in receipts] == [1, 5, 20]
    ids = dict(i.split(":", 1) for i in config.context_ids)
    assert ids["source_package_sha256"] == source_package_digest()["sha256"]
    assert ids["train_population_manifest_sha256"] == sha256_file(tiny_train / "manifest.json")
    assert ids["engineering_updates"] == "20(replaces recipe updates 40)"
    closing = read_receipt(out / "commission.receipt.json", CommissioningRunReceipt).record()
    fit = read_receipt(printed["fit_receipt"], FitReceipt).record()
    assert fit["body"]["observed_updates"] == 20 and fit["body"]["recipe_digest"] == ids["engineering_recipe_sha256"]
    assert closing["body"]["recipe_updates"] == 40 and closing["body"]["engineering_updates"] == 20
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    # a changed byte in a state file: read-back and `qhlab verify` both refuse, naming the file
    state = out / "milestone_u00000005.safetensors"
    state.chmod(0o644)
    _flip_byte(state, offset=len(state.read_bytes()) - 3)
    with pytest.raises(EvidenceError, match=r"milestone_u00000005\.safetensors"):
        read_commissioning_milestones(config, out)
    assert main(["verify", str(out)]) == 2
    assert "milestone_u00000005.safetensors" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("milestones", "text"),
    [("1,5,5", "milestones=(1, 5, 5)"), ("1,x", "--milestones='1,x'"), ("0,3", "milestones=(0, 3)")],
)
def test_cli_refuses_bad_milestones_and_writes_nothing(
    tiny_train: Path, tmp_path: Path, capsys, milestones: str, text: str
) -> None:
    out = tmp_path / "commission"
    assert _commission(tiny_train, out, milestones=milestones) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and text in err and "HINT" in err
    assert not out.exists()


@pytest.mark.slow
def test_cli_refuses_memory_budget_on_a_cpu_lane(tiny_train: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "commission"
    assert _commission(tiny_train, out, "--max-allocated-bytes", "1000000") == 2
    assert (
        "max_allocated_bytes=1000000 is not allowed; allowed: None with profile 'cpu-fp32'" in capsys.readouterr().err
    )
    assert not out.exists()


@pytest.mark.slow
def test_fit_recipe_with_and_without_gates_is_bit_identical(tiny_train: Path, tmp_path: Path) -> None:
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    config = _config(milestones=(1, 5, 40))  # the last milestone is the recipe's budget here
    gated = fit_recipe(
        FitRequest(
            recipe=load_recipe(TINY_RECIPE),
            profile="cpu-fp32",
            output=tmp_path / "a",
            train=tiny_train,
            evaluate=False,
            progress=False,
            extra_callbacks=[QhCommissioningMilestonesCallback(config, tmp_path / "m")],
        )
    )
    plain = fit_recipe(
        FitRequest(
            recipe=load_recipe(TINY_RECIPE),
            profile="cpu-fp32",
            output=tmp_path / "b",
            train=tiny_train,
            evaluate=False,
            progress=False,
        )
    )
    assert gated.observed_updates == plain.observed_updates == 40
    assert gated.final_state_sha256 == plain.final_state_sha256
    assert len(read_commissioning_milestones(config, tmp_path / "m")) == 3


def test_a_recipe_with_averaged_weights_is_gated_and_reloaded_with_them(tmp_path: Path) -> None:
    averaged = QhRecipe.model_validate({**RECIPE.model_dump(), "evaluation": {"average_decay": 0.5}})

    class Averaged(QhTDModule):
        def __init__(self, recipe, dims):
            super().__init__(averaged, dims)

    gate = QhCommissioningMilestonesCallback(_config(milestones=(1, 5)), tmp_path / "milestones")
    module, _ = _fit([gate], max_steps=5, module_cls=Averaged)
    assert module.average is not None
    for receipt in read_commissioning_milestones(_config(milestones=(1, 5)), tmp_path / "milestones"):
        assert receipt.strict_reload is True
        assert receipt.optimizer_evidence["residency"]["average"] == ["cpu"]
        tensors, _ = load_tensor_state(tmp_path / "milestones" / receipt.state_filename)
        assert {k.split(".")[0] for k in tensors} == {"online", "target", "average", "grad", "optim"}
