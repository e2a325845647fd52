"""``qhlab verify DIR [--populations ROOT] [--audit N]``: authenticate every receipt below a directory.

Owns: the command's arguments and its report. Does not own: authentication itself
(``qhlab.evidence.verify_directory``), which refuses at the first failing receipt or file, or
the label checks of every population found (``qhlab.scenes.audit``: the exact Bellman rule
always, a physics audit of N chain states with ``--audit``), or the recomputation of every
record whose kind registered one (``qhlab.evidence.envelope.record_checks``: the tuning, pilot
and E0 check records today), which this command runs on every such receipt it finds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qhlab.cli.command import Command
from qhlab.evidence import EvidenceError, QhInputError, authentication_roots, recorded_origin, verify_directory
from qhlab.evidence.accounting import unbound_lines
from qhlab.evidence.envelope import record_checks
from qhlab.evidence.signing import check_statement, signature_path, verify_signature
from qhlab.scenes.manifest import environment_words, read_manifest

__all__ = ["COMMAND", "KEYLESS", "run"]

# What a pass proves, said once: in --help and at the end of every keyless verify.
KEYLESS = (
    "Without --public-key a pass proves internal consistency (every receipt and every file it binds "
    "agree), not origin: anyone can rewrite a file and reseal the receipts above it; only a signature "
    "checked with --public-key says who made the bytes."
)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR")
    parser.add_argument(
        "--populations",
        metavar="ROOT",
        action="append",
        default=[],
        help="a directory populations were copied to (repeatable); ~/.cache/qhlab/populations is always searched",
    )
    parser.add_argument(
        "--public-key", metavar="PUB.pem", help="also check DIR/model.sig (`qhlab sign`) with this EC public key"
    )
    parser.add_argument(
        "--audit",
        metavar="N",
        type=int,
        default=None,
        help="also re-simulate N chain states (drawn with OS randomness) of every population "
        "found, against pymunk physics",
    )
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")


def run(args: argparse.Namespace) -> int:
    """Verify ``args.directory``; raise an EvidenceError (exit 2) at the first failure."""
    # Lazy: keeps importing this module free of numpy.
    from qhlab.scenes.audit import coverage_text

    if args.audit is not None and args.audit < 1:
        raise QhInputError(
            f"qhlab verify: --audit={args.audit!r} is not allowed; allowed: an integer >= 1. "
            "HINT: 8 chain states take a few seconds per population."
        )
    result = verify_directory(args.directory, args.populations)
    # Who made the bytes comes before what they say: a forged directory is refused by its signature.
    signature = _signature(args)
    result.update(content_checks(args.directory, args.populations, result, audit=args.audit))
    result["signature"] = signature
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    kinds: dict[str, int] = {}
    for receipt in result["receipts"]:
        kinds[receipt["kind"]] = kinds.get(receipt["kind"], 0) + 1
    summary = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    print(
        f"verified: {len(result['receipts'])} receipts ({summary}); "
        f"{result['bound_files']} files bound and authenticated in {args.directory}"
    )
    for entry in result["label_checks"]:
        line = f"labels: {entry['population']} ({entry['environment']}): every label obeys the Bellman rule exactly"
        if entry["user_environment"]:
            line += (
                "; its environment is user code, which verify never imports: its successors were not stepped "
                f"again (`qhlab scenes audit {entry['population']}` steps them through the frozen copy inside it)"
            )
        elif "audit" in entry:
            line += f"; {coverage_text(entry['audit'])}; passed"
        else:
            line += (
                f"; every one-step successor stepped again ({entry['successors_checked']} steps) equals its "
                f"environment's; the depth-H tree of its {entry['chain_states']} chain states was not audited "
                "(--audit N samples it)"
            )
        print(line)
    for entry in result["record_checks"]:
        print(entry["line"])
    if result["unbound"]:
        counts: dict[str, int] = {}
        for entry in result["unbound"]:
            counts[entry["kind"]] = counts.get(entry["kind"], 0) + 1
        print(
            f"note: {len(result['unbound'])} files are bound by no receipt, so they prove nothing ("
            + ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts.items())
            + "); each by its path:"
        )
        for line in unbound_lines(result["unbound"]):
            print(f"  {line}")
    if result["linked_logs"]:
        print(
            f"note: {len(result['linked_logs'])} W&B log link(s) a killed fit left ({result['linked_logs'][0]}); "
            "never followed, bound by no receipt; `qhlab study run` drops them when it resumes the cell, or "
            "delete them (`find DIR -type l -path '*/wandb/*' -delete`) before `qhlab sign`"
        )
    if result["temporary_files"]:
        shown = ", ".join(result["temporary_files"][:3]) + (", ..." if len(result["temporary_files"]) > 3 else "")
        print(
            f"note: {len(result['temporary_files'])} leftover files of an interrupted publication ({shown}); "
            "bound by no receipt, removed by the next run of the step that left them"
        )
    print(result["signature"]["summary"])
    if result["signature"]["status"] != "verified":
        print(f"note: {KEYLESS}")
    return 0


def content_checks(
    directory: str, populations: list[str], verified: dict, *, audit: int | None = None, call: str = "qhlab verify"
) -> dict:
    """What the bytes say, checked after their digests (``verify_directory``): every label and record.

    Digests prove the bytes; the labels must also obey Bellman, and (a built-in environment's,
    stepped again) their successors, and with ``audit`` the sampled trees. A user environment's
    code is never imported here. Every record whose kind registered a check is recomputed (a
    study's report rebuilt from its cells). ``qhlab sign`` runs the same checks before it signs.

    Args:
        directory: the verified directory.
        populations: further roots populations were copied to.
        verified: what ``verify_directory`` returned for ``directory``.
        audit: chain states to re-simulate per population, or None.
        call: the command named in a refusal.

    Returns:
        ``{"label_checks": [...], "record_checks": [...]}``.

    Raises:
        EvidenceError: a label breaks the Bellman rule, a successor differs, or a record is not
            what its bound inputs give.
    """
    # Lazy: keeps importing this module free of numpy.
    from qhlab.scenes.audit import audit_population, check_population_labels
    from qhlab.scenes.origin import user_environment

    checks = []
    for population in verified["populations"]:
        manifest = read_manifest(population)
        user_code = user_environment(manifest)
        labels = check_population_labels(population, call=call, simulate=False)
        chain = labels.step >= 0
        entry = {
            "population": population,
            "bellman": "exact",
            "chain_states": int(chain.sum()),
            "user_environment": user_code,
            "environment": environment_words(manifest["generator"]),
            "successors_checked": 0 if user_code else int(labels.mask[chain].sum()),
        }
        if audit is not None and not user_code:
            entry["audit"] = audit_population(population, states=audit, call=call)
        checks.append(entry)
    # A record's check re-reads the populations it binds: moved ones are found below --populations.
    with authentication_roots(directory, populations, original=recorded_origin(directory)):
        records = _record_checks(directory, verified["receipts"])
    return {"label_checks": checks, "record_checks": records}


def _record_checks(directory: str, receipts: list[dict]) -> list[dict]:
    """Recompute every record below ``directory`` whose kind registered a check, in receipt order.

    Returns:
        ``[{"kind", "directory", "line", **summary}]``, one per such receipt.
    """
    checks = record_checks()
    entries = []
    for receipt in receipts:
        check = checks.get(receipt["kind"])
        if check is not None and Path(receipt["path"]).name != check.file:
            # A renamed receipt would be authenticated but its record never recomputed.
            raise EvidenceError(
                f"qhlab verify: {Path(directory) / receipt['path']} is a receipt of kind {receipt['kind']}, "
                f"whose name is {check.file}. HINT: a record's receipt is never renamed; restore its name, so "
                "that verify recomputes the record it binds."
            )
        if check is not None:
            where = Path(directory) / Path(receipt["path"]).parent
            summary = check.check(where)
            entries.append(
                {"kind": receipt["kind"], "directory": str(where), **summary, "line": check.describe(where, summary)}
            )
    return entries


def _signature(args: argparse.Namespace) -> dict:
    """Check the directory's signature with ``--public-key``, or say whether it is signed."""
    path = signature_path(args.directory)
    if args.public_key is not None:
        checked = verify_signature(args.directory, public_key=args.public_key)
        return {
            "status": "verified",
            "path": str(path),
            "signed_files": checked["signed_files"],
            "summary": f"signature: {path} verified {checked['signed_files']} files with {args.public_key}",
        }
    if path.is_file():
        listed = check_statement(args.directory)
        return {
            "status": "statement checked",
            "path": str(path),
            "signed_files": listed["signed_files"],
            "summary": f"signature: {path} lists exactly the {listed['signed_files']} files below "
            f"{args.directory} with their digests; the signature itself was not checked (pass "
            "--public-key PUB.pem to check who signed them)",
        }
    return {"status": "unsigned", "path": None, "summary": f"note: unsigned (no {path}); sign with `qhlab sign`"}


COMMAND = Command(
    "verify",
    help="authenticate every receipt (and every file it binds) below a directory",
    description="Authenticate every *.receipt.json below DIR and re-hash every file it binds, each at its "
    "one place below DIR; refuse links and special files; check every population's labels. "
    f"{KEYLESS}",
    arguments=_arguments,
    run=run,
)
