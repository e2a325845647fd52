"""The study application: pre-registered architecture studies and the preparation they bind.

Sits above the science core (``qhlab.finite_horizon``: recipe, scorer, learning rule, data,
evaluation, diagnostics, fit) and below the command line. Owns, one idea per module, in the
order a study uses them: ``config`` (the study TOML model), ``layout`` (file names of a study
directory), ``populations`` (TRAIN / validation sources and support), ``authentication`` (the
receipt chain each step checks), ``family`` (user arms and their frozen copies), ``freeze``
(step 1), ``canary`` (the E0 rules) and ``admission`` (step 2, the gate), ``development``
(step 3), ``cells`` (step 4, one fit per cell), ``remote`` / ``remote_worker`` (cells as Ray
tasks), ``benchmarks`` (step 5), ``references`` / ``report`` / ``render`` / ``sections`` /
``seed_aware`` (step 6) and ``report_run`` (its W&B run), ``preparation`` (the tuning record a
study binds), ``lanes`` (comparing one study on two lanes), ``status`` (a read-only view of a
study in progress), ``command`` with ``terminal`` (the command line and what it draws), the
scene-level statistics (``statistics``: bootstrap intervals and retention margins;
``replication``: across training seeds) and ``tuning`` (``qhlab tune``).

Does not own: fitting (``qhlab.finite_horizon.fit``), evaluation arithmetic
(``qhlab.finite_horizon.evaluation``), populations (``qhlab.scenes``) or receipts
(``qhlab.evidence``). The seed's public path stays
``qhlab.finite_horizon.studies.architecture_study``, a thin facade over this package. Nothing is
imported eagerly here; import the module you need.
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
    "family",
    "freeze",
    "lanes",
    "layout",
    "populations",
    "preparation",
    "references",
    "remote",
    "render",
    "replication",
    "report",
    "report_run",
    "statistics",
    "status",
    "terminal",
    "tuning",
]
