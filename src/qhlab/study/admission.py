"""Step 2, the E0 gate: select the canary row, run the two TRAIN canaries, admit broad fits or not.

Owns: ``decide_e0`` (``Study.admit_canaries``): publishing ``canaries/selection.json`` by the fixed rule, running the
canaries through ``cells.fit_cell``, and the E0 receipt (written whether the gate passed or
not, with the reason and a failure record per failing canary and horizon). Does not own: the
rules themselves (``canary``) or the canary fits (``cells``).
"""

from __future__ import annotations

from qhlab.design.canary import canary_failures, failure_text, select_canary_row
from qhlab.design.study_records import StudyCellReceipt, StudyE0Receipt
from qhlab.evidence import EvidenceError, PublishConflictError, publish_json, read_receipt, sha256_file, write_receipt
from qhlab.evidence.layout import (
    CANARY_DIR,
    CELL_RECEIPT,
    DOCUMENT_SCHEMA_VERSION,
    E0_RECEIPT,
    SELECTION_FILE,
    cell_name,
)
from qhlab.finite_horizon.benchmark import canonical_chains
from qhlab.study.authentication import FrozenStudy, read_canary_selection
from qhlab.study.cells import fit_cell

__all__ = ["decide_e0", "publish_selection"]


def decide_e0(frozen: FrozenStudy) -> dict:
    """``admit_canaries`` on an authenticated study (a canary not fitted yet fits in this process;
    ``qhlab study run`` may have fitted them on its pool first)."""
    directory = frozen.output / CANARY_DIR
    if (directory / E0_RECEIPT).exists():
        raise PublishConflictError(
            f"admit_canaries: {directory / E0_RECEIPT} already exists; the E0 gate is decided once."
        )
    config = frozen.config
    selection = publish_selection(frozen)
    canaries = []
    if selection["selected"] is not None:
        for seed in config.seeds:
            cell = cell_name(config.baseline_arm, seed, "e0")
            receipt_path = directory / cell / CELL_RECEIPT
            if not receipt_path.exists():
                fit_cell(frozen, variant=config.baseline_arm, seed=seed, canary_role="e0")
            canary = read_receipt(receipt_path, StudyCellReceipt).body.canary
            if canary is None:
                raise EvidenceError(
                    f"admit_canaries: {receipt_path} is an evaluated cell, not a canary. HINT: a "
                    "canary's directory holds its own fit; remove a foreign receipt by hand."
                )
            canaries.append({"cell": cell, "seed": seed, "receipt": receipt_path, "canary": canary})
    passed = bool(canaries) and all(c["canary"]["recovered"] for c in canaries)
    failures = canary_failures(canaries, selection["selected"]) if canaries else []
    if selection["selected"] is None:
        reason = (
            f"no TRAIN chain state's best label beats the runner-up by more than "
            f"{config.canary_gap_multiple} x tie_band at every horizon"
        )
    elif passed:
        reason = "every canary recovered the optimal action"
    else:
        # Name what each failing canary chose, so a failed gate can be diagnosed from the
        # receipt (and the CLI line) without reopening the fits.
        reason = f"a canary did not recover the optimal action within tie_band={config.tie_band}: " + "; ".join(
            failure_text(f) for f in failures
        )
    body = {
        "study": config.name,
        "passed": passed,
        "reason": reason,
        "failures": failures,
        "selection": selection,
        "canaries": [{k: v for k, v in c.items() if k != "receipt"} for c in canaries],
        "canary_updates": config.canary_updates,
    }
    inputs = {"freeze": frozen.receipt_path, "selection": directory / SELECTION_FILE}
    inputs.update({f"canary/{c['cell']}": c["receipt"] for c in canaries})
    write_receipt(directory / E0_RECEIPT, StudyE0Receipt, body=body, inputs=inputs)
    # Written here from this process's digests: the next step takes it without re-hashing.
    frozen.keep("_e0", directory / E0_RECEIPT, read_receipt(directory / E0_RECEIPT, StudyE0Receipt, verify_files=False))
    return body


def publish_selection(frozen: FrozenStudy) -> dict:
    """The canary row by the fixed rule, published once as ``canaries/selection.json``; the
    authenticated selection (``selected`` None when no row qualifies)."""
    config = frozen.config
    directory = frozen.output / CANARY_DIR
    selection_path = directory / SELECTION_FILE
    if not selection_path.exists():
        population = frozen.train_population()
        selected = select_canary_row(
            population, canonical_chains(population), config.tie_band, gap_multiple=config.canary_gap_multiple
        )
        directory.mkdir(exist_ok=True)
        publish_json(
            selection_path,
            {
                "schema_version": DOCUMENT_SCHEMA_VERSION,
                "rule": "first TRAIN chain state in canonical order (chains by scene_id, chain_id; states by "
                "step) whose best label beats the runner-up by more than canary_gap_multiple x "
                "tie_band at every horizon",
                "tie_band": config.tie_band,
                "canary_gap_multiple": config.canary_gap_multiple,
                "canonical_first_chain": frozen.body.train["canonical_first_chain"],
                "freeze_receipt_sha256": sha256_file(frozen.receipt_path),
                "selected": selected,
            },
        )
    return read_canary_selection(frozen)
