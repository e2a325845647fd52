"""OpenSSF model signing of a finished evidence directory (key pair, offline).

Owns: where a directory's signature lives (``DIR/model.sig``, the ``model_signing`` default
name, left out of the signed set through the library's ignore-paths mechanism), signing every
other file below a directory that first authenticates (``sign_directory``), and checking that
signature (``verify_signature``). The signature is the library's standard Sigstore bundle: a
DSSE envelope around an in-toto statement whose subjects are the files and their SHA-256
digests, so ``model_signing verify key DIR --signature DIR/model.sig --public_key PUB.pem``
checks it without qhlab.

Does not own: receipts and their authentication (``receipts.verify_directory``, run first), or
key management (keys are PEM files the caller brings). ``model_signing`` is imported inside the
functions: importing ``qhlab.evidence`` stays stdlib-only and fast.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from qhlab.evidence.errors import EvidenceError, MissingEvidenceError, PublishConflictError, input_error
from qhlab.evidence.publish import publish_bytes
from qhlab.evidence.receipts import verify_directory

__all__ = ["SIGNATURE_FILE", "sign_directory", "signature_path", "verify_signature"]

SIGNATURE_FILE = "model.sig"


def signature_path(directory: str | os.PathLike) -> Path:
    """``DIR/model.sig``: the signature of ``directory`` (it may not exist)."""
    return Path(directory) / SIGNATURE_FILE


def _hashing_config():
    from model_signing import hashing

    # The signature cannot sign itself; the manifest records this ignored path, so
    # `model_signing verify` leaves it out too. Git metadata is left out as the library's
    # own CLI does by default, so both verifiers hash the same set of files.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE])


def _key(call: str, field: str, path: str | os.PathLike) -> Path:
    key = Path(path)
    if not key.is_file():
        raise input_error(call, field, str(path), "an existing PEM key file",
                          "create an EC P-256 key pair, e.g. `openssl ecparam -name prime256v1 -genkey`.")
    return key


def sign_directory(
    directory: str | os.PathLike,
    *,
    private_key: str | os.PathLike,
    password: str | None = None,
    populations: Sequence[str | os.PathLike] = (),
) -> dict:
    """Authenticate ``directory``, then sign every file below it with an EC private key.

    Args:
        directory: a finished directory of receipts (a fit attempt, a study, a commissioning run).
        private_key: PEM file of the elliptic-curve private key (P-256/P-384/P-521).
        password: the key's password, when it is encrypted.
        populations: directories populations were copied to (as ``verify_directory``).

    Returns:
        ``{"signature": path, "signed_files": n, "receipts": n}``.

    Raises:
        EvidenceError: (or a subclass) the directory does not authenticate; nothing is written.
        PublishConflictError: the directory is already signed (signatures are write-once).
        QhInputError: a missing or unusable key file.
    """
    from model_signing import signing

    call = "sign_directory"
    root = Path(directory)
    verified = verify_directory(root, populations)
    target = signature_path(root)
    if target.exists() or target.is_symlink():
        raise PublishConflictError(
            f"{call}: {target} already exists; allowed: an unsigned directory. HINT: a signature is "
            "write-once; verify it with `qhlab verify DIR --public-key PUB.pem`."
        )
    key = _key(call, "private_key", private_key)
    # The bundle is written outside the directory first (nothing there changes while it is
    # hashed), then published write-once beside the files it signs.
    with tempfile.TemporaryDirectory() as scratch:
        bundle = Path(scratch) / SIGNATURE_FILE
        try:
            # model_signing 1.1.1 hands the password to cryptography unchanged, which needs bytes.
            secret = None if password is None else password.encode()
            config = signing.Config().use_elliptic_key_signer(private_key=key, password=secret)
            config.set_hashing_config(_hashing_config()).sign(root, bundle)
        except (ValueError, TypeError, OSError) as exc:
            raise input_error(call, "private_key", str(private_key), "a PEM elliptic-curve private key",
                              f"the signer refused it: {exc}") from None
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
        EvidenceError: the signature does not match the files or the key.
        QhInputError: a missing key file.
    """
    from model_signing import verifying

    call = "verify_signature"
    root = Path(directory)
    target = signature_path(root)
    if not target.is_file():
        raise MissingEvidenceError(f"{call}: {target} does not exist: {root} is not signed.")
    key = _key(call, "public_key", public_key)
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=key)
        config.set_hashing_config(_hashing_config()).verify(root, target)
    except Exception as exc:  # the library raises ValueError and cryptography/protobuf errors alike
        raise EvidenceError(f"{call}: {target} does not verify {root} with {key}: {exc}") from None
    signed = sum(1 for p in root.rglob("*") if p.is_file() and p != target)
    return {"signature": target, "signed_files": signed}
