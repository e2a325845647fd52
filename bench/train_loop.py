"""Benchmark: qhlab's Lightning fit vs a minimal hand-written PyTorch loop (same math, same batches).

Prints ONE JSON line: updates/s of `Trainer.fit(QhTDModule, QhPopulationDataModule)` and of a
plain loop over the same batch stream doing the recipe's exact math with the learning rule's
pure functions (each member's TD targets from its own target scorer, native Huber, the
successor Q_1 and label terms, the cosine schedule from the observed update count, per-member
clipping, AdamW, the target rule and the evaluated average), their ratio (target >= 0.9),
whether both ended with bit-identical parameters (the first differing tensor is named if not),
and the share of a training step spent producing the batch (target <= 10%). Under a hard target
the hand loop keeps the successor-value table as the fit does, rebuilt after every copy.

With an ensemble (the recipe's ``ensemble_members``, or ``--members M``), it also fits the same
recipe with one member, interleaved, and prints ``members_ratio``: the M-member fit's updates/s
over the one-member fit's. It is printed, not a target: on a CPU each member's arithmetic is
its own, so M members cost about M times one.

Target values: it also fits the recipe three more times, interleaved with the rest: with a
Polyak target (``--tau``, the demo's former 0.04), and with a hard target (a copy every
``--interval`` updates; default the recipe's own, else 50) twice: with the successor-value table
(``cached``, what every fit does) and with the target scorer run on every batch (``uncached``).
``cached_speedup`` is the cached fit's updates/s over the uncached one's (target >= 1.5),
``cached_over_polyak`` over the Polyak one's, and ``cached_identical_final_state`` says whether
the cached and uncached fits ended bit-identical (else ``cached_max_abs_diff`` gives the
largest difference).

Usage:
    python bench/train_loop.py [--preset bench] [--recipe examples/demo-recipe.toml]
                               [--members M] [--interval N] [--tau 0.04] [--updates 600] [--repeats 3]
                               [--threads 1]

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

from qhlab.design.config_files import load_recipe
from qhlab.finite_horizon.batches import QhPopulationDataModule, population_dims
from qhlab.finite_horizon.data import load_population
from qhlab.finite_horizon.q_learning import (
    ADAMW_FOREACH,
    QhTDModule,
    bootstrapped_targets,
    native_huber_loss,
    polyak_target_update,
    refresh_target,
    scheduled_lr,
    successor_bootstrap,
    successor_label_loss,
    successor_reward_loss,
    td_targets,
)
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.finite_horizon.scorer import MAX_ENSEMBLE_MEMBERS, scorer_members
from qhlab.scenes.population import cached_population
from qhlab.training.console import configure_console
from qhlab.training.optimizer_state import observed_optimizer_updates

ROOT = Path(__file__).resolve().parents[1]
_STATE = ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")


def _data(recipe, population) -> QhPopulationDataModule:
    return QhPopulationDataModule(
        population, batch_size=recipe.batch_size, seed=recipe.seed, successor_labels=recipe.successor_label_rows > 0
    )


def _lightning_fit(recipe, population, updates: int, *, cache: bool = True) -> tuple[float, dict[str, torch.Tensor]]:
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(population), cache_target_values=cache)
    trainer = pl.Trainer(
        max_steps=updates,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=_data(recipe, population))
    wall = time.perf_counter() - start
    assert observed_optimizer_updates(trainer.optimizers[0]) == updates
    return wall, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _member_loss(recipe, batch, online, target, table) -> torch.Tensor:
    """One member's loss, written out from the learning rule's pure functions.

    ``table`` is the member's successor-value table [S, H-1] under a hard target (the fit keeps
    one), else None (the target scorer runs on the batch's successor states).
    """
    b, k = batch["reward"].shape
    h, delta = recipe.horizon, recipe.huber_delta
    with torch.no_grad():
        if table is None:
            next_q = target(*(batch["next_" + n].flatten(0, 1) for n in _STATE)).view(b, k, -1, h)
            y = td_targets(batch["reward"], next_q.float(), batch["next_candidate_mask"], batch["successor_valid"], h)
        else:
            values = table.index_select(0, batch["successor"].clamp_min(0).flatten()).view(b, k, -1)
            y = bootstrapped_targets(batch["reward"], values, batch["successor_valid"])
    loss = native_huber_loss(online(*(batch[n] for n in _STATE)).float(), y, batch["candidate_mask"], delta)
    for rows, term in ((recipe.successor_reward_rows, "reward"), (recipe.successor_label_rows, "labels")):
        m = min(rows, b)
        if not m:
            continue
        q = online(*(batch["next_" + n][:m].flatten(0, 1) for n in _STATE)).float()
        mask = batch["next_candidate_mask"][:m].flatten(0, 1)
        if term == "reward":  # Q_1 of the first m rows' successor states against their own rewards
            loss = loss + successor_reward_loss(q, batch["next_reward"][:m].flatten(0, 1), mask, delta)
        else:  # Q_1..Q_{H-1} of those successor states against their exact labels
            loss = loss + successor_label_loss(q, batch["next_labels"][:m].flatten(0, 1), mask, delta)
    return loss


def _successor_tables(module: QhTDModule, data: QhPopulationDataModule) -> list[torch.Tensor | None]:
    """Each member's successor-value table from its current target, written out from the pure
    functions (a hard target's fit keeps one); one None per member otherwise."""
    members = scorer_members(module.target)
    if not module.caches_target_values:
        return [None] * len(members)
    rows, states = data.successor_states()
    tables = []
    with torch.no_grad():
        for target in members:
            table = torch.zeros(data.population_rows, module.recipe.horizon - 1)
            for start in range(0, rows.numel(), 2048):
                chunk = [t[start : start + 2048] for t in states.values()]
                q = target(*chunk).float()
                table[rows[start : start + 2048]] = successor_bootstrap(q, chunk[-1], module.recipe.horizon)
            tables.append(table)
    return tables


def _hand_loop(recipe, population, updates: int) -> tuple[float, dict[str, torch.Tensor]]:
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(population))  # only to build identical scorers
    online, target, average = module.online, module.target, module.average
    pairs = list(zip(scorer_members(online), scorer_members(target), strict=True))
    data = _data(recipe, population)
    start = time.perf_counter()
    opt = recipe.optimizer
    optimizer = torch.optim.AdamW(
        online.parameters(),
        lr=opt.lr,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=ADAMW_FOREACH,
    )
    seen = 0
    tables = _successor_tables(module, data)
    for _, batch in zip(range(updates), data.train_dataloader()):
        if opt.schedule == "cosine":
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(opt.lr, seen, recipe.updates)
        losses = [_member_loss(recipe, batch, o, t, table) for (o, t), table in zip(pairs, tables, strict=True)]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        loss.backward()
        if opt.grad_clip_norm is not None:
            for member, _ in pairs:  # each member clipped alone, as its own fit would be
                torch.nn.utils.clip_grad_norm_(member.parameters(), opt.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = observed_optimizer_updates(optimizer)
        if refresh_target(target, online, recipe.target_update, seen, now):
            tables = _successor_tables(module, data)
        if average is not None:
            polyak_target_update(average, online, 1.0 - recipe.evaluation.average_decay)
        seen = now
    wall = time.perf_counter() - start
    assert seen == updates
    return wall, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _first_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """The first state-dict entry whose tensors differ (None when every entry is bit-identical)."""
    if a.keys() != b.keys():
        return f"keys differ: {sorted(a.keys() ^ b.keys())[:3]}"
    for key in a:
        if not torch.equal(a[key], b[key]):
            return f"{key} (max |diff| {float((a[key].float() - b[key].float()).abs().max()):.3g})"
    return None


def _with_members(recipe: QhRecipe, members: int) -> QhRecipe:
    return QhRecipe.model_validate({**recipe.model_dump(mode="json"), "ensemble_members": members})


def _with_target(recipe: QhRecipe, rule: dict) -> QhRecipe:
    return QhRecipe.model_validate({**recipe.model_dump(mode="json"), "target_update": rule})


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _batch_seconds(recipe, population, n: int) -> float:
    stream = iter(_data(recipe, population).train_dataloader())
    next(stream)
    start = time.perf_counter()
    for _ in range(n):
        next(stream)
    return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--recipe", default=str(ROOT / "examples" / "demo-recipe.toml"))
    parser.add_argument("--members", type=int, default=None, help="ensemble members (default: the recipe's)")
    parser.add_argument("--interval", type=int, default=None, help="hard target: updates between copies")
    parser.add_argument("--tau", type=float, default=0.04, help="the Polyak fit's tau")
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=str(ROOT / ".qhlab-cache"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    configure_console(verbose=False)  # one JSON line, no Lightning banners
    torch.set_num_threads(args.threads)

    if args.members is not None and not 1 <= args.members <= MAX_ENSEMBLE_MEMBERS:
        print(
            f"error: train_loop: --members={args.members!r} is not allowed; allowed: 1..{MAX_ENSEMBLE_MEMBERS}",
            file=sys.stderr,
        )
        return 2
    recipe = load_recipe(args.recipe)
    if args.members is not None:
        recipe = _with_members(recipe, args.members)
    interval = args.interval
    if interval is None:
        interval = recipe.target_update.interval if recipe.target_update.kind == "hard" else 50
    if interval < 1:
        print(f"error: train_loop: --interval={interval!r} is not allowed; allowed: >= 1", file=sys.stderr)
        return 2
    if not 0.0 < args.tau <= 1.0:
        print(f"error: train_loop: --tau={args.tau!r} is not allowed; allowed: 0 < tau <= 1", file=sys.stderr)
        return 2
    single = _with_members(recipe, 1) if recipe.ensemble_members > 1 else None
    hard = _with_target(recipe, {"kind": "hard", "interval": interval})
    polyak = _with_target(recipe, {"kind": "polyak", "tau": args.tau})
    path = cached_population(args.preset, "train", 0, args.cache)
    population = load_population(path, split="train", horizon=recipe.horizon)

    _lightning_fit(recipe, population, 10)  # warm-up: imports, allocator, first-call paths
    _hand_loop(recipe, population, 10)
    lightning_walls, hand_walls, single_walls, difference = [], [], [], None
    cached_walls, uncached_walls, polyak_walls, cached_diffs = [], [], [], []
    for _ in range(args.repeats):  # interleaved, so background load hits all alike
        wall_l, state_l = _lightning_fit(recipe, population, args.updates)
        wall_h, state_h = _hand_loop(recipe, population, args.updates)
        lightning_walls.append(wall_l)
        hand_walls.append(wall_h)
        difference = difference or _first_difference(state_l, state_h)
        if single is not None:
            single_walls.append(_lightning_fit(single, population, args.updates)[0])
        wall_c, state_c = _lightning_fit(hard, population, args.updates, cache=True)
        wall_u, state_u = _lightning_fit(hard, population, args.updates, cache=False)
        cached_walls.append(wall_c)
        uncached_walls.append(wall_u)
        polyak_walls.append(_lightning_fit(polyak, population, args.updates)[0])
        cached_diffs.append(_max_abs_diff(state_c, state_u))
    lightning_ups = args.updates / statistics.median(lightning_walls)
    hand_ups = args.updates / statistics.median(hand_walls)
    batch_s = _batch_seconds(recipe, population, 200)
    line = {
        "bench": "train_loop",
        "preset": args.preset,
        "recipe": recipe.name,
        "arm": recipe.architecture.arm,
        "batch_size": recipe.batch_size,
        "members": recipe.ensemble_members,
        "updates": args.updates,
        "repeats": args.repeats,
        "threads": args.threads,
        "qhlab_updates_per_s": round(lightning_ups, 2),
        "hand_loop_updates_per_s": round(hand_ups, 2),
        "ratio": round(lightning_ups / hand_ups, 4),
        "target_ratio": 0.9,
        "identical_final_state": difference is None,
        "first_difference": difference,
        "batch_seconds": round(batch_s, 6),
        "batch_share_of_step": round(batch_s * lightning_ups, 4),
        "target_batch_share": 0.10,
        "hard_interval": interval,
        "polyak_tau": args.tau,
        "polyak_updates_per_s": round(args.updates / statistics.median(polyak_walls), 2),
        "cached_over_polyak": round(statistics.median(polyak_walls) / statistics.median(cached_walls), 4),
        "hard_cached_updates_per_s": round(args.updates / statistics.median(cached_walls), 2),
        "hard_uncached_updates_per_s": round(args.updates / statistics.median(uncached_walls), 2),
        "cached_speedup": round(statistics.median(uncached_walls) / statistics.median(cached_walls), 4),
        "target_cached_speedup": 1.5,
        "cached_identical_final_state": max(cached_diffs) == 0.0,
        "cached_max_abs_diff": max(cached_diffs),
    }
    meets = {
        "ratio": line["ratio"] >= line["target_ratio"],
        "identical_final_state": difference is None,
        "batch_share": line["batch_share_of_step"] <= line["target_batch_share"],
        "cached_speedup": line["cached_speedup"] >= line["target_cached_speedup"],
    }
    if single is not None:
        single_ups = args.updates / statistics.median(single_walls)
        line.update(
            one_member_updates_per_s=round(single_ups, 2),
            members_ratio=round(lightning_ups / single_ups, 4),
        )
    line["meets_targets"] = meets
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
