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
import math
import os
from pathlib import Path
from typing import Any

from qhlab.design.study_records import StudyDevelopmentReceipt, StudyReportReceipt
from qhlab.evidence import DigestMismatchError, MissingEvidenceError, differing_keys, read_receipt, sha256_file
from qhlab.evidence.envelope import Closed, Json, Receipt, register_check
from qhlab.evidence.layout import (
    DEVELOPMENT_RECEIPT,
    FREEZE_RECEIPT,
    REPLICATION_JSON,
    REPLICATION_MARKDOWN,
    REPLICATION_RECEIPT,
    REPLICATION_STUDY_DIR,
    REPORT_DIR,
    REPORT_JSON,
    REPORT_RECEIPT,
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
        seed-pooled estimate changed sign. changed_conclusions: the variants whose decision
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


def _refuse(directory: Path, what: str, hint: str) -> DigestMismatchError:
    return DigestMismatchError(f"qhlab verify: {directory / REPLICATION_RECEIPT}: {what}. HINT: {hint}")


def _records(directory: Path, receipt: ReplicationReceipt) -> dict[str, dict[str, Any]]:
    """Each side's freeze and development bodies and report, read where they are, refused unless
    bound, and refused unless they are one study's: its development receipt and its report's
    receipt both bind its freeze receipt, and the report's receipt binds that ``report.json``."""
    sides: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        paths = {}
        for name in STUDY_FILES:
            bound = receipt.inputs.get(f"{side}/{name}")
            if bound is None:
                raise _refuse(directory, f"it binds no {side}/{name}", "a replication binds both studies' records.")
            # The replica is bound relative to the replication (it moves with it), the original absolutely.
            relative = not Path(bound.path).is_absolute()
            if relative != (side == "replica") or (relative and not bound.path.startswith(f"{REPLICATION_STUDY_DIR}/")):
                raise _refuse(
                    directory,
                    f"its {side}/{name} is bound at {bound.path!r}",
                    f"the replica's records lie below {REPLICATION_STUDY_DIR}/ beside the receipt, the original's "
                    "at an absolute path.",
                )
            path = directory / bound.path if relative else Path(bound.path)
            if not path.is_file():
                raise MissingEvidenceError(
                    f"qhlab verify: the {side} study's {name} record {path} is missing. HINT: a replication is "
                    "checked against both studies; verify it where its original study is."
                )
            digest = sha256_file(path)
            if digest != bound.sha256:
                raise _refuse(
                    directory,
                    f"the {side} study's {name} record {path} has sha256 {digest}, not the bound {bound.sha256}",
                    "the studies a replication compared are never edited.",
                )
            paths[name] = path
        freeze = sha256_file(paths["freeze"])
        development = read_receipt(paths["development"], StudyDevelopmentReceipt, verify_files=False)
        report_receipt = read_receipt(paths["report"].parent / REPORT_RECEIPT, StudyReportReceipt, verify_files=False)
        chained = (
            development.inputs.get("freeze"),
            report_receipt.inputs.get("freeze"),
        )
        report_json = report_receipt.outputs.get(REPORT_JSON)
        if (
            any(b is None or b.sha256 != freeze for b in chained)
            or report_json is None
            or (report_json.sha256 != sha256_file(paths["report"]))
        ):
            raise _refuse(
                directory,
                f"the {side} study's freeze, development and report records are not one study's",
                "a replication compares two whole studies, each as its own receipts chain it.",
            )
        sides[side] = {
            "freeze": json.loads(paths["freeze"].read_text(encoding="utf-8"))["body"],
            "development": development.body_record(),
            "report": json.loads(paths["report"].read_text(encoding="utf-8")),
        }
    return sides


def _same(a: Any, b: Any) -> bool:
    """Equal JSON values, floats within 1e-9 relative (the recomputation may run on other numpy or scipy)."""
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def check_replication(directory: str | os.PathLike) -> dict:
    """Recompute ``replication.json``, ``replication.md`` and the receipt's body from the two studies
    it binds; raise at the first disagreement.

    Returns:
        ``{"comparisons", "statistic", "dof", "p_value", "sign_flips", "changed_conclusions"}``.

    Raises:
        DigestMismatchError: a bound study record changed, the six records are not two whole
            studies, a recomputed value differs from the recorded one, the designs differ or the
            replica reused a population.
        MissingEvidenceError: a study record is not where the replication finds it.
    """
    # Lazy: the agreement test needs numpy and scipy, which `qhlab verify` does not load at start.
    from qhlab.replication.agreement import replication_document, replication_markdown

    directory = Path(directory)
    receipt = read_receipt(directory / REPLICATION_RECEIPT, ReplicationReceipt)
    sides = _records(directory, receipt)
    try:
        recomputed = json.loads(json.dumps(replication_document(sides["original"], sides["replica"])))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _refuse(
            directory, f"its studies' records do not make a replication ({exc!r})", "replicate again."
        ) from None
    recorded = json.loads((directory / REPLICATION_JSON).read_text(encoding="utf-8"))
    differing = [k for k in differing_keys(recomputed, recorded) if not _same(recomputed.get(k), recorded.get(k))]
    body = receipt.body.model_dump(mode="json")
    differing += [f"receipt body {k}" for k in body if not _same(body[k], recomputed.get(k))]
    if (directory / REPLICATION_MARKDOWN).read_text(encoding="utf-8") != replication_markdown(recorded):
        differing.append(REPLICATION_MARKDOWN)
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
        "percentile": (recomputed["agreement"].get("correlated") or {}).get("percentile"),
        "fresh": recomputed.get("fresh", ["TRAIN", "validation"]),
        "sign_flips": len(recomputed["sign_flips"]),
        "changed_conclusions": recomputed["changed_conclusions"],
    }


def _describe(directory: Path, summary: dict) -> str:
    changed = ", ".join(summary["changed_conclusions"]) or "none"
    return (
        f"replication: {directory}: recomputed from both studies ({summary['comparisons']} comparisons, "
        f"t-calibrated sum of z^2 {summary['statistic']:.2f} on {summary['dof']} dof, p {summary['p_value']:.3g}"
        + (
            ""
            if summary["percentile"] is None
            else f", at the {summary['percentile']:.0%} point under their correlation"
        )
        + f"; {summary['sign_flips']} sign flips; changed conclusions: {changed}); same design, fresh "
        + ", ".join(summary["fresh"])
    )


register_check(ReplicationReceipt, file=REPLICATION_RECEIPT, check=check_replication, describe=_describe)
