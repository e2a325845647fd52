"""``Study``: one study directory and its config, and every step of the pipeline called one way.

Owns: ``Study`` (``Study.open(config, output)``, ``Study.existing(output)`` and its steps
``freeze``, ``admit_canaries``, ``prepare_development``, ``run_fit``, ``benchmark``, ``report``,
``status`` and ``run``, the main job: the order of the steps). A step authenticates the study once per ``Study`` object
(``authenticate_freeze``) and works inside ``authentication_roots``: the receipts of a copied study
are checked in the copy, and populations that moved are found by digest. Does not own: what a step
does (the step modules: ``freeze``, ``admission``, ``development``, ``cells``, ``benchmarks``;
``run`` for the main job's fits), the report (``qhlab.report``, above the pipeline, which a
``Study`` is given as its ``reporter``) or the path-based step functions
(``qhlab.finite_horizon.studies.architecture_study``), which are one-line calls of this object.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.markup import escape

from qhlab.design.study_config import read_study_config
from qhlab.design.study_records import StudyBenchmarkReceipt, StudyCellReceipt, StudyReportReceipt
from qhlab.design.user_sources import environment_source_change, preset_file_changes, source_changes
from qhlab.evidence import authentication_roots, exclusive_lock, input_error, read_receipt, recorded_origin
from qhlab.evidence.layout import (
    CANARY_DIR,
    DEVELOPMENT_RECEIPT,
    E0_RECEIPT,
    FREEZE_RECEIPT,
    REPORT_DIR,
    REPORT_MARKDOWN,
    REPORT_RECEIPT,
    RUN_LOCK,
    benchmark_receipt_path,
    cell_receipt_path,
)
from qhlab.execution import ExecutorChoice, JobRunner
from qhlab.study.admission import decide_e0
from qhlab.study.authentication import (
    FrozenStudy,
    authenticate_cells,
    authenticate_development,
    authenticate_e0,
    authenticate_freeze,
    frozen_config_path,
    refuse_linked_study,
)
from qhlab.study.benchmarks import benchmark_cells
from qhlab.study.cells import fit_cell
from qhlab.study.development import seal_development
from qhlab.study.freeze import describe_family, freeze, refuse_occupied, release_refused_output
from qhlab.study.remote import check_cells_feasible
from qhlab.study.run import fit_canaries, run_cells, say_benchmark, say_e0
from qhlab.study.status import study_status
from qhlab.training.terminal import console as study_console
from qhlab.training.terminal import fit_runner

__all__ = ["Reporter", "Study"]


class Reporter(Protocol):
    """The study's last step, handed to it from above.

    The report is a package of its own (``qhlab.report``) that reads the pipeline's receipts; the
    pipeline never imports it, so a ``Study`` that reports is given one (``qhlab.report.open_study``
    gives ``qhlab.report.REPORTER``).
    """

    def publish(self, frozen: FrozenStudy) -> dict:
        """Publish ``report/`` once (a crash leaves no partial ``report/``).

        Returns:
            The report (the content of ``report.json``).
        """
        ...

    def log_run(self, output: Path) -> str:
        """Log the study's W&B report run from the published report; returns where it went."""
        ...


