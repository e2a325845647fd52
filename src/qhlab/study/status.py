"""``qhlab study status DIR``: where a study stands, read from its receipts alone.

Owns: ``study_status(output) -> dict`` (one row per step and per cell, in the order a study
runs them), the states it shows (``STATES``) and the rules that choose them, and
``status_lines(status)`` (the text table). It only reads: no lock file, cache or receipt is
ever created, and a writer's lock is probed on an existing file opened read-only.

Does not own: the layout (``layout``), reading receipts (``qhlab.evidence.read_receipt``),
the attempt files (``qhlab.training.segments``), or taking a writer's lock (``cells``,
``qhlab.training.wandb_attempt``).

States (every receipt shown is authenticated in full: kind, schema, its own digest and the
digests of every file it binds):

- ``authenticated``: the row's receipt exists and authenticates.
- ``crashed``: the receipt exists but fails authentication (the note says why); or a cell has
  attempt directories, no final receipt and no writer holding its lock; or a step has no
  receipt although its parts started and none runs (the E0 gate, the benchmarks).
- ``finished``: a cell has no final receipt, no writer holds its lock, but its latest
  attempt's fit receipt authenticates: the fit ran to its end (``qhlab study run`` adopts it
  instead of fitting again).
- ``running``: no final receipt, and another process holds one of the cell's writer locks
  (for the E0 gate: one of its canaries runs).
- ``not started``: nothing of the row exists.

A lock is probed by taking it non-blocking and releasing it at once: a writer that tries to
start in that instant is refused (``LockHeldError``, exit 3, nothing written) and can rerun.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from qhlab.design.study_config import read_study_config
from qhlab.design.study_records import (
    StudyBenchmarkReceipt,
    StudyCellReceipt,
    StudyDevelopmentReceipt,
    StudyE0Receipt,
    StudyFreezeReceipt,
    StudyReportReceipt,
)
from qhlab.design.user_sources import environment_source_change, preset_file_changes, source_changes
from qhlab.evidence import (
    RECEIPT_SUFFIX,
    EvidenceError,
    authentication_roots,
    input_error,
    layout,
    read_receipt,
    recorded_origin,
)
from qhlab.evidence.envelope import Receipt
from qhlab.study.authentication import frozen_config_path
from qhlab.training.records import FitReceipt, SegmentCheckpointReceipt
from qhlab.training.wandb_attempt import writer_lock_path

__all__ = ["STATES", "status_lines", "study_status"]

R = TypeVar("R", bound=Receipt)

STATES = ("not started", "running", "crashed", "finished", "authenticated")
_CALL = "study status"
# Column key -> header of the text table; the JSON rows carry the same keys (plus "kind").
_COLUMNS = {
    "row": "row",
    "state": "state",
    "attempts": "attempts",
    "updates": "updates",
    "mae_h": "MAE_H",
    "regret_h": "regret_H",
    "wall_seconds": "wall s",
    "note": "note",
}
# A row's columns besides its name, kind and state, and their values where a row gives none.
_OPTIONAL = {"attempts": None, "updates": None, "mae_h": None, "regret_h": None, "wall_seconds": None, "note": ""}


def study_status(output: str | os.PathLike, populations: Sequence[str | os.PathLike] = ()) -> dict:
    """Read where a study stands from its receipts, writing nothing.

    Receipts are authenticated on the study's own bytes (``authentication_roots``): a copy is
    judged by what the copy holds, whether or not the original still exists.

    Args:
        output: a study directory (it holds ``freeze.receipt.json``).
        populations: further roots its populations were copied to (``--populations``).

    Returns:
        ``{"study": name, "output": str, "rows": [row, ...]}``; rows in study order: freeze,
        the E0 gate, its canary cells, development, every declared cell (config order),
        benchmarks, report. A row has ``row`` (name), ``kind`` ("step" | "canary" | "cell"),
        ``state`` (one of ``STATES``), ``attempts`` (attempt directories of a cell, crashed
        ones included; None for a step), ``updates`` (observed optimizer updates: the final
        receipt's, else the latest attempt's fit receipt or newest segment checkpoint),
        ``mae_h`` / ``regret_h`` (validation metrics at horizon H of a finished broad cell),
        ``wall_seconds`` (the fit's, from its receipt) and ``note``. ``sources``: ``{arm: what}``
        for each user arm whose own source file differs from (or is gone since) the copy its
        freeze made ("source changed since freeze; the frozen copy is used"). ``environment``:
        the same for a user environment's own source (None: unchanged, or built in).
        ``presets``: each preset file that changed or is gone since the freeze, in words.

    Raises:
        QhInputError: ``output`` is not a study directory, or its config copy is unreadable.
    """
    with authentication_roots(output, populations, original=recorded_origin(output)):
        return _status(Path(output))


def _status(output: Path) -> dict:
    output = Path(output)
    if not (output / layout.FREEZE_RECEIPT).is_file():
        raise input_error(
            _CALL,
            "DIR",
            str(output),
            f"a study output directory (it holds {layout.FREEZE_RECEIPT})",
            "pass the --output directory of `qhlab study freeze` or `qhlab study run`",
        )
    # The config as the study's steps read it: the original while it is unchanged, so a recipe file
    # it names by a relative path resolves where it did.
    config, _, _ = read_study_config(frozen_config_path(output))
    freeze, frozen = _receipt_row("freeze", output / layout.FREEZE_RECEIPT, StudyFreezeReceipt)
    # The user's own arm files are only compared, never imported: the study uses its frozen copies.
    sources = {} if frozen is None else source_changes(frozen.body)
    environment = None if frozen is None else environment_source_change(frozen.body.train.get("environment_source"))
    canary_dir = output / layout.CANARY_DIR
    canaries = [
        _cell_row(canary_dir, layout.cell_name(config.baseline_arm, seed, role), "canary", config.canary_updates)
        for role in layout.CANARY_ROLES
        for seed in config.seeds
    ]
    e0, document = _receipt_row("E0 gate", canary_dir / layout.E0_RECEIPT, StudyE0Receipt)
    if document is not None:
        e0["note"] = "passed" if document.body.passed else f"failed: {document.body.reason}"
    else:
        _state_from_parts(e0, canaries, "the gate has no receipt")
    development, _ = _receipt_row("development", output / layout.DEVELOPMENT_RECEIPT, StudyDevelopmentReceipt)
    cells = [
        _cell_row(output / layout.CELLS_DIR, layout.cell_name(arm, seed), "cell", config.broad_updates)
        for arm, seed in config.cells
    ]
    report, _ = _receipt_row("report", output / layout.REPORT_DIR / layout.REPORT_RECEIPT, StudyReportReceipt)
    _unbound_report(report, output / layout.REPORT_DIR)
    benchmarks = _benchmarks_row(output, config.cells)
    return {
        "study": config.name,
        "output": str(output),
        "sources": sources,
        "environment": environment,
        "presets": [] if frozen is None else preset_file_changes(frozen.body),
        "rows": [freeze, e0, *canaries, development, *cells, benchmarks, report],
    }


def status_lines(status: dict) -> list[str]:
    """The status as text: a title line, then one aligned line per row under a header."""
    table = [list(_COLUMNS.values())]
    table += [[_cell_text(key, row[key]) for key in _COLUMNS] for row in status["rows"]]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS) - 1)]
    lines = [f"study {status['study']} ({status['output']})"]
    lines += [f"arm {arm}: {what}" for arm, what in sorted(status.get("sources", {}).items())]
    if status.get("environment"):
        lines.append(f"environment: {status['environment']}")
    lines += status.get("presets", [])
    for line in table:
        lines.append("  ".join(text.ljust(width) for text, width in zip(line, widths)) + "  " + line[-1])
    return [line.rstrip() for line in lines]


def _cell_text(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("mae_h", "regret_h"):
        return f"{value:.4f}"
    if key == "wall_seconds":
        return f"{value:.1f}"
    return str(value)


def _row(name: str, kind: str, state: str, **values: Any) -> dict:
    """A row: its name, kind ("step", "canary", "cell") and state, and its other columns from
    ``values`` (``_OPTIONAL`` gives those it leaves out)."""
    unknown = sorted(set(values) - set(_OPTIONAL))
    if unknown:
        raise ValueError(f"_row: {unknown} is not allowed; allowed: {sorted(_OPTIONAL)}. HINT: add the column first.")
    return {"row": name, "kind": kind, "state": state, **_OPTIONAL, **values}


def _authenticate(path: Path, kind: type[R]) -> tuple[R | None, str]:
    """(the receipt, "") when it authenticates, else (None, why not)."""
    try:
        return read_receipt(path, kind), ""
    except EvidenceError as exc:
        return None, str(exc)


def _receipt_row(name: str, path: Path, kind: type[R]) -> tuple[dict, R | None]:
    """A step's row from its one receipt, and the receipt when it authenticates."""
    if not path.is_file():
        return _row(name, "step", "not started"), None
    document, failure = _authenticate(path, kind)
    if document is None:
        return _row(name, "step", "crashed", note=f"receipt fails authentication: {failure}"), None
    return _row(name, "step", "authenticated"), document


def _unbound_report(row: dict, folder: Path) -> None:
    """A report folder that holds files without its receipt is no report: say so, never "not started"."""
    if row["state"] != "not started" or not folder.is_dir():
        return
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    if files:
        row.update(
            state="crashed",
            note=f"report/ holds {', '.join(files)} but no {layout.REPORT_RECEIPT} binds them; `qhlab verify` "
            "refuses it; remove report/ and rerun the report step",
        )


def _state_from_parts(row: dict, parts: list[dict], missing: str) -> None:
    """A step without its receipt is running or crashed as its parts are, else not started."""
    started = [part for part in parts if part["state"] != "not started"]
    if any(part["state"] == "running" for part in parts):
        row.update(state="running", note=f"{missing}; {len(started)} of {len(parts)} parts started")
    elif started:
        row.update(state="crashed", note=f"{missing}; {len(started)} of {len(parts)} parts started, none runs")


def _lock_paths(parent: Path, cell: str) -> tuple[Path, Path]:
    """The lock files a cell's writers hold while it runs.

    ``cells.fit_cell`` holds ``<parent>/.<cell>.lock`` around the whole cell; the launcher holds
    ``WandbAttempt.local_writer_lock(parent)``, ``<parent>/.locks/<logical run>.lock``, whose
    logical run is the cell (``qhlab.finite_horizon.fit``: ``cell[:64]``). Neither owner names
    the file by a constant; ``tests/study/test_study_status.py`` pins both.
    """
    # Lazy: keeps importing this module free of Lightning and pyarrow.
    from qhlab.finite_horizon.fit import default_logical_run_id

    return layout.cell_lock_path(parent, cell), writer_lock_path(parent, default_logical_run_id(cell))


def _lock_holder(path: Path) -> str | None:
    """The pid written in a lock file another process holds now; None when free or absent.

    Opened read-only and never created; the probe's own lock is released at once.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _attempt_progress(attempt: Path) -> tuple[bool, int | None, float | None]:
    """(fit finished, observed updates, wall seconds) of one attempt directory.

    A fit receipt that authenticates means the fit ran to its end; otherwise the newest
    segment checkpoint that authenticates gives the updates so far.
    """
    if (attempt / layout.FIT_RECEIPT).is_file():
        document, _ = _authenticate(attempt / layout.FIT_RECEIPT, FitReceipt)
        if document is not None:
            return True, document.body.observed_updates, document.body.wall_seconds
    updates = None
    for path in sorted(attempt.glob(f"*{RECEIPT_SUFFIX}")):
        document, _ = _authenticate(path, SegmentCheckpointReceipt)
        if document is not None:
            observed = document.body.observed_updates
            updates = observed if updates is None else max(updates, observed)
    return False, updates, None


def _cell_row(parent: Path, cell: str, kind: str, budget: int) -> dict:
    """A cell's row: its final receipt when present, else its attempts and writer locks."""
    directory = parent / cell
    # Hidden directories are never attempts (a Ray driver's unpublished staging directory).
    attempts = (
        sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        if directory.is_dir()
        else []
    )
    receipt = directory / layout.CELL_RECEIPT
    if receipt.is_file():
        document, failure = _authenticate(receipt, StudyCellReceipt)
        if document is None:
            return _row(cell, kind, "crashed", attempts=len(attempts), note=f"receipt fails authentication: {failure}")
        body = document.body
        evaluation = body.evaluation or {}
        canary = body.canary
        return _row(
            cell,
            kind,
            "authenticated",
            attempts=len(attempts),
            updates=body.observed_updates,
            mae_h=(evaluation.get("mae") or [None])[-1],
            regret_h=(evaluation.get("regret") or [None])[-1],
            wall_seconds=body.wall_seconds,
            note="" if canary is None else f"canary recovered: {canary['recovered']}",
        )
    finished, updates, wall = _attempt_progress(attempts[-1]) if attempts else (False, None, None)
    progress = dict(attempts=len(attempts), updates=updates, wall_seconds=wall)
    holder = next((pid for pid in map(_lock_holder, _lock_paths(parent, cell)) if pid is not None), None)
    if holder is not None:
        return _row(cell, kind, "running", **progress, note=f"writer pid {holder}; budget {budget} updates")
    if finished:
        return _row(
            cell,
            kind,
            "finished",
            **progress,
            note=f"fit of {attempts[-1].name} finished; its cell receipt is not written "
            "(`qhlab study run` adopts an attempt at the frozen budget)",
        )
    if attempts:
        return _row(
            cell,
            kind,
            "crashed",
            **progress,
            note=f"no final receipt and no writer holds its lock; budget {budget} updates "
            "(the next run records a new attempt)",
        )
    return _row(cell, kind, "not started", attempts=0)


def _benchmarks_row(output: Path, cells: tuple[tuple[str, int], ...]) -> dict:
    """One row for every cell's benchmark receipt (benchmarks hold no lock, so never "running")."""
    present = [
        path for path in (layout.benchmark_receipt_path(output, arm, seed) for arm, seed in cells) if path.is_file()
    ]
    for path in present:
        document, failure = _authenticate(path, StudyBenchmarkReceipt)
        if document is None:
            return _row("benchmarks", "step", "crashed", note=f"receipt fails authentication: {failure}")
    counted = f"{len(present)} of {len(cells)} cells benchmarked"
    if not present:
        return _row("benchmarks", "step", "not started")
    if len(present) < len(cells):
        return _row(
            "benchmarks", "step", "crashed", note=f"{counted}; a benchmark in progress (no lock to probe) also shows so"
        )
    return _row("benchmarks", "step", "authenticated", note=counted)
