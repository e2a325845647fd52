"""One fit job, run anywhere: a plain value that a pool worker, this process and a Ray task run alike.

Owns: ``FitJob`` (a fit as plain data: the recipe as JSON, the lane, the output root and cell, the
population directories, the torch thread count, the W&B grouping, the study it belongs to, and its
adopt-or-fit rule) and ``run_fit_job`` (adopt the cell's finished attempt by the one rule,
``qhlab.training.segments.finished_attempt``, or one copied from an earlier run where it binds the
same, or else make one ``fit_recipe`` call). A study's cells, a tuning's trials, a pilot's fits and a
Ray cell's task build a ``FitJob``; what exists only where a job runs (a loaded population, the
segment a cell continues, the progress bar, a Ray worker's local copies) is passed to
``FitJob.request`` beside it.

Does not own: the fit itself (``qhlab.finite_horizon.fit``), the rule's check
(``qhlab.training.segments``), which fits a tool or study makes, or authenticating a study's
adopted cell (``qhlab.study.cells``). Imports nothing heavy at module level: a job is unpickled in
a worker before torch is imported.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qhlab.evidence import sha256_file
from qhlab.evidence.layout import MANIFEST
from qhlab.evidence.publish import TEMP_MARKER
from qhlab.finite_horizon.recipe import QhRecipe, recipe_digest

if TYPE_CHECKING:
    from qhlab.finite_horizon.fit import FitRequest

__all__ = ["FitJob", "run_fit_job"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitJob:
    """One fit, as a frozen value that pickles without torch (a pool's or Ray's task argument).

    Contract: it crosses processes (a pool worker, a Ray task) as its own value: unpickling it
    imports no torch or Lightning. It is never persisted; what it ran is in the receipts of the
    attempt it adopted or made. ``run_fit_job`` is its only runner.

    Attributes:
        recipe: the validated recipe (a pydantic model: it pickles, and dumps to JSON).
        profile: the execution profile (lane).
        output: the output root; the cell's attempts are ``output/<cell>/<local_attempt_id>/``.
        cell: the cell's name.
        train: the TRAIN population directory.
        validation: the validation population directory; None: the fit is not evaluated (a canary).
        torch_threads: torch intra-op threads; the launcher sets them beside the seeding.
        job_type, group, tags: the W&B run's job type, group and tags.
        study: the study's identity (``{"name", "freeze_receipt_sha256", "study_id"}``) for a
            study's cell or canary, recorded in the fit receipt; None: a preparation fit.
        train_rows: the TRAIN rows a canary trains on; None: all.
        max_allocated_bytes: the lane's memory ceiling (CUDA lanes).
        curve_updates: observed updates the learning curve measures.
        expected_structure: the scorer structure the freeze recorded for the arm (None: unchecked).
        bind_populations: the adopt rule's check. True (a preparation fit): an adopted attempt's
            fit receipt must bind this job's applied recipe digest and population manifests, or the
            job is refused. False (a study's cell): the caller authenticates the adopted attempt.
        adopt_from: an earlier run's output root whose finished attempt of this cell is copied in
            and adopted where it binds the same recipe and populations (``bind_populations`` only).
    """

    recipe: QhRecipe
    profile: str
    output: str
    cell: str
    train: str
    validation: str | None
    torch_threads: int
    job_type: str
    group: str
    tags: tuple[str, ...] = ()
    study: Mapping[str, str] | None = None
    train_rows: tuple[int, ...] | None = None
    max_allocated_bytes: int | None = None
    curve_updates: tuple[int, ...] = ()
    expected_structure: str | None = None
    bind_populations: bool = False
    adopt_from: str | None = None

    def request(self, **live: Any) -> FitRequest:
        """The ``FitRequest`` this job runs.

        Args:
            live: ``FitRequest`` fields that exist only where the job runs, each replacing the
                job's: ``train``/``validation`` (a population loaded once per study, or a Ray
                worker's local copy), ``output``, ``recorded_populations``, ``resume``, ``progress``.

        Returns:
            The request.
        """
        # Lazy: keeps unpickling a job free of torch and Lightning.
        from qhlab.finite_horizon.fit import FitRequest

        fields = {
            "recipe": self.recipe,
            "profile": self.profile,
            "output": Path(self.output),
            "train": self.train,
            "validation": self.validation,
            "cell": self.cell,
            "evaluate": self.validation is not None,
            "train_rows": None if self.train_rows is None else list(self.train_rows),
            "max_allocated_bytes": self.max_allocated_bytes,
            "torch_threads": self.torch_threads,
            "job_type": self.job_type,
            "group": self.group,
            "tags": self.tags,
            "study": self.study,
            "curve_updates": self.curve_updates,
            "expected_structure": self.expected_structure,
        }
        return FitRequest(**{**fields, **live})

    def binds(self) -> dict[str, str] | None:
        """What an adopted attempt's fit receipt must bind (None: the caller authenticates it).

        Returns:
            ``{"recipe_digest": the recipe as the lane applies it, "train_manifest",
            "validation_manifest": the populations' manifest digests}``: a recipe names no
            population, so a fit of the same recipe on another population is another fit.
        """
        if not self.bind_populations:
            return None
        # Lazy: keeps unpickling a job free of torch and Lightning.
        from qhlab.training.launcher import admit_launch

        roles = {"train": self.train, "validation": self.validation}
        manifests = {f"{role}_manifest": sha256_file(Path(path) / MANIFEST) for role, path in roles.items() if path}
        return {"recipe_digest": recipe_digest(admit_launch(self.profile, self.recipe).recipe), **manifests}


def run_fit_job(job: FitJob, **live: Any) -> tuple[Path, bool]:
    """Adopt the job's finished attempt by the one rule, or fit it: the one adopt-or-fit.

    Args:
        job: the fit job.
        live: what exists only where the job runs (``FitJob.request``).

    Returns:
        (the attempt directory, True when a finished attempt was adopted rather than fitted).

    Raises:
        EvidenceError: the cell's finished attempt binds another recipe or population.
        QhInputError: anything ``fit_recipe`` refuses; nothing is written.
    """
    # Lazy: keeps unpickling a job free of torch and Lightning.
    from qhlab.finite_horizon.fit import fit_recipe
    from qhlab.training.segments import finished_attempt, unbound

    evaluated = job.validation is not None
    binds = job.binds()
    cell_dir = Path(job.output) / job.cell
    directory = finished_attempt(cell_dir, evaluated=evaluated, binds=binds)
    if directory is None and job.adopt_from is not None and binds is not None:
        # An earlier run's finished fit of this very cell (an arm that changed is fitted anew),
        # copied in whole so this run's record binds files of its own, then adopted by the rule.
        earlier = finished_attempt(Path(job.adopt_from) / job.cell, evaluated=evaluated)
        if earlier is not None and not unbound(earlier, binds) and _copy_attempt(earlier, cell_dir):
            directory = finished_attempt(cell_dir, evaluated=evaluated, binds=binds)
    if directory is not None:
        return directory, True
    return Path(fit_recipe(job.request(**live)).output_directory), False


def _copy_attempt(attempt: Path, cell_dir: Path) -> Path | None:
    """Copy a finished attempt into ``cell_dir`` under its own name, whole or not at all (a hidden
    temporary copy renamed into place, so an interrupted copy is never read as a finished attempt)."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    target = cell_dir / attempt.name
    if target.exists():  # an unfinished attempt of that name here: the cell is fitted anew
        return None
    temporary = cell_dir / f".{attempt.name}{TEMP_MARKER}"
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(attempt, temporary)
    os.replace(temporary, target)
    return target
