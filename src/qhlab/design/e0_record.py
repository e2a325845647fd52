"""The E0 check record: ``e0.json`` and the receipt that binds it, and its checks.

Owns: the check directory's file names, the record's layout (the config, the gate design it
checked, and per TRAIN draw its selected canary row with the row's labels, every canary's
predictions and recovery, and the gate's outcome), reading a record back (``read_record``:
authenticated) and ``check_record``, which recomputes every row selection, every canary's
recovery, every outcome and the pass share from the recorded labels and predictions with the
gate's own rules, and, where a draw's sub-study is present, compares it with its authenticated
E0 receipt and freeze. Torch-free, so ``qhlab verify`` runs it. Does not own: running the
draws (``run``) or the gate's rules (``qhlab.design.canary``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from qhlab.design.preparation_record import (
    Number,
    StudyReference,
    ToolBody,
    ToolRecordFiles,
    absent_note,
    opened_record,
)
from qhlab.design.study_records import StudyE0Receipt, StudyFreezeReceipt
from qhlab.evidence import DigestMismatchError, authentication_roots, read_receipt, recorded_origin, sha256_file
from qhlab.evidence.envelope import SHA256, Closed, Json, Receipt, register_check
from qhlab.evidence.layout import (
    CANARY_DIR,
    E0_CHECK_RECEIPT,
    E0_CHECK_RECORD,
    E0_CHECK_STUDIES_DIR,
    E0_RECEIPT,
    FREEZE_RECEIPT,
    RECORD_CONFIG_COPY,
)

__all__ = [
    "CONFIG_COPY",
    "RECEIPT",
    "RECORD",
    "STUDIES_DIR",
    "E0CheckReceipt",
    "E0CheckRecord",
    "check_record",
    "draw_outcome",
    "publish_record",
    "read_record",
]

RECORD = E0_CHECK_RECORD
RECEIPT = E0_CHECK_RECEIPT
CONFIG_COPY = RECORD_CONFIG_COPY
STUDIES_DIR = E0_CHECK_STUDIES_DIR


class E0CheckBody(ToolBody):
    """An E0 check's outcome (its draws' rows and canaries live in ``e0.json``, which it binds).

    Attributes:
        name: the check. config_sha256: its config and the gate design. draws: how many TRAIN
        draws. passed: how many passed. meets_min_pass_share: whether the share reached the config's.
    """

    draws: int
    passed: int
    meets_min_pass_share: bool


class E0CheckReceipt(Receipt, kind="e0_check", version=1):
    """``e0.receipt.json`` of ``qhlab e0-check``."""

    body: E0CheckBody


class CanaryHorizon(Closed):
    """One canary's recovery at one horizon: its predictions [K], the candidates it chose, and
    whether they are the row's optimum within the tie band."""

    horizon: int
    predicted: list[Number]
    chosen: list[int]
    recovered: bool


class DrawCanary(Closed):
    """One canary of a draw's gate: its seed, its recovery per horizon and overall."""

    seed: int
    per_horizon: list[CanaryHorizon]
    recovered: bool


class CanaryRow(Closed):
    """The canary row a draw's gate selected: its identity, labels [K][H], mask [K], gaps [H]
    and best candidate per horizon [H]."""

    row: int
    state_id: int
    scene_id: int
    chain_id: int
    step: int
    labels: list[list[Number]]
    candidate_mask: list[bool]
    gaps: list[Number]
    best_action: list[int]


class DrawOutcome(Closed):
    """One fresh TRAIN draw's gate: its seed and population, its sub-study and E0 receipt, the row,
    the canaries and the outcome."""

    train_seed: int
    manifest_sha256: str = Field(pattern=SHA256)
    directory: str
    e0_receipt_sha256: str = Field(pattern=SHA256)
    passed: bool
    reason: str
    selected: CanaryRow | None
    canaries: list[DrawCanary]


class E0Design(Closed):
    """What a gate's outcome depends on: lane, TRAIN preset, canary seeds, budget, row margin, tie
    band and the baseline's canary recipe."""

    profile: str
    train_preset: str
    seeds: list[int]
    canary_updates: int
    canary_gap_multiple: Number
    tie_band: Number
    recipe: Json


class E0CheckRecord(Closed):
    """``e0.json``: an E0 check's config, the gate design, every draw's outcome and the pass share.

    Attributes:
        kind: always ``e0_record``. name, config, config_sha256: the check and its config. study:
        the study whose gate it checks. design: the gate design. train_generator_sha256: the
        generator identity every draw's TRAIN shares (``qhlab.scenes.manifest.generator_identity``;
        a study binds the check only when its TRAIN has it too). outcomes: one per TRAIN draw, in
        the config's order. draws, passed, pass_share: the count. min_pass_share,
        meets_min_pass_share: the config's minimum and whether the share reached it.
    """

    kind: Literal["e0_record"]
    name: str
    config: Json
    config_sha256: str = Field(pattern=SHA256)
    study: StudyReference
    design: E0Design
    train_generator_sha256: str | None = Field(default=None, pattern=SHA256)
    outcomes: list[DrawOutcome]
    draws: int
    passed: int
    pass_share: Number
    min_pass_share: Number
    meets_min_pass_share: bool


