"""Comparing one study on two hardware lanes: ``qhlab study compare-lanes A B``.

Owns: ``compare`` (re-authenticate two finished studies frozen identically but for the profile,
compare them per scene against the seed effect with a TOST verdict, and publish ``lanes.json``,
``lanes.md``, ``lanes.png`` and their receipt). Does not own: the studies themselves
(``qhlab.study``) or the statistics (``qhlab.statistics``).
"""

__all__ = ["compare"]
