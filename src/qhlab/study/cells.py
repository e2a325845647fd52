"""Step 4, fits: run one charged cell (a broad fit or an E0 canary) once, to its final budget.

Owns: ``fit_cell`` (``Study.run_fit``: validation of the requested cell, its writer lock, adopting
a finished but unrecorded attempt once it authenticates as this cell's fit, a new attempt
after a crash) and the cell receipt that
binds a fit's final state, its evaluation on the sealed validation (broad cells) or its
recovery on the canary row (canaries). Does not own: the optimizer loop
(``qhlab.finite_horizon.fit.fit_recipe``), the canary rules (``canary``) or the gate
(``admission``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qhlab.design.canary import canary_recipe, canary_recovery
from qhlab.design.study_records import StudyCellReceipt, StudyDevelopmentReceipt
from qhlab.evidence import (
    EvidenceError,
    OrderError,
    PublishConflictError,
    exclusive_lock,
    input_error,
    read_receipt,
    sha256_file,
    write_receipt,
)
from qhlab.evidence.layout import (
    CANARY_DIR,
    CANARY_ROLES,
    CELL_RECEIPT,
    CELLS_DIR,
    DEVELOPMENT_RECEIPT,
    E0_RECEIPT,
    EVALUATION_RECEIPT,
    FINAL_STATE,
    FIT_RECEIPT,
    SELECTION_FILE,
    cell_lock_path,
    cell_name,
)
from qhlab.execution import where_am_i
from qhlab.finite_horizon.benchmark import load_final_module
from qhlab.finite_horizon.fit_job import FitJob, run_fit_job
from qhlab.finite_horizon.recipe import recipe_digest
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.study.authentication import (
    FrozenStudy,
    authenticate_attempt,
    authenticate_development,
    read_canary_selection,
)
from qhlab.training.records import FitReceipt
from qhlab.training.wandb_attempt import drop_wandb_links

if TYPE_CHECKING:
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = ["adoptable_attempt", "cell_fit_job", "fit_cell", "frozen_structure"]


def _attempt_directories(cell_dir: Path) -> list[Path]:
    """The attempt directories of a cell (finished or crashed), sorted by name.

    A hidden directory is never an attempt: a Ray driver killed while publishing a returned
    attempt leaves its staging directory (``.<attempt>.tmp-...``), which was never published.
    """
    if not cell_dir.is_dir():
        return []
    return sorted(p for p in cell_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def fit_cell(
    frozen: FrozenStudy,
    *,
    variant: str,
    seed: int,
    canary_role: str | None = None,
    progress: bool = True,
    execution: dict | None = None,
) -> dict:
    """``run_fit`` on an authenticated study, with the fit's progress bar on or off.

    Args:
        frozen: the authenticated study (its development record is authenticated once on it).
        variant: a declared arm (the baseline for a canary).
        seed: a declared seed.
        canary_role: None for a broad cell, or ``"e0"`` for a canary of the E0 gate.
        progress: draw Lightning's progress bar inside the fit (off in the worker processes
            of ``qhlab study run``, whose own bar counts cells). Display only: the fit, its
            files and its numbers are the same either way.
        execution: how the attempt this call adopts was run (the Ray driver's record of the
            executor and every try); None: this process fits or adopts locally. Recorded in
            the cell receipt's ``execution``.

    Returns:
        The cell receipt body.
    """
    step = "run_fit" if canary_role is None else "run_fit(canary)"
    config = frozen.config
    if variant not in config.arms:
        raise input_error(
            step,
            "variant",
            variant,
            f"a declared arm ({', '.join(config.arms)})",
            "exactly the frozen cells may be run",
        )
    if isinstance(seed, bool) or seed not in config.seeds:
        raise input_error(
            step,
            "seed",
            seed,
            f"a declared seed ({', '.join(map(str, config.seeds))})",
            "exactly the frozen cells may be run; there is no seed search",
        )
    if canary_role is not None:
        if canary_role not in CANARY_ROLES:
            raise input_error(
                step,
                "canary_role",
                canary_role,
                f"None or {', '.join(CANARY_ROLES)}",
                "canaries are the E0 gate's fits",
            )
        if variant != config.baseline_arm:
            raise input_error(
                step,
                "variant",
                variant,
                f"the baseline {config.baseline_arm!r} for a canary",
                "canaries fit the baseline only",
            )
        if not (frozen.output / CANARY_DIR / SELECTION_FILE).exists():
            raise OrderError(
                f"{step}: the canary row is not selected yet ({frozen.output / CANARY_DIR / SELECTION_FILE} "
                "is missing). HINT: canaries run through `qhlab study admit-canaries`."
            )
        if (frozen.output / CANARY_DIR / E0_RECEIPT).exists():
            raise OrderError(f"{step}: the E0 gate is already decided; canaries do not run again.")
        parent = frozen.output / CANARY_DIR
        development = None
    else:
        development = authenticate_development(frozen, step)
        parent = frozen.output / CELLS_DIR
    cell = cell_name(variant, seed, canary_role)
    cell_dir = parent / cell
    parent.mkdir(parents=True, exist_ok=True)

    def _refuse_finished() -> None:
        if (cell_dir / CELL_RECEIPT).exists():
            raise PublishConflictError(
                f"{step}: cell {cell} is finished ({cell_dir / CELL_RECEIPT} exists); a charged cell "
                "runs once and is reported whatever its result. HINT: nothing to do."
            )

    # Checked with the lock held but before the lock file records this process: a refused
    # run-fit leaves the lock file's bytes and mtime untouched.
    with exclusive_lock(cell_lock_path(parent, cell), admit=_refuse_finished):
        if canary_role is None:
            return _run_broad_cell(
                frozen, development, variant, seed, cell, cell_dir, progress=progress, execution=execution
            )
        return _run_canary_cell(frozen, variant, seed, cell, cell_dir, progress=progress)


def _fit(
    frozen: FrozenStudy,
    recipe: QhRecipe,
    cell_dir: Path,
    attempt: Path | None,
    previous: list[str],
    *,
    progress: bool,
    rows: list[int] | None = None,
) -> Path:
    """The cell's attempt: the adoptable ``attempt`` (taken out of ``previous``, the cell's earlier
    attempts), or else a new one from one ``fit_recipe`` call on the frozen lane, TRAIN (loaded once
    per study) and thread count. A broad cell (``rows`` None) is evaluated on the sealed validation;
    a canary trains ``rows`` of TRAIN and is not evaluated.

    A segment of this cell that a kill interrupted after a checkpoint is continued from that
    checkpoint (``interrupted_segment``), as ``qhlab fit --resume`` would: the final state is
    the one an uninterrupted fit makes, and the fit receipt records the lineage.
    """
    if attempt is not None:
        previous.remove(attempt.name)
        return attempt
    # Lazy: keeps importing this module free of torch.
    from qhlab.training.launcher import FitInterrupted
    from qhlab.training.segments import interrupted_segment

    # Authenticated before anything in the cell changes.
    validation = frozen.validation_population("run_fit") if rows is None else None
    interrupted = interrupted_segment(cell_dir)
    # A killed attempt may hold the W&B log link its logger made at start: it goes, so the
    # finished study holds no link (`qhlab sign` refuses links).
    for killed in _attempt_directories(cell_dir):
        drop_wandb_links(killed / "wandb")
    job = cell_fit_job(frozen, recipe, cell_dir, validation=None if validation is None else validation.path, rows=rows)
    try:
        # The populations this process loaded (and authenticated) once per study are passed as they are.
        directory, _ = run_fit_job(
            job,
            train=frozen.train_population(),
            validation=validation,
            progress=progress,
            resume=None if interrupted is None else interrupted.name,
        )
    except FitInterrupted as exc:
        # `--resume` is `qhlab fit`'s option: a study continues an interrupted cell by itself.
        raise FitInterrupted(
            f"cell {cell_dir.name}: fit interrupted at {exc.at} observed updates; segment checkpoint written "
            f"in {exc.directory}. HINT: run the same `qhlab study` command again: the cell continues from "
            "this checkpoint.",
            exc.directory,
            exc.at,
        ) from None
    return directory


def cell_fit_job(
    frozen: FrozenStudy, recipe: QhRecipe, cell_dir: Path, *, validation: Path | None, rows: list[int] | None = None
) -> FitJob:
    """The fit job of a study's cell or canary, wherever it runs (this process, a pool worker, a Ray task).

    Args:
        frozen: the authenticated study: its lane, TRAIN, thread count, memory ceiling, curve and
            identity, and the scorer structure it froze for the arm.
        recipe: the cell's recipe (``FrozenStudy.recipe``, or the canary rule's).
        cell_dir: the cell's directory (``<study>/cells/<cell>`` or ``<study>/canaries/<cell>``).
        validation: the sealed validation population's directory; None: a canary (not evaluated).
        rows: the TRAIN rows a canary trains on; None: a broad cell.

    Returns:
        The job; the study's cell authenticates an adopted attempt itself (``bind_populations`` off).
    """
    config = frozen.config
    return FitJob(
        recipe=recipe,
        profile=config.profile,
        output=str(cell_dir.parent),
        cell=cell_dir.name,
        train=str(frozen.train_path),
        validation=None if validation is None else str(validation),
        torch_threads=config.torch_threads,
        # W&B: the study's canaries and cells group together under the study's name.
        job_type="canary" if rows is not None else "cell",
        group=config.name,
        study=frozen.identity,
        train_rows=None if rows is None else tuple(rows),
        max_allocated_bytes=config.max_allocated_bytes,
        curve_updates=tuple(config.curve_updates) if validation is not None else (),
        expected_structure=frozen_structure(frozen, recipe.architecture.arm),
    )


def frozen_structure(frozen: FrozenStudy, arm: str) -> str | None:
    """The structure digest the freeze recorded for ``arm``'s scorer (None: a freeze that predates it)."""
    for entry in frozen.body.arms:
        if entry["arm"] == arm:
            return ((entry.get("contract") or {}).get("structure") or {}).get("sha256")
    return None


