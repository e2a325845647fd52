"""The study pipeline: the steps of a pre-registered, paired architecture study.

Sits above the science core (``qhlab.finite_horizon``), the statistics (``qhlab.statistics``) and
the design it runs (``qhlab.design``: the study config and every record it binds), below the
report (``qhlab.report``, which reads its receipts and is handed to a ``Study`` as its last
step), the preparation tools (``qhlab.preparation``) and the study's entry point
(``qhlab.finite_horizon.studies.architecture_study``). Owns, one idea per module: ``study``
(``Study``: every step called one way, and the main job's order), ``arguments`` (the study's
command-line arguments), ``authentication`` (the receipt chain each step checks),
``populations`` (TRAIN / validation sources and support), ``family`` (user arms' frozen copies
and their contract), ``freeze`` (step 1), ``admission`` (step 2, the E0 gate), ``development``
(step 3), ``cells`` (step 4, one fit per cell), ``run`` (the main job's fits on its job runner),
``remote`` / ``remote_worker`` (cells as Ray tasks), ``benchmarks`` (step 5), ``preparation``
(the records a freeze binds) and ``status`` (a read-only view of a study in progress). Nothing is
imported eagerly here; import the module you need.
"""

__all__ = ["Study"]


def __getattr__(name: str):
    if name == "Study":
        # Lazy: the pipeline imports torch; `qhlab study status` imports this package without it.
        from qhlab.study.study import Study

        return Study
    raise AttributeError(f"module 'qhlab.study' has no attribute {name!r}")
