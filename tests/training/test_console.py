"""Console modes: quiet by default at the libraries' own switches, verbose restores them."""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch  # noqa: F401 - attaches Lightning's console handler
import pytest

from qhlab.training.console import configure_console, console_verbose, fit_log


@pytest.fixture(autouse=True)
def _restore_console():
    yield
    configure_console(True)


def _lightning_console_levels() -> set[int]:
    handlers = logging.getLogger("lightning.pytorch").handlers
    return {
        h.level for h in handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    }


def test_quiet_raises_lightnings_console_handler_and_verbose_restores_it(monkeypatch) -> None:
    # Lightning attaches its console handler only when the root logger has none (a CLI
    # process); pytest configures the root logger, so attach one the way Lightning does.
    lightning_logger = logging.getLogger("lightning.pytorch")
    monkeypatch.setattr(lightning_logger, "handlers", [logging.StreamHandler()])
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    configure_console(False)
    assert not console_verbose()
    assert _lightning_console_levels() == {logging.WARNING}
    assert logging.getLogger("lightning.pytorch").getEffectiveLevel() <= logging.INFO  # records still flow
    import os

    assert os.environ["WANDB_SILENT"] == "true"
    configure_console(True)
    assert console_verbose() and _lightning_console_levels() == {logging.INFO}
    assert "WANDB_SILENT" not in os.environ


def test_quiet_filters_only_the_known_harmless_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_console(False)
        warnings.warn_explicit(
            "`isinstance(treespec, LeafSpec)` is deprecated, use ...",
            FutureWarning,
            "_pytree.py",
            21,
            module="lightning.pytorch.utilities._pytree",
        )
        warnings.warn_explicit(
            "something else is deprecated",
            FutureWarning,
            "_pytree.py",
            22,
            module="lightning.pytorch.utilities._pytree",
        )
        warnings.warn_explicit(
            "`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, "mine.py", 1, module="mypackage"
        )
    messages = [str(w.message) for w in caught]
    assert messages == ["something else is deprecated", "`isinstance(treespec, LeafSpec)` is deprecated"]


def test_fit_log_keeps_lightnings_info_lines_in_the_fit_directory_while_quiet(tmp_path) -> None:
    configure_console(False)
    with fit_log(tmp_path) as path:
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
    assert "GPU available: False" in path.read_text()
    assert not logging.getLogger("lightning.pytorch").handlers or all(
        not isinstance(h, logging.FileHandler) for h in logging.getLogger("lightning.pytorch").handlers
    )
