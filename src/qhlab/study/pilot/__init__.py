"""The pilot as evidence: ``qhlab pilot`` measures a study's variance components before its freeze.

Owns: ``config`` (the pilot TOML and the study design it measures), ``variance`` (the seed and
TRAIN-draw components, pure functions), ``run`` (the fits, resumable) and ``record``
(``pilot.json``, its receipt and the checks ``qhlab verify`` runs). Nothing is imported eagerly:
``record`` and ``variance`` are torch-free.
"""

__all__ = ["config", "record", "run", "variance"]
