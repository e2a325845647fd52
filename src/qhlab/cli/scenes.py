"""``qhlab scenes {generate,describe}``: make a labelled population; print its difficulty card.

Owns: the commands' arguments, the progress display (rich) and what they print. Does not
own: generation, labels, the card or its text (``qhlab.scenes.difficulty.card_lines``), or
the file format (``qhlab.scenes``).
"""

from __future__ import annotations

import argparse
import json
import time

from qhlab.execution import add_executor_arguments

__all__ = ["register", "run", "run_describe"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``scenes`` command group (``scenes generate``, ``scenes describe``)."""
    from qhlab.scenes.sampler import PRESETS, SPLITS

    parser = subparsers.add_parser(
        "scenes",
        help="generate physical puck populations with exact finite-horizon labels",
        description="Physical puck scenes (pymunk) with exact Q*_1..Q*_H labels by full tree search.",
    )
    commands = parser.add_subparsers(dest="scenes_command", metavar="SUBCOMMAND", required=True)
    generate = commands.add_parser(
        "generate",
        help="generate one population directory (write-once)",
        description=(
            "Sample scenes of a preset, run the declared actor's chains, label every chain state "
            "(Q*_1..Q*_H) and its successors (Q*_1..Q*_{H-1}) exactly, and publish manifest.json "
            "plus scenes/states/candidates Parquet files bound by SHA-256. Same arguments give "
            "byte-identical files, whatever --workers is."
        ),
    )
    generate.add_argument("--preset", required=True, help=f"one of: {', '.join(sorted(PRESETS))}")
    generate.add_argument("--split", required=True, help=f"one of: {', '.join(SPLITS)}")
    generate.add_argument("--seed", required=True, type=int, help="population seed (integer >= 0)")
    generate.add_argument("--out", required=True, help="population directory to create (must not exist)")
    generate.add_argument("--workers", type=int, default=None, help="label processes (default: all cores)")
    generate.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_executor_arguments(generate, what="label chunks")
    generate.set_defaults(handler=run)
    describe = commands.add_parser(
        "describe",
        help="authenticate a population and print its difficulty card",
        description=(
            "Authenticate a population, recompute its difficulty card from the files (it must equal "
            "the card in manifest.json) and print it: scene-weighted regret_H of the uniform policy, "
            "of every fixed candidate index and of the myopic oracle, the share of states where the "
            "myopic choice loses, and the optimal index's distribution and entropy."
        ),
    )
    describe.add_argument("population", help="population directory")
    describe.add_argument("--tie-band", type=float, default=None,
                          help="tie band in metres (default: the card's own, 0.001)")
    describe.add_argument("--json", action="store_true", help="print the card as one JSON line")
    describe.set_defaults(handler=run_describe)


def run(args: argparse.Namespace) -> int:
    """Generate the population; print a JSON summary line; return 0."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from qhlab.execution import executor_choice
    from qhlab.scenes import generate_population

    start = time.perf_counter()
    choice = executor_choice(args.executor, args.ray_address, call="qhlab scenes generate")
    if args.no_progress:
        out = generate_population(args.preset, args.split, args.seed, args.out, workers=args.workers,
                                  executor=choice)
    else:
        columns = (TextColumn("[bold]labelling simulations"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("simulations", total=None)

            def _progress(done: int, planned: int) -> None:
                bar.update(task, completed=done, total=planned)

            out = generate_population(args.preset, args.split, args.seed, args.out,
                                      workers=args.workers, progress=_progress, executor=choice)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    print(json.dumps({
        "population": str(out),
        "name": manifest["name"],
        "split": manifest["split"],
        "horizon": manifest["horizon"],
        "K": manifest["K"],
        "counts": manifest["counts"],
        "executor": choice.kind,
        "seconds": round(time.perf_counter() - start, 2),
    }, sort_keys=True))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    """Print the authenticated, recomputed difficulty card; return 0."""
    from qhlab.scenes.difficulty import card_lines, describe_population

    described = describe_population(args.population, tie_band=args.tie_band)
    print(json.dumps(described, sort_keys=True) if args.json else "\n".join(card_lines(described)))
    return 0
