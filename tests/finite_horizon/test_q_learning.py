"""TD learning rule: hand-checked targets and losses, target refresh, data batches, short fits.

The population here is a synthetic-but-valid shim with the tensor fields of the
`Population` contract (docs/ARCHITECTURE.md), so these tests do not depend on the scene
generator; the end-to-end path over real populations is tested by the fit launcher.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch

from qhlab.evidence import QhError, QhInputError
from qhlab.finite_horizon.batches import BATCH_KEYS, QhPopulationDataModule, population_dims
from qhlab.finite_horizon.predict import predict_q
from qhlab.finite_horizon.q_learning import (
    QhTDModule,
    bootstrapped_targets,
    hard_target_update,
    native_huber_loss,
    polyak_target_update,
    refresh_target,
    successor_bootstrap,
    successor_label_loss,
    successor_reward_loss,
    target_table_bytes,
    td_targets,
)
from qhlab.finite_horizon.recipe import HardTargetUpdate, PolyakTargetUpdate, QhRecipe
from qhlab.finite_horizon.scorer import scorer_members
from qhlab.training.optimizer_state import observed_optimizer_updates
from synthetic_population import SyntheticPopulation, synthetic_population
from tiny_recipe import TINY_RECIPE

INF = float("inf")


# ----------------------------------------------------------------- pure TD functions


def test_td_targets_by_hand() -> None:
    reward = torch.tensor([[1.0, 2.0, -0.5]])  # [B=1, K=3]
    # next_q [1, 3, K'=3, H=3]; horizon index 2 (Q_3) is never read for H=3
    next_q = torch.tensor(
        [
            [
                [[0.5, 9.0, 99.0], [0.7, -1.0, 99.0], [100.0, 100.0, 100.0]],  # a'=2 masked below
                [[-3.0, -2.0, 0.0], [-1.0, -4.0, 0.0], [-2.0, -5.0, 0.0]],
                [[5.0, 5.0, 5.0], [5.0, 5.0, 5.0], [5.0, 5.0, 5.0]],  # invalid successor
            ]
        ]
    )
    next_mask = torch.tensor([[[True, True, False], [True, True, True], [True, True, True]]])
    valid = torch.tensor([[True, True, False]])
    y = td_targets(reward, next_q, next_mask, valid, horizon=3)
    expected = torch.tensor(
        [
            [
                [1.0, 1.0 + 0.7, 1.0 + 9.0],  # max over a' in {0, 1}; the masked 100 is ignored
                [2.0, 2.0 - 1.0, 2.0 - 2.0],
                [-0.5, -0.5, -0.5],  # no successor (padded/synthetic input only): y_h = r
            ]
        ]
    )
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_td_targets_masked_never_the_max_even_when_all_negative() -> None:
    reward = torch.zeros(1, 1)
    next_q = torch.tensor([[[[-5.0], [-7.0], [0.0]]]])  # [1, 1, 3, 1]; the 0.0 slot is padding
    mask = torch.tensor([[[True, True, False]]])
    y = td_targets(reward, next_q, mask, torch.tensor([[True]]), horizon=2)
    torch.testing.assert_close(y, torch.tensor([[[0.0, -5.0]]]))
    # a successor with no valid candidate bootstraps nothing (and yields no -inf)
    y = td_targets(reward, next_q, torch.zeros_like(mask), torch.tensor([[True]]), horizon=2)
    torch.testing.assert_close(y, torch.tensor([[[0.0, 0.0]]]))


def test_td_targets_horizon_one_is_reward_and_bad_args_refused() -> None:
    reward = torch.tensor([[0.25, -1.0]])
    next_q = torch.full((1, 2, 2, 1), 50.0)
    y = td_targets(reward, next_q, torch.ones(1, 2, 2, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool), 1)
    torch.testing.assert_close(y, reward.unsqueeze(-1))
    with pytest.raises(ValueError, match="horizon"):
        td_targets(reward, next_q, torch.ones(1, 2, 2, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool), 3)


def test_native_huber_loss_by_hand() -> None:
    delta = 0.5
    q = torch.tensor([[[0.1, 1.0], [2.0, 0.0], [9.0, 9.0]]])  # [1, 3, 2]
    y = torch.tensor([[[0.0, 0.0], [0.0, -0.3], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # candidate 0: 0.5*0.1^2 + 0.5*(1.0-0.25) = 0.005 + 0.375; candidate 1: 0.5*(2-0.25) + 0.5*0.3^2
    c0 = 0.5 * 0.01 + 0.5 * (1.0 - 0.25)
    c1 = 0.5 * (2.0 - 0.25) + 0.5 * 0.09
    loss = native_huber_loss(q, y, mask, delta)
    assert loss.item() == pytest.approx((c0 + c1) / 2, abs=1e-7)
    assert native_huber_loss(q, y, torch.zeros_like(mask), delta).item() == 0.0


def test_successor_reward_loss_is_native_huber_of_q1_against_reward() -> None:
    delta = 0.5
    next_q = torch.tensor([[[0.1, 7.0], [2.0, -7.0], [9.0, 9.0]]])  # [M=1, K'=3, H=2]
    next_reward = torch.tensor([[0.0, 0.2, 5.0]])
    mask = torch.tensor([[True, True, False]])
    # only horizon 1 is read: 0.5*0.1^2 and 0.5*(1.8-0.25); the masked candidate adds nothing
    want = (0.5 * 0.01 + 0.5 * (1.8 - 0.25)) / 2
    assert successor_reward_loss(next_q, next_reward, mask, delta).item() == pytest.approx(want, abs=1e-7)
    assert successor_reward_loss(next_q, next_reward, torch.zeros_like(mask), delta).item() == 0.0


def test_successor_label_loss_is_native_huber_of_heads_1_to_h_minus_1() -> None:
    delta = 0.5
    next_q = torch.tensor([[[0.1, 0.3, 7.0], [2.0, 0.0, -7.0], [9.0, 9.0, 9.0]]])  # [M=1, K'=3, H=3]
    labels = torch.tensor([[[0.0, 0.0, 0.0], [0.2, 1.0, 5.0], [0.0, 0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # horizons 1..2 only (H=3 is the parent's horizon, never a successor's label); per
    # candidate the horizons are summed: c0 = 0.5*0.1^2 + 0.5*0.3^2, c1 = 0.5*(1.8-0.25) + 0.5*(1-0.25)
    c0 = 0.5 * 0.01 + 0.5 * 0.09
    c1 = 0.5 * (1.8 - 0.25) + 0.5 * (1.0 - 0.25)
    assert successor_label_loss(next_q, labels, mask, delta).item() == pytest.approx((c0 + c1) / 2, abs=1e-6)
    assert successor_label_loss(next_q[..., :1], labels[..., :1], mask, delta).item() == 0.0  # H = 1


def test_target_refresh_rules() -> None:
    online, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = [p.clone() for p in target.parameters()]
    hard = HardTargetUpdate(kind="hard", interval=5)
    assert refresh_target(target, online, hard, 0, 4) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))
    assert refresh_target(target, online, hard, 4, 4) == 0  # skipped AMP step: nothing observed
    assert refresh_target(target, online, hard, 4, 5) == 1
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), target.parameters()))

    target2 = torch.nn.Linear(2, 2)
    start = [p.clone() for p in target2.parameters()]
    polyak_target_update(target2, online, 0.25)
    for s, o, t in zip(start, online.parameters(), target2.parameters()):
        torch.testing.assert_close(t, 0.75 * s + 0.25 * o)
    assert refresh_target(target2, online, PolyakTargetUpdate(kind="polyak", tau=1.0), 3, 5) == 2
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), target2.parameters()))
    hard_target_update(target2, torch.nn.Linear(2, 2))


# ------------------------------------------------------- fits on a synthetic population


def _recipe(**update) -> QhRecipe:
    raw = {
        "name": "t",
        "seed": 7,
        "horizon": 2,
        "batch_size": 8,
        "huber_delta": 0.05,
        "updates": 20,
        "architecture": {"arm": "baseline", "encoder": {"width": 16, "heads": 2}},
        "optimizer": {"lr": 3e-3},
        "target_update": {"kind": "hard", "interval": 100},
    }
    raw.update(update)
    return QhRecipe.model_validate(raw)


# ------------------------------------------------------------------------ data module


def test_batches_gather_rows_and_successors() -> None:
    pop = synthetic_population()
    dm = QhPopulationDataModule(pop, batch_size=5, seed=1)
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == set(BATCH_KEYS)
    rows = batch["rows"]
    assert rows.shape == (5,) and pop.is_chain[rows].all()
    torch.testing.assert_close(batch["objects"], pop.objects[rows])
    torch.testing.assert_close(batch["reward"], pop.reward[rows])
    succ = pop.successor[rows]
    assert torch.equal(batch["successor_valid"], succ >= 0)
    assert batch["next_objects"].shape == (5, 4, 3, 4)
    assert batch["next_candidates"].shape == (5, 4, 4, 3)
    for b in range(5):
        for k in range(4):
            if succ[b, k] >= 0:
                torch.testing.assert_close(batch["next_objects"][b, k], pop.objects[succ[b, k]])
                assert torch.equal(batch["next_candidate_mask"][b, k], pop.candidate_mask[succ[b, k]])
            else:
                assert not batch["next_candidate_mask"][b, k].any()
            torch.testing.assert_close(batch["next_reward"][b, k], pop.reward[succ[b, k].clamp_min(0)])


def test_batch_stream_is_seeded_covers_passes_and_resumes() -> None:
    pop = synthetic_population(n_chain=6)
    take = lambda dm, n: [b["rows"] for _, b in zip(range(n), dm.train_dataloader())]  # noqa: E731
    first = take(QhPopulationDataModule(pop, batch_size=4, seed=3), 6)
    again = take(QhPopulationDataModule(pop, batch_size=4, seed=3), 6)
    other = take(QhPopulationDataModule(pop, batch_size=4, seed=4), 6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    stream = torch.cat(first)  # 24 rows = 4 passes over 6 chain rows, each pass a permutation
    for p in range(4):
        assert sorted(stream[6 * p : 6 * p + 6].tolist()) == list(range(6))
    resumed = take(QhPopulationDataModule(pop, batch_size=4, seed=3, start_batch=2), 4)
    assert all(torch.equal(a, b) for a, b in zip(first[2:], resumed))
    # a single row (the canary case) fills a batch by repetition
    canary = take(QhPopulationDataModule(pop, batch_size=8, seed=0, rows=torch.tensor([2])), 1)[0]
    assert canary.tolist() == [2] * 8


def test_data_module_refuses_bad_arguments() -> None:
    pop = synthetic_population()
    with pytest.raises(QhInputError, match="batch_size=0"):
        QhPopulationDataModule(pop, batch_size=0, seed=0)
    with pytest.raises(QhInputError, match=r"rows=\[7\]"):
        QhPopulationDataModule(pop, batch_size=2, seed=0, rows=torch.tensor([1, 7]))
    with pytest.raises(QhInputError, match="dims.horizon=2"):
        QhTDModule(_recipe(horizon=3), population_dims(pop))


# ------------------------------------------------------------------------------ fits


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models on a shared 2-core machine: intra-op threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fit(
    recipe: QhRecipe,
    pop: SyntheticPopulation,
    steps: int,
    log_every: int = 50,
    *,
    cache: bool = True,
    callbacks: tuple[pl.Callback, ...] = (),
) -> tuple[QhTDModule, pl.Trainer]:
    pl.seed_everything(recipe.seed, workers=True, verbose=False)
    module = QhTDModule(recipe, population_dims(pop), cache_target_values=cache)
    dm = QhPopulationDataModule(pop, batch_size=recipe.batch_size, seed=recipe.seed)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        deterministic=True,
        log_every_n_steps=log_every,
        callbacks=list(callbacks),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, datamodule=dm)
    return module, trainer


def _fixed_loss(module: QhTDModule, pop: SyntheticPopulation) -> float:
    dm = QhPopulationDataModule(pop, batch_size=1, seed=0)
    batch = dm.gather(dm.chain_rows)
    with torch.no_grad():
        y = module.td_target(batch)
        return native_huber_loss(module(batch), y, batch["candidate_mask"], module.recipe.huber_delta).item()


def test_short_fit_reduces_loss_and_counts_updates_from_optimizer() -> None:
    pop = synthetic_population()
    recipe = _recipe()
    pl.seed_everything(recipe.seed, verbose=False)
    before = _fixed_loss(QhTDModule(recipe, population_dims(pop)), pop)
    module, trainer = _fit(recipe, pop, 20, log_every=4)
    after = _fixed_loss(module, pop)
    logged = trainer.callback_metrics["train/loss"]
    assert torch.isfinite(logged) and logged.item() > 0
    assert after < 0.5 * before, (before, after)
    assert observed_optimizer_updates(trainer.optimizers[0]) == 20
    assert module.observed_updates == 20
    assert module.target_refreshes == 0  # interval 100 never crossed
    assert not module.target.training and all(not p.requires_grad for p in module.target.parameters())
    assert {n.split(".")[0] for n, _ in module.state_dict().items()} == {"online", "target"}
    fresh = module.build_scorer()
    fresh.load_state_dict(module.online.state_dict(), strict=True)


def test_hard_target_refresh_follows_observed_updates() -> None:
    pop = synthetic_population()
    module, _ = _fit(_recipe(target_update={"kind": "hard", "interval": 5}), pop, 20)
    assert module.target_refreshes == 4
    for a, b in zip(module.online.parameters(), module.target.parameters()):
        assert torch.equal(a, b)
    module, _ = _fit(_recipe(target_update={"kind": "hard", "interval": 6}), pop, 20)
    assert module.target_refreshes == 3  # after updates 6, 12, 18: target lags online
    assert not all(torch.equal(a, b) for a, b in zip(module.online.parameters(), module.target.parameters()))


def test_successor_reward_rows_add_the_q1_reward_loss_of_the_first_rows() -> None:
    pop = synthetic_population()
    recipe = _recipe(successor_reward_rows=2)
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    batch = QhPopulationDataModule(pop, batch_size=5, seed=1).gather(torch.tensor([0, 1, 2, 3, 4]))
    chain = native_huber_loss(module(batch), module.td_target(batch), batch["candidate_mask"], 0.05)
    rows = pop.successor[:2].flatten()  # the first 2 chain rows' successor states, in order
    valid = rows >= 0
    q1 = module.online(
        *(
            getattr(pop, n)[rows.clamp_min(0)]
            for n in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")
        )
    )[..., :1]
    mask = pop.candidate_mask[rows.clamp_min(0)] & valid.unsqueeze(-1)
    extra = native_huber_loss(q1, pop.reward[rows.clamp_min(0)].unsqueeze(-1), mask, 0.05)
    got = module.training_step(batch, 0)
    torch.testing.assert_close(got, chain + extra)
    assert extra.item() > 0
    plain = QhTDModule(_recipe(), population_dims(pop))
    plain.load_state_dict(module.state_dict())
    torch.testing.assert_close(plain.training_step(batch, 0), chain)
    with pytest.raises(Exception, match="successor_reward_rows"):
        _recipe(successor_reward_rows=-1)
    module, _ = _fit(recipe, pop, 6)  # a real fit with the extra term runs and counts updates
    assert module.observed_updates == 6


def test_successor_label_rows_anchor_the_successors_of_the_first_rows_to_their_labels() -> None:
    pop = synthetic_population()
    recipe = _recipe(successor_label_rows=2)
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    plain_batch = QhPopulationDataModule(pop, batch_size=5, seed=1).gather(torch.tensor([0, 1, 2, 3, 4]))
    with pytest.raises(QhInputError, match="successor_label_rows=2 is not allowed.*successor_labels=True"):
        module.training_step(plain_batch, 0)
    batch = QhPopulationDataModule(pop, batch_size=5, seed=1, successor_labels=True).gather(
        torch.tensor([0, 1, 2, 3, 4])
    )
    assert set(batch) == set(BATCH_KEYS) | {"next_labels"}
    succ = pop.successor[:5]
    torch.testing.assert_close(batch["next_labels"], pop.q[succ.clamp_min(0)])
    chain = native_huber_loss(module(batch), module.td_target(batch), batch["candidate_mask"], 0.05)
    rows = pop.successor[:2].flatten()
    valid = rows >= 0
    q = module.online(
        *(
            getattr(pop, n)[rows.clamp_min(0)]
            for n in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")
        )
    )
    mask = pop.candidate_mask[rows.clamp_min(0)] & valid.unsqueeze(-1)
    extra = native_huber_loss(q[..., :1], pop.q[rows.clamp_min(0)][..., :1], mask, 0.05)  # H=2: head 1 only
    assert extra.item() > 0
    torch.testing.assert_close(module.training_step(batch, 0), chain + extra)


def test_polyak_refresh_runs_every_update() -> None:
    pop = synthetic_population()
    module, _ = _fit(_recipe(target_update={"kind": "polyak", "tau": 0.1}), pop, 10)
    assert module.target_refreshes == 10


def test_two_fits_with_same_seed_are_bit_identical() -> None:
    pop = synthetic_population()
    recipe = _recipe(
        architecture={"arm": "variant_cross_attention", "encoder": {"width": 16, "heads": 2}},
        target_update={"kind": "hard", "interval": 7},
    )
    a, ta = _fit(recipe, pop, 12)
    b, tb = _fit(recipe, pop, 12)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = ta.optimizers[0].state_dict()["state"], tb.optimizers[0].state_dict()["state"]
    assert all(torch.equal(oa[i]["exp_avg_sq"], ob[i]["exp_avg_sq"]) for i in oa)
    c, _ = _fit(recipe.model_copy(update={"seed": 8}), pop, 12)
    assert not torch.equal(c.state_dict()["online.readout.mlp.2.weight"], sa["online.readout.mlp.2.weight"])


def _per_tensor_polyak(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t_param, o_param in zip(target.parameters(), online.parameters(), strict=True):
            t_param.lerp_(o_param, tau)
        for t_buf, o_buf in zip(target.buffers(), online.buffers(), strict=True):
            t_buf.copy_(o_buf)


def test_multi_tensor_adamw_and_polyak_are_bit_identical_to_the_per_tensor_loops(monkeypatch) -> None:
    """The step's multi-tensor AdamW and Polyak refresh change no bit of a fit: the same final
    online, target and averaged weights and AdamW moments as torch's per-tensor loops."""
    from qhlab.finite_horizon import q_learning

    pop = synthetic_population()
    recipe = _recipe(
        ensemble_members=2,
        successor_reward_rows=2,
        target_update={"kind": "polyak", "tau": 0.3},
        optimizer={"lr": 3e-3, "weight_decay": 0.01, "schedule": "cosine"},
        evaluation={"tie_band": 0.001, "average_decay": 0.6},
        updates=15,
    )
    fast, fast_trainer = _fit(recipe, pop, 15)
    assert fast_trainer.optimizers[0].defaults["foreach"] is True
    monkeypatch.setattr(q_learning, "ADAMW_FOREACH", False)
    monkeypatch.setattr(q_learning, "polyak_target_update", _per_tensor_polyak)
    slow, slow_trainer = _fit(recipe, pop, 15)
    assert slow_trainer.optimizers[0].defaults["foreach"] is False
    a, b = fast.state_dict(), slow.state_dict()
    assert a.keys() == b.keys() and {k.split(".")[0] for k in a} == {"online", "target", "average"}
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    oa, ob = (t.optimizers[0].state_dict()["state"] for t in (fast_trainer, slow_trainer))
    assert all(torch.equal(oa[i][m], ob[i][m]) for i in oa for m in ("exp_avg", "exp_avg_sq", "step"))
    # The refresh really averaged: the target and the average lag the online weights.
    online = [k for k in a if k.startswith("online.")]
    for copy in ("target", "average"):
        assert not all(torch.equal(a[k], a[copy + k[len("online") :]]) for k in online), copy


