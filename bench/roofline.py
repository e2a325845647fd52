"""Benchmark: how far a demo cell's training step is from this CPU's matmul peak, and where it goes.

Prints ONE JSON line:

* ``peak_fraction``: the achieved FLOP/s of one Lightning training step of the demo recipe
  (FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` over a whole step: the matmuls
  of every member's target forward, forward and backward; it has no formula for the CPU
  flash-attention kernel, whose FLOPs are left out) over the float32 matmul peak of this CPU
  at the fits' thread count, both measured in this run;
* ``peak_gflops``: that peak at 1 and at 2 threads (a square matmul, best of several);
* ``matmul_gflops``, ``matmul_share_of_step`` and ``attention_share_of_step``: the rate of the
  step's own matmuls and the share of the step's operator time they take (``torch.profiler``),
  and the attention kernels' share; the rest is elementwise operators, copies, gathers and
  normalisations;
* ``split_seconds``: one step split into data, target forward, forward, backward, optimizer,
  target refresh and framework (the Lightning step's time less the sum of the parts, each part
  timed alone in the same loop a fit runs; framework therefore also holds what the parts leave
  out: the schedule's rate, the finiteness check and logging);
* ``what_would_move_it``: the largest parts and the operators outside matmuls that take most of
  the step, from the profile;
* ``alternatives``: the same loop of parts with the members' forwards under ``torch.compile``
  (Inductor fuses the operators outside matmuls), under a bfloat16 autocast, and with the
  attention written out as two batched matmuls and a softmax (``unfused_attention``), each against
  the float32 eager loop on identically seeded modules: its ``speedup`` (eager step time over its
  own), ``setup_seconds`` (five warm-up steps, which compile; Inductor keeps its kernels in an
  on-disk cache, so a second run compiles faster) and ``max_abs_q_difference`` (metres, the
  online Q on the first batch after those five updates: each changes the arithmetic, so a fit
  under any of them would need its own equivalence evidence), or ``unavailable`` with the reason
  (Inductor needs a C++ compiler).

With ``--hard-interval N`` the recipe's target rule becomes a hard copy every N updates, and
the step measured is the cached one every such fit runs: ``target_forward`` is then the lookup
of the batch's successor values in the table, ``target_refresh`` holds the table's rebuilds
(one every N steps), and the FLOPs per step add a rebuild's FLOPs over N
(``table_build_flops``).

Usage:
    python bench/roofline.py [--preset bench] [--recipe examples/demo-recipe.toml]
                             [--steps 200] [--threads 1] [--hard-interval N]

The bench preset has the demo's batch shapes (K = 8 candidates, up to 5 pucks, H = 3) on fewer
scenes; its population is generated once into .qhlab-cache/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.flop_counter import FlopCounterMode

from qhlab.design.config_files import load_recipe
from qhlab.finite_horizon.batches import QhPopulationDataModule, population_dims
from qhlab.finite_horizon.data import load_population
from qhlab.finite_horizon.q_learning import QhTDModule, native_huber_loss, refresh_target, successor_reward_loss
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.finite_horizon.scorer import scorer_members
from qhlab.scenes.population import cached_population
from qhlab.training.console import configure_console
from qhlab.training.optimizer_state import observed_optimizer_updates

ROOT = Path(__file__).resolve().parents[1]
_MATMULS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")
# FlopCounterMode has no formula for torch's CPU flash-attention kernels: their FLOPs (a 6-token
# attention here) are not counted, so their time is reported apart, never as matmul time.
_ATTENTION = ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_flash_attention")


def _matmul_peak(threads: int, n: int = 1024, repeats: int = 7) -> float:
    """FLOP/s of the best of ``repeats`` float32 n x n matmuls at ``threads`` intra-op threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(previous)
    return 2.0 * n**3 / best


def _lightning_step_seconds(recipe, population, steps: int) -> float:
    pl.seed_everything(recipe.seed, verbose=False)
    module = QhTDModule(recipe, population_dims(population))
    data = QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    return (time.perf_counter() - start) / steps


