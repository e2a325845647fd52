"""Benchmark: a tuning's winning recipe against today's, once, on the default pair and a fresh held-out pair.

The moonshot tuning (``examples/moonshot-tune.toml``) searches a wide space at no more cost than
today's cell, on the demo's tuning population, for a recipe whose baseline regret_3 is at most
1.5 x the myopic oracle's. Its winner is picked by the record's rule; this bench checks it once,
outside the tuning population: the winning recipe and today's recipe (the demo tuning's
``recipe.toml``) are each fitted with one seed on the default study's pair (TRAIN demo-train
31001, validation demo-validation 31002) and on one fresh pair no record uses (TRAIN 61001,
validation 61002), with ``qhlab fit``; each is scored on its pair's validation population against
that population's myopic oracle (its manifest's difficulty card).

Prints ONE JSON line: ``ratio`` (the winner's regret_3 over the myopic oracle's on the fresh pair;
target <= 1.5), and for every pair and recipe its regret_3, the oracle's and their ratio; the
winner's trial, parameters and tuning-population figure from the record.

Usage:
    python bench/moonshot.py [--tuning examples/preparation/moonshot] [--seed 0] [--fresh 61001,61002]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from qhlab.design.tuning_record import read_record
from qhlab.evidence import read_receipt
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.scenes.population import cached_population

_ROOT = Path(__file__).resolve().parent.parent
_TARGET = 1.5
_CACHE = Path("~/.cache/qhlab/populations").expanduser()


def _myopic(population: Path) -> float:
    manifest = json.loads((population / "manifest.json").read_text(encoding="utf-8"))
    return float(manifest["difficulty"]["regret_H"]["myopic_oracle"])


def _fit(recipe: dict, train: Path, validation: Path, output: Path) -> float:
    """Fit ``recipe`` with ``qhlab fit`` (one thread) and return its regret at H on ``validation``."""
    output.mkdir(parents=True)
    path = output / "recipe.toml"
    path.write_text(tomli_w.dumps(recipe), encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "qhlab.cli",
            "fit",
            str(path),
            "--profile",
            "cpu-fp32",
            "--output",
            str(output / "fits"),
            "--train",
            str(train),
            "--validation",
            str(validation),
            "--no-progress",
            "--threads",
            "1",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    receipt = next((output / "fits").glob("*/*/evaluation.receipt.json"))
    return float(read_receipt(receipt, EvaluationReceipt).body.regret_primary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuning", type=Path, default=_ROOT / "examples" / "preparation" / "moonshot")
    parser.add_argument("--today", type=Path, default=_ROOT / "examples" / "preparation" / "demo-tune")
    parser.add_argument("--seed", type=int, default=0, help="the one fit seed of every check")
    parser.add_argument("--fresh", default="61001,61002", help="the fresh pair: TRAIN seed,validation seed")
    parser.add_argument("--workers", type=int, default=2, help="fits at once")
    args = parser.parse_args()
    started = time.perf_counter()
    record, today = read_record(args.tuning), read_record(args.today)
    winner = record["winner"]
    if winner["number"] is None:
        raise SystemExit(f"{args.tuning}: the tuning has no admissible trial, so nothing to check")
    recipes = {"winner": winner["recipe"], "today": today["winner"]["recipe"]}
    fresh_train, fresh_validation = (int(s) for s in args.fresh.split(","))
    pairs = {"default": (31001, 31002), "fresh": (fresh_train, fresh_validation)}
    populations = {
        name: (
            cached_population("demo-train", "train", t, _CACHE),
            cached_population("demo-validation", "validation", v, _CACHE),
        )
        for name, (t, v) in pairs.items()
    }
    jobs = {
        (pair, name): {**recipe, "seed": args.seed, "data": {"train": "", "validation": ""}}
        for pair in pairs
        for name, recipe in recipes.items()
    }
    with (
        tempfile.TemporaryDirectory(prefix="qhlab-bench-moonshot-") as tmp,
        concurrent.futures.ThreadPoolExecutor(args.workers) as pool,
    ):
        futures = {
            key: pool.submit(_fit, recipe, *populations[key[0]], Path(tmp) / f"{key[0]}-{key[1]}")
            for key, recipe in jobs.items()
        }
        regrets = {key: future.result() for key, future in futures.items()}
    out = {}
    for pair, (t, v) in pairs.items():
        oracle = _myopic(populations[pair][1])
        out[pair] = {
            "train_seed": t,
            "validation_seed": v,
            "myopic_oracle": round(oracle, 6),
            **{
                name: {
                    "regret_3": round(regrets[(pair, name)], 6),
                    "ratio_to_myopic": round(regrets[(pair, name)] / oracle, 3),
                }
                for name in recipes
            },
        }
    tuning_oracle = (
        _myopic(Path(record["populations"]["validation"]["path"]))
        if Path(record["populations"]["validation"]["path"]).is_dir()
        else None
    )
    print(
        json.dumps(
            {
                "bench": "moonshot",
                "ratio": out["fresh"]["winner"]["ratio_to_myopic"],
                "target": f"<= {_TARGET}",
                "meets_target": out["fresh"]["winner"]["ratio_to_myopic"] <= _TARGET,
                "seed": args.seed,
                "winner": {
                    "trial": winner["number"] + 1,
                    "params": winner["params"],
                    "tuning_mean": winner["mean"],
                    "tuning_ratio_to_myopic": None
                    if tuning_oracle is None
                    else round(winner["mean"] / tuning_oracle, 3),
                },
                "today_tuning_mean": today["winner"]["mean"],
                "pairs": out,
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
