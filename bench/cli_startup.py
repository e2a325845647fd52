"""Benchmark: how long the command line takes to answer when it trains nothing.

Times, each in a fresh interpreter and in one run, ``qhlab --help``, ``qhlab --version`` and
``qhlab verify --help`` against ``python -c pass`` (the interpreter's own start), and records
which of torch, Lightning and W&B each loaded (none should). Prints ONE JSON line with the
medians of ``--repeats`` runs, ``ratio`` (``qhlab --help`` against ``python -c pass``) and
``overhead_seconds`` (their difference).
Run: ``python bench/cli_startup.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_PROBE = """
import sys
from qhlab.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write(",".join(m for m in ("torch", "lightning", "wandb") if m in sys.modules))
"""
COMMANDS = {"help": ["--help"], "version": ["--version"], "verify_help": ["verify", "--help"]}


def _time(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stderr.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs timed per command (default 5)")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"bench/cli_startup.py: --repeats={args.repeats!r} is not allowed; allowed: >= 1")
    load_before = os.getloadavg()[0]
    _time([sys.executable, "-c", _PROBE, "--version"])  # warm the file cache once, untimed
    bare = statistics.median(_time([sys.executable, "-c", "pass"])[0] for _ in range(args.repeats))
    seconds, loaded = {}, {}
    for name, argv in COMMANDS.items():
        runs = [_time([sys.executable, "-c", _PROBE, *argv]) for _ in range(args.repeats)]
        seconds[name] = round(statistics.median(t for t, _ in runs), 3)
        loaded[name] = sorted({m for _, text in runs for m in text.split(",") if m})
    print(
        json.dumps(
            {
                "bench": "cli_startup",
                "python_pass_seconds": round(bare, 3),
                "seconds": seconds,
                "heavy_modules_loaded": loaded,
                "ratio": round(seconds["help"] / bare, 2),
                "overhead_seconds": round(seconds["help"] - bare, 3),
                "repeats": args.repeats,
                "cores": os.cpu_count(),
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
