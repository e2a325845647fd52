"""OpenSSF model signing of a finished evidence directory (key pair, offline).

Owns: where a directory's signature lives (``DIR/model.sig``, the ``model_signing`` default
name, left out of the signed set through the library's ignore-paths mechanism), signing every
other file below a directory that first authenticates (``sign_directory``), and checking that
signature (``verify_signature``). The signature is the library's standard Sigstore bundle: a
DSSE envelope around an in-toto statement whose subjects are the files and their SHA-256
digests, so ``model_signing verify key DIR --signature DIR/model.sig --public_key PUB.pem``
checks it without qhlab.

Does not own: receipts and their authentication (``verification.verify_directory``, run first), or
key management (keys are PEM files the caller brings). ``model_signing`` is imported inside the
functions: importing ``qhlab.evidence`` stays stdlib-only and fast.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from qhlab.evidence.canonical import sha256_file
from qhlab.evidence.errors import EvidenceError, MissingEvidenceError, PublishConflictError, input_error
from qhlab.evidence.layout import SIGNATURE_FILE
from qhlab.evidence.publish import publish_bytes
from qhlab.evidence.tree import refuse_links
from qhlab.evidence.verification import verify_directory

__all__ = ["SIGNATURE_FILE", "check_statement", "sign_directory", "signature_path", "verify_signature"]


def signature_path(directory: str | os.PathLike) -> Path:
    """``DIR/model.sig``: the signature of ``directory`` (it may not exist)."""
    return Path(directory) / SIGNATURE_FILE


def _hashing_config():
    from model_signing import hashing

    # The signature cannot sign itself; the manifest records this ignored path, so
    # `model_signing verify` leaves it out too. Git metadata is left out as the library's
    # own CLI does by default, so both verifiers hash the same set of files.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE])


_SIGN_HINT = (
    "qhlab publishes attempts, commissioning runs and studies without links; W&B's links left by an "
    "older qhlab (wandb/latest-run, wandb/debug.log, wandb/debug-internal.log, <run>/logs/debug-core.log) "
    "are bound by no receipt and can be deleted (`find DIR -type l -path '*/wandb/*' -delete`). Then "
    "sign again."
)


def _key(call: str, field: str, path: str | os.PathLike) -> Path:
    key = Path(path)
    if not key.is_file():
        raise input_error(
            call,
            field,
            str(path),
            "an existing PEM key file",
            "create an EC P-256 key pair, e.g. `openssl ecparam -name prime256v1 -genkey`.",
        )
    return key


def sign_directory(
    directory: str | os.PathLike,
    *,
    private_key: str | os.PathLike,
    password: str | None = None,
    populations: Sequence[str | os.PathLike] = (),
    check: Callable[[dict], object] | None = None,
) -> dict:
    """Authenticate ``directory``, then sign every file below it with an EC private key.

    Args:
        directory: a finished directory of receipts (a fit attempt, a study, a commissioning run).
        private_key: PEM file of the elliptic-curve private key (P-256/P-384/P-521).
        password: the key's password, when it is encrypted.
        populations: directories populations were copied to (as ``verify_directory``).
        check: called with what ``verify_directory`` returned, before anything is signed; it
            raises to refuse. ``qhlab sign`` passes ``qhlab verify``'s label and record checks,
            so that nothing verify would refuse is signed.

    Returns:
        ``{"signature": path, "signed_files": n, "receipts": n}``.

    Raises:
        QhInputError: ``directory`` is, or holds, a symbolic link or a special file (each named
            by its path), or the key file is missing or not a usable EC private key (its
            password included); nothing is written.
        EvidenceError: (or a subclass) the directory does not authenticate, or a file could not
            be read while it was hashed; nothing is written.
        PublishConflictError: the directory is already signed (signatures are write-once).
    """
    from model_signing import signing

    call = "sign_directory"
    root = Path(directory)
    refuse_links(call, root, hint=_SIGN_HINT)
    verified = verify_directory(root, populations)
    if check is not None:
        check(verified)
    target = signature_path(root)
    if target.exists() or target.is_symlink():
        raise PublishConflictError(
            f"{call}: {target} already exists; allowed: an unsigned directory. HINT: a signature is "
            "write-once; verify it with `qhlab verify DIR --public-key PUB.pem`."
        )
    key = _key(call, "private_key", private_key)
    # The key is loaded (and refused) on its own: only an error loading it is the key's fault.
    try:
        # model_signing 1.1.1 hands the password to cryptography unchanged, which needs bytes.
        secret = None if password is None else password.encode()
        config = signing.Config().use_elliptic_key_signer(private_key=key, password=secret)
    except Exception as exc:  # cryptography raises ValueError, TypeError, UnsupportedAlgorithm
        if isinstance(exc, AttributeError):  # model_signing reads .curve of whatever key it loaded
            hint = (
                "it is not an elliptic-curve key (RSA? Ed25519?); create one with "
                "`openssl ecparam -name prime256v1 -genkey`"
            )
        elif password is None and "encrypted" in str(exc):
            hint = "it is encrypted: pass its password with --password-env VAR"
        else:
            hint = f"the signer could not load it: {exc}"
        raise input_error(
            call,
            "private_key",
            str(private_key),
            "a PEM elliptic-curve private key (P-256, P-384 or P-521) and its password if it is encrypted",
            hint,
        ) from None
    # The bundle is written outside the directory first (nothing there changes while it is
    # hashed), then published write-once beside the files it signs.
    with tempfile.TemporaryDirectory() as scratch:
        bundle = Path(scratch) / SIGNATURE_FILE
        try:
            config.set_hashing_config(_hashing_config()).sign(root, bundle)
        except (ValueError, OSError) as exc:
            # The key loaded: what fails now is reading the directory (a file removed, made
            # unreadable or replaced by a link after the check above).
            raise EvidenceError(
                f"{call}: {root} could not be hashed for signing: {exc}. HINT: nothing was written; sign "
                "a finished directory that no process is still writing to."
            ) from None
        publish_bytes(target, bundle.read_bytes())
    signed = sum(1 for p in root.rglob("*") if p.is_file() and p != target)
    return {"signature": target, "signed_files": signed, "receipts": len(verified["receipts"])}


def verify_signature(directory: str | os.PathLike, *, public_key: str | os.PathLike) -> dict:
    """Check ``DIR/model.sig`` against every file below ``directory`` with an EC public key.

    Any changed byte, added or removed file, or a signature by another key is refused.

    Args:
        directory: a directory signed by :func:`sign_directory` (or ``model_signing sign key``
            with ``--signature DIR/model.sig``).
        public_key: PEM file of the public key paired with the signing key.

    Returns:
        ``{"signature": path, "signed_files": n}``.

    Raises:
        MissingEvidenceError: the directory has no signature.
        EvidenceError: the signature does not match the files or the key, or a symbolic link or
            special file is below the directory (named by its path).
        QhInputError: a missing key file.
    """
    from model_signing import verifying

    call = "verify_signature"
    root = Path(directory)
    target = signature_path(root)
    if not target.is_file():
        raise MissingEvidenceError(f"{call}: {target} does not exist: {root} is not signed.")
    refuse_links(call, root, error=EvidenceError)
    key = _key(call, "public_key", public_key)
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=key)
        config.set_hashing_config(_hashing_config()).verify(root, target)
    except Exception as exc:  # the library raises ValueError and cryptography/protobuf errors alike
        raise EvidenceError(f"{call}: {target} does not verify {root} with {key}: {exc}") from None
    signed = sum(1 for p in root.rglob("*") if p.is_file() and p != target)
    return {"signature": target, "signed_files": signed}


def check_statement(directory: str | os.PathLike) -> dict:
    """Without a key: check that ``DIR/model.sig`` lists exactly the files below ``directory``.

    The signature's in-toto statement names every signed file with its SHA-256. Comparing it
    with the files proves that they are the bytes the statement lists, so a directory changed
    after signing (a stale ``model.sig``) is refused. It does not prove who signed: the
    signature over the statement is only checked with a public key (``verify_signature``).

    Args:
        directory: a directory holding ``model.sig``.

    Returns:
        ``{"signature": path, "signed_files": n}``.

    Raises:
        MissingEvidenceError: the directory has no signature.
        EvidenceError: the bundle is not a model-signing statement of files, or a listed file is
            missing or has other bytes, or a file below the directory is not listed (each named).
    """
    call = "qhlab verify"
    root = Path(directory)
    target = signature_path(root)
    if not target.is_file():
        raise MissingEvidenceError(f"{call}: {target} does not exist: {root} is not signed.")
    try:
        envelope = json.loads(target.read_text(encoding="utf-8"))["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"]))
        serialization = statement["predicate"]["serialization"]
        resources = {r["name"]: (r["algorithm"], r["digest"]) for r in statement["predicate"]["resources"]}
        ignored = set(serialization.get("ignore_paths", []))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EvidenceError(
            f"{call}: {target} is not a model-signing bundle with an in-toto statement ({exc!r}). "
            "HINT: sign with `qhlab sign DIR --private-key KEY.pem`."
        ) from None
    if serialization.get("method") != "files" or any(a != "sha256" for a, _ in resources.values()):
        raise EvidenceError(
            f"{call}: {target} signs by method {serialization.get('method')!r}; allowed: 'files' "
            "with sha256 (what `qhlab sign` writes). HINT: check it with --public-key PUB.pem."
        )
    present = {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not ({p.relative_to(root).parts[0], p.relative_to(root).as_posix()} & ignored)
    }
    problems = [f"{name} is listed but missing" for name in sorted(set(resources) - set(present))]
    problems += [f"{name} is not listed" for name in sorted(set(present) - set(resources))]
    problems += [
        f"{name} has sha256 {digest}, the statement lists {resources[name][1]}"
        for name in sorted(set(resources) & set(present))
        if (digest := sha256_file(present[name])) != resources[name][1]
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise EvidenceError(
            f"{call}: {target} does not list the files below {root}: {shown}. HINT: the directory changed after "
            "it was signed (a stale signature); restore the signed bytes, or remove model.sig and sign again."
        )
    return {"signature": target, "signed_files": len(resources)}
