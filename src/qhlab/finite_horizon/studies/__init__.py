"""The seed's public path of the architecture study: ``architecture_study``.

Owns nothing else: the study application lives in ``qhlab.study``, a package above this science
core, and ``architecture_study`` re-exports the seed's names from it.
"""

__all__ = ["architecture_study"]