def test_polyak_refuses_scorers_of_different_shapes() -> None:
    pop = synthetic_population()
    small = QhTDModule(_recipe(), population_dims(pop))
    wide = QhTDModule(_recipe(ensemble_members=2), population_dims(pop))
    with pytest.raises(ValueError, match="polyak_target_update: target has"):
        polyak_target_update(small.target, wide.online, 0.1)


def test_predict_q_matches_direct_forward_on_chain_rows() -> None:
    pop = synthetic_population()
    pl.seed_everything(0, verbose=False)
    module = QhTDModule(_recipe(), population_dims(pop))
    pred = predict_q(module.online, pop, batch_size=4)
    rows = pop.is_chain.nonzero().flatten()
    with torch.no_grad():
        direct = module.online(
            pop.objects[rows],
            pop.object_mask[rows],
            pop.goal[rows],
            pop.candidates[rows],
            pop.candidate_object[rows],
            pop.candidate_mask[rows],
        )
    assert pred.shape == (6, 4, 2) and not pred.requires_grad
    torch.testing.assert_close(pred, direct, rtol=1e-5, atol=1e-6)
    every = predict_q(module.online, pop, rows=torch.arange(pop.objects.shape[0]), batch_size=7)
    assert every.shape == (pop.objects.shape[0], 4, 2)


