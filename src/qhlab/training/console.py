"""What a qhlab process prints: quiet third-party output by default, everything with --verbose.

Owns: ``configure_console(verbose)`` (silence known, harmless third-party output at its
source: Lightning's info banners and tips through its own logger, wandb's console through its
own settings, and the exact deprecation warnings we know are harmless through targeted
warning filters; never a blanket redirect of stderr, so a real error still prints),
``console_verbose()`` (whether fits should show Lightning's own progress bar instead of
qhlab's ``QhFitProgressBar`` in ``qhlab.training.callbacks``) and ``fit_log(directory)``
(Lightning's log lines of one fit go to ``fit.log`` in its directory whatever the console
shows). It imports no Lightning, so light commands (``qhlab verify``) stay fast. Does not own:
qhlab's own step headers and result lines (the commands print those).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from qhlab.evidence.layout import FIT_LOG

__all__ = ["configure_console", "console_verbose", "fit_log"]

"""Lightning's log lines of one fit, in the fit's directory (bound by no receipt)."""

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
# Warnings known to be harmless here, matched exactly (message and module) so that any other
# warning of the same category still prints.
_HARMLESS_WARNINGS = (
    # torch 2.13 deprecates isinstance(spec, LeafSpec); Lightning 2.6's _pytree still uses it.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
)
_state = {"verbose": True}


def configure_console(verbose: bool) -> None:
    """Quiet (default) or verbose third-party output for this process.

    Call once at start-up in every process that fits (the CLI and the study's workers).

    Args:
        verbose: True restores every banner, tip, warning and Lightning's progress bar.
    """
    _state["verbose"] = bool(verbose)
    _apply_lightning_console_level()
    if verbose:
        os.environ.pop("WANDB_SILENT", None)
        return
    os.environ["WANDB_SILENT"] = "true"
    for message, module in _HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)


def _apply_lightning_console_level() -> None:
    # Lightning attaches its own console handler when it is imported; raising that handler's
    # level (not the logger's) keeps INFO records flowing to fit.log while the console stays
    # quiet. Applied again at every fit, since the CLI configures before Lightning is imported.
    level = logging.INFO if _state["verbose"] else logging.WARNING
    for name in _LIGHTNING_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(level)


def console_verbose() -> bool:
    """True when the process was configured verbose (or never configured: library use)."""
    return _state["verbose"]


@contextlib.contextmanager
def fit_log(directory: Path) -> Iterator[Path]:
    """Send Lightning's log records (INFO and up) to ``directory/fit.log`` for one fit.

    Wrap the ``Trainer``'s construction too: it logs the accelerator banners.
    """
    _apply_lightning_console_level()
    path = Path(directory) / FIT_LOG
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    try:
        yield path
    finally:
        for logger, level in zip(loggers, previous):
            logger.removeHandler(handler)
            logger.setLevel(level)
        handler.close()
