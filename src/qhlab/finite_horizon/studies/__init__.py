"""The architecture study's public API path: ``architecture_study``.

``architecture_study`` is the study application's entry point: its step functions (one call each
of ``qhlab.study.Study``), its command and ``main``. It sits above the study pipeline
(``qhlab.study``) and the preparation tools, not in the science core beside it; import-linter's
contract in ``pyproject.toml`` lists it as its own layer.
"""

__all__ = ["architecture_study"]
