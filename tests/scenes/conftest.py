"""Shared fixtures of the scene tests: tiny populations generated once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from qhlab.scenes import generate_population


@pytest.fixture(scope="session")
def tiny_train(tmp_path_factory) -> Path:
    """The tiny TRAIN population, seed 0, generated in this process (workers=1)."""
    return generate_population("tiny", "train", 0, tmp_path_factory.mktemp("tiny") / "train-0", workers=1)
