"""One QH fit: recipe + populations -> launcher seam -> final state -> evaluation receipt.

Owns: ``FitRequest`` (the launcher's ``LaunchOptions`` plus what to fit, where and as whom),
``Fit`` (one fit in named phases: ``prepare`` validates everything once, ``train`` builds the QH
module and datamodule and hands them to the launcher's segment, ``evaluate``, ``publish``) and
``fit_recipe`` (``Fit(request).run()``), the default cell and attempt ids, the evaluation
receipt, the validation learning curve (``ValidationCurve``), a fit's scorer record and its user
arm's source (``scorer_record``), and ``FitResult``. Does not own: the training loop, callbacks, W&B or receipts of the
fit (``qhlab.training.launcher``), the learning rule (``q_learning``), the metrics
(``evaluation``), the TRAIN-only constant reference (a study's development step) or the
population format (``data``).
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from qhlab.evidence import (
    EvidenceError,
    FileCopy,
    QhInputError,
    input_error,
    safe_component,
    sha256_file,
    source_package_digest,
    write_receipt,
)
from qhlab.evidence.layout import EVALUATION_RECEIPT, WANDB_RECEIPT
from qhlab.execution.user_code import (
    ENTRY_FORMS,
    FrozenSource,
    UnfrozenImportError,
    file_digests,
    provide,
    read_source,
    resolve_entry,
    source_digest,
)
from qhlab.finite_horizon.batches import QhPopulationDataModule, population_dims
from qhlab.finite_horizon.data import Population, load_population
from qhlab.finite_horizon.evaluation import evaluate_population
from qhlab.finite_horizon.predict import predict_q
from qhlab.finite_horizon.q_learning import QhTDModule, refuse_oversized_target_table
from qhlab.finite_horizon.recipe import QhRecipe, recipe_digest
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.finite_horizon.scorer import scorer_members, scorer_structure
from qhlab.training.execution_profile import WandbAttempt
from qhlab.training.launcher import (
    LaunchOptions,
    LaunchRequest,
    TrainedSegment,
    abandon_segment,
    admit_launch,
    publish_segment,
    start_segment,
    train_segment,
)
from qhlab.training.records import train_rows_record
from qhlab.training.segments import load_resume_state, refuse_second_continuation, resume_segment_directory
from qhlab.training.tensor_state import structure_path
from qhlab.training.wandb_attempt import fit_run_config

__all__ = [
    "Fit",
    "FitRequest",
    "FitResult",
    "ValidationCurve",
    "default_logical_run_id",
    "fit_recipe",
    "scorer_record",
]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What one ``fit_recipe`` call published (see docs/ARCHITECTURE.md, "Fit launcher").

    Contract: every path in it exists, is write-once and is bound by a receipt in
    ``output_directory``; ``evaluation_receipt`` is None only for a fit that was not evaluated.
    The value itself is never persisted: the receipts are the record.
    """

    output_directory: Path
    cell: str
    local_attempt_id: str
    logical_run_id: str
    recipe: QhRecipe
    recipe_digest: str
    observed_updates: int
    cold_init: Path
    final_state: Path
    final_state_sha256: str
    fit_receipt: Path
    evaluation_receipt: Path | None
    wandb_receipt: Path
    metrics: dict
    wall_seconds: float
    resumed_from: str | None