def draw_outcome(seed: int, e0: dict, manifest_sha256: str, study: Path, root: Path) -> dict:
    """What the record keeps of one draw's gate.

    Args:
        seed: the draw's TRAIN seed.
        e0: the sub-study's E0 receipt body.
        manifest_sha256: its TRAIN population's manifest digest (from its freeze).
        study: the sub-study directory.
        root: the check directory (the record names the sub-study relative to it).

    Returns:
        ``{"train_seed", "manifest_sha256", "directory", "e0_receipt_sha256", "passed", "reason",
        "selected", "canaries"}``; ``selected`` is the canary row's record (its labels [K][H],
        ``candidate_mask`` [K], ``gaps`` [H], ``best_action`` [H] and identities) or None, and
        each canary is ``{"seed", "per_horizon", "recovered"}``.
    """
    return {
        "train_seed": seed,
        "manifest_sha256": manifest_sha256,
        "directory": study.relative_to(root).as_posix(),
        "e0_receipt_sha256": sha256_file(study / CANARY_DIR / E0_RECEIPT),
        "passed": e0["passed"],
        "reason": e0["reason"],
        "selected": e0["selection"]["selected"],
        "canaries": [
            {"seed": c["seed"], "per_horizon": c["canary"]["per_horizon"], "recovered": c["canary"]["recovered"]}
            for c in e0["canaries"]
        ],
    }


def _outcome(record: dict) -> dict:
    """What an E0 receipt's body says of its record: the outcome."""
    return {k: record.get(k) for k in ("draws", "passed", "meets_min_pass_share")}


_FILES = ToolRecordFiles(RECORD, RECEIPT, E0CheckReceipt, E0CheckRecord, _outcome)

# This record's ``publish_record(directory, record)`` and ``read_record(directory)``.
publish_record = _FILES.publish
read_record = _FILES.read_record


def _selection(labels: list, mask: list, tie_band: float, multiple: float) -> tuple[list[float], list[int], bool]:
    """A row's gaps [H] and best candidates [H] from its labels [K][H] and mask [K], and whether
    the selection rule admits it (``qhlab.design.canary.select_canary_row``'s test)."""
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    import numpy as np

    # float32, as the population holds the labels and the selection rule subtracts them: a gap
    # recomputed in float64 differs from the recorded one in its last bits.
    q = np.asarray(labels, dtype=np.float32)
    valid = np.flatnonzero(np.asarray(mask, dtype=bool))
    ordered = np.sort(q[valid], axis=0)[::-1]
    gaps = ordered[0] - ordered[1]
    best = [int(valid[int(np.argmax(q[valid, h]))]) for h in range(q.shape[1])]
    return [float(g) for g in gaps], best, len(valid) >= 2 and bool((gaps > multiple * tie_band).all())


def _check_outcome(where: str, outcome: dict, design: dict) -> None:
    """Recompute one draw's row selection, canary recoveries and outcome with the gate's rules."""
    import numpy as np

    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    from qhlab.design.canary import canary_recovery

    seed, selected = outcome["train_seed"], outcome["selected"]
    if selected is None:
        if outcome["passed"] or outcome["canaries"]:
            raise DigestMismatchError(f"{where}: TRAIN {seed} selected no canary row, yet records canaries or a pass.")
        return
    gaps, best, admitted = _selection(
        selected["labels"], selected["candidate_mask"], design["tie_band"], design["canary_gap_multiple"]
    )
    if (
        not admitted
        or best != selected["best_action"]
        or not all(
            math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for a, b in zip(gaps, selected["gaps"], strict=True)
        )
    ):
        raise DigestMismatchError(
            f"{where}: TRAIN {seed}'s canary row is not one the selection rule admits with its "
            f"recorded gaps and best actions (recomputed gaps {gaps}, best {best})."
        )
    if sorted(c["seed"] for c in outcome["canaries"]) != sorted(design["seeds"]):
        raise DigestMismatchError(
            f"{where}: TRAIN {seed} records canaries of seeds "
            f"{[c['seed'] for c in outcome['canaries']]}, not the design's {design['seeds']}."
        )
    labels = np.asarray(selected["labels"], dtype=np.float64)
    mask = np.asarray(selected["candidate_mask"], dtype=bool)
    for canary in outcome["canaries"]:
        pred = np.asarray([h["predicted"] for h in canary["per_horizon"]], dtype=np.float64).T  # [K, H]
        recomputed = canary_recovery(pred, labels, mask, design["tie_band"])
        if recomputed != canary["per_horizon"] or canary["recovered"] != all(h["recovered"] for h in recomputed):
            raise DigestMismatchError(
                f"{where}: TRAIN {seed} canary seed {canary['seed']}'s recovery is not what its "
                "predictions and the row's labels give."
            )
    if outcome["passed"] != all(c["recovered"] for c in outcome["canaries"]):
        raise DigestMismatchError(f"{where}: TRAIN {seed}'s outcome is not what its canaries give.")


