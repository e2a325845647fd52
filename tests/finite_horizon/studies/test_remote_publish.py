"""The Ray driver publishes a worker's returned attempt only after re-authenticating every file.

A returned attempt is modelled from a real finished attempt of the tiny study (its files and
digests, exactly what ``_fit_on_worker`` sends); no Ray is needed for the driver's checks.
"""

from __future__ import annotations

import re

import pytest

from qhlab.evidence import DigestMismatchError, EvidenceError, MissingEvidenceError, sha256_bytes
from qhlab.finite_horizon.studies.architecture.remote import _publish_returned


def _returned(finished_study, cell: str = "baseline-s0") -> dict:
    cell_dir = finished_study["output"] / "cells" / cell
    attempt = next(p for p in sorted(cell_dir.iterdir()) if p.is_dir())
    files = {p.relative_to(attempt).as_posix(): p.read_bytes() for p in sorted(attempt.rglob("*")) if p.is_file()}
    return {"attempt": attempt.name, "files": files, "sha256": {k: sha256_bytes(v) for k, v in files.items()}}


def test_an_intact_returned_attempt_is_published_byte_for_byte(finished_study, tmp_path) -> None:
    returned = _returned(finished_study)
    published = _publish_returned(tmp_path / "baseline-s0", returned)
    assert published == tmp_path / "baseline-s0" / returned["attempt"]
    assert {p.relative_to(published).as_posix(): p.read_bytes()
            for p in published.rglob("*") if p.is_file()} == returned["files"]


@pytest.mark.parametrize("change", ["bytes and digest", "bytes only", "loose file", "escaping path", "missing output"])
def test_a_changed_returned_attempt_is_refused_and_nothing_is_published(finished_study, tmp_path, change) -> None:
    returned = _returned(finished_study)
    files, digests = dict(returned["files"]), dict(returned["sha256"])
    state = "final_state.safetensors"
    if change == "bytes and digest":  # a consistent forgery: the fit receipt still binds the old digest
        files[state] = files[state][:-1] + bytes([files[state][-1] ^ 1])
        digests[state] = sha256_bytes(files[state])
        error, text = DigestMismatchError, "final_state"
    elif change == "bytes only":
        files[state] = files[state] + b"\0"
        error, text = EvidenceError, "does not match its digest"
    elif change == "loose file":
        files["extra.bin"] = b"planted"
        digests["extra.bin"] = sha256_bytes(b"planted")
        error, text = EvidenceError, re.escape("returned files no receipt binds: ['extra.bin']")
    elif change == "escaping path":
        files["../outside.txt"] = b"x"
        digests["../outside.txt"] = sha256_bytes(b"x")
        error, text = EvidenceError, "outside the attempt"
    else:
        del files[state], digests[state]
        error, text = MissingEvidenceError, "final_state"
    cell_dir = tmp_path / "baseline-s0"
    with pytest.raises(error, match=text):
        _publish_returned(cell_dir, {**returned, "files": files, "sha256": digests})
    assert not (cell_dir / returned["attempt"]).exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
