"""Typed receipts of the preparation steps: ``qhlab tune``, ``qhlab pilot`` and ``qhlab e0-check``.

Owns: the receipt models of the three preparation records (each binds its record file and its
config's copy). Does not own: the envelope and the registry of kinds (``envelope``), nor what
a record holds (each step's ``record`` module). ``records`` imports and re-exports these kinds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from qhlab.evidence.envelope import _SHA256, Receipt, _Closed, _Json

__all__ = ["E0CheckReceipt", "PilotReceipt", "TuningReceipt"]


class TuningBody(_Closed):
    """A tuning's record (the trials and the rule live in ``tuning.json``, which it binds).

    Attributes:
        name: the tuning. config_sha256: its config. trials: how many. winner: the winning
        trial's number (None when no trial is admissible).
    """

    name: str
    config_sha256: str = Field(pattern=_SHA256)
    trials: int
    winner: int | None


class TuningReceipt(Receipt):
    """``tuning.receipt.json``."""

    kind: Literal["tuning"] = "tuning"
    schema_version: Literal[1] = 1
    body: TuningBody


class PilotBody(_Closed):
    """A pilot's record (its fits and variance components live in ``pilot.json``, which it binds).

    Attributes:
        name: the pilot. config_sha256: its config and the study design. fits: how many.
        seed_variance, train_draw: the maxima a study freezes (``train_draw`` None without draws).
    """

    name: str
    config_sha256: str = Field(pattern=_SHA256)
    fits: int
    seed_variance: _Json
    train_draw: _Json | None


class PilotReceipt(Receipt):
    """``pilot.receipt.json``."""

    kind: Literal["pilot"] = "pilot"
    schema_version: Literal[1] = 1
    body: PilotBody


class E0CheckBody(_Closed):
    """An E0 check's outcome (its draws' rows and canaries live in ``e0.json``, which it binds).

    Attributes:
        name: the check. config_sha256: its config and the gate design. draws: how many TRAIN
        draws. passed: how many passed. meets_min_pass_share: whether the share reached the config's.
    """

    name: str
    config_sha256: str = Field(pattern=_SHA256)
    draws: int
    passed: int
    meets_min_pass_share: bool


class E0CheckReceipt(Receipt):
    """``e0.receipt.json`` of ``qhlab e0-check``."""

    kind: Literal["e0_check"] = "e0_check"
    schema_version: Literal[1] = 1
    body: E0CheckBody
