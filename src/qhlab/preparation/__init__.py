"""The preparation tools: what shapes a study before its freeze, run as evidence.

Owns: ``tune`` (``qhlab tune``: a declared search space as real fits on a tuning population,
with Optuna on SQLite), ``pilot`` (``qhlab pilot``: a study's variance components), ``e0_check``
(``qhlab e0-check``: the study's E0 gate on fresh TRAIN draws), ``plan`` (``qhlab plan``: a
study's MDEs predicted from its pilot), ``fits`` (one resumable fit of a tuning trial or a pilot,
and the tool's output directory) and ``declared`` (a tool's populations checked against its study
before any is drawn). Each writes a record that a study's freeze binds. Does not own:
the configs and records themselves (``qhlab.design``), which sit below the study pipeline so
that a freeze reads them, nor the pipeline (``qhlab.study``), which these tools run on top of.
"""

__all__ = ["declared", "e0_check", "fits", "pilot", "plan", "tune"]
