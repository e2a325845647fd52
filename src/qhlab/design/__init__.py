"""The pre-registered design: what a study and its preparation declare, and the records they bind.

Sits below the study pipeline and the preparation tools, so that a freeze reads the records
that ``qhlab tune``, ``qhlab pilot`` and ``qhlab e0-check`` write without importing the tools,
and the tools read the study config without importing the pipeline. Torch-free throughout.

Owns: the config kit (``config_files``: the one strict TOML reader, ``load_recipe``, one config
kind's form and the field types every kind repeats; ``tool_config``: a tool's config read with the
study it serves), the study config (``study_config``), the E0 gate's rules (``canary``), and per
preparation tool its config and its record (models, readers and the checks ``qhlab verify``
runs): ``tuning_config`` / ``tuning_rule`` / ``tuning_record``, ``pilot_config`` /
``pilot_record``, ``e0_config`` / ``e0_record``. Does not own: running anything (``qhlab.study``,
``qhlab.preparation``), the statistics (``qhlab.statistics``) or file names
(``qhlab.evidence.layout``).
"""

__all__ = [
    "canary",
    "config_files",
    "e0_config",
    "e0_record",
    "pilot_config",
    "pilot_record",
    "study_config",
    "tool_config",
    "tuning_config",
    "tuning_record",
    "tuning_rule",
]
