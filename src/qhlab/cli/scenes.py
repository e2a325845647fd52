"""``qhlab scenes {generate,describe,audit}``: make a labelled population of any environment; print
its difficulty card; audit it against its environment.

Owns: the commands' arguments, the progress display (rich) and what they print. Does not
own: generation, labels, the card or its text (``qhlab.scenes.difficulty.card_lines``), or
the file format (``qhlab.scenes``).
"""

from __future__ import annotations

import argparse
import json
import time

from qhlab.cli.command import Command
from qhlab.evidence import input_error, require_workers
from qhlab.execution import add_executor_arguments, executor_choice
from qhlab.scenes import generate_population
from qhlab.scenes.audit import AUDIT_STATES, audit_population, coverage_text, environment_text
from qhlab.scenes.describe import describe_population
from qhlab.scenes.difficulty import card_lines, card_warnings
from qhlab.scenes.presets import PRESET_NAMES
from qhlab.scenes.sampler import SPLITS

__all__ = ["COMMAND", "run", "run_audit", "run_describe"]


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        required=True,
        metavar="NAME_OR_FILE",
        help=f"a built-in preset ({', '.join(PRESET_NAMES)}) or a preset file",
    )
    parser.add_argument("--split", required=True, help=f"one of: {', '.join(SPLITS)}")
    parser.add_argument("--seed", required=True, type=int, help="population seed (integer >= 0)")
    parser.add_argument("--out", required=True, help="population directory to create (must not exist)")
    parser.add_argument("--workers", type=int, default=None, help="label processes (default: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_executor_arguments(parser, what="label chunks")


def _describe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("population", help="population directory")
    parser.add_argument(
        "--tie-band", type=float, default=None, help="tie band, in the reward's unit (default: the card's own, 0.001)"
    )
    parser.add_argument(
        "--audit",
        type=int,
        default=None,
        metavar="N",
        help="also step N chain states' whole trees again through the population's environment: this runs its "
        "code (your own environment's frozen copy inside the population); without it nothing of the population runs",
    )
    parser.add_argument("--json", action="store_true", help="print the card as one JSON line")


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("population", help="population directory")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--states", type=int, default=None, metavar="N", help="chain states to step again (default 8)")
    group.add_argument("--all", action="store_true", help="step every chain state again")
    parser.add_argument("--json", action="store_true", help="print the audit record as one JSON line")


def run(args: argparse.Namespace) -> int:
    """Generate the population; print a JSON summary line; return 0."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    if args.workers is not None:
        require_workers("qhlab scenes generate", "--workers", args.workers, hint="labels do not depend on it.")
    choice = executor_choice(args.executor, args.ray_address, call="qhlab scenes generate")
    if args.no_progress:
        out = generate_population(args.preset, args.split, args.seed, args.out, workers=args.workers, executor=choice)
    else:
        columns = (TextColumn("[bold]labelling simulations"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("simulations", total=None)

            def _progress(done: int, planned: int) -> None:
                bar.update(task, completed=done, total=planned)

            out = generate_population(
                args.preset, args.split, args.seed, args.out, workers=args.workers, progress=_progress, executor=choice
            )
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    print(
        json.dumps(
            {
                "population": str(out),
                "name": manifest["name"],
                "split": manifest["split"],
                "horizon": manifest["horizon"],
                "K": manifest["K"],
                "counts": manifest["counts"],
                "executor": choice.kind,
                "seconds": round(time.perf_counter() - start, 2),
                "warnings": card_warnings(manifest["difficulty"]),
            },
            sort_keys=True,
        )
    )
    return 0


def run_describe(args: argparse.Namespace) -> int:
    """Print the authenticated, recomputed difficulty card; return 0."""
    if args.audit is not None and args.audit < 1:
        raise input_error(
            "qhlab scenes describe", "--audit", args.audit, "an integer >= 1", "8 chain states take a few seconds"
        )
    described = describe_population(args.population, tie_band=args.tie_band, audit_states=args.audit)
    if args.json:
        print(json.dumps(described, sort_keys=True))
        return 0
    audit = described["audit"]
    if audit is not None:
        checked = (
            f"  audited ({environment_text(audit)}): every label obeys the Bellman rule; "
            f"{coverage_text(audit)}; all equal the environment's"
        )
    elif described["user_code"]:
        checked = (
            "  checked without running its environment (user code): every label obeys the Bellman rule; its "
            "successors were not stepped (--audit N steps N chain states' trees through the frozen copy)"
        )
    else:
        checked = (
            "  checked: every label obeys the Bellman rule and every one-step successor stepped again equals its "
            "built-in environment's (--audit N also steps N chain states' whole trees)"
        )
    print("\n".join([*card_lines(described), checked]))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    """Audit the population (``qhlab.scenes.audit.audit_population``); print the result; return 0."""
    if args.states is not None and args.states < 1:
        raise input_error(
            "qhlab scenes audit",
            "--states",
            args.states,
            "an integer >= 1 (or --all)",
            "8 chain states take a few seconds",
        )
    states = None if args.all else (AUDIT_STATES if args.states is None else args.states)
    record = audit_population(args.population, states=states, call="qhlab scenes audit")
    if args.json:
        print(json.dumps(record, sort_keys=True))
    else:
        where = environment_text(record)
        print(
            f"audit passed: {args.population}: {where}; {record['scenes_checked']} scenes drawn again, every label "
            f"obeys the Bellman rule, {coverage_text(record)} ({record['seconds']:.1f} s; states {record['states']})"
        )
    return 0


COMMAND = Command(
    "scenes",
    help="generate populations with exact finite-horizon labels (the puck world, or your own environment)",
    description="Populations of an environment's scenes with exact Q*_1..Q*_H labels by full tree search "
    "through its step: the built-in puck world (pymunk) and tank network, or a preset file naming your own.",
    dest="scenes_command",
    subcommands=(
        Command(
            "generate",
            help="generate one population directory (write-once)",
            description="Draw the scenes of a preset from its environment, run the declared actor's chains, label "
            "every chain state (Q*_1..Q*_H) and its successors (Q*_1..Q*_{H-1}) exactly, and publish manifest.json "
            "plus scenes/states/candidates Parquet files bound by SHA-256 (and a user environment's source, frozen "
            "under environment/). Same arguments give byte-identical files, whatever --workers is.",
            arguments=_generate_arguments,
            run=run,
        ),
        Command(
            "describe",
            help="authenticate a population and print its difficulty card",
            description="Authenticate a population, check its counts and every label's Bellman rule, recompute its "
            "difficulty card from the files (it must equal the card in manifest.json) and print it: scene-weighted "
            "regret_H of the uniform policy, of every fixed candidate index and of the myopic oracle, the share of "
            "states where the myopic choice loses, and the optimal index's distribution and entropy. It runs none of "
            "the population's own code (a stranger's environment is never imported) unless --audit N asks it to step "
            "the environment; a built-in environment's successors are stepped again (qhlab's own code).",
            arguments=_describe_arguments,
            run=run_describe,
        ),
        Command(
            "audit",
            help="step a population again through its environment",
            description="Authenticate a population, draw every scene again from its seed, check every label's "
            "Bellman rule exactly and every chain state's successors, and step the whole depth-H tree of N chain "
            "states (drawn with OS randomness) or of every chain state (--all) again: states, features, rewards and "
            "labels must equal the environment's to the bit. This runs the population's environment code: a user "
            "environment is imported from the frozen copy inside the population, never from your files, so audit "
            "only a population whose environment you would run.",
            arguments=_audit_arguments,
            run=run_audit,
        ),
    ),
)
