"""``qhlab profiles``: which execution lanes this host admits, and why the others are refused.

Owns: the command's arguments and its report. Does not own: the registry or the admission
rules (``qhlab.training.execution_profile``). Exits 0 whether or not a lane is admitted:
the command reports; ``qhlab fit`` refuses.
"""

from __future__ import annotations

import argparse
import json

from qhlab.cli.command import Command

__all__ = ["COMMAND", "run"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per profile with the full runtime evidence or the refusal",
    )


def run(args: argparse.Namespace) -> int:
    """Print each profile's admission result; return 0."""
    # Lazy: keeps importing this module free of torch.
    from qhlab.training.execution_profile import PROFILE_NAMES, ProfileRefusedError, execution_profile

    for name in PROFILE_NAMES:
        profile = execution_profile(name)
        try:
            evidence = profile.admit_runtime()
        except ProfileRefusedError as exc:
            if args.json:
                refusal = {"profile": name, "admitted": False, "needs": exc.needs, "actual": exc.actual}
                print(json.dumps(refusal, sort_keys=True))
            else:
                print(f"{name}: refused: needs {exc.needs}; this host {exc.actual}")
            continue
        if args.json:
            print(json.dumps({"profile": name, "admitted": True, "evidence": evidence.as_dict()}, sort_keys=True))
        else:
            print(f"{name}: admitted")
    return 0


COMMAND = Command(
    "profiles",
    help="list the execution profiles and whether this host admits each",
    description="Run every execution profile's admission check (host OS/architecture, backend availability, "
    "MPS fallback rule) and print 'NAME: admitted' or 'NAME: refused: ...'.",
    arguments=_arguments,
    run=run,
)