@dataclass(eq=False, repr=False)
class Study:
    """A study directory and the config it is (or will be) frozen from.

    Opening writes and reads nothing; each step authenticates what came before it. The object
    keeps the authenticated freeze (``frozen``), so a run of several steps reads and re-hashes
    each receipt once.

    Attributes:
        config_path: the study TOML.
        output: the study directory.
        populations: further roots its populations were copied to (``--populations``).
        executor: where labelling and fits run (None: the config's executor).
        reporter: the report step (None: a study that runs every step but the report, which it
            refuses by name).
    """

    config_path: Path
    output: Path
    populations: tuple[str, ...] = field(default=(), kw_only=True)
    executor: ExecutorChoice | None = field(default=None, kw_only=True)
    reporter: Reporter | None = field(default=None, kw_only=True)
    _frozen: FrozenStudy | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.config_path = Path(self.config_path)
        self.output = Path(self.output)
        self.populations = tuple(str(p) for p in self.populations)

    @classmethod
    def open(
        cls,
        config_path: str | os.PathLike,
        output: str | os.PathLike,
        *,
        populations: Sequence[str | os.PathLike] = (),
        executor: ExecutorChoice | None = None,
        reporter: Reporter | None = None,
    ) -> Study:
        """The study at ``output`` made from ``config_path`` (nothing is read or written yet)."""
        return cls(config_path, output, populations=populations, executor=executor, reporter=reporter)

    @classmethod
    def existing(
        cls,
        output: str | os.PathLike,
        *,
        populations: Sequence[str | os.PathLike] = (),
        executor: ExecutorChoice | None = None,
        reporter: Reporter | None = None,
    ) -> Study:
        """The study frozen at ``output``, with the config it was frozen from: that file while its
        bytes are the frozen ones (its relative paths resolve where they did), else the study's
        own copy (authenticated either way, by the first step)."""
        return cls(
            frozen_config_path(output), Path(output), populations=populations, executor=executor, reporter=reporter
        )

    @contextlib.contextmanager
    def authenticated(self, step: str, *, runs: bool = True) -> Iterator[FrozenStudy]:
        """The authenticated freeze (``authenticate``), inside this study's authentication roots."""
        with self.roots():
            yield self.authenticate(step, runs=runs)

    def authenticate(self, step: str, *, runs: bool = True) -> FrozenStudy:
        """The authenticated freeze, read once per object (call it inside ``roots``).

        Args:
            step: the call named in refusals.
            runs: the step runs study code, so this process must have the frozen package
                versions; False for a step that only reads a finished study.
        """
        if self._frozen is None:
            self._frozen = authenticate_freeze(self.config_path, self.output, step, runs=runs)
        return self._frozen

    @contextlib.contextmanager
    def roots(self) -> Iterator[None]:
        """Authenticate receipts as ``qhlab verify`` does: a copied study's files in the copy, moved
        populations by digest below ``populations`` and the cache."""
        with authentication_roots(self.output, self.populations, original=recorded_origin(self.output)):
            yield

    def freeze(self, *, gate_feasible: bool = True) -> dict:
        """Bind TRAIN support, source and controls without constructing held-out data.

        Validates the config completely, resolves the TRAIN population (generated or reused from
        the cache when named by preset) and digests its files, records TRAIN support, the
        canonical first TRAIN chain, the arms with their resolved architectures and recipe
        digests, both seeds, budgets, thresholds, the source-package digest and the exact
        versions of Python and the study's packages. The validation population is only
        declared: it is neither generated nor opened here.

        Returns:
            The freeze receipt body.

        Args:
            gate_feasible: refuse a TRAIN on which the E0 gate cannot pass (no row it could select),
                before any fit; an E0 check's sub-studies pass False, since a draw whose gate cannot
                pass is what the check counts.

        Raises:
            QhInputError: bad config or TRAIN data (nothing written).
            PublishConflictError: the study is already frozen at ``output``.
        """
        with self.roots():
            self._frozen = freeze(self.config_path, self.output, executor=self.executor, gate_feasible=gate_feasible)
        return self._frozen.receipt.body_record()

    def admit_canaries(self) -> dict:
        """Gate broad fits using the original labels of one prospectively selected TRAIN row.

        Selects the row by the fixed rule (the first TRAIN chain state in canonical order whose
        best label beats the runner-up by more than ``canary_gap_multiple x tie_band`` at every
        horizon), runs the canary fits (the baseline, each seed, ``canary_updates``, that TRAIN
        row only) and admits when each recovers the optimal action within ``tie_band`` on the
        row's original labels. Writes the E0 receipt either way.

        Returns:
            The E0 receipt body; ``passed`` says whether broad fits may run, and on failure
            ``reason`` and ``failures`` name, per failing canary and horizon, the chosen and the
            optimal candidates with their predicted and true values.
        """
        with self.authenticated("admit_canaries") as frozen:
            return decide_e0(frozen)

    def prepare_development(self) -> dict:
        """Seal exposed validation and the TRAIN-only constant after the E0 gate passes.

        Resolves and authenticates the validation population, checks that it matches TRAIN's
        horizon, candidates and features and holds no scene physically equal to a TRAIN (or
        tuning) scene, computes the TRAIN-only constant and its validation metrics and the
        heuristic references, and writes the development receipt binding the validation files.

        Returns:
            The development receipt body.
        """
        with self.authenticated("prepare_development") as frozen:
            return seal_development(frozen, executor=self.executor)

    def run_fit(self, variant: str, seed: int, *, canary_role: str | None = None, progress: bool = True) -> dict:
        """Fit one charged cell using canonical diagnostic admission and receipts.

        A broad cell runs the frozen recipe of ``variant`` with ``seed`` to ``broad_updates`` on
        TRAIN and is evaluated on the sealed validation population; a canary
        (``canary_role="e0"``, the baseline only) runs ``canary_updates`` on the selected TRAIN
        row and is scored on that row's original labels. A finished cell is never rerun; a
        crashed attempt is kept and a new attempt is recorded.

        Args:
            variant: a declared arm (the baseline for a canary).
            seed: a declared seed.
            canary_role: None for a broad cell, or ``"e0"`` for a canary of the E0 gate.
            progress: draw Lightning's progress bar inside the fit (display only).

        Returns:
            The cell receipt body.
        """
        step = "run_fit" if canary_role is None else "run_fit(canary)"
        with self.authenticated(step) as frozen:
            return fit_cell(frozen, variant=variant, seed=seed, canary_role=canary_role, progress=progress)

    def benchmark(
        self,
        variant: str | None = None,
        seed: int | None = None,
        *,
        on_result: Callable[[str, int, dict], None] | None = None,
    ) -> None:
        """Time verified final scorers on the canonical first TRAIN chain, without updates.

        Args:
            variant, seed: one declared cell, or both None for every cell not benchmarked yet.
            on_result: called as ``on_result(arm, seed, result)`` after each new benchmark.
        """
        with self.authenticated("benchmark") as frozen:
            benchmark_cells(frozen, variant, seed, on_result=on_result)

    def report(self) -> dict:
        """Compare all charged final cells; never select an intermediate checkpoint.

        Requires every declared cell's final receipt. Publishes ``report/`` (``report.json``,
        ``report.md``, the figures and the report receipt) once; a crash leaves no partial
        ``report/``.

        Returns:
            The report (the content of ``report.json``).
        """
        reporter = self._reporter("report_study")
        with self.authenticated("report_study") as frozen:
            return reporter.publish(frozen)

    def _reporter(self, call: str) -> Reporter:
        """The report step this study was given; refused by name when it was given none."""
        if self.reporter is None:
            raise input_error(
                call,
                "reporter",
                None,
                "a Study opened with its report step",
                "open it with qhlab.report.open_study(config, output), which gives it qhlab.report.REPORTER",
            )
        return self.reporter

    def status(self) -> dict:
        """Where the study stands, read from its receipts alone (writes nothing;
        ``qhlab.study.status.study_status``)."""
        return study_status(self.output, self.populations)

    def run(self, *, workers: int | None = None, console: Any = None) -> int:
        """Every step in order, skipping the steps whose receipts authenticate: the main job.

        One job runner serves the canaries and the broad cells, so they share its workers.

        Args:
            workers: fits at once on the local executor (None: the config's ``workers``).
            console: where progress goes (None: the study's console).

        Returns:
            0, or 1 when the E0 gate failed (its receipt stays and no broad fit runs).
        """
        self._reporter("qhlab study run")  # refused before anything is written
        with self.roots():
            console = console or study_console()
            config, data, _ = read_study_config(self.config_path)
            choice = self.executor or config.executor_choice()
            refuse_linked_study(self.output, "qhlab study run")
            if not (self.output / FREEZE_RECEIPT).exists():
                refuse_occupied(self.output, data)  # before a lock file is made in a directory that is not ours
            created, locked = not self.output.exists(), False
            before = set(os.listdir(self.output)) if self.output.is_dir() else set()
            try:
                # Held for the whole run: a second run of this study is refused at its start (exit 3)
                # and the first never meets it cell by cell.
                with exclusive_lock(
                    self.output / RUN_LOCK,
                    hint="another `qhlab study run` is running this study; wait for it, then run it again",
                ):
                    locked = True
                    with fit_runner(choice, workers or config.workers, "qhlab study run") as runner:
                        if runner.kind == "ray":
                            # Connected once for the run (labelling and cells share it), and a cluster
                            # where no node can run a cell is refused before anything is written.
                            runner.ray()
                            check_cells_feasible(config, "qhlab study run")
                        return self._run_steps(console, runner)
            except BaseException:
                # A run refused before its freeze wrote anything leaves the output as it found it:
                # the output is not used up by a refusal. Only the run that held the lock cleans
                # up: a run refused by another's lock leaves that run's directory alone.
                if locked:
                    release_refused_output(self.output, created=created, before=before)
                raise

    def _run_steps(self, console: Any, runner: JobRunner) -> int:
        """``run``'s steps on its job runner."""
        started = time.perf_counter()
        ran: list[str] = []
        verified: list[str] = []
        output = self.output
        if (output / FREEZE_RECEIPT).exists():
            frozen = self.authenticate("run")
            verified.append("freeze")
        else:
            console.rule("[bold]1/6 freeze")
            self.freeze()
            frozen = self.authenticate("run")
            for line in describe_family(frozen):
                console.print(line, highlight=False, markup=False)
            ran.append("freeze")
        config = frozen.config
        if (output / CANARY_DIR / E0_RECEIPT).exists():
            e0 = authenticate_e0(frozen, "run").body
            passed, reason = e0.passed, e0.reason
            verified.append("admit-canaries")
        else:
            console.rule("[bold]2/6 canaries (E0 gate)")
            fit_canaries(console, frozen, runner)
            decided = decide_e0(frozen)
            passed, reason = decided["passed"], decided["reason"]
            ran.append("admit-canaries")
            if passed:
                say_e0(console, passed, reason)
        if not passed:
            return say_e0(console, passed, reason)
        if (output / DEVELOPMENT_RECEIPT).exists():
            authenticate_development(frozen, "run")
            verified.append("prepare-development")
        else:
            console.rule("[bold]3/6 development")
            self.prepare_development()
            ran.append("prepare-development")
        pending = []
        for arm, seed in config.cells:
            path = cell_receipt_path(output, arm, seed)
            if path.exists():
                read_receipt(path, StudyCellReceipt)
            else:
                pending.append((arm, seed))
        if pending:
            at_once = "as Ray tasks" if runner.kind == "ray" else f"{runner.workers} at a time"
            console.rule(f"[bold]4/6 broad fits ({len(pending)} of {len(config.cells)} cells, {at_once})")
            run_cells(console, frozen, pending, runner)
            ran.append("run-fit")
        else:
            verified.append("run-fit")
        missing_bench = [c for c in config.cells if not benchmark_receipt_path(output, *c).exists()]
        # Once the report is published the study is closed: benchmarks are not added afterwards.
        if missing_bench and not (output / REPORT_DIR / REPORT_RECEIPT).exists():
            console.rule("[bold]5/6 benchmark")
            self.benchmark(on_result=say_benchmark(console))
            ran.append("benchmark")
        else:
            for arm, seed in config.cells:
                path = benchmark_receipt_path(output, arm, seed)
                if path.exists():
                    read_receipt(path, StudyBenchmarkReceipt)
            verified.append("benchmark")
        if (output / REPORT_DIR / REPORT_RECEIPT).exists():
            read_receipt(output / REPORT_DIR / REPORT_RECEIPT, StudyReportReceipt)
            authenticate_cells(frozen, "run")
            verified.append("report")
        else:
            console.rule("[bold]6/6 report")
            report = self.report()
            for q in report["question"]:
                # The report's own answer, word for word (its markdown emphasis dropped).
                console.print(q["answer"]["text"].replace("**", ""), highlight=False, markup=False)
            console.print(report["headline"]["text"])
            console.print(f"W&B report run (offline): {self._reporter('run').log_run(output)}")
            ran.append("report")
        _say_finished(console, frozen, output, ran, verified, time.perf_counter() - started)
        return 0


