"""The receipt kind of a lane comparison (``lane_comparison``).

Owns: its body model, registered by its kind when defined. Does not own: the comparison
(``compare``) or authentication (``qhlab.evidence``).
"""

from __future__ import annotations

from qhlab.evidence.envelope import Closed, Json, Receipt

__all__ = [
    "LaneComparisonBody",
    "LaneComparisonReceipt",
]


class LaneComparisonBody(Closed):
    """Two lanes' reports of one study, compared.

    Attributes:
        study: the study. profiles: each lane's report. margin: the agreement margin.
        summary: the comparison.
    """

    study: str
    profiles: Json
    margin: float
    summary: Json


class LaneComparisonReceipt(Receipt, kind="lane_comparison", version=1):
    """``lanes.receipt.json``."""

    body: LaneComparisonBody
