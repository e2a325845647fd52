"""The E0 gate's robustness as evidence: ``qhlab e0-check`` runs a study's E0 gate on fresh TRAIN draws.

Owns: ``config`` (the check's TOML and the gate design it checks), ``run`` (one frozen sub-study
per fresh TRAIN draw, its canary row and canaries, resumable) and ``record`` (``e0.json``, its
receipt and the checks ``qhlab verify`` runs). Nothing is imported eagerly: ``config`` and
``record`` are torch-free.
"""

__all__ = ["config", "record", "run"]