# ------------------------------------------------------------- real tiny population


@pytest.fixture(scope="module")
def tiny_train(tmp_path_factory):
    from qhlab.finite_horizon.data import load_population
    from qhlab.scenes.population import generate_population

    path = generate_population("tiny", "train", 0, tmp_path_factory.mktemp("qh") / "tiny-train", workers=1)
    return load_population(path, split="train", horizon=2)


def test_td_targets_on_exact_successor_labels_reproduce_exact_labels(tiny_train) -> None:
    """With Q- = Q* the TD target is the Bellman recursion the labels were built with."""
    pop = tiny_train
    dm = QhPopulationDataModule(pop, batch_size=1, seed=0)
    batch = dm.gather(dm.chain_rows)
    next_q = pop.q.index_select(0, pop.successor[dm.chain_rows].clamp_min(0).flatten())
    next_q = next_q.view(*batch["reward"].shape, *next_q.shape[1:])
    y = td_targets(batch["reward"], next_q, batch["next_candidate_mask"], batch["successor_valid"], pop.horizon)
    mask = batch["candidate_mask"]
    torch.testing.assert_close(y[mask], pop.q[dm.chain_rows][mask], rtol=0, atol=1e-6)
    # and a wrong bootstrap (ignoring the successor) does not
    assert not torch.allclose(batch["reward"][mask], pop.q[dm.chain_rows][mask][:, 1], atol=1e-6)


