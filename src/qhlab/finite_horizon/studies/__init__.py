"""The architecture study's seed API path: ``architecture_study``.

``architecture_study`` is a thin alias of ``qhlab.application.architecture_study``, the study
application's entry point, which sits above the command line and outside the science core.
"""

__all__ = ["architecture_study"]