class _Parts:
    """One step of the learning rule, cut where a profile reads it: each part is timed alone."""

    def __init__(self, recipe, population) -> None:
        pl.seed_everything(recipe.seed, verbose=False)
        self.recipe = recipe
        self.module = QhTDModule(recipe, population_dims(population))
        self.data = QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed)
        self.stream = iter(self.data.train_dataloader())
        if self.module.caches_target_values:
            self.module.build_target_values(self.data)  # what a fit does before its first update
        self.optimizer = self.module.configure_optimizers()  # the fit's own AdamW (multi-tensor)
        self.seen = 0

    def step(self, times: dict[str, list[float]] | None = None) -> None:
        clock = time.perf_counter
        t0 = clock()
        batch = next(self.stream)
        t1 = clock()
        pairs = list(zip(scorer_members(self.module.online), scorer_members(self.module.target), strict=True))
        targets = [self.module.member_targets(batch, target, m) for m, (_, target) in enumerate(pairs)]
        t2 = clock()
        losses = [self._loss(batch, online, y) for (online, _), y in zip(pairs, targets, strict=True)]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        t3 = clock()
        loss.backward()
        t4 = clock()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t5 = clock()
        now = observed_optimizer_updates(self.optimizer)
        if refresh_target(self.module.target, self.module.online, self.recipe.target_update, self.seen, now):
            if self.module.caches_target_values:
                self.module.build_target_values(self.data)
        self.seen = now
        t6 = clock()
        if times is not None:
            for name, seconds in (
                ("data", t1 - t0),
                ("target_forward", t2 - t1),
                ("forward", t3 - t2),
                ("backward", t4 - t3),
                ("optimizer", t5 - t4),
                ("target_refresh", t6 - t5),
            ):
                times[name].append(seconds)

    def _loss(self, batch, online, y) -> torch.Tensor:
        # QhTDModule._member_loss with the target computed before (so that it is timed apart).
        recipe = self.recipe
        q = online(
            batch["objects"],
            batch["object_mask"],
            batch["goal"],
            batch["candidates"],
            batch["candidate_object"],
            batch["candidate_mask"],
        ).float()
        loss = native_huber_loss(q, y, batch["candidate_mask"], recipe.huber_delta)
        rows = min(recipe.successor_reward_rows, q.shape[0])
        if rows:
            loss = loss + successor_reward_loss(
                self.module.successor_q(batch, rows, online).float(),
                batch["next_reward"][:rows].flatten(0, 1),
                batch["next_candidate_mask"][:rows].flatten(0, 1),
                recipe.huber_delta,
            )
        return loss


@contextlib.contextmanager
def _unfused_attention():
    """The scorer's attention as two batched matmuls and a softmax, in place of torch's fused CPU kernel."""
    fused = torch.nn.functional.scaled_dot_product_attention

    def unfused(q, k, v, attn_mask):
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), dim=-1) @ v

    torch.nn.functional.scaled_dot_product_attention = unfused
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = fused