def _population(
    call: str, field: str, explicit: Path | str | Population | None, from_recipe: str, horizon: int | None = None
) -> Population:
    """The ``field`` population: an already loaded (authenticated) one, or loaded from its path."""
    if isinstance(explicit, Population):
        if explicit.split != field:
            raise input_error(
                call,
                field,
                f"a {explicit.split} population ({explicit.path})",
                f"a {field} population",
                f"pass the {field} split here",
            )
        if horizon is not None and explicit.horizon != horizon:
            raise input_error(
                call,
                f"{field}.horizon",
                explicit.horizon,
                f"{horizon} (the requested horizon)",
                "generate a population with the recipe's horizon.",
            )
        # Loaded earlier: the manifest the receipts will bind must still be the one it was loaded from.
        current = sha256_file(explicit.path / "manifest.json") if (explicit.path / "manifest.json").is_file() else None
        if current != explicit.digest:
            raise input_error(
                call,
                f"{field}.manifest_sha256",
                current,
                f"{explicit.digest}, the digest of the loaded population",
                f"{explicit.path} changed after it was loaded; load it again",
            )
        return explicit
    value = explicit if explicit is not None else from_recipe
    if not value:
        raise QhInputError(
            f"{call}: {field}={value!r} is not allowed; allowed: a population directory (recipe "
            f"data.{field} or the --{field} option). HINT: generate one with `qhlab scenes generate`."
        )
    return load_population(Path(value), split=field, horizon=horizon)


def default_logical_run_id(cell: str) -> str:
    """The logical run (writer lock and W&B group) of a fit of ``cell`` that names none."""
    return cell[:64]


