"""A receipt kind for the evidence layer's own tests: a note whose body may hold any fields.

The evidence layer authenticates bytes and bound files whatever a body says; its tests use
this kind so that they do not depend on the layout of any step's body. Importing this module
registers the kind in the test process only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from qhlab.evidence.envelope import Receipt


class NoteBody(BaseModel):
    """Any JSON object."""

    model_config = ConfigDict(extra="allow", frozen=True)


class NoteReceipt(Receipt, kind="test_note", version=1):
    """``kind: "test_note"``: a receipt for tests of authentication itself."""

    body: NoteBody
