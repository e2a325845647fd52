"""What every preparation tool's config shares: the study it serves, read and checked with it.

Owns: ``read_tool_config`` (a tool's config file and the study config it names, both fully
validated, then the tool's own cross-checks against that study, every problem in one error,
before anything is written). Does not own: reading TOML (``config_files``), the study config
(``study_config``) or any one tool's fields (``pilot_config``, ``plan_config``, ``e0_config``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from qhlab.design.config_files import ConfigForm
from qhlab.design.study_config import QhArchitectureStudyConfig, read_study_config

__all__ = ["read_tool_config"]

M = TypeVar("M", bound=BaseModel)


def read_tool_config(
    form: ConfigForm[M],
    path: str | os.PathLike,
    check: Callable[[M, QhArchitectureStudyConfig], list[str]] | None = None,
    hint: str = "",
) -> tuple[M, bytes, QhArchitectureStudyConfig]:
    """Read a tool's config and the study it serves (its ``study`` field), and cross-check them.

    Args:
        form: the tool's config kind; its model has a ``study`` path field.
        path: the tool's config file.
        check: the tool's checks of its config against the study: one line per problem, each
            naming the field, its value and what is allowed (None: no cross-check).
        hint: the closing HINT line of a refusal of ``check``'s problems.

    Returns:
        (the validated config, the file's exact bytes, the study config).

    Raises:
        QhInputError: the config or the study is missing, unreadable or invalid (every field at
            once), or ``check`` found problems (all of them, in one error).
    """
    config, data, _ = form.read(path)
    study = read_study_config(config.study)[0]
    if check is not None:
        form.refuse(path, check(config, study), hint)
    return config, data, study
