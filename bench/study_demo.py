"""Benchmark: wall time of the default demo study on this machine (target: 5 minutes, half the 10-minute mark).

Runs ``qhlab study run examples/default-study.toml`` end to end in a fresh output directory,
by default with a fresh population cache too (so population generation is included, as on a
new machine); ``--reuse-cache`` keeps the configured cache. The study's own receipts are then
authenticated with ``qhlab verify``. ``--output DIR`` keeps the finished study there (a new
directory) instead of a temporary one, and its config copy and fresh cache in ``DIR-inputs``,
so that it can be read and verified later.

Prints ONE JSON line: ``ratio = wall_seconds / 600`` (target <= 0.5, i.e. 300 s), the wall time
of each phase as measured here, and the load average (a shared machine slows everything).
Run: ``python bench/study_demo.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_MARK_SECONDS = 600.0
_TARGET_RATIO = 0.5


def _with_fresh_cache(config: Path, cache: Path, copy: Path) -> None:
    """Write ``config`` to ``copy`` with its population cache replaced and its paths absolute
    (the copy lives elsewhere, and the study names its recipe and records relative to itself)."""
    import tomli_w

    from qhlab.design.config_files import read_toml
    from qhlab.design.study_config import STUDY_PATH_FIELDS

    raw, _, _ = read_toml(
        config,
        call="bench/study_demo.py",
        field="--config",
        example="examples/default-study.toml",
        relative=STUDY_PATH_FIELDS,
    )
    raw["population_cache"] = str(cache)
    copy.write_text(
        f"# {config.resolve()} with a fresh population cache (bench/study_demo.py)\n" + tomli_w.dumps(raw),
        encoding="utf-8",
    )


def _qhlab(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "qhlab.cli", *args], check=True, stdout=subprocess.DEVNULL)


def _phases(output: Path, started: float) -> dict[str, float]:
    """Seconds per phase, from when each step's final receipt was written (``started``: epoch seconds).

    A phase ends when its step publishes its receipt: TRAIN generation and the freeze, the two
    canaries (E0), validation generation and development, the broad cells (the last cell
    receipt), then benchmarks and the report.
    """
    ends = [
        ("train_and_freeze", [output / "freeze.receipt.json"]),
        ("canaries", [output / "canaries" / "e0.receipt.json"]),
        ("validation_and_development", [output / "development.receipt.json"]),
        ("cells", sorted((output / "cells").glob("*/cell.receipt.json"))),
        ("benchmarks_and_report", [output / "report" / "report.receipt.json"]),
    ]
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
            copy = Path(tmp) / config.name
            _with_fresh_cache(config, Path(tmp) / "cache", copy)
            config = copy
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
                    "mark_seconds": _MARK_SECONDS,
                    "ratio": round(wall / _MARK_SECONDS, 3),
                    "target_ratio": _TARGET_RATIO,
                    "meets_target": wall / _MARK_SECONDS <= _TARGET_RATIO,
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
