"""The study's report: what a finished study answers, and every way it is shown.

Sits above the step pipeline (``qhlab.study``), whose receipts it reads and which never imports
it (a ``Study`` is handed the report step, ``REPORTER``), and below the analyses of finished
studies (``qhlab.lanes``, ``qhlab.replication``), which read studies through ``finished_study``.
Owns, one idea per module: ``build`` (``report.json``, ``report.md`` and the report receipt),
``references``, ``seed_aware``, ``preparation_section`` and ``answer`` (its sections),
``sections`` and ``document`` (the section contract and the document's schema), ``render``,
``figures`` and ``tuning_figures`` (tables and figures), ``records`` (recomputing a published
report), ``receipt`` (the report receipt authenticated, torch-free), ``export`` (``qhlab study
export``), ``wandb_run`` (the W&B report run) and
``finished`` (the report step a ``Study`` is given, and a finished study read whole). Nothing is
imported eagerly here; import the module you need.
"""

__all__ = ["REPORTER", "FinishedStudy", "finished_study", "open_study"]


def __getattr__(name: str):
    if name in __all__:
        # Lazy: the report step imports torch through the pipeline; `qhlab verify` and `study export`
        # import report modules without it.
        from qhlab.report import finished

        return getattr(finished, name)
    raise AttributeError(f"module 'qhlab.report' has no attribute {name!r}")
