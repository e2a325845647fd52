"""Benchmark: wall time of the default demo study on this machine (target: under 10 minutes).

Runs ``qhlab study run examples/default-study.toml`` end to end in a fresh output directory,
by default with a fresh population cache too (so population generation is included, as on a
new machine); ``--reuse-cache`` keeps the configured cache. The study's own receipts are then
authenticated with ``qhlab verify``. ``--output DIR`` keeps the finished study there (a new
directory) instead of a temporary one, and its config copy and fresh cache in ``DIR-inputs``,
so that it can be read and verified later.

Prints ONE JSON line: ``ratio = wall_seconds / 600`` (target <= 1.0), the wall time of each
phase as measured here, and the load average (a shared machine slows everything).
Run: ``python bench/study_demo.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_TARGET_SECONDS = 600.0


def _qhlab(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "qhlab.cli", *args], check=True, stdout=subprocess.DEVNULL)


def _phases(output: Path, started: float) -> dict[str, float]:
    """Seconds per phase, from when each step's final receipt was written (``started``: epoch seconds).

    A phase ends when its step publishes its receipt: TRAIN generation and the freeze, the two
    canaries (E0), validation generation and development, the broad cells (the last cell
    receipt), then benchmarks and the report.
    """
    ends = [("train_and_freeze", [output / "freeze.receipt.json"]),
            ("canaries", [output / "canaries" / "e0.receipt.json"]),
            ("validation_and_development", [output / "development.receipt.json"]),
            ("cells", sorted((output / "cells").glob("*/cell.receipt.json"))),
            ("benchmarks_and_report", [output / "report" / "report.receipt.json"])]
    phases, previous = {}, started
    for name, files in ends:
        end = max(f.stat().st_mtime for f in files)
        phases[name], previous = round(end - previous, 1), end
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=_ROOT / "examples" / "default-study.toml")
    parser.add_argument("--reuse-cache", action="store_true", help="keep the configured population cache")
    parser.add_argument("--output", type=Path, default=None, help="keep the study here (must not exist)")
    args = parser.parse_args()
    if args.output is not None:
        args.output = args.output.resolve()
        inputs = args.output.with_name(args.output.name + "-inputs")
        if args.output.exists() or inputs.exists():
            raise SystemExit(f"--output {args.output}: it or {inputs.name} exists; give a new directory")
        inputs.mkdir(parents=True)

    with tempfile.TemporaryDirectory(prefix="qhlab-bench-study-") as tmp:
        tmp = tmp if args.output is None else inputs
        config = args.config
        if not args.reuse_cache:
            # Same study, fresh cache: rewrite only the cache line of a copy of the config.
            text = config.read_text(encoding="utf-8")
            cache = Path(tmp) / "cache"
            text, n = re.subn(r"(?m)^population_cache\s*=.*$", f'population_cache = "{cache}"', text)
            if n != 1:
                text = f'population_cache = "{cache}"\n' + text
            config = Path(tmp) / config.name
            config.write_text(text, encoding="utf-8")
        output = args.output or Path(tmp) / "study"
        load_before = os.getloadavg()[0]
        started, started_epoch = time.perf_counter(), time.time()
        _qhlab("study", "run", str(config), "--output", str(output))
        wall = time.perf_counter() - started
        phases = _phases(Path(output), started_epoch)
        _qhlab("verify", str(output))
        print(
            json.dumps(
                {
                    "bench": "study_demo",
                    "config": str(args.config.relative_to(_ROOT) if args.config.is_relative_to(_ROOT) else args.config),
                    "fresh_population_cache": not args.reuse_cache,
                    "wall_seconds": round(wall, 1),
                    "target_seconds": _TARGET_SECONDS,
                    "ratio": round(wall / _TARGET_SECONDS, 3),
                    "phase_seconds": phases,
                    "cores": os.cpu_count(),
                    "load_average_before": round(load_before, 2),
                    "load_average_after": round(os.getloadavg()[0], 2),
                },
                sort_keys=True,
            )
        )


if __name__ == "__main__":
    main()
