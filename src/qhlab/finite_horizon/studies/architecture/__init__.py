"""The architecture study (seed 002), one idea per module; its public path is ``studies.architecture_study``.

Modules, in the order a study uses them:
``config`` (the study TOML model), ``layout`` (file names of a study directory),
``populations`` (TRAIN / validation sources and support), ``authentication`` (the receipt
chain each step checks), ``freeze`` (step 1), ``canary`` (the E0 rules) and ``admission``
(step 2, the gate), ``development`` (step 3), ``cells`` (step 4, one fit per cell),
``benchmarks`` (step 5), ``references`` / ``report`` / ``render`` (step 6) and ``report_run``
(its W&B run), ``status`` (a read-only view of a study in progress), and ``command`` with
``terminal`` (the command line and what it draws).

Does not own: fitting, evaluation, statistics, populations or receipts (see
``architecture_study``). Nothing is imported eagerly here; import the module you need.
"""

__all__ = [
    "admission",
    "authentication",
    "benchmarks",
    "canary",
    "cells",
    "command",
    "config",
    "development",
    "freeze",
    "layout",
    "populations",
    "references",
    "render",
    "report",
    "report_run",
    "status",
    "terminal",
]