def check_record(directory: str | os.PathLike) -> dict:
    """Recompute an E0 check record from its evidence; raise at the first disagreement.

    Checks: the receipt and the files it binds; the config (validated again) and the record's
    digest of it and of the gate design; that the draws are exactly the config's TRAIN seeds, in
    order; every draw's row (the selection rule's gaps and best actions from its labels), every
    canary's recovery (from its predictions and the row's labels) and every outcome; the pass
    count, share and whether it meets the config's minimum; and, for each draw whose sub-study is
    present below the check directory, its E0 receipt (authenticated, and the recorded one), that
    the record holds that receipt's row and canaries, and that its freeze bound the draw's TRAIN
    seed and the gate design.

    Returns:
        ``{"draws", "passed", "studies_checked", "studies_absent"}``.

    Raises:
        DigestMismatchError: a draw's row, a canary's recovery, an outcome or the pass count, as
            recomputed, differs from the record's, or a sub-study's E0 receipt is not the one recorded.
    """
    # Lazy: keeps importing this module (and so `qhlab verify`) free of torch.
    from qhlab.design.e0_config import QhE0CheckConfig, e0_digest

    directory = Path(directory)
    record, receipt, where, config = opened_record(
        directory, read_record, (E0CheckReceipt, RECEIPT), RECORD, QhE0CheckConfig, e0_digest
    )
    design = record["design"]
    outcomes = record["outcomes"]
    if [o["train_seed"] for o in outcomes] != list(config.train_seeds):
        raise DigestMismatchError(
            f"{where}: records draws {[o['train_seed'] for o in outcomes]}, not its config's "
            f"{list(config.train_seeds)}."
        )
    try:
        for outcome in outcomes:
            _check_outcome(where, outcome, design)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DigestMismatchError(f"{where}: a draw's values do not make a gate outcome ({exc!r}).") from None
    passed = sum(bool(o["passed"]) for o in outcomes)
    share = passed / len(outcomes)
    if (
        record["draws"],
        record["passed"],
        record["pass_share"],
        record["min_pass_share"],
        record["meets_min_pass_share"],
    ) != (len(outcomes), passed, share, config.min_pass_share, share >= config.min_pass_share):
        raise DigestMismatchError(
            f"{where}: records {record['passed']} of {record['draws']} draws passed, not the "
            f"{passed} of {len(outcomes)} its outcomes give, or another share or minimum."
        )
    present = absent = 0
    for outcome in outcomes:
        study = directory / outcome["directory"]
        if not study.is_dir():
            absent += 1
            continue
        _check_study(where, study, outcome, design)
        present += 1
    return {"draws": len(outcomes), "passed": passed, "studies_checked": present, "studies_absent": absent}


def _check_study(where: str, study: Path, outcome: dict, design: dict) -> None:
    """One present sub-study against the record: its E0 receipt, row, canaries, TRAIN and gate design."""
    # Lazy: keeps importing this module (and so `qhlab verify`) free of numpy.
    from qhlab.design.e0_config import e0_design
    from qhlab.design.study_config import QhArchitectureStudyConfig

    seed = outcome["train_seed"]
    path = study / CANARY_DIR / E0_RECEIPT
    if not path.is_file() or sha256_file(path) != outcome["e0_receipt_sha256"]:
        raise DigestMismatchError(f"{where}: TRAIN {seed}'s {path} is absent or not the one recorded.")
    # A moved check moves its sub-studies: their receipts name their own files where they were made.
    with authentication_roots(study, original=recorded_origin(study)):
        e0 = read_receipt(path, StudyE0Receipt).body
        frozen = read_receipt(study / FREEZE_RECEIPT, StudyFreezeReceipt).body
    if (
        e0.selection["selected"] != outcome["selected"]
        or e0.passed != outcome["passed"]
        or [
            {"seed": c["seed"], "per_horizon": c["canary"]["per_horizon"], "recovered": c["canary"]["recovered"]}
            for c in e0.canaries
        ]
        != outcome["canaries"]
    ):
        raise DigestMismatchError(f"{where}: TRAIN {seed}'s row, canaries or outcome are not its E0 receipt's.")
    declared = frozen.train["declared"]
    if (declared.get("preset"), declared.get("seed"), frozen.train["manifest_sha256"]) != (
        design["train_preset"],
        seed,
        outcome["manifest_sha256"],
    ):
        raise DigestMismatchError(f"{where}: TRAIN {seed}'s sub-study froze TRAIN {declared}, not the recorded draw.")
    if e0_design(QhArchitectureStudyConfig.model_validate(frozen.config["resolved"])) != design:
        raise DigestMismatchError(f"{where}: TRAIN {seed}'s sub-study froze another gate design than the record's.")


def _describe(directory: Path, entry: dict) -> str:
    """``qhlab verify``'s line for a recomputed E0 check record."""
    absent = absent_note(entry["studies_absent"], "sub-studies")
    return (
        f"e0 check: {directory}: every row selection, canary recovery and outcome recomputed by the gate's rules "
        f"({entry['passed']} of {entry['draws']} draws passed); {entry['studies_checked']} sub-studies' E0 "
        f"receipts and freezes compared{absent}"
    )


register_check(E0CheckReceipt, file=RECEIPT, check=check_record, describe=_describe)