def _say_finished(
    console: Any, frozen: FrozenStudy, output: Path, ran: list[str], verified: list[str], elapsed: float
) -> None:
    """The main job's last lines: what changed in the user's files since freeze, and what ran."""
    # The user's own files are only compared, never run: a study keeps running its frozen copies.
    changes = [f"arm {arm}: {what}" for arm, what in source_changes(frozen.body).items()]
    environment = environment_source_change(frozen.body.train.get("environment_source"))
    changes += [] if environment is None else [f"environment: {environment}"]
    changes += preset_file_changes(frozen.body)
    for change in changes:
        console.print(
            f"[yellow]note[/]: {escape(change)}. HINT: to study the new source, freeze it into a new "
            "--output directory.",
            highlight=False,
            soft_wrap=True,  # one line per note, whatever the width: its path stays whole
        )
    if not ran:
        console.print(
            f"[green]study {output} is complete[/]: every receipt authenticated "
            f"({', '.join(verified)}); nothing was run ({elapsed:.1f} s)."
        )
    else:
        console.print(
            f"[green]study {output} finished[/]: ran {', '.join(ran)}"
            + (f"; verified {', '.join(verified)}" if verified else "")
            + f" ({elapsed:.1f} s). Report: {output / REPORT_DIR / REPORT_MARKDOWN}"
        )
