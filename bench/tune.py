"""Benchmark: what ``qhlab tune`` costs beyond its fits, and what a second worker buys.

Measured in one run on the same machine, on the tiny preset (cached before timing), with the
tiny tuning config (``examples/tiny-tune.toml``) at ``--updates`` updates per fit (default 300: about
2.3 s a fit here):

1. ``run_tuning`` with 1 worker, into a fresh directory: its wall time against the sum of its
   fits' own wall times (each fit receipt's ``wall_seconds``). ``overhead`` = tuning wall / sum of
   fit walls (target <= 1.10): suggestions, SQLite, adoption checks, the record, the receipt.
2. The same config with 2 workers, into another fresh directory: ``speedup`` = wall with 1
   worker / wall with 2 (target >= 1.7 on 2 cores), and ``identical``: both give the same
   trials and the same ``recipe.toml`` bytes.

Prints ONE JSON line. Run: ``python bench/tune.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from qhlab.preparation.fits import ToolRun
from qhlab.preparation.tune import run_tuning
from qhlab.scenes import cached_population
from qhlab.training.console import configure_console

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _config(directory: Path, cache: Path, updates: int, trials: int) -> Path:
    recipe = (EXAMPLES / "tiny-recipe.toml").read_text().replace("updates = 40", f"updates = {updates}")
    (directory / "recipe.toml").write_text(recipe)
    text = (EXAMPLES / "tiny-tune.toml").read_text()
    text = text.replace('recipe = "tiny-recipe.toml"', 'recipe = "recipe.toml"')
    text = text.replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{cache}"')
    text = text.replace("trials = 4 ", f"trials = {trials} ")
    path = directory / "tune.toml"
    path.write_text(text)
    return path


def _trials(directory: Path) -> list:
    record = json.loads((directory / "tuning.json").read_text())
    return [
        (t["params"], t["state"], [(f["regret"], f["final_state_sha256"]) for f in t["fits"]]) for t in record["trials"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300, help="updates per fit (default 300)")
    parser.add_argument("--trials", type=int, default=4, help="trials (default 4, two batches of two)")
    args = parser.parse_args()
    configure_console(False)  # qhlab's quiet console, as the CLI sets it: no third-party banners
    with tempfile.TemporaryDirectory(prefix="qhlab-bench-tune-") as tmp:
        root = Path(tmp)
        cache = root / "cache"
        cached_population("tiny", "train", 7, cache, workers=1)
        cached_population("tiny", "validation", 9, cache, workers=1)
        config = _config(root, cache, args.updates, args.trials)
        walls = {}
        for workers in (1, 2):
            started = time.perf_counter()
            record = run_tuning(ToolRun(config, root / f"w{workers}", workers=workers, say=lambda line: None))
            walls[workers] = time.perf_counter() - started
            if workers == 1:
                fit_seconds = sum(f["wall_seconds"] for t in record["trials"] for f in t["fits"])
        identical = (
            _trials(root / "w1") == _trials(root / "w2")
            and (root / "w1" / "recipe.toml").read_bytes() == (root / "w2" / "recipe.toml").read_bytes()
        )
        overhead = walls[1] / fit_seconds
        speedup = walls[1] / walls[2]
        print(
            json.dumps(
                {
                    "bench": "tune",
                    "overhead": round(overhead, 3),
                    "speedup": round(speedup, 3),
                    "identical": identical,
                    "tuning_seconds_1_worker": round(walls[1], 2),
                    "tuning_seconds_2_workers": round(walls[2], 2),
                    "fit_seconds": round(fit_seconds, 2),
                    "fits": args.trials * 2,
                    "updates_per_fit": args.updates,
                    "targets": {"overhead": 1.10, "speedup": 1.7},
                    "meets_targets": {"overhead": overhead <= 1.10, "speedup": speedup >= 1.7},
                },
                sort_keys=True,
            )
        )


if __name__ == "__main__":
    main()
