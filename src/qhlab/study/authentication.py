"""The receipt chain of a study: each step authenticates what came before it, once per process.

Owns: ``FrozenStudy`` (the authenticated freeze record plus its config) and the checks every
later step makes before it writes: the config bytes and the source package are the frozen
ones and the packages run at their frozen versions (``authenticate_freeze``,
``runtime_versions``), the E0 and development receipts exist, authenticate and bind the
receipts before them, the canary selection is the freeze's, a fit attempt is the fit of its
frozen cell (``authenticate_attempt``), and cells' final receipts are complete. Refusals name
the missing or mismatching file or field. Does not own: reading a receipt's
bytes and digests (``qhlab.evidence.read_receipt``), the layout (``layout``) or what a step
does once admitted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from qhlab.design.study_config import EXECUTION_FIELDS, QhArchitectureStudyConfig, read_study_config
from qhlab.design.study_records import (
    StudyBenchmarkReceipt,
    StudyCellReceipt,
    StudyDevelopmentReceipt,
    StudyE0Receipt,
    StudyFreezeReceipt,
)
from qhlab.evidence import (
    EvidenceError,
    OrderError,
    canonical_json,
    input_error,
    locate_population,
    read_receipt,
    sha256_bytes,
    sha256_file,
    source_package_digest,
)
from qhlab.evidence.envelope import Receipt
from qhlab.evidence.layout import (
    CANARY_DIR,
    DEVELOPMENT_RECEIPT,
    E0_RECEIPT,
    FIT_RECEIPT,
    FREEZE_RECEIPT,
    SELECTION_FILE,
    STUDY_CALL,
    STUDY_CONFIG_COPY,
    benchmark_receipt_path,
    cell_name,
    cell_receipt_path,
)
from qhlab.evidence.source import runtime_versions
from qhlab.finite_horizon.recipe import recipe_digest
from qhlab.study.family import provide_family
from qhlab.training.profiles import execution_profile
from qhlab.training.records import FitReceipt, train_rows_record

R = TypeVar("R", bound=Receipt)

if TYPE_CHECKING:
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = [
    "FrozenStudy",
    "authenticate_attempt",
    "authenticate_cells",
    "authenticate_development",
    "authenticate_e0",
    "authenticate_freeze",
    "check_bound",
    "frozen_config_path",
    "read_benchmarks",
    "read_canary_selection",
    "read_cell_receipts",
    "refuse_linked_study",
    "require_step",
]

# How deep below a study directory its steps write directories of their own (``cells/<cell>/
# <attempt>``); a link at or above that depth would put a step's evidence outside the study.
_STEP_DEPTH = 3


def refuse_linked_study(output: str | os.PathLike, step: str) -> None:
    """Refuse a study directory that is, or holds where its steps write, a symbolic link.

    ``ln -s /tmp/out S/cells`` would put every cell outside the directory that is verified and
    signed. Only the levels the steps create are looked at (``_STEP_DEPTH``), not the whole tree,
    so a fit still writing its W&B files below its attempt is never in the way.

    Raises:
        QhInputError: the first link, named with its target.
    """
    output = Path(output)
    level = [output]
    for depth in range(_STEP_DEPTH + 1):
        following = []
        for path in level:
            if path.is_symlink():
                raise input_error(
                    step,
                    "output",
                    str(output),
                    "a study directory without symbolic links where its steps write",
                    f"{path} links to {os.readlink(path)!r}; a step never writes "
                    "through a link, since its target is outside the study that is verified and "
                    "signed. Remove the link and move the study whole.",
                )
            if depth < _STEP_DEPTH and path.is_dir():
                following.extend(sorted(path.iterdir()))
        level = following


def require_step(path: Path, what: str, step: str, hint: str) -> None:
    """Refuse (``OrderError``) when the file an earlier step publishes is missing."""
    if not path.is_file():
        raise OrderError(
            f"{step}: {what} is missing ({path} does not exist); the study steps run in order "
            f"freeze -> admit-canaries -> prepare-development -> run-fit -> report. HINT: {hint}"
        )


class FrozenStudy:
    """The authenticated freeze record plus the config it was made from.

    One object per study and process: later steps take it from the step before, and the E0
    and development receipts and the TRAIN and validation populations, once authenticated
    against it, are kept on it, so each is read and its bound files re-hashed once per process
    (``authenticate_e0``, ``authenticate_development``, ``train_population``). Each later use of
    a kept receipt re-hashes that small file (``unchanged``): one replaced mid-run is refused,
    so a later receipt never binds bytes other than those this process checked.

    Attributes:
        config: the study config (its bytes are the frozen ones).
        receipt: the whole freeze receipt; ``body`` its body.
        output: the study directory.
        config_path: the resolved config file.
        receipt_path: ``output / FREEZE_RECEIPT``.
        train_path: the frozen TRAIN population directory.
        sources: ``{arm: source sha256}`` of the user arms, whose frozen copies this object
            made importable in this process (``family.provide_family``).
    """

    def __init__(
        self, config: QhArchitectureStudyConfig, receipt: StudyFreezeReceipt, output: Path, config_path: Path
    ) -> None:
        self.config = config
        self.receipt = receipt
        self.body = receipt.body
        self.output = output
        self.config_path = config_path
        self.receipt_path = output / FREEZE_RECEIPT
        # The digests of the receipts authenticated (or written) once in this process: each later
        # use re-hashes the small receipt file and refuses a change (``unchanged``).
        self._digests: dict[Path, str] = {self.receipt_path: sha256_file(self.receipt_path)}
        # Where TRAIN's bytes are now (a moved study's populations are found by digest).
        self.train_path = locate_population(self.body.train["path"], self.body.train["manifest_sha256"])
        # User arms are imported from the study's own frozen copies, never from the user's files.

        self.sources = provide_family(self.body, output)
        self._e0: StudyE0Receipt | None = None
        self._development: StudyDevelopmentReceipt | None = None
        self._train_population = None
        self._validation_population = None

    def train_population(self):
        """The frozen TRAIN ``Population`` (authenticated, Bellman-checked), loaded once per process."""
        if self._train_population is None:
            # Lazy: keeps importing this module free of torch and pyarrow.
            from qhlab.finite_horizon.data import load_population

            self._train_population = load_population(self.train_path, split="train", horizon=self.horizon)
        return self._train_population

    def keep_population(self, population) -> None:
        """Keep a Population this process just loaded (and authenticated) for the later steps,
        when it was read from the directory the receipts bind (else it is loaded again there)."""
        if population.split == "train" and population.path == self.train_path:
            self._train_population = population
        elif population.split == "validation" and self._development is not None:
            sealed = self._development.body.validation
            if population.path == locate_population(sealed["path"], sealed["manifest_sha256"]):
                self._validation_population = population

    def validation_population(self, step: str):
        """The sealed validation ``Population`` (after ``authenticate_development``), loaded once per process."""
        if self._validation_population is None:
            # Lazy: keeps importing this module free of torch and pyarrow.
            from qhlab.finite_horizon.data import load_population

            sealed = authenticate_development(self, step).body.validation
            path = locate_population(sealed["path"], sealed["manifest_sha256"])
            self._validation_population = load_population(path, split="validation", horizon=self.horizon)
        return self._validation_population

    @property
    def identity(self) -> dict[str, str]:
        """What a fit of this study records as its ``study`` (``FitRequest.study``)."""
        return {
            "name": self.config.name,
            "study_id": self.body.study_id,
            "freeze_receipt_sha256": self.unchanged(self.receipt_path),
        }

    def unchanged(self, path: Path) -> str:
        """The sha256 of a receipt this object authenticated, refused if the file changed since."""
        current = sha256_file(path) if path.is_file() else None
        if current != self._digests[path]:
            raise EvidenceError(
                f"{STUDY_CALL}: {path} changed after it was authenticated in this process (sha256 "
                f"{self._digests[path]}, now {current}). HINT: a study's receipts are write-once; "
                "restore it or run the study again from a copy."
            )
        return current

    def keep(self, attribute: str, path: Path, receipt: R) -> R:
        """Keep an authenticated (or just written) receipt on this object; returns it."""
        self._digests[path] = sha256_file(path)
        setattr(self, attribute, receipt)
        return receipt

    @property
    def horizon(self) -> int:
        """H of the frozen TRAIN population."""
        return int(self.body.train["support"]["H"])

    def recipe(self, arm: str, seed: int, updates: int) -> QhRecipe:
        """The recipe of one cell, refused unless its digest is the one the freeze binds."""
        recipe = self.config.cell_recipe(arm, seed, updates, sources=self.sources)
        frozen = self.body.recipes[arm][str(seed)][str(updates)]
        if recipe_digest(recipe) != frozen:
            raise EvidenceError(
                f"{STUDY_CALL}: the recipe of cell {arm}-s{seed} has digest {recipe_digest(recipe)}; the "
                f"freeze receipt {self.receipt_path} binds {frozen}. HINT: the study is frozen."
            )
        return recipe


def frozen_config_path(output: str | os.PathLike) -> Path:
    """The config a study at ``output`` was frozen from: that file while its bytes are the frozen
    ones (its relative paths resolve where they did), else the study's own copy. Either is
    authenticated by ``authenticate_freeze``; an unreadable freeze receipt gives the copy, which that
    authentication then refuses by name."""
    output = Path(output)
    try:
        recorded = json.loads((output / FREEZE_RECEIPT).read_text(encoding="utf-8"))["body"]["config"]
        source = Path(recorded["source_path"])
        if source.is_file() and sha256_file(source) == recorded["sha256"]:
            return source
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return output / STUDY_CONFIG_COPY


def authenticate_freeze(
    config_path: str | os.PathLike,
    output: str | os.PathLike,
    step: str,
    *,
    runs: bool = True,
    same_source: bool = True,
) -> FrozenStudy:
    """Re-read the config and authenticate the freeze receipt, TRAIN bytes and source code.

    Args:
        config_path: the study TOML; every field but ``EXECUTION_FIELDS`` must be the frozen one.
        output: the study directory.
        step: the call named in refusals.
        runs: the step runs study code (fits, benchmarks, reports), so this process must have the
            frozen package versions. False for a step that only reads finished studies (a lane
            comparison of a study made on another machine, a recomputed report), which reports the
            versions instead.
        same_source: this process must run the frozen qhlab source package. False only where the
            caller judges the source itself (a recomputed report is accepted from other source
            only when this source gives the same bytes).
    """
    output = Path(output)
    missing = (
        output / FREEZE_RECEIPT,
        "the freeze receipt",
        step,
        f"run `qhlab study freeze {config_path} --output {output}` first",
    )
    if Path(config_path) == output / STUDY_CONFIG_COPY:
        # A study named by its directory alone: a directory that is no study is refused as that,
        # not as its missing config copy.
        require_step(*missing)
    config, data, resolved = read_study_config(config_path)
    require_step(*missing)
    refuse_linked_study(output, step)
    receipt = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt)
    body = receipt.body
    if "decision_sha256" not in body.config:
        raise EvidenceError(
            f"{step}: the freeze receipt {output / FREEZE_RECEIPT} has no config.decision_sha256; it was made by an "
            "older qhlab. HINT: a study runs on the code it was frozen with; freeze a new study."
        )
    decision = sha256_bytes(canonical_json(config.decision_record()))
    if body.config["decision_sha256"] != decision:
        frozen_record = {k: v for k, v in (body.config.get("resolved") or {}).items() if k not in EXECUTION_FIELDS}
        changed = sorted(
            k
            for k in set(frozen_record) | set(config.decision_record())
            if frozen_record.get(k) != config.decision_record().get(k)
        )
        raise EvidenceError(
            f"{step}: config {str(resolved)!r} has decision digest {decision}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body.config.get('decision_sha256')} (changed: "
            f"{', '.join(changed) or 'unknown'}). HINT: a frozen study's config cannot change, except its "
            f"execution fields ({', '.join(EXECUTION_FIELDS)}); freeze a new study into a new output directory."
        )
    source = source_package_digest()
    if same_source and source["sha256"] != body.source_package["sha256"]:
        raise EvidenceError(
            f"{step}: the qhlab source package has sha256 {source['sha256']}; the freeze receipt "
            f"{output / FREEZE_RECEIPT} binds {body.source_package['sha256']}. HINT: the package "
            "code changed after freeze; a study runs on the code it was frozen with."
        )
    current = runtime_versions() if runs else body.versions
    for package, version in body.versions.items():
        if current.get(package) != version:
            raise input_error(
                step,
                f"versions.{package}",
                current.get(package),
                f"{version!r}, the version the freeze receipt {output / FREEZE_RECEIPT} binds",
                f"a study runs under the package versions it was frozen with; install {package} {version}.",
                error=EvidenceError,
            )
    return FrozenStudy(config, receipt, output, resolved)


def authenticate_attempt(
    frozen: FrozenStudy,
    attempt: Path,
    *,
    cell: str,
    recipe: QhRecipe,
    step: str,
    verify_files: bool = True,
    train_rows: list[int] | None = None,
) -> FitReceipt:
    """The fit receipt of ``attempt``, refused unless it is the finished fit of this frozen cell.

    Checks the cell (the recipe's name), arm, seed, lane, the digest of the profile-applied
    recipe, the TRAIN manifest bound as the fit's input, the TRAIN rows it trained on, the
    study it was fitted for (freeze receipt digest and study id), the source package that made
    the fit and the update budget, so a fit copied in from another cell or study (even one
    frozen from the same config), or trained on another row, is never adopted or reported.

    Args:
        frozen: the authenticated freeze.
        attempt: the attempt directory (holding the fit receipt).
        cell: the cell's name (for messages).
        recipe: the cell's recipe as fitted (before the profile is applied).
        step: the call named in refusals.
        verify_files: re-hash the files the fit receipt binds.
        train_rows: the TRAIN rows the cell trains on (a canary's selected row); None: all.

    Raises:
        EvidenceError: naming the field, the attempt's value and the frozen one.
    """
    document = read_receipt(attempt / FIT_RECEIPT, FitReceipt, verify_files=verify_files)
    body = document.body
    fitted = body.recipe
    train = document.inputs.get("train_manifest")
    expected = {
        "cell": (recipe.name, fitted.get("name")),
        "arm": (recipe.architecture.arm, (fitted.get("architecture") or {}).get("arm")),
        "seed": (recipe.seed, body.seed),
        "profile": (frozen.config.profile, body.profile),
        "recipe_digest": (recipe_digest(execution_profile(frozen.config.profile).apply(recipe)), body.recipe_digest),
        "train_manifest_sha256": (frozen.body.train["manifest_sha256"], None if train is None else train.sha256),
        # The code that made the fit: a fit of another qhlab source is never adopted.
        "source_package_sha256": (frozen.body.source_package["sha256"], body.source_package.get("sha256")),
        "update_budget": (recipe.updates, body.update_budget),
        "train_rows": (train_rows_record(frozen.body.train["manifest_sha256"], train_rows), body.train_rows),
        "study": (frozen.identity, body.study),
        "observed_updates": (recipe.updates, body.observed_updates),
    }
    for field, (want, actual) in expected.items():
        if actual != want:
            raise input_error(
                step,
                field,
                actual,
                f"{want!r}, the frozen value of cell {cell}",
                f"{attempt / FIT_RECEIPT} is not the fit of cell {cell}; an attempt directory holds the fit "
                "of its own frozen cell only; remove a foreign or stale attempt by hand after inspection.",
                error=EvidenceError,
            )
    return document


def check_bound(receipt: Receipt, name: str, expected: Path, where: Path) -> None:
    """Refuse unless ``receipt`` (read from ``where``) binds the current bytes of ``expected`` as ``name``."""
    entry = receipt.inputs.get(name)
    if entry is None or entry.sha256 != sha256_file(expected):
        raise EvidenceError(
            f"{STUDY_CALL}: {where} does not bind the current {name} receipt {expected}. HINT: receipts "
            "of one study chain each other; a replaced receipt breaks the chain."
        )


def _read_chained(frozen: FrozenStudy, path: Path, model: type[R], step: str, what: str, command: str) -> R:
    """The receipt an earlier study step (``command``) published at ``path``, refused unless it binds
    this freeze receipt."""
    require_step(path, what, step, f"run `qhlab study {command} {frozen.config_path} --output {frozen.output}`")
    receipt = read_receipt(path, model)
    check_bound(receipt, "freeze", frozen.receipt_path, path)
    return receipt


def _kept(frozen: FrozenStudy, path: Path, receipt: R) -> R:
    """A receipt this process already authenticated, once its file and the freeze receipt are
    re-hashed unchanged."""
    frozen.unchanged(path)
    frozen.unchanged(frozen.receipt_path)
    return receipt


def authenticate_e0(frozen: FrozenStudy, step: str) -> StudyE0Receipt:
    """The E0 gate receipt (passed or not), chained to the freeze; read once per ``frozen``."""
    path = frozen.output / CANARY_DIR / E0_RECEIPT
    if frozen._e0 is None:
        receipt = _read_chained(frozen, path, StudyE0Receipt, step, "the E0 gate receipt", "admit-canaries")
        return frozen.keep("_e0", path, receipt)
    return _kept(frozen, path, frozen._e0)


def authenticate_development(frozen: FrozenStudy, step: str) -> StudyDevelopmentReceipt:
    """The development receipt, chained to the freeze and to an E0 gate that passed; read once
    per ``frozen``."""
    path = frozen.output / DEVELOPMENT_RECEIPT
    if frozen._development is None:
        what = "the development receipt (validation not sealed)"
        receipt = _read_chained(frozen, path, StudyDevelopmentReceipt, step, what, "prepare-development")
        e0 = authenticate_e0(frozen, step)
        check_bound(receipt, "e0", frozen.output / CANARY_DIR / E0_RECEIPT, path)
        if not e0.body.passed:
            raise EvidenceError(f"{step}: {path} binds an E0 gate that did not pass.")
        return frozen.keep("_development", path, receipt)
    return _kept(frozen, path, frozen._development)


def read_canary_selection(frozen: FrozenStudy) -> dict:
    """``canaries/selection.json``, refused unless canonical and made for this freeze receipt."""
    path = frozen.output / CANARY_DIR / SELECTION_FILE
    raw = path.read_bytes()
    selection = json.loads(raw)
    if canonical_json(selection) != raw or selection.get("freeze_receipt_sha256") != sha256_file(frozen.receipt_path):
        raise EvidenceError(f"{STUDY_CALL}: {path} was edited or belongs to another freeze receipt.")
    return selection


def authenticate_cells(frozen: FrozenStudy, step: str) -> dict[tuple[str, int], dict]:
    """The final receipt of every declared broad cell, each chained to this freeze and development
    and made from the fit of its own frozen cell (``authenticate_attempt``).

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
        document = read_receipt(path, StudyCellReceipt)
        check_bound(document, "freeze", frozen.receipt_path, path)
        check_bound(document, "development", frozen.output / DEVELOPMENT_RECEIPT, path)
        # The cell receipt re-hashed the fit receipt and final state it binds just above.
        authenticate_attempt(
            frozen,
            path.parent / document.body.attempt,
            cell=cell_name(arm, seed),
            recipe=frozen.recipe(arm, seed, frozen.config.broad_updates),
            step=step,
            verify_files=False,
        )
        cells[(arm, seed)] = {"path": path, "document": document}
    if missing:
        raise OrderError(
            f"{step}: {len(missing)} of {len(frozen.config.cells)} charged cells have no final receipt: "
            f"{', '.join(missing)}. HINT: run `qhlab study run-fit CONFIG --output DIR --variant ARM "
            "--seed S` for each (or `qhlab study run`); the report compares all cells."
        )
    return cells


def read_cell_receipts(
    frozen: FrozenStudy, wanted: Iterable[tuple[str, int]], step: str
) -> dict[tuple[str, int], dict]:
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
        require_step(
            path,
            f"the final receipt of cell {arm}-s{seed}",
            step,
            f"run `qhlab study run-fit ... --variant {arm} --seed {seed}` first",
        )
        document = read_receipt(path, StudyCellReceipt)
        cells[(arm, seed)] = {"path": path, "document": document}
    return cells


def read_benchmarks(frozen: FrozenStudy) -> dict[tuple[str, int], dict]:
    """Every declared cell's benchmark receipt, {(arm, seed): {"path", "document"}}; {} while any
    cell has none (the report times every cell or none).

    Raises:
        EvidenceError: a benchmark receipt that exists fails to authenticate.
    """
    benchmarks = {}
    for arm, seed in frozen.config.cells:
        path = benchmark_receipt_path(frozen.output, arm, seed)
        if path.is_file():
            benchmarks[(arm, seed)] = {"path": path, "document": read_receipt(path, StudyBenchmarkReceipt)}
    return benchmarks if len(benchmarks) == len(frozen.config.cells) else {}