def adoptable_attempt(cell_dir: Path, evaluate: bool) -> Path | None:
    """An attempt whose fit finished (fit receipt, and evaluation receipt for a broad cell) but
    whose cell receipt was never written: adopted rather than rerun, since a finished fit is
    never rerun. The rule every fit job selects by (``qhlab.training.segments.finished_attempt``),
    with no filter: ``_cell_body_common`` then authenticates it as the fit of this cell, and a
    foreign fit copied in is refused, not fitted beside."""
    # Lazy: keeps importing this module free of torch.
    from qhlab.training.segments import finished_attempt

    return finished_attempt(cell_dir, evaluated=evaluate)


def _cell_body_common(
    frozen: FrozenStudy,
    variant: str,
    seed: int,
    cell: str,
    recipe: QhRecipe,
    attempt: Path,
    previous: list[str],
    updates: int,
    step: str,
    *,
    adopted: bool,
    train_rows: list[int] | None = None,
) -> tuple[dict, dict]:
    """The body and inputs every cell receipt shares; refuses a fit that is not this frozen cell's
    (trained on ``train_rows``, None: all of TRAIN)."""
    # Lazy: keeps importing this module free of torch.
    from qhlab.training.tensor_state import structure_path

    fit = authenticate_attempt(frozen, attempt, cell=cell, recipe=recipe, step=step, train_rows=train_rows).body
    observed = fit.observed_updates
    final_state = attempt / FINAL_STATE
    body = {
        "study": frozen.config.name,
        "cell": cell,
        "arm": variant,
        "seed": seed,
        "attempt": attempt.name,
        # True: the fit finished earlier (before a crash) and this step adopted it.
        "adopted": adopted,
        "previous_attempts": previous,
        "recipe_digest": recipe_digest(recipe),
        "fit_recipe_digest": fit.recipe_digest,
        "observed_updates": observed,
        "update_budget": updates,
        "final_state_sha256": sha256_file(final_state),
        "profile": fit.profile,
        "wall_seconds": fit.wall_seconds,
    }
    inputs = {
        "freeze": frozen.receipt_path,
        "fit": attempt / FIT_RECEIPT,
        "final_state": final_state,
        "final_state_structure": structure_path(final_state),
    }
    return body, inputs


