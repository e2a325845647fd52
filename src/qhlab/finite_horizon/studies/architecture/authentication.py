"""The receipt chain of a study: each step re-reads and authenticates what came before it.

Owns: ``FrozenStudy`` (the authenticated freeze record plus its config) and the checks every
later step makes before it writes: the config bytes and the source package are the frozen
ones (``authenticate_freeze``), the E0 and development receipts exist, authenticate and bind
the receipts before them, the canary selection is the freeze's, and cells' final receipts are
complete. Refusals name the missing or mismatching file. Does not own: reading a receipt's
bytes and digests (``qhlab.evidence.read_receipt``), the layout (``layout``) or what a step
does once admitted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from qhlab.evidence import (
    EvidenceError,
    OrderError,
    canonical_json,
    input_error,
    read_receipt,
    sha256_bytes,
    sha256_file,
    source_package_digest,
)
from qhlab.finite_horizon.studies.architecture.config import QhArchitectureStudyConfig, read_study_config
from qhlab.finite_horizon.studies.architecture.layout import (
    CANARY_DIR,
    DEVELOPMENT_RECEIPT,
    E0_RECEIPT,
    FREEZE_RECEIPT,
    SCHEMA_VERSION,
    SELECTION_FILE,
    STUDY_CALL,
    cell_name,
    cell_receipt_path,
)

if TYPE_CHECKING:
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = [
    "FrozenStudy",
    "authenticate_cells",
    "authenticate_development",
    "authenticate_e0",
    "authenticate_freeze",
    "check_bound",
    "read_canary_selection",
    "read_cell_receipts",
    "require_step",
]


def require_step(path: Path, what: str, step: str, hint: str) -> None:
    """Refuse (``OrderError``) when the file an earlier step publishes is missing."""
    if not path.is_file():
        raise OrderError(
            f"{step}: {what} is missing ({path} does not exist); the study steps run in order "
            f"freeze -> admit-canaries -> prepare-development -> run-fit -> report. HINT: {hint}"
        )


class FrozenStudy:
    """The authenticated freeze record plus the config it was made from.

    Attributes:
        config: the study config (its bytes are the frozen ones).
        receipt: the whole freeze receipt; ``body`` its body.
        output: the study directory.
        config_path: the resolved config file.
        receipt_path: ``output / FREEZE_RECEIPT``.
        train_path: the frozen TRAIN population directory.
    """

    def __init__(self, config: QhArchitectureStudyConfig, receipt: dict, output: Path, config_path: Path) -> None:
        self.config = config
        self.receipt = receipt
        self.body = receipt["body"]
        self.output = output
        self.config_path = config_path
        self.receipt_path = output / FREEZE_RECEIPT
        self.train_path = Path(self.body["train"]["path"])

    @property
    def horizon(self) -> int:
        """H of the frozen TRAIN population."""
        return int(self.body["train"]["support"]["H"])

    def recipe(self, arm: str, seed: int, updates: int) -> QhRecipe:
        """The recipe of one cell, refused unless its digest is the one the freeze binds."""
        recipe = self.config.cell_recipe(arm, seed, updates)
        from qhlab.finite_horizon.recipe import recipe_digest

        frozen = self.body["recipes"][arm][str(seed)][str(updates)]
        if recipe_digest(recipe) != frozen:
            raise EvidenceError(
                f"{STUDY_CALL}: the recipe of cell {arm}-s{seed} has digest {recipe_digest(recipe)}; the "
                f"freeze receipt {self.receipt_path} binds {frozen}. HINT: the study is frozen."
            )
        return recipe


def authenticate_freeze(config_path: str | os.PathLike, output: str | os.PathLike, step: str) -> FrozenStudy:
    """Re-read the config and authenticate the freeze receipt, TRAIN bytes and source code.

    Args:
        config_path: the study TOML; its bytes must be the frozen ones.
        output: the study directory.
        step: the call named in refusals.
    """
    config, data, resolved = read_study_config(config_path)
    output = Path(output)
    require_step(output / FREEZE_RECEIPT, "the freeze receipt", step,
                 f"run `qhlab study freeze {config_path} --output {output}` first")
    receipt = read_receipt(output / FREEZE_RECEIPT, kind="study_freeze", schema_version=SCHEMA_VERSION)
    body = receipt["body"]
    if body["config"]["sha256"] != sha256_bytes(data):
        raise EvidenceError(
            f"{step}: config {str(resolved)!r} has sha256 {sha256_bytes(data)}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body['config']['sha256']}. HINT: a frozen study's config "
            "cannot change; freeze a new study into a new output directory."
        )
    source = source_package_digest()
    if source["sha256"] != body["source_package"]["sha256"]:
        raise EvidenceError(
            f"{step}: the qhlab source package has sha256 {source['sha256']}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body['source_package']['sha256']}. HINT: the package "
            "code changed after freeze; a study runs on the code it was frozen with."
        )
    return FrozenStudy(config, receipt, output, resolved)


def check_bound(receipt: dict, name: str, expected: Path, where: Path) -> None:
    """Refuse unless ``receipt`` (read from ``where``) binds the current bytes of ``expected`` as ``name``."""
    entry = receipt["inputs"].get(name)
    if entry is None or entry["sha256"] != sha256_file(expected):
        raise EvidenceError(
            f"{STUDY_CALL}: {where} does not bind the current {name} receipt {expected}. HINT: receipts "
            "of one study chain each other; a replaced receipt breaks the chain."
        )


def authenticate_e0(frozen: FrozenStudy, step: str) -> dict:
    """The E0 gate receipt (passed or not), chained to the freeze."""
    path = frozen.output / CANARY_DIR / E0_RECEIPT
    require_step(path, "the E0 gate receipt", step,
                 f"run `qhlab study admit-canaries {frozen.config_path} --output {frozen.output}`")
    receipt = read_receipt(path, kind="study_e0", schema_version=SCHEMA_VERSION)
    check_bound(receipt, "freeze", frozen.receipt_path, path)
    return receipt


def authenticate_development(frozen: FrozenStudy, step: str) -> dict:
    """The development receipt, chained to the freeze and to an E0 gate that passed."""
    path = frozen.output / DEVELOPMENT_RECEIPT
    require_step(path, "the development receipt (validation not sealed)", step,
                 f"run `qhlab study prepare-development {frozen.config_path} --output {frozen.output}`")
    receipt = read_receipt(path, kind="study_development", schema_version=SCHEMA_VERSION)
    check_bound(receipt, "freeze", frozen.receipt_path, path)
    e0 = authenticate_e0(frozen, step)
    check_bound(receipt, "e0", frozen.output / CANARY_DIR / E0_RECEIPT, path)
    if not e0["body"]["passed"]:
        raise EvidenceError(f"{step}: {path} binds an E0 gate that did not pass.")
    return receipt


def read_canary_selection(frozen: FrozenStudy) -> dict:
    """``canaries/selection.json``, refused unless canonical and made for this freeze receipt."""
    path = frozen.output / CANARY_DIR / SELECTION_FILE
    raw = path.read_bytes()
    selection = json.loads(raw)
    if canonical_json(selection) != raw or selection.get("freeze_receipt_sha256") != sha256_file(frozen.receipt_path):
        raise EvidenceError(f"{STUDY_CALL}: {path} was edited or belongs to another freeze receipt.")
    return selection


def authenticate_cells(frozen: FrozenStudy, step: str) -> dict[tuple[str, int], dict]:
    """The final receipt of every declared broad cell, each chained to this freeze and development.

    Returns:
        {(arm, seed): {"path": Path, "document": receipt}}.

    Raises:
        OrderError: naming every cell without a final receipt.
    """
    missing, cells = [], {}
    for arm, seed in frozen.config.cells:
        path = cell_receipt_path(frozen.output, arm, seed)
        if not path.is_file():
            missing.append(cell_name(arm, seed))
            continue
        document = read_receipt(path, kind="study_cell", schema_version=SCHEMA_VERSION)
        check_bound(document, "freeze", frozen.receipt_path, path)
        check_bound(document, "development", frozen.output / DEVELOPMENT_RECEIPT, path)
        cells[(arm, seed)] = {"path": path, "document": document}
    if missing:
        raise OrderError(
            f"{step}: {len(missing)} of {len(frozen.config.cells)} charged cells have no final receipt: "
            f"{', '.join(missing)}. HINT: run `qhlab study run-fit CONFIG --output DIR --variant ARM "
            "--seed S` for each (or `qhlab study run`); the report compares all cells."
        )
    return cells


def read_cell_receipts(frozen: FrozenStudy, wanted: Iterable[tuple[str, int]], step: str) -> dict[tuple[str, int], dict]:
    """The final receipts of some declared broad cells: {(arm, seed): {"path", "document"}}.

    Raises:
        QhInputError: a cell is not declared.
        OrderError: a cell has no final receipt.
    """
    cells = {}
    for arm, seed in wanted:
        if (arm, seed) not in frozen.config.cells:
            raise input_error(step, "cell", f"{arm}-s{seed}", "a declared cell", "see the freeze receipt's cells")
        path = cell_receipt_path(frozen.output, arm, seed)
        require_step(path, f"the final receipt of cell {arm}-s{seed}", step,
                     f"run `qhlab study run-fit ... --variant {arm} --seed {seed}` first")
        document = read_receipt(path, kind="study_cell", schema_version=SCHEMA_VERSION)
        cells[(arm, seed)] = {"path": path, "document": document}
    return cells
