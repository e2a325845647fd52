"""The study's statistics as pure functions over per-scene arrays (the scene is the unit).

Owns, one idea per module: ``bootstrap`` (BCa scene-bootstrap intervals, paired when two arms are
compared, the retention margins D_reg and D_mae with a seed's reading of them, and the paired
probability of improvement over scenes), ``replication`` (seed-pooled paired differences whose
intervals carry the fits' noise and are never narrower than the scene-only ones, replication
labels, the study's retention decision and minimum detectable effects), ``seed_check`` (the
study's check of its pilot's seed component against its own seeds), ``agreement`` (whether two
studies of one design agree) and ``variance`` (a pilot's seed and TRAIN-draw components of each
comparison, and the floored Satterthwaite sum of variance terms). Every function takes arrays and
settings and returns plain records; the docstrings give shapes. Does not own: computing per-scene
MAE or regret (``qhlab.finite_horizon.evaluation``), choosing thresholds (the study config) or
reading evidence.
"""

__all__ = ["agreement", "bootstrap", "replication", "seed_check", "variance"]
