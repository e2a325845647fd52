"""The receipt kind of a replication (``study_replication``) and the check ``qhlab verify`` runs on it.

Owns: its body model, registered by its kind when defined, and ``check_replication``: it reads
the six records the receipt binds (each study's freeze and development receipts and
``report.json``; the replica's below the replication's directory, the original's at its recorded
path), refuses any whose bytes are not the bound ones, recomputes
``replication.json`` from them and refuses a record that differs, or that claims a replication
whose design is not the original's or whose populations are not fresh. Torch- and numpy-free
at import, so ``qhlab verify`` starts fast. Does not own: the computation
(``agreement.replication_document``) or running a replication (``run``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from qhlab.evidence import DigestMismatchError, MissingEvidenceError, differing_keys, read_receipt, sha256_file
from qhlab.evidence.envelope import Closed, Json, Receipt, register_check
from qhlab.evidence.layout import (
    DEVELOPMENT_RECEIPT,
    FREEZE_RECEIPT,
    REPLICATION_JSON,
    REPLICATION_RECEIPT,
    REPORT_DIR,
    REPORT_JSON,
)

__all__ = ["SIDES", "STUDY_FILES", "ReplicationBody", "ReplicationReceipt", "check_replication"]

# The records of each study a replication reads, as its receipt names them: "<side>/<name>".
SIDES = ("original", "replica")
STUDY_FILES = {"freeze": FREEZE_RECEIPT, "development": DEVELOPMENT_RECEIPT, "report": f"{REPORT_DIR}/{REPORT_JSON}"}


class ReplicationBody(Closed):
    """A study's frozen design run again on a fresh population pair, and the agreement of the two.

    Attributes:
        study: the study's name. original, replica: each study's id, directory and populations.
        agreement: the chi-square test over every comparison. sign_flips: the comparisons whose
        seed-pooled estimate changed sign. changed_conclusions: the variants whose answer or verdict
        changed.
    """

    study: str
    original: Json
    replica: Json
    agreement: Json
    sign_flips: list[str]
    changed_conclusions: list[str]


class ReplicationReceipt(Receipt, kind="study_replication", version=1):
    """``replication.receipt.json``, beside the replica study it binds."""

    body: ReplicationBody


def _records(directory: Path, receipt: ReplicationReceipt) -> dict[str, dict[str, Any]]:
    """Each side's freeze and development bodies and report, read where they are and refused unless bound."""
    sides: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        sides[side] = {}
        for name in STUDY_FILES:
            bound = receipt.inputs.get(f"{side}/{name}")
            if bound is None:
                raise DigestMismatchError(
                    f"qhlab verify: {directory / REPLICATION_RECEIPT} binds no {side}/{name}. HINT: a replication "
                    "binds both studies' freeze and development receipts and reports."
                )
            # The replica is bound relative to the replication (it moves with it), the original absolutely.
            path = Path(bound.path) if Path(bound.path).is_absolute() else directory / bound.path
            if not path.is_file():
                raise MissingEvidenceError(
                    f"qhlab verify: the {side} study's {name} record {path} is missing. HINT: a replication is "
                    "checked against both studies; verify it where its original study is."
                )
            digest = sha256_file(path)
            if digest != bound.sha256:
                raise DigestMismatchError(
                    f"qhlab verify: the {side} study's {name} record {path} has sha256 {digest}; "
                    f"{directory / REPLICATION_RECEIPT} binds {bound.sha256}. HINT: the studies a replication "
                    "compared are never edited."
                )
            document = json.loads(path.read_text(encoding="utf-8"))
            sides[side][name] = document if name == "report" else document["body"]
    return sides


def check_replication(directory: str | os.PathLike) -> dict:
    """Recompute ``replication.json`` from the two studies it binds; raise at the first disagreement.

    Returns:
        ``{"comparisons", "statistic", "dof", "p_value", "sign_flips", "changed_conclusions"}``.

    Raises:
        DigestMismatchError: a bound study record changed, the recomputed document differs from
            the recorded one, the designs differ or the replica reused a population.
        MissingEvidenceError: a study record is not where the replication finds it.
    """
    # Lazy: the agreement test needs numpy and scipy, which `qhlab verify` does not load at start.
    from qhlab.replication.agreement import replication_document

    directory = Path(directory)
    receipt = read_receipt(directory / REPLICATION_RECEIPT, ReplicationReceipt)
    sides = _records(directory, receipt)
    recomputed = json.loads(json.dumps(replication_document(sides["original"], sides["replica"])))
    recorded = json.loads((directory / REPLICATION_JSON).read_text(encoding="utf-8"))
    differing = differing_keys(recomputed, recorded)
    if differing:
        raise DigestMismatchError(
            f"qhlab verify: {directory / REPLICATION_JSON} differs from its recomputation from the two studies "
            f"in {', '.join(differing)}. HINT: a replication record is computed, never written by hand; run "
            "`qhlab study replicate` again into a new directory."
        )
    if not recomputed["design"]["identical"] or recomputed["reused"]:
        problems = recomputed["design"]["differences"] + recomputed["reused"]
        raise DigestMismatchError(
            f"qhlab verify: {directory} is no replication of {recomputed['original']['directory']}: "
            f"{'; '.join(problems)}. HINT: a replication runs the original's frozen design on populations "
            "none of its records drew."
        )
    return {
        "comparisons": len(recomputed["comparisons"]),
        **{k: recomputed["agreement"][k] for k in ("statistic", "dof", "p_value")},
        "sign_flips": len(recomputed["sign_flips"]),
        "changed_conclusions": recomputed["changed_conclusions"],
    }


def _describe(directory: Path, summary: dict) -> str:
    changed = ", ".join(summary["changed_conclusions"]) or "none"
    return (
        f"replication: {directory}: recomputed from both studies ({summary['comparisons']} comparisons, sum of "
        f"z^2 {summary['statistic']:.2f} on {summary['dof']} dof, p {summary['p_value']:.3g}; "
        f"{summary['sign_flips']} sign flips; changed conclusions: {changed}); same design, fresh populations"
    )


register_check(ReplicationReceipt, file=REPLICATION_RECEIPT, check=check_replication, describe=_describe)
