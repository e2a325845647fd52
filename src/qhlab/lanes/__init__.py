"""Comparing one study on two hardware lanes: ``qhlab study compare-lanes A B``.

Owns: ``compare`` (re-authenticate two finished studies frozen identically but for the profile,
compare them per scene against the seed effect with a TOST verdict, and publish ``lanes.json``,
``lanes.md``, ``lanes.png`` and their receipt), ``render`` (``lanes.md`` and ``lanes.png``) and
``records`` (the receipt's kind). Does not own: the studies themselves (read through
``qhlab.report.finished_study``) or the statistics (``qhlab.statistics``).
"""

__all__ = ["compare"]
