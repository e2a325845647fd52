"""One fit of a preparation step (a tuning trial's or a pilot's), and the tool's directory around it.

Owns: how a tool's run is asked for (``ToolRun``), a tool's directory (``finished_record``: a
finished run's record is adopted when its config digest is this run's, and refused otherwise; a
directory holding anything the tool does not write is refused; ``publish_config_copy``), its fits
with their progress shown (``run_fits``: each a ``qhlab.finite_horizon.fit_job.FitJob`` that adopts
its cell's finished attempt by the one rule, or fits it with the same launcher, lane and receipts
as every qhlab fit; ``adopt_or_fit`` runs one in a worker), and ``fit_evidence``, what a record
keeps of a finished fit. Does not own: which fits a step makes (``qhlab.preparation.tune``,
``qhlab.preparation.pilot``), the job and its rule (``qhlab.finite_horizon.fit_job``) or fitting
itself (``qhlab.finite_horizon.fit``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qhlab.design.preparation_record import record_writer
from qhlab.evidence import exclusive_lock, file_in_the_way, input_error, publish_bytes, read_receipt, sha256_file
from qhlab.evidence.layout import EVALUATION_RECEIPT, FIT_RECEIPT, PREPARATION_FITS_DIR, RECORD_CONFIG_COPY
from qhlab.evidence.publish import TEMP_MARKER
from qhlab.execution import ExecutorChoice, JobRunner, executor_choice, reporting
from qhlab.finite_horizon.fit_job import FitJob, run_fit_job
from qhlab.finite_horizon.recipe import QhRecipe
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.study.populations import resolve_population
from qhlab.training.records import FitReceipt
from qhlab.training.terminal import FitBoard
from qhlab.training.terminal import console as study_console

__all__ = [
    "ToolRun",
    "adopt_or_fit",
    "finished_record",
    "fit_evidence",
    "publish_config_copy",
    "resolve_tool_population",
    "run_fits",
    "study_record_head",
    "tool_fit_job",
]


@dataclass(frozen=True)
class ToolRun:
    """One run of a preparation tool (``run_tuning``, ``run_pilot``, ``run_e0_check``), as asked for.

    Attributes:
        config_path: the tool's TOML.
        output: its directory (created; an interrupted run's directory resumes, a finished run's
            record is re-read; any other directory that is not empty is refused).
        workers: jobs at once on the local executor (None: the config's ``workers``).
        executor: an ``ExecutorChoice`` (None: the config's executor).
        say: where progress lines go.
        adopt_from: an earlier run's directory whose finished fits of the same cells are adopted
            (``adopt_or_fit``); None: none.
    """

    config_path: str | os.PathLike
    output: str | os.PathLike
    workers: int | None = None
    executor: Any = None
    say: Callable[[str], None] = print
    adopt_from: str | os.PathLike | None = None

    @property
    def directory(self) -> Path:
        """The output directory, absolute."""
        return Path(self.output).expanduser().absolute()

    def choice(self, config: Any, call: str) -> ExecutorChoice:
        """Where the tool's jobs run: ``executor``, else its config's executor."""
        return self.executor if self.executor is not None else executor_choice(config.executor, None, call=call)

    def jobs_at_once(self, config: Any) -> int:
        """``workers``, else its config's."""
        return config.workers if self.workers is None else self.workers

    @contextlib.contextmanager
    def writing(self, call: str, lock: str, data: bytes | None = None) -> Iterator[Path]:
        """The output directory, made and held with the tool's writer lock (a second run of the
        tool there exits 3); with ``data``, the config's bytes copied in first (``publish_config_copy``)."""
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(directory / lock, hint=f"another {call} writes this directory; wait for it"):
            if data is not None:
                publish_config_copy(directory / RECORD_CONFIG_COPY, data, call=call)
            yield directory


def resolve_tool_population(source: Any, split: str, config: Any, choice: Any, *, call: str, role: str) -> Path:
    """A tool's population (a named directory, or a preset drawn into its cache), absolute.

    Raises:
        QhInputError: a named directory that does not exist (naming ``role``).
    """
    if source.path is not None and not Path(source.path).is_dir():
        raise input_error(
            call,
            f"{role}.path",
            source.path,
            "an existing population directory",
            "generate it with `qhlab scenes generate` or name a preset and seed",
        )
    return Path(
        resolve_population(source, split, config.population_cache, progress=True, executor=choice, call=call)
    ).absolute()


def study_record_head(kind: str, config: Any, digest: str, study: Any, design: dict) -> dict:
    """The fields a record made for a study opens with (a pilot's, an E0 check's): its kind, name,
    config and digest, the study (its resolved path and name) and the study design it was made for."""
    study_path = str(Path(config.study).resolve())
    return {
        "kind": kind,
        "name": config.name,
        "config": config.record(),
        "config_sha256": digest,
        "study": {"path": study_path, "name": study.name},
        "design": design,
    }


def finished_record(
    directory: Path,
    receipt: str,
    read_record: Callable[[Path], dict],
    digest: str,
    *,
    call: str,
    what: str,
    own: Collection[str],
    data: bytes | None = None,
) -> dict | None:
    """The record a finished run of this config left in ``directory``, or None when there is none.

    The tools call it first, so an output that can never be this config's is refused before any
    population is drawn or any file written: a file, a directory holding anything the tool does
    not write there (another tool's output, the user's files), another config's copy or record.

    Args:
        directory: the tool's output directory.
        receipt: the record's receipt's file name (its presence marks a finished run).
        read_record: the record's reader (authenticates and validates it).
        digest: this run's config (and design) digest.
        call: the command named in a refusal.
        what: the tool's record, for the refusal (e.g. ``"tuning"``).
        own: every name the tool writes directly in its directory (its lock file included): an
            interrupted or finished run of it leaves nothing else there.
        data: the config's bytes: a directory begun with another config is refused.

    Raises:
        QhInputError: the output is a file or lies below one, holds a name the tool does not write,
            or holds another config's copy or finished record (nothing written).
    """
    blocking = file_in_the_way(directory)
    if blocking is not None:
        below = "" if blocking == directory else f" (it lies below the file {str(blocking)!r})"
        raise input_error(
            call, "--output", str(directory), f"a new directory, or this config's {what}{below}", "use another --output"
        )
    _refuse_foreign(directory, own, call=call, what=what)
    if data is not None:
        _refuse_other_config(directory / RECORD_CONFIG_COPY, data, call=call)
    if not (directory / receipt).is_file():
        return None
    record = read_record(directory)
    if record["config_sha256"] != digest:
        raise input_error(
            call,
            "--output",
            str(directory),
            f"a new directory, or this config's {what}",
            f"it holds the finished {what} of another config or design; use another --output",
        )
    return record


def _refuse_foreign(directory: Path, own: Collection[str], *, call: str, what: str) -> None:
    """Refuse an existing directory holding a name the tool never writes there.

    A tool writes beside nothing but its own earlier output (which it resumes or re-reads), as
    ``qhlab study freeze`` does: its files never mix with another tool's or the user's. Hidden
    temporary files of an interrupted publication (``TEMP_MARKER``) are its own too.

    Raises:
        QhInputError: the names it does not write, and whose output the directory is when a
            preparation record says so (nothing written).
    """
    if not directory.is_dir():
        return
    foreign = sorted(
        p.name
        for p in directory.iterdir()
        if p.name not in own and not (p.name.startswith(".") and TEMP_MARKER in p.name)
    )
    if not foreign:
        return
    # A preparation record there says whose output the directory is.
    tools = [f"`{record_writer(name)}` ({name})" for name in foreign if record_writer(name) is not None]
    more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    shown = ", ".join(repr(name) for name in foreign[:5]) + more
    whose = f"it is the output of {', '.join(tools)}" if tools else f"it holds {shown}, which {call} does not write"
    raise input_error(
        call,
        "--output",
        str(directory),
        f"a new or empty directory, or this config's {what} directory (to resume or re-read it)",
        f"{whose}; nothing was written: use another --output",
    )


def publish_config_copy(path: Path, data: bytes, *, call: str) -> None:
    """Write the config's bytes to ``path``, or keep an identical copy there; refuse another.

    A preparation directory resumes with the config it began with: its record binds this copy,
    so a copy of another config would bind bytes the record was not made from.

    Raises:
        QhInputError: ``path`` holds other bytes (nothing is written).
    """
    _refuse_other_config(path, data, call=call)
    if not path.exists():
        publish_bytes(path, data)


def _refuse_other_config(path: Path, data: bytes, *, call: str) -> None:
    if path.is_file() and path.read_bytes() != data:
        raise input_error(
            call,
            "--output",
            str(path.parent),
            "a new directory, or one begun with this config",
            f"its {path.name} is another config's; use another --output, or remove the "
            "directory's config and records to re-derive them (finished fits are adopted)",
        )


def tool_fit_job(
    config: Any,
    recipe: QhRecipe,
    profile: str,
    directory: Path,
    cell: str,
    train: Path,
    validation: Path,
    *,
    job_type: str,
    tag: str,
    adopt_from: Path | None = None,
) -> FitJob:
    """A preparation tool's fit job: in its ``fits`` directory, with its thread count and W&B group,
    evaluated on its validation population; an adopted attempt must bind its recipe and populations.

    Args:
        config: the tool's config (its ``name`` and ``torch_threads``).
        recipe: the fit's recipe.
        profile: the lane.
        directory: the tool's directory (the job's output is ``directory/fits``).
        cell: the fit's cell name.
        train, validation: the population directories.
        job_type, tag: the W&B job type and the run's tag.
        adopt_from: an earlier run's directory whose finished fit of this cell is adopted where it
            binds the same (None: none).
    """
    return FitJob(
        recipe=recipe,
        profile=profile,
        output=str(directory / PREPARATION_FITS_DIR),
        cell=cell,
        train=str(train),
        validation=str(validation),
        torch_threads=config.torch_threads,
        job_type=job_type,
        group=config.name,
        tags=(tag,),
        bind_populations=True,
        adopt_from=None if adopt_from is None else str(adopt_from / PREPARATION_FITS_DIR),
    )


def adopt_or_fit(job: FitJob) -> tuple[Path, bool]:
    """A tool's fit job where it runs (a pool or Ray task): ``run_fit_job``, its progress reported
    to the tool's console (``run_fits``).

    Returns:
        (the attempt directory, True when a finished attempt was adopted rather than fitted).

    Raises:
        EvidenceError: the cell's finished attempt binds another recipe or population.
    """
    return run_fit_job(job, progress=reporting())


def fit_evidence(directory: Path, root: Path) -> tuple[dict[str, Any], Any, Any]:
    """What a record keeps of a finished fit, and its two receipt bodies.

    Args:
        directory: the attempt directory.
        root: the directory the record's relative ``directory`` starts from.

    Returns:
        (``{"final_state_sha256", "fit_receipt_sha256", "evaluation_receipt_sha256", "directory",
        "observed_updates", "wall_seconds"}``, the fit receipt's body, the evaluation receipt's body).
    """

    fit_body = read_receipt(directory / FIT_RECEIPT, FitReceipt).body
    evaluation = read_receipt(directory / EVALUATION_RECEIPT, EvaluationReceipt).body
    return (
        {
            "final_state_sha256": fit_body.final_state_sha256,
            "fit_receipt_sha256": sha256_file(directory / FIT_RECEIPT),
            "evaluation_receipt_sha256": sha256_file(directory / EVALUATION_RECEIPT),
            "directory": directory.relative_to(root).as_posix(),
            "observed_updates": fit_body.observed_updates,
            "wall_seconds": fit_body.wall_seconds,
        },
        fit_body,
        evaluation,
    )


def run_fits(
    runner: JobRunner,
    function: Callable[..., Any],
    jobs: list[tuple],
    *,
    on_result: Callable[[int, Any], None] | None = None,
    prefixes: list[str] | None = None,
) -> list[Any]:
    """``runner.run`` over a tool's fit jobs, showing each running fit's progress (``FitBoard``: a
    bar per fit in a terminal, a line every few seconds otherwise).

    Args:
        prefixes: one per job, before its fits' names where two jobs' fits share them (E0 draws).
    """
    with FitBoard(study_console()) as board:
        return runner.run(function, jobs, on_result=on_result, on_progress=board.report, progress_prefixes=prefixes)
