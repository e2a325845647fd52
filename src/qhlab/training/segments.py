"""One write-once segment directory: its file names and receipt kinds, and resuming from it.

Owns: the names inside ``OUTPUT/<cell>/<local_attempt_id>/`` that the launcher publishes
(final state, fit and W&B receipts, segment checkpoints) and their receipt kinds,
authenticating an interrupted segment to continue from (:func:`load_resume_state`, which
returns a :class:`ResumeState`), and the one rule by which every fit job adopts a cell's finished
attempt instead of fitting again (:func:`finished_attempt`: a study's cells and canaries, its Ray
cells, tuning trials' and pilots' fits).

Does not own: writing checkpoints (``qhlab.training.callbacks``), the cold-init lineage check
(``qhlab.training.lineage``), tensor files (``qhlab.training.tensor_state``), or receipts
(``qhlab.evidence``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path

from qhlab.evidence import EvidenceError, MissingEvidenceError, QhInputError, input_error, read_receipt
from qhlab.evidence.layout import COLD_INIT_STATE, CONTINUATION_FILE, EVALUATION_RECEIPT, FINAL_STATE, FIT_RECEIPT
from qhlab.training.lineage import lineage_record, verified_cold_initialization_lineage
from qhlab.training.records import FitReceipt, SegmentCheckpointReceipt
from qhlab.training.tensor_state import load_tensor_state

__all__ = [
    "ResumeState",
    "checkpoint_state_path",
    "continuation_of",
    "finished_attempt",
    "interrupted_segment",
    "load_resume_state",
    "refuse_second_continuation",
    "resume_segment_directory",
    "unbound",
]


def finished_attempt(cell_dir: Path, *, evaluated: bool, binds: Mapping[str, str] | None = None) -> Path | None:
    """The attempt a fit job adopts instead of fitting its cell again, or None: the one rule.

    The first attempt directory (by name) whose fit finished (its fit receipt, and its evaluation
    receipt when ``evaluated``) is the cell's fit, and it must be this job's: a finished fit is
    never fitted again, and a finished fit of something else in the cell is refused, never fitted
    beside. With ``binds`` (a preparation fit) its fit receipt must bind them; without (a study's
    cell) the caller authenticates it further (study, rows, recipe, scorer structure) and refuses
    one that is not its own. A hidden directory (a staging or half-copied attempt) is never an
    attempt.

    Args:
        cell_dir: the cell's directory (absent: no attempt).
        evaluated: whether the cell's fit is evaluated (a canary's is not).
        binds: ``{"recipe_digest": the applied recipe's digest, input name: its SHA-256}``, e.g.
            ``train_manifest`` and ``validation_manifest``; None: the caller authenticates.

    Raises:
        EvidenceError: the finished attempt's fit receipt is not a fit receipt of its own digest,
            or binds another recipe or population than ``binds``.
    """
    if not cell_dir.is_dir():
        return None
    for attempt in sorted(p for p in cell_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (attempt / FIT_RECEIPT).is_file() or (evaluated and not (attempt / EVALUATION_RECEIPT).is_file()):
            continue
        differing = [] if binds is None else unbound(attempt, binds)
        if differing:
            raise EvidenceError(
                f"fit job: attempt={str(attempt)!r} is not allowed; allowed: a finished fit of this cell's own "
                f"{' and '.join(sorted(binds))} (its fit receipt binds another {', '.join(differing)}). HINT: a "
                "finished fit is never fitted again nor fitted beside; move the foreign attempt out of the cell "
                "and run again."
            )
        return attempt
    return None


def unbound(attempt: Path, binds: Mapping[str, str]) -> list[str]:
    """The names in ``binds`` that a finished attempt's fit receipt binds otherwise (empty: its own).

    Args:
        attempt: an attempt directory holding a fit receipt.
        binds: as ``finished_attempt``'s.

    Raises:
        EvidenceError: the fit receipt is not a fit receipt of its own digest.
    """
    # Its own digest checked; the files it binds are the caller's to authenticate (where they now lie).
    receipt = read_receipt(attempt / FIT_RECEIPT, FitReceipt, verify_files=False)
    bound = {name: receipt.inputs[name].sha256 for name in binds if name in receipt.inputs}
    bound["recipe_digest"] = receipt.body.recipe_digest
    return sorted(name for name, value in binds.items() if bound.get(name) != value)


# Published first in a segment that continues another (write-once, bound by its fit receipt):
# which segment and checkpoint it continues. A segment is continued at most once.
_CHECKPOINT_RE = re.compile(r"^segment_checkpoint_u(\d{8})\.receipt\.json$")


def checkpoint_state_path(directory: Path, observed_updates: int) -> Path:
    """``directory / "segment_checkpoint_u<NNNNNNNN>.safetensors"`` for a count of updates."""
    return Path(directory) / f"segment_checkpoint_u{observed_updates:08d}.safetensors"


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """The authenticated state a new segment continues from.

    Attributes:
        previous_local_attempt_id: the segment that wrote the state.
        previous_directory: its directory.
        cold_init: its (lineage-verified) ``cold_init.safetensors``.
        lineage: what ``verified_cold_initialization_lineage`` returned (JSON-able).
        state_path: the segment checkpoint loaded.
        state_sha256: digest of its bytes.
        start_updates: observed updates in the state.
        logical_run_id: logical run recorded by the previous segment.
        recipe_digest: recipe digest recorded by the previous segment.
        tensors: CPU tensors (module state + ``optim.*``).
        structure: the checkpoint's structure JSON.
    """

    previous_local_attempt_id: str
    previous_directory: Path
    cold_init: Path
    lineage: dict
    state_path: Path
    state_sha256: str
    start_updates: int
    logical_run_id: str | None
    recipe_digest: str
    tensors: dict
    structure: dict


def resume_segment_directory(output: Path, cell: str, attempt: str, *, call: str = "resume") -> Path:
    """``output/cell/attempt``, the segment ``--resume ATTEMPT`` names, confined to that cell.

    ``attempt`` is one directory name (no ``/``, no ``..``), and the path must resolve to
    itself under the resolved output root: a symlink (at the segment or the cell) leading
    elsewhere is refused, so a new segment never continues one of another output.

    Raises:
        QhInputError: any of the above; nothing is read or written.
    """
    hint = (
        f"pass the local_attempt_id of an interrupted segment of this cell: one directory name "
        f"under {str(Path(output) / cell)!r}, as the interrupted fit printed it"
    )
    if (
        not isinstance(attempt, str)
        or not attempt
        or attempt in {".", ".."}
        or "/" in attempt
        or "\\" in attempt
        or "\x00" in attempt
        or attempt.startswith(".")
    ):
        raise input_error(
            call, "--resume", attempt, "one segment directory name of this cell (no '/', no '..', not hidden)", hint
        )
    expected = Path(output).resolve() / cell / attempt
    path = Path(output) / cell / attempt
    resolved = path.resolve()
    if resolved != expected:
        raise input_error(
            call,
            "--resume",
            attempt,
            f"a segment directory inside {str(Path(output).resolve())!r} "
            f"(it resolves to {str(resolved)!r}, through a symbolic link)",
            hint,
        )
    return path


def interrupted_segment(cell_dir: Path) -> Path | None:
    """The newest segment of a cell that a kill interrupted after a checkpoint, or None.

    A segment is interrupted when it holds a segment checkpoint receipt but no fit receipt and
    no final state, and no later segment continues it. Continuing it (``load_resume_state``)
    gives the same final state as an uninterrupted fit, so a killed cell resumes from its last
    checkpoint instead of starting over. Hidden directories (staging) are never segments.
    """
    if not Path(cell_dir).is_dir():
        return None
    for segment in sorted(
        (p for p in Path(cell_dir).iterdir() if p.is_dir() and not p.name.startswith(".")), reverse=True
    ):
        if (segment / FIT_RECEIPT).exists() or (segment / FINAL_STATE).exists():
            continue
        if any(_CHECKPOINT_RE.match(p.name) for p in segment.iterdir()) and continuation_of(segment) is None:
            return segment
    return None


def continuation_of(previous_directory: Path) -> Path | None:
    """The segment that continues ``previous_directory`` (a sibling in its cell), or None.

    A continuation is recognised by its ``continuation.json`` (published before it trains) or,
    for a segment finished before that file existed, by its fit receipt's lineage.
    """
    previous = Path(previous_directory)
    parent = previous.parent
    if not parent.is_dir():
        return None
    for sibling in sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if sibling.name == previous.name:
            continue
        for name, key in ((CONTINUATION_FILE, ()), (FIT_RECEIPT, ("body", "lineage"))):
            record = sibling / name
            if not record.is_file():
                continue
            try:
                document = json.loads(record.read_bytes())
                for part in key:
                    document = document[part]
                named = document.get("previous_local_attempt_id")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if named == previous.name:
                return sibling
    return None


def refuse_second_continuation(previous_directory: Path, *, call: str = "resume") -> None:
    """Refuse to continue a segment that another segment already continues (at most once)."""
    previous = Path(previous_directory)
    first = continuation_of(previous)
    if first is not None:
        raise input_error(
            call,
            "--resume",
            previous.name,
            f"an interrupted segment that no segment continues yet; {previous.name!r} is already continued "
            f"by segment {first.name!r} ({str(first)!r})",
            f"a segment is continued at most once; continue the lineage from its latest segment "
            f"(--resume {first.name}) if that one was interrupted",
        )


def load_resume_state(
    previous_directory: Path, *, seed: int, source_package_digest: str, recipe_digest: str
) -> ResumeState:
    """Authenticate a previous segment and return its newest segment checkpoint.

    Order of checks: the previous segment exists and has no final state (a finished fit is
    never continued) and no other segment continues it yet (a segment is continued at most
    once); its cold initialization verifies for ``seed`` and
    ``source_package_digest``; its newest checkpoint receipt and state authenticate; the
    checkpoint was written for ``recipe_digest``.

    Raises:
        QhInputError / EvidenceError: any of the above fails; nothing is written.
    """
    previous = Path(previous_directory)
    if not previous.is_dir():
        raise MissingEvidenceError(
            f"resume: segment directory {str(previous)!r} does not exist. HINT: pass the local_attempt_id "
            "of an earlier segment of this cell (a directory name under OUTPUT/<cell>/)."
        )
    if (previous / FINAL_STATE).exists() or (previous / FIT_RECEIPT).exists():
        raise QhInputError(
            f"resume: segment {previous.name!r} already finished (it has {FINAL_STATE}); allowed: an interrupted "
            "segment. HINT: a finished fit is never continued; start a new cell instead."
        )
    refuse_second_continuation(previous)
    lineage = verified_cold_initialization_lineage(
        previous / COLD_INIT_STATE, source_package_digest=source_package_digest, seed=seed
    )
    receipts = sorted((int(m.group(1)), p) for p in previous.iterdir() if (m := _CHECKPOINT_RE.match(p.name)))
    if not receipts:
        raise MissingEvidenceError(
            f"resume: segment {previous.name!r} has no segment checkpoint receipt. HINT: it stopped before its "
            "first checkpoint; start a new fit."
        )
    updates, receipt_path = receipts[-1]
    body = read_receipt(receipt_path, SegmentCheckpointReceipt).body
    if body.observed_updates != updates:
        raise EvidenceError(
            f"resume: {receipt_path} records observed_updates={body.observed_updates!r} but its name says {updates}."
        )
    if body.recipe_digest != recipe_digest:
        raise input_error(
            "resume",
            "recipe_digest",
            recipe_digest,
            f"{body.recipe_digest!r} (the recipe of segment {previous.name!r})",
            "resume with the same recipe and profile.",
        )
    state_path = checkpoint_state_path(previous, updates)
    tensors, structure = load_tensor_state(state_path, expected_sha256=body.state_sha256)
    return ResumeState(
        previous_local_attempt_id=previous.name,
        previous_directory=previous,
        cold_init=previous / COLD_INIT_STATE,
        lineage=lineage_record(lineage),
        state_path=state_path,
        state_sha256=body.state_sha256,
        start_updates=updates,
        logical_run_id=body.logical_run_id,
        recipe_digest=recipe_digest,
        tensors=tensors,
        structure=structure,
    )
