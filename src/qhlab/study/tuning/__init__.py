"""Tuning as evidence: ``qhlab tune`` searches a recipe space on a declared tuning population.

Owns: ``config`` (the tuning TOML), ``rule`` (a trial's score and the winner rule, pure
functions), ``run`` (the trials as real fits, with Optuna on SQLite, deterministic and
resumable) and ``record`` (``tuning.json``, ``recipe.toml``, their receipt and the checks
``qhlab verify`` runs). Nothing is imported eagerly: ``record`` and ``rule`` are torch-free.
"""

__all__ = ["config", "record", "rule", "run"]
