"""``qhlab scenes generate``: generate a labelled population with a progress bar.

Owns: the command's arguments, its progress display (rich) and its one-line summary. Does
not own: generation, labels or the file format (``qhlab.scenes.generate_population``).
"""

from __future__ import annotations

import argparse
import json
import time

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``scenes`` command group (``scenes generate``)."""
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
    generate.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Generate the population; print a JSON summary line; return 0."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from qhlab.scenes import generate_population

    start = time.perf_counter()
    if args.no_progress:
        out = generate_population(args.preset, args.split, args.seed, args.out, workers=args.workers)
    else:
        columns = (TextColumn("[bold]labelling simulations"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("simulations", total=None)

            def _progress(done: int, planned: int) -> None:
                bar.update(task, completed=done, total=planned)

            out = generate_population(args.preset, args.split, args.seed, args.out,
                                      workers=args.workers, progress=_progress)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    print(json.dumps({
        "population": str(out),
        "name": manifest["name"],
        "split": manifest["split"],
        "horizon": manifest["horizon"],
        "K": manifest["K"],
        "counts": manifest["counts"],
        "seconds": round(time.perf_counter() - start, 2),
    }, sort_keys=True))
    return 0
