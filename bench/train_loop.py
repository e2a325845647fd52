"""Benchmark: qhlab's Lightning fit vs a minimal hand-written PyTorch loop (same math, same batches).

Prints ONE JSON line: updates/s of `Trainer.fit(QhTDModule, QhPopulationDataModule)` and of a
plain loop over the same batch stream doing the same TD math (targets from the target scorer,
native Huber, the recipe's successor-reward Q_1 term, AdamW, target refresh from the
optimizer's observed step count), their ratio
(target >= 0.9), whether both ended with bit-identical parameters, and the share of a
training step spent producing the batch (target <= 10%).

Usage:
    python bench/train_loop.py [--preset bench] [--recipe examples/demo-recipe.toml]
                               [--updates 600] [--repeats 3] [--threads 1]

The population is generated once into .qhlab-cache/ (cached by content digest). Fits run
with 1 intra-op thread by default: the demo runs cells in parallel processes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch

from qhlab.finite_horizon.data import load_population
from qhlab.finite_horizon.q_learning import (
    QhPopulationDataModule,
    QhTDModule,
    native_huber_loss,
    population_dims,
    refresh_target,
)
from qhlab.finite_horizon.recipe import load_recipe
from qhlab.scenes.population import cached_population
from qhlab.training.optimizer_state import observed_optimizer_updates

ROOT = Path(__file__).resolve().parents[1]


def _lightning_fit(recipe, population, updates: int) -> tuple[float, dict[str, torch.Tensor]]:
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(population))
    data = QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed)
    trainer = pl.Trainer(
        max_steps=updates, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - start
    assert observed_optimizer_updates(trainer.optimizers[0]) == updates
    return wall, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _hand_loop(recipe, population, updates: int) -> tuple[float, dict[str, torch.Tensor]]:
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(population))  # only to build identical scorers
    online, target = module.online, module.target
    data = QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed)
    h = recipe.horizon
    start = time.perf_counter()
    opt = recipe.optimizer
    optimizer = torch.optim.AdamW(online.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    seen = 0
    for step, batch in zip(range(updates), data.train_dataloader()):
        b, k = batch["reward"].shape
        with torch.no_grad():
            next_q = target(*(batch["next_" + n].flatten(0, 1) for n in (
                "objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask",
            ))).view(b, k, -1, h)
            reward = batch["reward"].unsqueeze(-1)
            masked = next_q[..., : h - 1].masked_fill(~batch["next_candidate_mask"].unsqueeze(-1), float("-inf"))
            best = masked.amax(dim=2)
            ok = (batch["successor_valid"] & batch["next_candidate_mask"].any(dim=2)).unsqueeze(-1)
            y = torch.cat([reward, reward + torch.where(ok, best, torch.zeros_like(best))], dim=-1)
        q = online(batch["objects"], batch["object_mask"], batch["goal"], batch["candidates"],
                   batch["candidate_object"], batch["candidate_mask"])
        loss = native_huber_loss(q, y, batch["candidate_mask"], recipe.huber_delta)
        m = min(recipe.successor_reward_rows, b)
        if m:  # Q_1 of the first m rows' successor states against their own rewards (y_1 = r)
            q1 = online(*(batch["next_" + n][:m].flatten(0, 1) for n in (
                "objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask",
            )))[..., :1]
            loss = loss + native_huber_loss(q1, batch["next_reward"][:m].flatten(0, 1).unsqueeze(-1),
                                            batch["next_candidate_mask"][:m].flatten(0, 1), recipe.huber_delta)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now = observed_optimizer_updates(optimizer)
        refresh_target(target, online, recipe.target_update, seen, now)
        seen = now
    wall = time.perf_counter() - start
    assert seen == updates
    return wall, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _batch_seconds(recipe, population, n: int) -> float:
    data = QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed)
    stream = iter(data.train_dataloader())
    next(stream)
    start = time.perf_counter()
    for _ in range(n):
        next(stream)
    return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--recipe", default=str(ROOT / "examples" / "demo-recipe.toml"))
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=str(ROOT / ".qhlab-cache"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    recipe = load_recipe(args.recipe)
    path = cached_population(args.preset, "train", 0, args.cache)
    population = load_population(path, split="train", horizon=recipe.horizon)

    _lightning_fit(recipe, population, 10)  # warm-up: imports, allocator, first-call paths
    _hand_loop(recipe, population, 10)
    lightning_walls, hand_walls, identical = [], [], True
    for _ in range(args.repeats):  # interleaved, so background load hits both alike
        wall_l, state_l = _lightning_fit(recipe, population, args.updates)
        wall_h, state_h = _hand_loop(recipe, population, args.updates)
        lightning_walls.append(wall_l)
        hand_walls.append(wall_h)
        identical &= state_l.keys() == state_h.keys() and all(torch.equal(state_l[k], state_h[k]) for k in state_l)
    lightning_ups = args.updates / statistics.median(lightning_walls)
    hand_ups = args.updates / statistics.median(hand_walls)
    batch_s = _batch_seconds(recipe, population, 200)
    print(json.dumps({
        "bench": "train_loop",
        "preset": args.preset,
        "recipe": recipe.name,
        "arm": recipe.architecture.arm,
        "batch_size": recipe.batch_size,
        "updates": args.updates,
        "repeats": args.repeats,
        "threads": args.threads,
        "qhlab_updates_per_s": round(lightning_ups, 2),
        "hand_loop_updates_per_s": round(hand_ups, 2),
        "ratio": round(lightning_ups / hand_ups, 4),
        "target_ratio": 0.9,
        "identical_final_state": bool(identical),
        "batch_seconds": round(batch_s, 6),
        "batch_share_of_step": round(batch_s * lightning_ups, 4),
        "target_batch_share": 0.10,
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
