"""``qhlab sign DIR --private-key KEY.pem``: authenticate a directory, then sign every file in it.

Owns: the command's arguments and its one-line report. Does not own: authentication or the
signature (``qhlab.evidence.signing``: OpenSSF ``model_signing`` with an EC key pair, offline).
"""

from __future__ import annotations

import argparse
import os

from qhlab.cli.command import Command
from qhlab.cli.verify import content_checks
from qhlab.evidence.signing import sign_directory

__all__ = ["COMMAND", "run"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR")
    parser.add_argument(
        "--private-key", required=True, metavar="KEY.pem", help="PEM file of the EC private key (P-256, P-384 or P-521)"
    )
    parser.add_argument(
        "--populations",
        metavar="ROOT",
        action="append",
        default=[],
        help="a directory populations were copied to (repeatable), as for `qhlab verify`",
    )
    parser.add_argument(
        "--password-env",
        metavar="VAR",
        help="name of an environment variable holding the key's password, if it is encrypted",
    )


def run(args: argparse.Namespace) -> int:
    """Sign ``args.directory``; refuse (exit 2) when it holds a link, does not authenticate (as
    ``qhlab verify`` judges it: digests, every file accounted for, labels and recomputed
    records), is already signed, or the key is unusable (each refusal names its cause; nothing
    is written)."""
    password = os.environ.get(args.password_env) if args.password_env else None
    result = sign_directory(
        args.directory,
        private_key=args.private_key,
        password=password,
        populations=args.populations,
        # What verify refuses is never signed: its label and record checks too, not only the digests.
        check=lambda verified: content_checks(args.directory, args.populations, verified, call="qhlab sign"),
    )
    print(
        f"signed: {result['signed_files']} files ({result['receipts']} receipts authenticated first) "
        f"in {args.directory}; signature {result['signature']}"
    )
    return 0


COMMAND = Command(
    "sign",
    help="authenticate a directory of receipts, then sign every file below it (OpenSSF model signing)",
    description="Run `qhlab verify DIR`, then sign every file below DIR with an elliptic-curve private "
    "key (offline, no account). The signature, a Sigstore bundle (DSSE envelope around an "
    "in-toto statement), is written once to DIR/model.sig and is not part of the signed set. "
    "A symbolic link or special file below DIR is refused by its path before anything is "
    "written (qhlab publishes none). Check the signature with `qhlab verify DIR --public-key "
    "PUB.pem` or `model_signing verify key`.",
    arguments=_arguments,
    run=run,
)