def _local_execution() -> dict:
    where = where_am_i()
    # The process that fitted or adopted the cell (a pool worker under `study run`).
    return {"executor": "local", "process": {"hostname": where["hostname"], "pid": where["pid"]}}


def _run_broad_cell(
    frozen: FrozenStudy,
    development: StudyDevelopmentReceipt,
    variant: str,
    seed: int,
    cell: str,
    cell_dir: Path,
    *,
    progress: bool,
    execution: dict | None,
) -> dict:
    """Fit (or adopt) a broad cell, check its evaluation is of the sealed validation, publish its receipt."""

    config = frozen.config
    recipe = frozen.recipe(variant, seed, config.broad_updates)
    previous = [p.name for p in _attempt_directories(cell_dir)]
    attempt = adoptable_attempt(cell_dir, evaluate=True)
    if execution is not None and (attempt is None or attempt.name != execution.get("attempt")):
        # A remote record describes one published attempt; it never labels a local fit.
        raise EvidenceError(
            f"run_fit: the {execution.get('executor')} record names attempt {execution.get('attempt')!r} of cell "
            f"{cell}; the adoptable attempt is {attempt.name if attempt else None!r}."
        )
    # A remote record describes the attempt its driver just published: fitted, not adopted.
    adopted = attempt is not None and execution is None
    attempt = _fit(frozen, recipe, cell_dir, attempt, previous, progress=progress)
    body, inputs = _cell_body_common(
        frozen, variant, seed, cell, recipe, attempt, previous, config.broad_updates, "run_fit", adopted=adopted
    )
    if execution is None:
        execution = _local_execution()
        if adopted:
            # Finished before a crash of whoever ran it (a local process or a Ray driver): the
            # fit receipt says where it ran; this process only adopts it.

            fit_ran = read_receipt(attempt / FIT_RECEIPT, FitReceipt, verify_files=False).body.execution
            execution.update(
                executor=fit_ran.get("executor", "local"),
                attempt=attempt.name,
                adopted_after_restart=True,
                fit_ran_on=fit_ran,
            )
    ev = read_receipt(attempt / EVALUATION_RECEIPT, EvaluationReceipt).body
    population_digest = ev.population.get("digest")
    if population_digest != development.body.validation["manifest_sha256"]:
        raise EvidenceError(
            f"run_fit: {attempt / EVALUATION_RECEIPT} evaluates population {population_digest}; "
            f"the sealed validation is {development.body.validation['manifest_sha256']}."
        )
    if ev.final_state_sha256 != body["final_state_sha256"]:
        raise EvidenceError(f"run_fit: {attempt / EVALUATION_RECEIPT} evaluates another final state.")
    # Per-scene arrays are [n_scenes][H] in ascending scene order of the sealed validation.
    body["evaluation"] = {
        "horizon": ev.horizon,
        "mae": ev.mae,
        "regret": ev.regret,
        "scene_ids": ev.per_scene["scene_id"],
        "scene_mae": ev.per_scene["mae"],
        "scene_regret": ev.per_scene["regret"],
        "curve": ev.curve,
    }
    # Which executor ran the fit, and where (the fit receipt names the node that ran it).
    body["execution"] = execution
    inputs.update(development=frozen.output / DEVELOPMENT_RECEIPT, evaluation=attempt / EVALUATION_RECEIPT)
    write_receipt(cell_dir / CELL_RECEIPT, StudyCellReceipt, body=body, inputs=inputs)
    return body


