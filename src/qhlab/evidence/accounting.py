"""Every file below a verified directory accounted for: what a file no receipt binds is, and
where such a file is refused.

Owns: the kinds of file qhlab writes without binding them (a W&B run file, a fit log, a lock file,
the signature, and a step's output that a kill left before the receipt that binds it) and the rule
for a study directory (one holding ``freeze.receipt.json``): it holds no file of unknown kind, and
a report folder that holds files has the receipt that binds them. Does not own: finding which
files are bound (``verification.verify_directory``), or files of interrupted publications and
links a killed fit left (listed there).

Why a study is closed: a study is qhlab's write-once output, and its decision is read from the
files in it. A file no receipt binds is evidence of nothing, so one that could be read as
qhlab's (an ``answer.md`` beside the report, a ``report.md`` whose receipt was deleted) is
refused rather than listed, and ``qhlab sign`` (which verifies first) never signs it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from qhlab.evidence.errors import EvidenceError
from qhlab.evidence.layout import (
    BENCHMARK_DIR,
    CANARY_DIR,
    CELLS_DIR,
    COLD_INIT_STATE,
    COLD_INIT_STRUCTURE,
    CONTINUATION_FILE,
    E0_RECEIPT,
    FAMILY_DIR,
    FINAL_STATE,
    FIT_LOG,
    FREEZE_RECEIPT,
    PREPARATION_DIR,
    REPORT_DIR,
    REPORT_RECEIPT,
    SELECTION_FILE,
    SIGNATURE_FILE,
    WANDB_REPORT_DIR,
)

__all__ = ["UNBOUND_KINDS", "account_for_unbound", "unbound_lines"]

# The kinds of a file no receipt binds, as verify names them.
WANDB_FILE = "W&B run file"
FIT_LOG_FILE = "fit log"
LOCK_FILE = "lock file"
SIGNATURE = "signature"
UNFINISHED = "unfinished step output"
UNKNOWN = "unknown file"
UNBOUND_KINDS = (WANDB_FILE, FIT_LOG_FILE, LOCK_FILE, SIGNATURE, UNFINISHED, UNKNOWN)

# An offline W&B run's own directory: wandb/offline-run-<stamp>-<id>/ (or run-... online).
_WANDB_RUN = re.compile(r"^(offline-)?run-[0-9]{8}_[0-9]{6}-")
# What a fit publishes in its attempt directory before the receipt that binds it: a fit killed in
# between leaves it unbound (its next attempt starts afresh).
_ATTEMPT_OUTPUT = re.compile(
    rf"^({re.escape(FINAL_STATE)}|final_state\.json|{re.escape(COLD_INIT_STATE)}|{re.escape(COLD_INIT_STRUCTURE)}|"
    rf"{re.escape(CONTINUATION_FILE)}|segment_checkpoint_u[0-9]{{8}}\.(safetensors|json))$"
)
# Where a study's fits run: only their attempt directories hold logs, W&B runs and cell locks.
_FIT_FOLDERS = (CELLS_DIR, CANARY_DIR)
# Every folder a study step writes; an unknown file in one of them (or at the study's top) is refused.
_STUDY_FOLDERS = (REPORT_DIR, CELLS_DIR, CANARY_DIR, BENCHMARK_DIR, PREPARATION_DIR, FAMILY_DIR, WANDB_REPORT_DIR)


def _kind(parts: Sequence[str]) -> str:
    """The kind of the unbound file at relative path ``parts``, judged by its place only."""
    name = parts[-1]
    if len(parts) == 1 and name == SIGNATURE_FILE:
        return SIGNATURE
    if name.endswith(".lock") and (name.startswith(".") or (len(parts) > 1 and parts[-2] == ".locks")):
        return LOCK_FILE
    for i, part in enumerate(parts[:-2]):
        if part == "wandb" and _WANDB_RUN.match(parts[i + 1]):
            return WANDB_FILE
    if name == FIT_LOG and len(parts) > 1:
        return FIT_LOG_FILE
    if (len(parts) > 1 and _ATTEMPT_OUTPUT.match(name)) or tuple(parts[-2:]) == (CANARY_DIR, SELECTION_FILE):
        return UNFINISHED
    return UNKNOWN


def _allowed_in_study(kind: str, inside: Sequence[str], e0_done: bool) -> bool:
    """Whether a file of ``kind`` at ``inside`` (its path relative to its study) belongs there;
    ``e0_done``: the study's E0 receipt exists (it binds the row selection once written)."""
    top = inside[0] if len(inside) > 1 else None
    if kind == UNFINISHED:
        if tuple(inside) == (CANARY_DIR, SELECTION_FILE):
            return not e0_done
        # <cells|canaries>/<cell>/<attempt>/<file>: a fit's own output, where its fit writes it.
        return top in _FIT_FOLDERS and len(inside) == 4
    if kind == LOCK_FILE:
        return top is None or top in _FIT_FOLDERS
    if kind == FIT_LOG_FILE:
        return top in _FIT_FOLDERS
    if kind == WANDB_FILE:
        return top in (*_FIT_FOLDERS, WANDB_REPORT_DIR)
    # A study may itself be signed; an unknown file belongs nowhere in a study.
    return kind == SIGNATURE


