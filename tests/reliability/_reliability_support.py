"""Helpers of the reliability suite (imported by its conftest and test modules).

Owns: the reliability recipe (the tiny example recipe with a few lines replaced) and the study
config template, the in-process CLI runner, the subprocess helpers that start ``qhlab`` and
SIGKILL it at a recorded point, the "no published
file is partial" invariant check, and the population forger (rewrite tables, recompute every
digest) used by the numerics and bad-input tests. Does not own: fixtures (``conftest.py``) or
any behaviour under test. The module name is unique so that test modules can import it
without colliding with other directories' ``conftest`` modules.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qhlab.evidence.envelope import Receipt
from qhlab.scenes.records import PopulationReceipt
from tiny_recipe import tiny_recipe_text

REPO = Path(__file__).resolve().parents[2]
# `qhlab.cli` is a package without __main__; this is exactly what the console script runs.
QHLAB = [sys.executable, "-c", "import sys; from qhlab.cli import main; sys.exit(main())"]
TEMP_MARKER = ".tmp-"

# One torch thread per process: several fits share 2 cores (see docs/ARCHITECTURE.md, CPU note).
CHILD_ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "PYTHONUNBUFFERED": "1",
}


def reliability_recipe(*, updates: int, train: Path | str, validation: Path | str) -> str:
    """The reliability recipe's TOML: the tiny example recipe, smaller (batch 8, width 16),
    with ``updates`` and the session's populations."""
    return tiny_recipe_text(
        name="rel-tiny",
        batch_size=8,
        updates=updates,
        encoder={"depth": 1, "width": 16, "heads": 2},
        train=train,
        validation=validation,
    )


STUDY_TEMPLATE = """\
name = "rel-study"
profile = "cpu-fp32"
seeds = [0, 1]
canary_updates = 600
broad_updates = {broad_updates}
tie_band = 0.001
regret_fraction = 0.9
mae_fraction = 1.1
workers = 1
population_cache = "{cache}"

[train]
preset = "tiny"
seed = 7

[validation]
preset = "tiny"
seed = 8

[bootstrap]
resamples = 199
seed = 0

[experiment.recipe]
name = "rel"
horizon = 2
batch_size = 8
huber_delta = 0.05
architecture = {{ arm = "baseline", encoder = {{ depth = 1, width = 16, heads = 2 }} }}
optimizer = {{ lr = 3e-3 }}
target_update = {{ kind = "hard", interval = 10 }}

[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "control_no_interaction"
role = "control"

[[experiment.arms]]
arm = "variant_cross_attention"
role = "variant"
control = "control_global_readout"

[[experiment.arms]]
arm = "variant_deep"
role = "variant"
control = "control_no_interaction"
"""


# ----------------------------------------------------------------------------- in-process CLI


@dataclass(frozen=True)
class CliResult:
    """Exit status and captured streams of one in-process ``qhlab.cli.main`` call."""

    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """Lines that announce an error: ``error: ...`` (qhlab) or ``PROG: error: ...`` (argparse)."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:") or ": error: " in line]


def run_cli(argv: list[str]) -> CliResult:
    """Run ``qhlab argv`` in this process, capturing stdout and stderr."""
    from qhlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return CliResult(code, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- subprocesses


@dataclass
class KillPoint:
    """One seeded kill: what ran, what triggered the SIGKILL, and what was on disk then."""

    label: str
    argv: list[str]
    trigger: str
    planned_delay: float
    killed: bool = False
    seconds: float = 0.0
    returncode: int | None = None
    newest_files: list[str] = field(default_factory=list)
    stderr_tail: str = ""

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "label",
                "argv",
                "trigger",
                "planned_delay",
                "killed",
                "seconds",
                "returncode",
                "newest_files",
                "stderr_tail",
            )
        }


def start_qhlab(argv: list[str], *, log: Path) -> subprocess.Popen:
    """Start ``python -m qhlab.cli argv`` with one torch thread; stdout+stderr go to ``log``."""
    handle = open(log, "ab")
    try:
        return subprocess.Popen(
            [*QHLAB, *map(str, argv)],
            cwd=REPO,
            env=CHILD_ENV,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        handle.close()


def matches(root: Path, pattern: str) -> list[Path]:
    """Files below ``root`` matching ``pattern``; temporary paths only when the pattern names them."""
    if not root.exists():
        return []
    return [p for p in root.glob(pattern) if TEMP_MARKER in pattern or TEMP_MARKER not in p.as_posix()]


def kill_when(
    point: KillPoint,
    *,
    root: Path,
    log: Path,
    pattern: str | None,
    count: int = 1,
    timeout: float = 240.0,
) -> KillPoint:
    """Run ``point.argv``; SIGKILL it ``point.planned_delay`` s after ``count`` files match
    ``pattern`` below ``root`` (or after the delay alone when ``pattern`` is None).

    If the process exits first, ``point.killed`` stays False and its return code is kept.
    """
    started = time.monotonic()
    proc = start_qhlab(point.argv, log=log)
    armed_at = started if pattern is None else None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now - started > timeout:
                break
            if armed_at is None and len(matches(root, pattern)) >= count:
                armed_at = now
            if armed_at is not None and now - armed_at >= point.planned_delay:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                # It may have exited on its own between the last poll and the signal.
                point.killed = proc.returncode == -signal.SIGKILL
                break
            time.sleep(0.005)
        else:
            point.killed = False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            point.killed = proc.returncode == -signal.SIGKILL
    point.seconds = round(time.monotonic() - started, 3)
    point.returncode = proc.returncode
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    files.sort(key=lambda p: p.stat().st_mtime_ns)
    point.newest_files = [p.relative_to(root).as_posix() for p in files[-3:]]
    text = log.read_text(errors="replace") if log.exists() else ""
    point.stderr_tail = text[-600:]
    return point


def run_to_end(argv: list[str], *, log: Path, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run ``qhlab argv`` to completion as a subprocess; output captured as text."""
    with open(log, "ab") as handle:
        handle.write(f"\n$ qhlab {' '.join(map(str, argv))}\n".encode())
    return subprocess.run(
        [*QHLAB, *map(str, argv)], cwd=REPO, env=CHILD_ENV, capture_output=True, text=True, timeout=timeout
    )


