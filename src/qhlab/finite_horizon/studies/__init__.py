"""Pre-registered studies over charged fits, and the scene-level statistics they report.

Owns: ``statistics`` (scene bootstrap intervals, retention margins, seed agreement),
``architecture`` (the architecture study, one module per idea: config, layout, receipt chain,
each step, report, command) and ``architecture_study`` (seed 002's public path: a facade over
``architecture``). Does not own: the evaluation arithmetic (``qhlab.finite_horizon.evaluation``),
fitting (``qhlab.finite_horizon.fit``) or timing a scorer (``qhlab.finite_horizon.benchmark``).
Nothing is imported eagerly; import the module you need (the steps import Lightning only when
they run).
"""

__all__ = ["architecture", "architecture_study", "statistics"]