def _run_canary_cell(
    frozen: FrozenStudy, variant: str, seed: int, cell: str, cell_dir: Path, *, progress: bool
) -> dict:
    """Fit (or adopt) a canary on the selected TRAIN row, score its recovery, publish its receipt."""
    import torch

    # Lazy: keeps importing this module free of torch.
    from qhlab.finite_horizon.predict import predict_q

    config = frozen.config
    selection = read_canary_selection(frozen)["selected"]
    if selection is None:
        raise OrderError("run_fit(canary): no canary row was selected; the E0 gate fails without fits.")
    # Authenticated against the freeze, then the canary rule (successor Q_1 trained) applied.
    recipe, successor_training = canary_recipe(frozen.recipe(variant, seed, config.canary_updates))
    previous = [p.name for p in _attempt_directories(cell_dir)]
    attempt = adoptable_attempt(cell_dir, evaluate=False)
    adopted = attempt is not None
    attempt = _fit(frozen, recipe, cell_dir, attempt, previous, progress=progress, rows=[selection["row"]])
    body, inputs = _cell_body_common(
        frozen,
        variant,
        seed,
        cell,
        recipe,
        attempt,
        previous,
        config.canary_updates,
        "run_fit(canary)",
        adopted=adopted,
        train_rows=[selection["row"]],
    )
    population = frozen.train_population()
    module = load_final_module(recipe, population, attempt / FINAL_STATE, body["final_state_sha256"])
    pred = predict_q(module.evaluated, population, rows=torch.tensor([selection["row"]])).numpy()[0]
    labels = np.asarray(selection["labels"], dtype=np.float64)
    mask = np.asarray(selection["candidate_mask"], dtype=bool)
    per_horizon = canary_recovery(pred, labels, mask, config.tie_band)
    body["canary"] = {
        "role": "e0",
        "row": selection["row"],
        "state_id": selection["state_id"],
        "per_horizon": per_horizon,
        "recovered": all(h["recovered"] for h in per_horizon),
        "successor_training": successor_training,
    }
    body["execution"] = _local_execution()  # canaries fit locally: in the admitting process or its pool
    inputs["selection"] = frozen.output / CANARY_DIR / SELECTION_FILE
    write_receipt(cell_dir / CELL_RECEIPT, StudyCellReceipt, body=body, inputs=inputs)
    return body
