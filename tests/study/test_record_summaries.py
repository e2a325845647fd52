"""A preparation receipt's body summarises its record; a resealed body that says otherwise is refused.

Run on copies of the committed demo records (no fit is run): each receipt is resealed, as anyone who
can write its directory can, with one summary field changed, and the record reader refuses it,
naming the field.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qhlab.design import e0_record, pilot_record, plan_record, tuning_record
from qhlab.evidence import DigestMismatchError
from record_forgery import reseal

PREPARATION = Path(__file__).resolve().parents[2] / "examples" / "preparation"


@pytest.mark.parametrize(
    ("name", "module", "receipt", "field", "value"),
    [
        ("demo-pilot", pilot_record, "pilot.receipt.json", "fits", 1),
        ("demo-plan", plan_record, "plan.receipt.json", "chosen", 99),
        ("demo-e0", e0_record, "e0.receipt.json", "passed", 0),
        ("demo-plan", plan_record, "plan.receipt.json", "designs", 1),
        ("demo-tune", tuning_record, "tuning.receipt.json", "winner", 0),
        ("demo-tune", tuning_record, "tuning.receipt.json", "trials", 3),
    ],
)
def test_a_receipt_body_that_summarises_another_record_is_refused(tmp_path, name, module, receipt, field, value):
    copy = shutil.copytree(PREPARATION / name, tmp_path / name)
    record = module.read_record(copy)  # the committed copy reads
    assert record["name"]
    reseal(copy / receipt, lambda body: body.update({field: value}))
    with pytest.raises(DigestMismatchError, match=rf"{receipt} and its \S+ disagree on {field}\."):
        module.read_record(copy)
