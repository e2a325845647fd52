"""Seed 002: a frozen, pre-registered, paired architecture study over charged final fits.

Owns nothing itself: this module is the seed's public path and re-exports the study's API from
the focused modules of ``qhlab.study`` (config, layout,
authentication, one module per step, references, report, render, command) and
``benchmark_scorer`` from ``qhlab.finite_horizon.benchmark``. ``python -m
qhlab.finite_horizon.studies.architecture_study STEP CONFIG --output DIR`` runs ``main``.

The study's order: ``freeze_study`` -> ``admit_canaries`` (E0 gate) -> ``prepare_development``
-> ``run_fit`` for every declared cell -> ``benchmark_scorer`` -> ``report_study``.

Scientific guard rails, each enforced by the step modules:
* the statistical unit is the scene (evaluation and bootstrap work on per-scene values);
* TRAIN is digested at freeze and re-authenticated once by each process that runs a later step; validation is not
  opened before ``prepare_development`` and only after a passed E0 gate; no test data exists;
* exactly the declared cells (arm x seed) run, each once to its final budget; only a
  crashed cell (no final receipt) is attempted again, as a new recorded attempt;
* the report uses final states only, never an intermediate checkpoint;
* the qhlab source package may not change after freeze (``source_package_digest``).

Does not own: fitting (``qhlab.finite_horizon.fit.fit_recipe`` is the only optimizer loop),
evaluation arithmetic (``qhlab.finite_horizon.evaluation``), statistics
(``qhlab.study.statistics``), populations (``qhlab.scenes``,
``qhlab.finite_horizon.data``), and receipts/write-once files (``qhlab.evidence``).
"""

from __future__ import annotations

from qhlab.finite_horizon.benchmark import benchmark_scorer
from qhlab.study.admission import admit_canaries
from qhlab.study.cells import run_fit
from qhlab.study.command import main
from qhlab.study.config import QhArchitectureStudyConfig
from qhlab.study.development import prepare_development
from qhlab.study.freeze import freeze_study
from qhlab.study.references import reference_comparisons
from qhlab.study.report import report_study

__all__ = [
    "QhArchitectureStudyConfig",
    "admit_canaries",
    "benchmark_scorer",
    "freeze_study",
    "main",
    "prepare_development",
    "reference_comparisons",
    "report_study",
    "run_fit",
]


if __name__ == "__main__":
    main()