def _attempt(request: FitRequest, cell: str, resume_logical: str | None) -> WandbAttempt:
    """The request's W&B identity; every id default is here. A new segment id is
    ``<cell or resumed online run, [:40]>-<UTC stamp>-<hex4>``; the logical run (lock and W&B
    group) is the resumed segment's or the cell's."""

    def segment_id(prefix: str) -> str:
        return f"{prefix[:40]}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"

    offline, run_id = request.offline, request.run_id
    if request.attempt is not None:
        return request.attempt
    if run_id is None:
        return WandbAttempt(
            run_id=segment_id(cell), offline=offline, logical_run_id=resume_logical or default_logical_run_id(cell)
        )
    if not offline and request.resume is not None:
        return WandbAttempt(run_id=run_id, resume=True, local_attempt_id=segment_id(run_id))
    return WandbAttempt(
        run_id=run_id, offline=offline, logical_run_id=default_logical_run_id(cell) if offline else None
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitRequest(LaunchOptions):
    """One fit to run: what to fit, on which lane, into which directory, and how.

    Contract: the public call's argument (``fit_recipe``); frozen and keyword-only. Nothing in it
    is checked until ``Fit.prepare``, which refuses every bad field before anything is written.

    The launch options (``extra_callbacks``, ``segment_checkpoint_every``, ``progress``,
    ``job_type``, ``tags``, ``group``) are ``qhlab.training.launcher.LaunchOptions``'s, passed
    through as they are; ``tags`` follow the arm, ``seed-<n>`` and the lane.

    Attributes:
        recipe: the validated recipe (a file is read by ``qhlab.design.config_files.load_recipe``).
        source_dir: the directory the recipe's file lies in, where a user arm's builder is found
            and digested; None: the arm's source must already be provided in this process (a
            study's frozen copy). Built-in arms ignore it.
        profile: execution profile name (e.g. ``"cpu-fp32"``).
        output: output root; the segment is ``output/<cell>/<local_attempt_id>/``.
        train / validation: population directories, or ``Population`` s already loaded (and
            so authenticated) by the caller, e.g. a study's; default ``recipe.data.*``.
        attempt: W&B identity; default a new segment grouped by ``cell`` (see ``run_id``).
        run_id: W&B run id of this segment when ``attempt`` is None (online with ``resume``:
            the run to resume); default ``<cell>-<UTC stamp>-<hex4>``.
        resume: local_attempt_id of an interrupted segment of the same cell to continue.
        cell: cell name; default ``<recipe.name>-s<seed>``.
        evaluate: evaluate on validation and write ``evaluation.receipt.json``.
        train_rows: optional TRAIN chain rows to train on (e.g. a canary row).
        max_allocated_bytes: memory cap admitted with the profile (CUDA lanes only).
        offline: offline W&B (default) when ``attempt`` is None.
        study: ``{"name", "freeze_receipt_sha256", "study_id"}`` of the study whose canary or
            cell this fit is (None for a lone fit); recorded in the fit receipt so that an
            attempt of another study is never adopted.
        recorded_populations: ``{"train"|"validation": path}``: the populations were read from
            byte-identical copies (a Ray worker's temporary directory); receipts bind them
            under these original paths (``qhlab.evidence.FileCopy``) so the driver that
            publishes the fit authenticates them where it keeps them.
        curve_updates: observed updates (each below the budget) at which the evaluated scorer is
            also measured on validation, for the learning curve only (``ValidationCurve``): the
            evaluation receipt's ``curve`` lists them with the final point. Display, never selection.
        expected_structure: the SHA-256 of the scorer structure a freeze recorded for this arm
            (``scorer_structure``); the fit refuses to train another (None: not checked). The fit
            receipt's ``scorer.structure`` records what was built either way.
    """

    recipe: QhRecipe
    profile: str
    source_dir: Path | str | None = None
    output: Path | str
    train: Path | str | Population | None = None
    validation: Path | str | Population | None = None
    attempt: WandbAttempt | None = None
    run_id: str | None = None
    resume: str | None = None
    cell: str | None = None
    evaluate: bool = True
    train_rows: Sequence[int] | None = None
    max_allocated_bytes: int | None = None
    offline: bool = True
    recorded_populations: Mapping[str, Path] | None = None
    study: Mapping[str, str] | None = None
    curve_updates: Sequence[int] = ()
    expected_structure: str | None = None


class ValidationCurve(Callback):
    """Validation MAE_h and regret_h of the evaluated scorer at declared observed updates.

    It measures at the start of the batch after each declared update, when the update, the
    target refresh and any weight average of that step are done; it predicts without gradients
    and with torch's RNG forked, so the fit's state and numbers are those of a fit without it
    (a test compares final-state bytes). Each point is also sent to the fit's loggers
    (``curve/val_mae_h``, ``curve/val_regret_h`` at H). A resumed segment measures only the points
    after its start. The fit's wall time includes these evaluations.

    Attributes:
        points: ``[{"updates", "mae": [H], "regret": [H]}]`` measured so far, in update order.
    """

    def __init__(
        self, population: Population, updates: Sequence[int], *, tie_band: float, autocast: Callable[[], Any]
    ) -> None:
        super().__init__()
        wanted = sorted(set(updates))
        if any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in wanted):
            raise QhInputError(
                f"ValidationCurve: updates={list(updates)!r} is not allowed; allowed: observed update "
                "counts >= 1. HINT: curve points are counts of successful optimizer updates."
            )
        self._wanted = wanted
        self._population = population
        self._tie_band = tie_band
        self._autocast = autocast
        self.points: list[dict] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = pl_module.observed_updates
        if now not in self._wanted or any(p["updates"] == now for p in self.points):
            return
        devices = [pl_module.device] if pl_module.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            pred = predict_q(pl_module.evaluated, self._population, autocast=self._autocast)
            summary = evaluate_population(pred, self._population, tie_band=self._tie_band)
        self.points.append({"updates": int(now), "mae": summary["mae"], "regret": summary["regret"]})
        # Straight to the loggers: Lightning's own logging would keep only every log_every_n_steps-th step.
        for logger in trainer.loggers:
            logger.log_metrics(
                {
                    "curve/val_mae_h": float(summary["mae_primary"]),
                    "curve/val_regret_h": float(summary["regret_primary"]),
                    "curve/observed_updates": float(now),
                },
                step=trainer.global_step,
            )


def scorer_record(recipe: QhRecipe) -> dict:
    """What built a fit's scorer: the arm, its builder and source digest, and how members ran.

    Returns:
        ``{"arm", "builder"`` ("qhlab" for a built-in arm, else the builder string),
        ``"source_sha256"`` (a user arm's source digest, else None), ``"members"`` (M) and
        ``"members_path"`` (how an ensemble's members compute)``}``.
    """
    arch, members = recipe.architecture, recipe.ensemble_members
    return {
        "arm": arch.arm,
        "builder": arch.builder or "qhlab",
        "source_sha256": arch.source_sha256,
        "members": members,
        "members_path": "one scorer" if members == 1 else "sequential",
    }