def _alternatives(recipe, population, steps: int) -> dict[str, dict]:
    """Step time of the parts loop eager, compiled, under bf16 autocast and with unfused attention
    (module docstring)."""

    def setup(kind: str) -> tuple[_Parts, Callable[[], contextlib.AbstractContextManager]]:
        parts = _Parts(recipe, population)  # seeded alike: each kind starts from the same parameters
        if kind == "compiled":
            for member in scorer_members(parts.module.online) + scorer_members(parts.module.target):
                member.forward = torch.compile(member.forward, dynamic=False)
        if kind == "bf16_autocast":
            return parts, lambda: torch.autocast("cpu", dtype=torch.bfloat16)
        if kind == "unfused_attention":
            return parts, _unfused_attention
        return parts, contextlib.nullcontext

    def batch_q(parts: _Parts, context) -> torch.Tensor:
        batch = next(
            iter(QhPopulationDataModule(population, batch_size=recipe.batch_size, seed=recipe.seed).train_dataloader())
        )
        with torch.no_grad(), context():
            return parts.module.online(
                batch["objects"],
                batch["object_mask"],
                batch["goal"],
                batch["candidates"],
                batch["candidate_object"],
                batch["candidate_mask"],
            ).float()

    results: dict[str, dict] = {}
    reference = None
    for kind in ("eager", "compiled", "bf16_autocast", "unfused_attention"):
        parts, context = setup(kind)
        try:
            start = time.perf_counter()
            with context():
                for _ in range(5):
                    parts.step()
            q = batch_q(parts, context)
            warm = time.perf_counter() - start
            with context():
                start = time.perf_counter()
                for _ in range(steps):
                    parts.step()
        except Exception as error:  # noqa: BLE001 - a missing compiler is a result here, not a crash
            if kind != "compiled":
                raise
            results[kind] = {"unavailable": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            continue
        seconds = (time.perf_counter() - start) / steps
        if reference is None:
            reference = (seconds, q)
        results[kind] = {
            "step_seconds": round(seconds, 6),
            "setup_seconds": round(warm, 2),
            "speedup": round(reference[0] / seconds, 3),
            "max_abs_q_difference": float((q - reference[1]).abs().max()),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--recipe", default=str(ROOT / "examples" / "demo-recipe.toml"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=str(ROOT / ".qhlab-cache"))
    parser.add_argument("--hard-interval", type=int, default=None, help="measure the cached hard-target step")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    configure_console(verbose=False)
    if args.hard_interval is not None and args.hard_interval < 1:
        print(f"error: roofline: --hard-interval={args.hard_interval!r} is not allowed; allowed: >= 1", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    if not 1 <= args.threads <= cores:
        print(
            f"error: roofline: --threads={args.threads!r} is not allowed; allowed: 1..{cores} (this machine's cores)",
            file=sys.stderr,
        )
        return 2
    recipe = load_recipe(args.recipe)
    if args.hard_interval is not None:
        recipe = QhRecipe.model_validate(
            {**recipe.model_dump(mode="json"), "target_update": {"kind": "hard", "interval": args.hard_interval}}
        )
    if recipe.successor_label_rows:
        print(
            f"error: roofline: recipe.successor_label_rows={recipe.successor_label_rows!r} is not allowed; "
            "allowed: 0 (the split times the demo recipe's terms). HINT: use the demo recipe.",
            file=sys.stderr,
        )
        return 2
    population = load_population(
        cached_population(args.preset, "train", 0, args.cache), split="train", horizon=recipe.horizon
    )
    peaks = {threads: _matmul_peak(threads) for threads in sorted({1, min(2, cores), args.threads})}
    torch.set_num_threads(args.threads)

    parts = _Parts(recipe, population)
    for _ in range(10):
        parts.step()
    with FlopCounterMode(display=False) as counter:
        parts.step()
    flops = counter.get_total_flops()
    build_flops = 0
    if parts.module.caches_target_values:
        with FlopCounterMode(display=False) as counter:
            parts.module.build_target_values(parts.data)
        build_flops = counter.get_total_flops()
        flops += build_flops / recipe.target_update.interval

    _lightning_step_seconds(recipe, population, 10)  # warm-up
    lightning_runs, split_runs = [], []
    for _ in range(3):  # interleaved, so background load hits both alike
        lightning_runs.append(_lightning_step_seconds(recipe, population, args.steps))
        times: dict[str, list[float]] = {
            k: [] for k in ("data", "target_forward", "forward", "backward", "optimizer", "target_refresh")
        }
        for _ in range(args.steps):
            parts.step(times)
        split_runs.append({k: statistics.mean(v) for k, v in times.items()})
    step = statistics.median(lightning_runs)
    split = {k: statistics.median(run[k] for run in split_runs) for k in split_runs[0]}
    split["framework"] = max(step - sum(split.values()), 0.0)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            parts.step()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total_us = sum(e.self_cpu_time_total for e in events)
    matmul_us = sum(e.self_cpu_time_total for e in events if e.key.startswith(_MATMULS))
    attention_us = sum(e.self_cpu_time_total for e in events if e.key.startswith(_ATTENTION))
    others = sorted(
        (e for e in events if not e.key.startswith(_MATMULS + _ATTENTION)), key=lambda e: -e.self_cpu_time_total
    )
    top_others = [f"{e.key.removeprefix('aten::')} {e.self_cpu_time_total / total_us:.0%}" for e in others[:4]]
    matmul_share = matmul_us / total_us
    matmul_gflops = flops / (matmul_us * 1e-6 / 10) / 1e9
    achieved = flops / step
    peak = peaks[args.threads]
    largest = sorted(split, key=lambda k: -split[k])[:2]
    alternatives = _alternatives(recipe, population, args.steps)
    print(
        json.dumps(
            {
                "bench": "roofline",
                "preset": args.preset,
                "recipe": recipe.name,
                "members": recipe.ensemble_members,
                "batch_size": recipe.batch_size,
                "threads": args.threads,
                "steps": args.steps,
                "flops_per_step": round(flops),
                "target_update": recipe.target_update.model_dump(mode="json"),
                "cached_target_values": parts.module.caches_target_values,
                "table_build_flops": build_flops,
                "step_seconds": round(step, 6),
                "achieved_gflops": round(achieved / 1e9, 3),
                "peak_gflops": {str(t): round(v / 1e9, 2) for t, v in peaks.items()},
                "peak_fraction": round(achieved / peak, 4),
                "matmul_gflops": round(matmul_gflops, 2),
                "matmul_share_of_step": round(matmul_share, 4),
                "attention_share_of_step": round(attention_us / total_us, 4),
                "split_seconds": {k: round(v, 6) for k, v in split.items()},
                "split_share": {k: round(v / step, 4) for k, v in split.items()},
                "alternatives": alternatives,
                "what_would_move_it": (
                    f"the step's matmuls run at {matmul_gflops / (peak / 1e9):.0%} of peak and take {matmul_share:.0%} "
                    f"of its operator time, attention {attention_us / total_us:.0%}; the largest other operators are "
                    f"{', '.join(top_others)}"
                    + (
                        "; most of the step is outside matmuls, so fusing those operators would move peak_fraction most"
                        if matmul_share < 0.5
                        else "; most of the step is matmuls, so their own rate would move it most"
                    )
                    + f"; the largest parts are {largest[0]} ({split[largest[0]] / step:.0%}) and {largest[1]} "
                    f"({split[largest[1]] / step:.0%})"
                    + "".join(
                        f"; {kind} measured {alternatives[kind]['speedup']}x the eager step"
                        for kind in ("compiled", "bf16_autocast", "unfused_attention")
                        if "speedup" in alternatives[kind]
                    )
                ),
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
