"""One registry of record kinds: a kind added in one file is read, authenticated and checked by verify.

This file is the whole of a new kind: its body model, its receipt and the check ``qhlab verify``
recomputes. Nothing else in qhlab names it, yet ``qhlab verify`` finds its receipts, runs its
check, prints its line, and refuses a record whose claim its check does not recompute.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from qhlab.cli import main
from qhlab.evidence import DigestMismatchError, publish_json, write_receipt
from qhlab.evidence.envelope import Closed, Receipt, load_kinds, receipt_kinds, record_checks, register_check

COUNT_RECORD = "count.json"
COUNT_RECEIPT = "count.receipt.json"


class CountBody(Closed):
    """A record that claims the sum of its numbers."""

    total: int


class CountReceipt(Receipt, kind="registry_test_count", version=1):
    """``count.receipt.json``: binds ``count.json``."""

    body: CountBody


def check_count(directory: Path) -> dict:
    """Recompute the claimed total from the record's numbers."""
    record = json.loads((directory / COUNT_RECORD).read_text())
    if sum(record["numbers"]) != record["total"]:
        raise DigestMismatchError(
            f"qhlab verify: {directory / COUNT_RECORD} claims {record['total']}, its numbers "
            f"sum to {sum(record['numbers'])}."
        )
    return {"numbers": len(record["numbers"])}


register_check(
    CountReceipt,
    file=COUNT_RECEIPT,
    check=check_count,
    describe=lambda directory, entry: f"count: {directory}: {entry['numbers']} numbers summed again",
)


def _write(directory: Path, numbers: list[int], total: int) -> None:
    directory.mkdir(parents=True)
    publish_json(directory / COUNT_RECORD, {"numbers": numbers, "total": total})
    write_receipt(
        directory / COUNT_RECEIPT, CountReceipt, body={"total": total}, outputs={"record": directory / COUNT_RECORD}
    )


def _verify(directory: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", str(directory)])
    return code, out.getvalue(), err.getvalue()


def test_a_kind_defined_in_one_file_is_registered_with_its_check() -> None:
    assert "registry_test_count" in receipt_kinds()
    assert record_checks()["registry_test_count"].check is check_count


def test_verify_runs_the_new_kinds_check_and_refuses_a_claim_it_does_not_recompute(tmp_path) -> None:
    _write(tmp_path / "good", [1, 2, 3], 6)
    code, out, _ = _verify(tmp_path / "good")
    assert code == 0
    assert "verified: 1 receipts (1 registry_test_count)" in out
    assert f"count: {tmp_path / 'good'}: 3 numbers summed again" in out
    # The receipt authenticates (its digests are right), but the claim is false: the check refuses.
    _write(tmp_path / "bad", [1, 2, 3], 7)
    code, _, err = _verify(tmp_path / "bad")
    assert code == 2
    assert "claims 7, its numbers sum to 6" in err


def test_every_owner_module_of_qhlab_is_found_by_name(tmp_path) -> None:
    modules = load_kinds()
    assert {
        "qhlab.training.records",
        "qhlab.scenes.records",
        "qhlab.finite_horizon.records",
        "qhlab.design.study_records",
        "qhlab.lanes.records",
        "qhlab.design.tuning_record",
        "qhlab.design.pilot_record",
        "qhlab.design.e0_record",
    } <= set(modules)
    assert {"tuning", "pilot", "e0_check"} <= set(record_checks())
