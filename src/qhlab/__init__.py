"""qhlab: a research harness for finite-horizon Q-learning on physical scenes.

The top-level package owns only the version. Sub-packages: ``evidence`` (torch-free
receipts), ``scenes`` (pymunk benchmark), ``training`` (execution profiles, launcher),
``finite_horizon`` (scorer, learning rule, diagnostics, studies) and ``cli``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