def test_example_recipes_match_presets_and_tiny_recipe_fits(tiny_train) -> None:
    from qhlab.design.config_files import load_recipe
    from qhlab.scenes import load_preset

    tiny = load_recipe(TINY_RECIPE)
    assert tiny.horizon == load_preset("tiny").horizon
    assert load_recipe(TINY_RECIPE.parent / "demo-recipe.toml").horizon == load_preset("demo-train").horizon
    pl.seed_everything(tiny.seed, verbose=False)
    before = _fixed_loss(QhTDModule(tiny, population_dims(tiny_train)), tiny_train)
    module, trainer = _fit(tiny, tiny_train, tiny.updates)
    assert observed_optimizer_updates(trainer.optimizers[0]) == tiny.updates
    assert module.target_refreshes == tiny.updates // tiny.target_update.interval
    assert _fixed_loss(module, tiny_train) < before


def test_cosine_schedule_by_hand_and_in_a_fit() -> None:
    from qhlab.finite_horizon.q_learning import scheduled_lr

    assert scheduled_lr(1e-3, 0, 10) == 1e-3
    assert scheduled_lr(1e-3, 5, 10) == pytest.approx(5e-4)
    assert scheduled_lr(1e-3, 10, 10) == pytest.approx(0.0, abs=1e-18)
    pop = synthetic_population()
    recipe = _recipe(optimizer={"lr": 3e-3, "schedule": "cosine"}, updates=8)
    seen = []

    class Spy(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            seen.append(optimizer.param_groups[0]["lr"])

    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    trainer = pl.Trainer(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[Spy()],
    )
    trainer.fit(module, datamodule=QhPopulationDataModule(pop, batch_size=recipe.batch_size, seed=recipe.seed))
    # Each update's rate is the schedule at the updates observed before it: 3e-3 first, decaying to ~0.
    assert seen == pytest.approx([scheduled_lr(3e-3, u, 8) for u in range(8)])


def test_gradient_clipping_bounds_the_gradient_norm_of_every_update() -> None:
    pop = synthetic_population()
    norms = []

    class Spy(pl.Callback):
        # Lightning clips after on_before_optimizer_step, inside the step: look after the step.
        def on_train_start(self, trainer, pl_module):
            def record(optimizer, args, kwargs):
                grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

            trainer.optimizers[0].register_step_post_hook(record)

    for clip, check in ((1e-3, lambda n: n <= 1e-3 * (1 + 1e-4)), (None, lambda n: n > 1e-3)):
        norms.clear()
        recipe = _recipe(optimizer={"lr": 3e-3, "grad_clip_norm": clip})
        pl.seed_everything(recipe.seed, verbose=False)
        trainer = pl.Trainer(
            max_steps=4,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=False,
            callbacks=[Spy()],
        )
        trainer.fit(
            QhTDModule(recipe, population_dims(pop)),
            datamodule=QhPopulationDataModule(pop, batch_size=recipe.batch_size, seed=recipe.seed),
        )
        assert len(norms) == 4 and all(check(n) for n in norms), (clip, norms)


def test_averaged_evaluation_weights_follow_the_polyak_rule_by_hand() -> None:
    pop = synthetic_population()
    plain = QhTDModule(_recipe(), population_dims(pop))
    assert plain.average is None and plain.evaluated is plain.online
    assert not any(k.startswith("average.") for k in plain.state_dict())
    recipe = _recipe(evaluation={"average_decay": 0.1}, updates=6)
    online_after = []

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            online_after.append({k: v.detach().clone() for k, v in pl_module.online.state_dict().items()})

    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    cold = {k: v.detach().clone() for k, v in module.online.state_dict().items()}
    assert module.evaluated is module.average and not any(p.requires_grad for p in module.average.parameters())
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[Spy()],
    )
    trainer.fit(module, datamodule=QhPopulationDataModule(pop, batch_size=recipe.batch_size, seed=recipe.seed))
    # Each record is online after one observed update (the module's batch-end hook never changes
    # online weights, so the order of the two hooks does not matter).
    assert len(online_after) == 6 and module.observed_updates == 6
    expected = cold
    for online in online_after:
        expected = {k: expected[k] + 0.9 * (online[k] - expected[k]) for k in expected}
    average, online = module.average.state_dict(), module.online.state_dict()
    for name, tensor in average.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-7)
    assert all(
        not torch.equal(average[k], online[k])
        for k in online
        if online[k].is_floating_point() and not torch.equal(cold[k], online[k])
    )
    assert {k.split(".")[0] for k in module.state_dict()} == {"online", "target", "average"}