def _user_arm_source(recipe: QhRecipe, base: Path | None, call: str) -> QhRecipe:
    """Provide a recipe file's user arm from the source beside it, binding its digest into the recipe.

    A recipe read from a file (``base``: its directory) names its builder relative to that
    file; its source is digested and provided here, and ``architecture.source_sha256`` is set
    (or, when the file sets it, must match). A recipe object (``base`` None) must name a source
    already provided in this process (a study's frozen copy). Built-in arms pass unchanged.
    """
    arch = recipe.architecture
    if not arch.is_user_arm:
        return recipe
    if base is not None:
        try:
            located, files = read_source(arch.builder, base)
        except (ValueError, OSError) as exc:
            raise input_error(call, "architecture.builder", arch.builder, ENTRY_FORMS, str(exc)) from None
        digests = file_digests(files)
        sha = source_digest(digests)
        if arch.source_sha256 not in (None, sha):
            raise input_error(
                call,
                "architecture.source_sha256",
                arch.source_sha256,
                f"{sha!r}, the digest of {str(located.path)!r} now",
                "the recipe binds another version of the arm's source; remove source_sha256 or restore that source",
            )
        provide(
            FrozenSource(
                owner=f"arm {arch.arm!r}",
                entry=arch.builder,
                root=located.path.parent,
                module=located.module,
                function=located.function,
                files=digests,
                sealed=False,
            )
        )
        recipe = recipe.model_copy(update={"architecture": arch.model_copy(update={"source_sha256": sha})})
    resolve_entry(f"arm {arch.arm!r}", arch.builder, recipe.architecture.source_sha256, call=call)
    return recipe


def fit_recipe(request: FitRequest) -> FitResult:
    """Fit one recipe on one lane and publish its evidence into a new segment directory (``Fit``).

    Everything is validated before any directory is created: the recipe, both populations
    (and that their horizon equals ``recipe.horizon``), profile admission on this host, the
    resume lineage, and the output path.

    Args:
        request: the fit (see ``FitRequest``).

    Returns:
        ``FitResult``.

    Raises:
        QhInputError: bad recipe, population, horizon mismatch, profile not admitted, bad
            resume lineage, or an existing output; nothing is written.
        LockHeldError: another process writes the same logical run.
        FitInterrupted: SIGINT; a segment checkpoint names the attempt to resume.
    """
    return Fit(request).run()