def _study_of(parts: Sequence[str], studies: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The innermost study directory (relative parts) that holds the file at ``parts``."""
    holding = [s for s in studies if len(s) < len(parts) and tuple(parts[: len(s)]) == s]
    return max(holding, key=len) if holding else None


def _refuse_unbound_report(call: str, root: str, study: tuple[str, ...], files: list[str]) -> None:
    where = "/".join((*study, REPORT_DIR)) or REPORT_DIR
    shown = ", ".join(PurePosixPath(f).relative_to(where).as_posix() for f in files)
    raise EvidenceError(
        f"{call}: {root}/{where}/ holds {shown} but no {REPORT_RECEIPT} binds them: a report no receipt binds "
        "states nothing (anyone can write or edit it, and no step recomputes it). HINT: remove the report "
        "folder and rerun the study's report step (`qhlab study run CONFIG --output STUDY` runs it), which "
        "writes the report and its receipt together."
    )


def account_for_unbound(call: str, root: str, unbound: Iterable[str], all_files: Iterable[str]) -> list[dict]:
    """Name the kind of every file no receipt binds, and refuse one a study cannot hold.

    Args:
        call: the call named in a refusal (``verify``).
        root: the verified directory, as named in a refusal.
        unbound: relative POSIX paths of the files no receipt binds (temporary files excluded).
        all_files: relative POSIX paths of every file below ``root`` (to find the studies:
            directories holding ``freeze.receipt.json``).

    Returns:
        ``[{"path", "kind"}]`` in the order of ``unbound``, ``kind`` one of ``UNBOUND_KINDS``.

    Raises:
        EvidenceError: a study's report folder holds files with no report receipt beside them,
            or a study holds a file of unknown kind, or a known kind outside its place (a fit
            log in ``report/``); each named by its path.
    """
    all_files = list(all_files)
    # A study at the verified directory itself is the empty tuple.
    studies = [PurePosixPath(f).parts[:-1] for f in all_files if PurePosixPath(f).name == FREEZE_RECEIPT]
    present = set(all_files)
    entries, misplaced, unreported = [], [], {}
    for path in unbound:
        parts = PurePosixPath(path).parts
        kind = _kind(parts)
        entries.append({"path": path, "kind": kind})
        study = _study_of(parts, studies)
        if study is None:
            continue
        inside = parts[len(study) :]
        if inside[0] == REPORT_DIR and len(inside) > 1:
            report_receipt = "/".join((*study, REPORT_DIR, REPORT_RECEIPT))
            if report_receipt not in present:
                unreported.setdefault(study, []).append(path)
                continue
        e0_done = "/".join((*study, CANARY_DIR, E0_RECEIPT)) in present
        if not _allowed_in_study(kind, inside, e0_done):
            misplaced.append((path, kind, "/".join((root, *study))))
    for study, files in unreported.items():
        _refuse_unbound_report(call, root, study, files)
    if misplaced:
        shown = "; ".join(f"{path} ({kind})" for path, kind, _ in misplaced[:5])
        more = f"; and {len(misplaced) - 5} more" if len(misplaced) > 5 else ""
        raise EvidenceError(
            f"{call}: {shown}{more} lie(s) in the study {misplaced[0][2]} (paths below {root}), but no receipt "
            "binds them and "
            "no study step writes such a file there. A study holds only what its steps wrote: receipts, the files "
            "they bind, fit logs, W&B run files, lock files and a killed fit's own output in cells/ and canaries/, "
            "and the W&B report run. "
            "HINT: move the file out of the study directory; if a step should have bound it, rerun that step."
        )
    return entries


def unbound_lines(entries: Sequence[dict]) -> list[str]:
    """``qhlab verify``'s lines naming every unbound file: one per kind and folder.

    A W&B run's files are grouped at the run's own directory, every other kind at the file's
    folder, so each file is named by its path without one line per file.

    Args:
        entries: ``[{"path", "kind"}]`` as ``account_for_unbound`` returns them.

    Returns:
        ``["<kind>: <folder>/ (<name>, ...)", ...]`` (``"<kind>: <name>, ..."`` at the top) in the
        order of first appearance.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        parts = PurePosixPath(entry["path"]).parts
        cut = len(parts) - 1
        if entry["kind"] == WANDB_FILE:
            cut = next(i + 2 for i, part in enumerate(parts[:-2]) if part == "wandb" and _WANDB_RUN.match(parts[i + 1]))
        folder = "/".join(parts[:cut])
        groups.setdefault((entry["kind"], folder), []).append("/".join(parts[cut:]))
    return [
        f"{kind}: {folder}/ ({', '.join(names)})" if folder else f"{kind}: {', '.join(names)}"
        for (kind, folder), names in groups.items()
    ]
