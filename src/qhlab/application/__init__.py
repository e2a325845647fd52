"""The study application: the top of the house, above the command line.

``architecture_study`` is the architecture study's entry point: its step functions (one call each
of ``qhlab.study.Study``), its ``main`` and the names the seed API names with them. It imports the
command line, the report and the design; nothing imports it but the seed API's own path,
``qhlab.finite_horizon.studies.architecture_study``, a thin alias of it.
"""

__all__ = ["architecture_study"]