# ----------------------------------------------------------------------------- invariants


def is_temporary(path: Path, root: Path) -> bool:
    """A path is temporary when any component below ``root`` carries the temp marker."""
    return TEMP_MARKER in path.relative_to(root).as_posix()


def assert_nothing_partial(root: Path, *, context: str = "") -> dict:
    """Every published (non-temporary) file below ``root`` is complete; every receipt authenticates.

    Complete means: every ``.json`` parses (receipts authenticate with every bound file),
    every ``.safetensors`` opens with all its tensors, every ``.parquet`` reads, every ``.png``
    has its IEND chunk. Returns counts by kind.
    """
    import pyarrow.parquet as pq
    from safetensors import safe_open

    from qhlab.evidence import read_receipt

    counts = {"json": 0, "receipts": 0, "safetensors": 0, "parquet": 0, "png": 0, "other": 0, "temporary": 0}
    if not root.exists():
        return counts
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if is_temporary(path, root):
            counts["temporary"] += 1
            continue
        name = path.name
        where = f"{context}: {path.relative_to(root)}"
        if "/wandb/" in f"/{path.relative_to(root).as_posix()}" and not name.endswith(".receipt.json"):
            # W&B's own run files are appended by wandb-core and are never bound; skip them.
            counts["other"] += 1
            continue
        if name.endswith(".receipt.json"):
            read_receipt(path, Receipt, verify_files=True).record()
            counts["receipts"] += 1
        elif name.endswith(".json"):
            json.loads(path.read_text(encoding="utf-8"))
            counts["json"] += 1
        elif name.endswith(".safetensors"):
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():
                    handle.get_tensor(key)
            counts["safetensors"] += 1
        elif name.endswith(".parquet"):
            pq.read_table(path)
            counts["parquet"] += 1
        elif name.endswith(".png"):
            assert path.read_bytes().endswith(b"IEND\xaeB`\x82"), f"{where} is a truncated PNG"
            counts["png"] += 1
        else:
            counts["other"] += 1
    return counts


# ----------------------------------------------------------------------------- populations


def forge_population(source: Path, target: Path, mutate: Callable[[dict], None]) -> Path:
    """Copy a population and rewrite its tables, RECOMPUTING every digest (manifest and receipt).

    The result authenticates, so only the loader's content checks can refuse it.

    Args:
        source: a population directory.
        target: the forged copy (must not exist).
        mutate: edits ``{"scenes.parquet": Table, "states.parquet": ..., "candidates.parquet": ...}``
            in place (assign new ``pyarrow.Table`` values).
    """
    import pyarrow.parquet as pq

    from qhlab.evidence import canonical_json, publish_json, read_receipt, sha256_file, write_receipt

    names = ("scenes.parquet", "states.parquet", "candidates.parquet")
    receipt = read_receipt(source / "population.receipt.json", PopulationReceipt).record()
    tables = {name: pq.read_table(source / name) for name in names}
    mutate(tables)
    target.mkdir(parents=True)
    manifest = json.loads((source / "manifest.json").read_text())
    for name in names:
        pq.write_table(tables[name], target / name)
        manifest["files"][name] = sha256_file(target / name)
    publish_json(target / "manifest.json", manifest)
    assert (target / "manifest.json").read_bytes() == canonical_json(manifest)
    write_receipt(
        target / "population.receipt.json",
        PopulationReceipt,
        body=receipt["body"],
        outputs={n: target / n for n in (*names, "manifest.json")},
    )
    return target


def set_list_value(table, column: str, row: int, index: int, value: float):
    """A copy of ``table`` whose list<double> ``column`` holds ``value`` at [row][index]."""
    import pyarrow as pa

    values = table.column(column).to_pylist()
    values[row] = list(values[row])
    values[row][index] = value
    position = table.column_names.index(column)
    return table.set_column(
        position, table.schema.field(column), pa.array(values, type=table.schema.field(column).type)
    )


def set_scalar_value(table, column: str, row: int, value):
    """A copy of ``table`` whose scalar ``column`` holds ``value`` at ``row``."""
    import pyarrow as pa

    values = table.column(column).to_pylist()
    values[row] = value
    position = table.column_names.index(column)
    return table.set_column(
        position, table.schema.field(column), pa.array(values, type=table.schema.field(column).type)
    )