class Fit:
    """One fit, read top to bottom, like a recipe: ``prepare``, ``train``, ``evaluate``, ``publish``.

    ``prepare`` validates and admits everything (nothing is written); the other three run under
    the logical run's writer lock. ``train`` seeds the process (``start_segment``, nothing written),
    builds the Lightning module and hands it to the launcher's ``train_segment`` (the segment
    directory, cold initialization, ``Trainer.fit``, final state, fit receipt); ``evaluate`` scores
    the final state on validation;
    ``publish`` hands the evaluation to ``publish_segment`` (the W&B attempt receipt). Its
    collaborators (the module, the datamodule, the callbacks, the W&B attempt and the resumed
    state) are built here and passed down; the launcher never calls back.

    ``qhlab fit``, study cells and canaries, tuning trials, pilot fits and E0 draws all run this
    object, through ``fit_recipe``.
    """

    call = "fit_recipe"

    def __init__(self, request: FitRequest) -> None:
        if not isinstance(request, FitRequest):
            raise QhInputError(
                f"fit_recipe: request={type(request).__name__!r} is not allowed; allowed: a FitRequest. "
                "HINT: fit_recipe(FitRequest(recipe=..., profile='cpu-fp32', output=...))."
            )
        self.request = request
        self.started = time.perf_counter()

    def run(self) -> FitResult:
        """Every phase in order; returns what the fit published."""
        self.prepare()
        self.output.mkdir(parents=True, exist_ok=True)
        with self.attempt.local_writer_lock(self.output):
            if self.resume_state is not None:
                # Again under the writer lock: a continuation that started meanwhile is seen.
                refuse_second_continuation(self.resume_state.previous_directory, call=self.call)
            try:
                trained = self.train()
                try:
                    files, metrics = self.evaluate(trained)
                except BaseException:
                    # The run is closed as failed: left open, the next fit in this process would take it over.
                    abandon_segment(trained)
                    raise
            except UnfrozenImportError as exc:
                architecture = self.applied.architecture
                builder = f" (builder {architecture.builder!r})" if architecture.builder else ""
                raise exc.refusal(self.call, f"arm {architecture.arm!r}{builder} in cell {self.cell!r}") from None
            return self.publish(trained, files, metrics)  # closes the run, as failed if publishing fails

    def prepare(self) -> None:
        """Validate the recipe, populations, lane, resume lineage and output; build the data.

        Raises:
            QhInputError: anything the fit would refuse; nothing is written.
        """
        request, call = self.request, self.call
        recipe = request.recipe
        if not isinstance(recipe, QhRecipe):
            raise input_error(
                call,
                "recipe",
                type(recipe).__name__,
                "QhRecipe",
                "read a recipe file with qhlab.design.config_files.load_recipe and pass its directory as source_dir.",
            )
        source_dir = None if request.source_dir is None else Path(request.source_dir).expanduser()
        recipe = _user_arm_source(recipe, source_dir, call)
        self.recipe = recipe
        self._populations()
        admitted = admit_launch(request.profile, recipe, request.max_allocated_bytes)  # refused before writing
        self.admitted, self.applied = admitted, admitted.recipe
        self.digest = recipe_digest(self.applied)
        # Checked here, before the cell becomes part of a W&B run id, so the error names --cell.
        self.cell = safe_component(request.cell or f"{recipe.name}-s{recipe.seed}", field="cell", call=call)
        self.output = Path(request.output)
        self._resume_and_attempt()
        self._data()

    def _populations(self) -> None:
        """TRAIN (of the recipe's horizon) and, when evaluating, validation; the rows to fit."""
        request, call, recipe = self.request, self.call, self.recipe
        self.train_pop = _population(call, "train", request.train, recipe.data.train)
        if self.train_pop.horizon != recipe.horizon:
            raise QhInputError(
                f"{call}: population horizon={self.train_pop.horizon} of {str(self.train_pop.path)!r} is not "
                f"allowed; allowed: recipe.horizon={recipe.horizon}. HINT: generate the population with the "
                "recipe's horizon or use a recipe for this population."
            )
        self.val_pop = None
        if request.evaluate:
            self.val_pop = _population(call, "validation", request.validation, recipe.data.validation, recipe.horizon)
        rows = request.train_rows
        self.rows = None if rows is None else torch.as_tensor(list(rows), dtype=torch.int64)

    def _resume_and_attempt(self) -> None:
        """The resumed segment's state (if any), the W&B attempt and its segment directory."""
        request, output = self.request, self.output
        self.resume_state = None
        if request.resume is not None:
            self.resume_state = load_resume_state(
                resume_segment_directory(output, self.cell, request.resume, call=self.call),
                seed=self.recipe.seed,
                source_package_digest=source_package_digest()["sha256"],
                recipe_digest=self.digest,
            )
        logical = self.resume_state.logical_run_id if self.resume_state else None
        self.attempt = _attempt(request, self.cell, logical)
        if output.is_dir():
            # A concurrent writer of this logical run may already have created the attempt
            # directory checked below: report its lock (LockHeldError, exit 3), not a conflict.
            with self.attempt.local_writer_lock(output):
                pass
        self.directory = self.attempt.output_directory(output, self.cell)

    def _data(self) -> None:
        """The datamodule, the receipt's caller fields, the manifests bound and the learning curve."""
        request, applied = self.request, self.applied
        # Built before anything is written: it validates rows and batch size.
        self.datamodule = QhPopulationDataModule(
            self.train_pop,
            batch_size=applied.batch_size,
            seed=applied.seed,
            rows=self.rows,
            start_batch=self.resume_state.start_updates if self.resume_state is not None else 0,
            successor_labels=applied.successor_label_rows > 0,
        )
        self.dims = population_dims(self.train_pop)
        refuse_oversized_target_table(self.call, applied, self.datamodule.population_rows)
        self.scorer = scorer_record(applied)
        # The module keeps this record current while it trains; the receipt reads it at the end.
        self.receipt_fields: dict[str, Any] = {
            "train_rows": train_rows_record(self.train_pop.digest, request.train_rows),
            "scorer": self.scorer,
            "study": None if request.study is None else dict(request.study),
        }
        val_path = None if self.val_pop is None else self.val_pop.path
        self.manifests = _manifest_bindings(self.call, request.recorded_populations, self.train_pop.path, val_path)
        self.curve = None
        if self.val_pop is not None and request.curve_updates:
            self.curve = ValidationCurve(
                self.val_pop,
                [u for u in request.curve_updates if u < applied.updates],
                tie_band=applied.evaluation.tie_band,
                autocast=self.admitted.profile.autocast_context,
            )

    def train(self) -> TrainedSegment:
        """Seed, build the module, train it to the budget; the final state and fit receipt are published."""
        request, applied, admitted, curve = self.request, self.applied, self.admitted, self.curve
        segment = start_segment(
            admitted,
            LaunchRequest(
                datamodule=self.datamodule,
                update_budget=applied.updates,
                seed=applied.seed,
                attempt=self.attempt,
                directory=self.directory,
                recipe_digest=self.digest,
                # The request's own launch options; its tags follow the arm, seed and lane.
                options=dataclasses.replace(
                    request,
                    tags=(applied.architecture.arm, f"seed-{applied.seed}", admitted.profile.name, *request.tags),
                    extra_callbacks=(*request.extra_callbacks, *([curve] if curve is not None else [])),
                ),
                inputs=dict(self.manifests),
                resume=self.resume_state,
                run_config=fit_run_config(
                    applied.model_dump(mode="json"),
                    self.cell,
                    admitted.profile.name,
                    admitted.runtime,
                    {
                        role: {"name": pop.name, "manifest_sha256": pop.digest}
                        for role, pop in (("train", self.train_pop), ("validation", self.val_pop))
                        if pop is not None
                    },
                ),
                receipt_fields=self.receipt_fields,
            ),
        )
        self.module = self._module()
        return train_segment(segment, self.module)

    def _module(self) -> QhTDModule:
        """The Lightning module, built in the seeded process and refused when its scorer is not the frozen one."""
        module = QhTDModule(self.applied, self.dims)
        self.receipt_fields["target_values"] = module.target_values_evidence
        # What was trained is what was frozen: the structure built, recorded, and compared with
        # the one the caller's freeze recorded before the first update.
        scorer = self.scorer
        scorer["structure"] = scorer_structure(scorer_members(module.online)[0])
        expected = self.request.expected_structure
        if expected is not None and scorer["structure"]["sha256"] != expected:
            raise EvidenceError(
                f"{self.call}: the scorer built for arm {self.applied.architecture.arm!r} has structure "
                f"{scorer['structure']['sha256'][:16]} ({scorer['structure']['parameters']:,} parameters per member), "
                f"not the {expected[:16]} its freeze recorded. HINT: the arm's builder built another network than at "
                "the freeze (an environment variable, a file or randomness in its shape); make its structure a "
                "function of its architecture and dims alone."
            )
        return module

    def evaluate(self, trained: TrainedSegment) -> tuple[dict, dict]:
        """The evaluation receipt on validation (none without validation): ``(files, metrics)``."""
        if self.val_pop is None:
            return {}, {}
        return _evaluate(
            self.module,
            self.admitted.profile,
            self.applied,
            self.val_pop,
            trained.final_state,
            trained.final_state_sha256,
            self.manifests,
            curve=None if self.curve is None else self.curve.points,
        )

    def publish(self, trained: TrainedSegment, files: dict, metrics: dict) -> FitResult:
        """The W&B attempt receipt (binding the evaluation), the run closed; what the fit published."""
        metrics = publish_segment(trained, files, metrics)
        return FitResult(
            output_directory=trained.directory,
            cell=self.cell,
            local_attempt_id=self.attempt.resolved_local_attempt_id,
            logical_run_id=self.attempt.logical_run_id,
            recipe=self.applied,
            recipe_digest=self.digest,
            observed_updates=trained.observed_updates,
            cold_init=trained.cold_init,
            final_state=trained.final_state,
            final_state_sha256=trained.final_state_sha256,
            fit_receipt=trained.fit_receipt,
            evaluation_receipt=files.get("evaluation_receipt"),
            wandb_receipt=trained.directory / WANDB_RECEIPT,
            metrics=metrics,
            wall_seconds=time.perf_counter() - self.started,
            resumed_from=self.request.resume,
        )


