"""Replicating a finished study: ``qhlab study replicate STUDY --train-seed A --validation-seed B``.

Owns: ``run`` (run the original's frozen design on a fresh population pair as a study of its own,
then publish the replication record), ``agreement`` (the design check, the refused seeds and every
number of ``replication.json``: per comparison both seed-pooled estimates and z, the chi-square
agreement test, sign flips and changed conclusions) and ``records`` (the receipt kind and the
check ``qhlab verify`` recomputes). Does not own: the study steps (``qhlab.study``) or the
statistics (``qhlab.statistics``).
"""

__all__ = ["agreement", "records", "run"]
