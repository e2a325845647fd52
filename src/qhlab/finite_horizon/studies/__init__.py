"""Pre-registered studies over charged fits, and the scene-level statistics they report.

Owns: ``statistics`` (scene bootstrap intervals, retention margins, seed agreement) and
``architecture_study`` (seed 002: freeze, canaries, development, fits, report). Does not own:
the evaluation arithmetic (``qhlab.finite_horizon.evaluation``) or fitting
(``qhlab.finite_horizon.fit``). Nothing is imported eagerly: ``architecture_study`` pulls in
Lightning and the scorer, so import it explicitly.
"""

__all__ = ["architecture_study", "statistics"]