@pytest.mark.parametrize(
    ("decay", "updates", "message"),
    [
        (0.0, 20, "average_decay"),
        (1.0, 20, "average_decay"),
        (-0.5, 20, "average_decay"),
        # a window the budget cannot flush: the cold initialization would weigh 0.9^20 = 0.12
        (
            0.9,
            20,
            r"evaluation.average_decay=0.9 with updates=20 is not allowed; allowed: updates x \(1 - "
            r"average_decay\) >= 5 \(here 2\)",
        ),
    ],
)
def test_average_decay_outside_its_bounds_is_refused(decay, updates, message) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        _recipe(evaluation={"average_decay": decay}, updates=updates)
    assert _recipe(evaluation={"average_decay": 0.75}, updates=20).evaluation.average_decay == 0.75


def test_averaging_never_feeds_back_into_the_online_weights() -> None:
    from qhlab.design.canary import canary_recipe

    pop = synthetic_population()
    finals = []
    for evaluation in ({}, {"average_decay": 0.1}):
        recipe = _recipe(evaluation=evaluation, updates=6, target_update={"kind": "polyak", "tau": 0.1})
        pl.seed_everything(recipe.seed, verbose=False)
        module = QhTDModule(recipe, population_dims(pop))
        trainer = pl.Trainer(
            max_steps=6,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=False,
        )
        trainer.fit(module, datamodule=QhPopulationDataModule(pop, batch_size=recipe.batch_size, seed=recipe.seed))
        finals.append({k: v for k, v in module.state_dict().items() if not k.startswith("average.")})
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    # so the E0 canary, which checks the learner, reads the online weights of the same trajectory
    canary, record = canary_recipe(_recipe(evaluation={"average_decay": 0.5}))
    assert canary.evaluation.average_decay is None and canary.successor_label_rows == 1
    assert record["evaluated"] == "online" and record["study_average_decay"] == 0.5


