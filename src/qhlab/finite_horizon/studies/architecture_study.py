"""The seed API's path of the architecture study: a thin alias of ``qhlab.application.architecture_study``.

Owns nothing: every name is the application module's own object (the same functions, signatures
and classes), and ``python -m qhlab.finite_horizon.studies.architecture_study SUBCOMMAND ...``
runs its ``main``. The code sits above the command line, outside the science core, in
``qhlab.application``; this file keeps the path the seed API documents.
"""

from qhlab.application.architecture_study import (
    QhArchitectureStudyConfig,
    admit_canaries,
    benchmark_scorer,
    freeze_study,
    main,
    prepare_development,
    report_study,
    run_fit,
)

__all__ = [
    "QhArchitectureStudyConfig",
    "admit_canaries",
    "benchmark_scorer",
    "freeze_study",
    "main",
    "prepare_development",
    "report_study",
    "run_fit",
]

if __name__ == "__main__":
    main()