def _manifest_bindings(
    call: str, recorded: Mapping[str, Path] | None, train: Path, validation: Path | None
) -> dict[str, Path | FileCopy]:
    """How receipts bind the populations' manifests: where they were read, or as copies of originals."""
    local = {"train": train, "validation": validation}
    recorded = dict(recorded or {})
    unknown = sorted(set(recorded) - {k for k, v in local.items() if v is not None})
    if unknown:
        raise input_error(
            call,
            "recorded_populations",
            unknown,
            "keys 'train' and 'validation' (when evaluated)",
            "name the original of each population copy the fit reads",
        )
    bindings: dict[str, Path | FileCopy] = {}
    for role, path in local.items():
        if path is None:
            continue
        manifest = path / "manifest.json"
        original = recorded.get(role)
        bindings[f"{role}_manifest"] = (
            manifest if original is None else FileCopy(manifest, Path(original) / "manifest.json")
        )
    return bindings


def _evaluate(
    module,
    profile,
    recipe,
    val_pop,
    final_state: Path,
    final_sha: str,
    manifests: Mapping[str, Path | FileCopy],
    *,
    curve: list[dict] | None = None,
):
    """Predict validation chain rows with the final evaluated scorer; write the evaluation receipt.

    The TRAIN-only constant reference is not computed here: a study's development step
    computes it once for every cell. ``curve``: the ``ValidationCurve`` points, recorded with
    the final point appended as ``curve`` (absent without a curve, so such receipts are unchanged).
    """
    tie_band = recipe.evaluation.tie_band
    pred = predict_q(module.evaluated, val_pop, autocast=profile.autocast_context)
    summary = evaluate_population(pred, val_pop, tie_band=tie_band)
    body = {
        "horizon": summary["horizon"],
        "tie_band": tie_band,
        "weighting": summary["weighting"],
        "mae": summary["mae"],
        "regret": summary["regret"],
        "mae_primary": summary["mae_primary"],
        "regret_primary": summary["regret_primary"],
        "per_scene": summary["per_scene"],
        "counts": {k: summary[k] for k in ("n_scenes", "n_states", "n_candidates", "rows")},
        "population": {"name": val_pop.name, "split": val_pop.split, "digest": val_pop.digest},
        "final_state_sha256": final_sha,
    }
    if curve is not None:
        body["curve"] = [
            *curve,
            {"updates": int(module.observed_updates), "mae": summary["mae"], "regret": summary["regret"]},
        ]
    directory = final_state.parent
    receipt = directory / EVALUATION_RECEIPT
    write_receipt(
        receipt,
        EvaluationReceipt,
        body=body,
        inputs={
            "validation_manifest": manifests["validation_manifest"],
            "final_state": final_state,
            "final_state_structure": structure_path(final_state),
        },
    )
    metrics = {}
    for h in range(1, body["horizon"] + 1):
        metrics[f"val_mae_h{h}"] = float(body["mae"][h - 1])
        metrics[f"val_regret_h{h}"] = float(body["regret"][h - 1])
    return {"evaluation_receipt": receipt}, metrics