# --------------------------------------------------------------------------- ensembles


def _member_grads(module: QhTDModule, batch: dict) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    module.zero_grad()
    loss = module.training_step(batch, 0)
    loss.backward()
    return loss.detach(), [{n: p.grad.clone() for n, p in m.named_parameters()} for m in scorer_members(module.online)]


def test_each_ensemble_member_is_trained_as_its_own_one_member_fit() -> None:
    """Member m's loss and gradient come from online member m and target member m alone: bit for bit
    a one-member fit's at one intra-op thread (every study fit's)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _check_members_against_single_fits()
    finally:
        torch.set_num_threads(before)


def _check_members_against_single_fits() -> None:
    pop = synthetic_population()
    recipe = _recipe(ensemble_members=2, successor_reward_rows=2, target_update={"kind": "polyak", "tau": 0.5})
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    # targets that differ from their online members, so a crossed target would show
    for member in scorer_members(module.target):
        with torch.no_grad():
            for p in member.parameters():
                p.add_(0.05 * torch.randn_like(p))
    batch = QhPopulationDataModule(pop, batch_size=5, seed=1).gather(torch.tensor([0, 1, 2, 3, 4]))
    loss, grads = _member_grads(module, batch)
    singles = []
    for online, target, got in zip(scorer_members(module.online), scorer_members(module.target), grads, strict=True):
        single = QhTDModule(
            _recipe(successor_reward_rows=2, target_update={"kind": "polyak", "tau": 0.5}), population_dims(pop)
        )
        single.online.load_state_dict(online.state_dict())
        single.target.load_state_dict(target.state_dict())
        one, (want,) = _member_grads(single, batch)
        singles.append(one)
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name
    assert torch.equal(loss, singles[0] + singles[1])
    assert not torch.allclose(singles[0], singles[1])
    with torch.no_grad():  # the evaluated Q is the members' mean
        torch.testing.assert_close(
            module(batch),
            (
                scorer_members(module.online)[0](
                    *(
                        batch[k]
                        for k in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")
                    )
                )
                + scorer_members(module.online)[1](
                    *(
                        batch[k]
                        for k in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")
                    )
                )
            )
            / 2,
        )


def test_an_ensemble_clips_each_member_by_its_own_norm() -> None:
    pop = synthetic_population()
    recipe = _recipe(ensemble_members=2, optimizer={"lr": 3e-3, "grad_clip_norm": 1e-4})
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(pop))
    batch = QhPopulationDataModule(pop, batch_size=5, seed=1).gather(torch.tensor([0, 1, 2, 3, 4]))
    _, raw = _member_grads(module, batch)
    norms = [torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in m.values()])) for m in raw]
    assert all(n > 1e-3 for n in norms) and not torch.isclose(norms[0], norms[1])
    module.configure_gradient_clipping(torch.optim.AdamW(module.online.parameters()))
    for member in scorer_members(module.online):
        clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in member.parameters()]))
        torch.testing.assert_close(
            clipped, torch.tensor(1e-4), rtol=1e-4, atol=0
        )  # one global norm would not give both


def test_an_ensemble_fit_moves_every_member_and_reloads_into_a_fresh_ensemble() -> None:
    pop = synthetic_population()
    recipe = _recipe(ensemble_members=2, target_update={"kind": "polyak", "tau": 0.1})
    pl.seed_everything(recipe.seed, verbose=False)
    cold = QhTDModule(recipe, population_dims(pop)).state_dict()
    module, _ = _fit(recipe, pop, 8)
    assert module.observed_updates == 8 and module.target_refreshes == 8
    state = module.state_dict()
    assert {k.split(".")[0] for k in state} == {"online", "target"}
    assert all(k.split(".")[1] == "members" for k in state)
    for m in range(2):
        moved = [k for k in state if k.startswith(f"online.members.{m}.") and not torch.equal(state[k], cold[k])]
        assert moved, m
    fresh = module.build_scorer()
    fresh.load_state_dict(module.online.state_dict(), strict=True)
    with pytest.raises(Exception, match="ensemble_members"):
        _recipe(ensemble_members=9)


# ------------------------------------------------------- cached successor values (hard targets)


def test_successor_bootstrap_by_hand() -> None:
    # two successor states, K' = 3, H' = 3; horizon 3 reads Q_1 and Q_2
    next_q = torch.tensor(
        [
            [[0.5, 9.0, 99.0], [0.7, -1.0, 99.0], [100.0, 100.0, 100.0]],  # a'=2 masked
            [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]],  # no valid a'
        ]
    )
    mask = torch.tensor([[True, True, False], [False, False, False]])
    assert torch.equal(successor_bootstrap(next_q, mask, 3), torch.tensor([[0.7, 9.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="horizon=1 is not allowed"):
        successor_bootstrap(next_q, mask, 1)
    # td_targets is bootstrapped_targets over per-candidate successor_bootstrap values
    reward = torch.tensor([[1.0, 2.0]])
    y = bootstrapped_targets(reward, successor_bootstrap(next_q, mask, 3).unsqueeze(0), torch.tensor([[True, False]]))
    assert torch.equal(y, torch.tensor([[[1.0, 1.0 + 0.7, 10.0], [2.0, 2.0, 2.0]]]))


def _cache_fit(recipe: QhRecipe, pop, *, cache: bool) -> tuple[QhTDModule, list[torch.Tensor]]:
    """A Lightning fit that records every update's TD targets of every member (as the loss reads them)."""
    seen: list[torch.Tensor] = []

    class Targets(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            members = scorer_members(pl_module.target)
            seen.append(torch.stack([pl_module.member_targets(batch, t, m) for m, t in enumerate(members)]))

    module, _ = _fit(recipe, pop, recipe.updates, cache=cache, callbacks=(Targets(),))
    return module, seen


@pytest.mark.parametrize("members", [1, 2])
def test_cached_target_values_reproduce_the_per_batch_targets_of_the_tiny_recipe(tiny_train, members) -> None:
    """The table is the per-batch arithmetic, rebuilt at every refresh: targets, loss and final state agree.

    On this CPU they agree bit for bit; the table's target forward runs 2,048 states per call
    where a batch runs B x K, so a kernel whose summation order depends on the batch may move
    the last bits, which the tolerance (1e-6 m) allows.
    """
    from qhlab.design.config_files import load_recipe

    tiny = load_recipe(TINY_RECIPE)
    recipe = QhRecipe.model_validate({**tiny.model_dump(mode="json"), "ensemble_members": members})
    cached, cached_targets = _cache_fit(recipe, tiny_train, cache=True)
    plain, plain_targets = _cache_fit(recipe, tiny_train, cache=False)
    assert len(cached_targets) == len(plain_targets) == recipe.updates
    for step, (a, b) in enumerate(zip(cached_targets, plain_targets, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=lambda m, step=step: f"update {step}: {m}")
    assert _fixed_loss(cached, tiny_train) == pytest.approx(_fixed_loss(plain, tiny_train), abs=1e-6)
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(cached.state_dict()[key], value, rtol=0, atol=1e-6)
    # one build before the first update, one after each refresh
    interval = recipe.target_update.interval
    successors = int(torch.unique(tiny_train.successor[tiny_train.is_chain]).numel())
    assert cached.target_values_evidence == {
        "cached": True,
        "table_builds": 1 + recipe.updates // interval,
        "successor_states": successors,
        "table_bytes": target_table_bytes(tiny_train.successor.shape[0], recipe.horizon, members),
    }
    assert plain.target_values is None and plain.target_values_evidence["table_builds"] == 0
    # the table holds what the (final) target scorer gives each successor state
    dm = QhPopulationDataModule(tiny_train, batch_size=1, seed=0)
    rows, states = dm.successor_states()
    for m, target in enumerate(scorer_members(cached.target)):
        with torch.no_grad():
            q = target(*states.values())  # the six inputs, in the scorer's order
        expected = successor_bootstrap(q, states["candidate_mask"], recipe.horizon)
        torch.testing.assert_close(cached.target_values[m, rows], expected, rtol=0, atol=1e-6)


def test_only_a_hard_target_with_something_to_bootstrap_keeps_a_table() -> None:
    pop = synthetic_population()
    dims = population_dims(pop)
    assert QhTDModule(_recipe(), dims).caches_target_values
    assert not QhTDModule(_recipe(), dims, cache_target_values=False).caches_target_values
    polyak = _recipe(target_update={"kind": "polyak", "tau": 0.5})
    assert not QhTDModule(polyak, dims).caches_target_values
    one = _recipe(horizon=1)
    assert not QhTDModule(one, population_dims(synthetic_population(horizon=1))).caches_target_values
    with pytest.raises(QhError, match=r"build_target_values: datamodule='NoneType' is not allowed"):
        QhTDModule(_recipe(), dims).build_target_values()
