"""The study's command-line arguments: each ``qhlab study`` subcommand's options, one adder each.

Owns: ``STEPS``, ``STUDY_HELPS`` (each subcommand's one line), ``STUDY_DESCRIPTIONS`` and ``study_arguments(name)`` (the
adder of that subcommand's positional arguments and options). Imports neither torch nor the
pipeline, so that ``qhlab --help`` and every ``--help`` start fast. Does not own: the command rows
or running a subcommand (``qhlab.cli.study``, which ``python -m
qhlab.finite_horizon.studies.architecture_study`` runs too).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from qhlab.evidence.layout import CANARY_ROLES, FREEZE_RECEIPT
from qhlab.execution import add_executor_arguments

__all__ = ["STEPS", "STUDY_DESCRIPTIONS", "STUDY_HELPS", "STUDY_SUBCOMMANDS", "study_arguments"]

STEPS = ("freeze", "admit-canaries", "prepare-development", "run-fit", "benchmark", "report", "run")
# Every subcommand of ``qhlab study``, in the order its --help lists them.
STUDY_SUBCOMMANDS = (*STEPS, "status", "export", "replicate", "compare-lanes")
STUDY_HELPS = {
    "freeze": "validate the config, resolve TRAIN, bind source and arms (step 1)",
    "admit-canaries": "select the canary row and run the two TRAIN canaries: the E0 gate (step 2)",
    "prepare-development": "seal validation and the TRAIN-only constant after E0 passes (step 3)",
    "run-fit": "fit one declared cell to its final budget (step 4)",
    "benchmark": "time verified final scorers on the canonical first TRAIN chain (step 5)",
    "report": "compare all charged final cells; report.json, report.md, figures (step 6)",
    "run": "every step in order, skipping steps whose receipts authenticate (the main job)",
    "status": "where a study stands, read from its receipts (writes nothing)",
    "export": "a finished study's results as a tidy Parquet or CSV table (writes one file)",
    "replicate": "run a finished study's frozen design on a fresh population pair and test the agreement",
    "compare-lanes": "is study B (another lane) the same science as study A?",
}
# What each subcommand's --help says it does, where that is more than its one line.
STUDY_DESCRIPTIONS = {
    **STUDY_HELPS,
    "status": "One row per step and cell: state, attempts, updates, MAE_H, regret_H, wall time. Reads receipts only.",
    "export": "Write one tidy table of a finished study, read from its authenticated report: `cells` (one row "
    "per arm, seed, horizon and metric, with its interval, as report.json holds it) or `scenes` (one row per "
    "arm, seed, validation scene, horizon and metric).",
    "replicate": "Run STUDY's frozen design (recipe, family, budgets, preparation records, gate) on a fresh TRAIN "
    "and validation pair as a study of its own in DIR/study, then write replication.json and replication.md: per "
    "comparison both seed-pooled estimates and z, the chi-square agreement test, sign flips and changed "
    "conclusions. Seeds that the study, its tuning, pilot or E0 check drew are refused. With --seeds every fit "
    "also takes fresh training seeds (the replica then runs its own E0 gate but binds no E0 check record, which "
    "was of the original's seeds). Resumes a killed replication in the same DIR.",
    "compare-lanes": "Re-authenticate two finished studies frozen identically but for the profile; publish "
    "lanes.json, lanes.md, lanes.png and their receipt.",
}


def study_arguments(name: str) -> Callable[[argparse.ArgumentParser], None]:
    """The adder of subcommand ``name``'s arguments (``name`` in ``STUDY_SUBCOMMANDS``).

    A step's namespace has ``config``, ``study_output`` and, per step, ``variant``, ``seed``,
    ``canary_role``, ``workers`` and the executor options. ``status`` takes only ``DIR``
    (``study_output``) and ``--json``; ``export`` ``STUDY`` and ``--output`` (``export_output``);
    ``replicate`` ``STUDY`` (``replicate_study``) and ``--output`` (``replicate_output``);
    ``compare-lanes`` two study directories (``lane_a``, ``lane_b``), ``--output`` and ``--margin``.

    Raises:
        KeyError: ``name`` is not a study subcommand.
    """
    if name in STEPS:
        return lambda parser: _step(parser, name)
    return {"status": _status, "export": _export, "replicate": _replicate, "compare-lanes": _lanes}[name]


def _step(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("config", help="study TOML (e.g. examples/default-study.toml)")
    # dest is not "output": a study directory outlives any one failed step, so the CLI's
    # "remove a new --output on bad input" net must not delete a study's finished steps.
    # Each step validates before it writes, so bad input still writes nothing.
    p.add_argument("--output", dest="study_output", metavar="DIR", required=True, help="study directory")
    if name in ("run-fit", "benchmark"):
        p.add_argument("--variant", required=name == "run-fit", help="declared arm")
        p.add_argument("--seed", type=int, required=name == "run-fit", help="declared seed")
    if name == "run-fit":
        canary = "run a canary of the E0 gate (normally done by admit-canaries)"
        p.add_argument("--canary-role", default=None, choices=CANARY_ROLES, help=canary)
    if name == "run":
        workers = "override the config's parallel fits (does not change results)"
        p.add_argument("--workers", type=int, default=None, help=workers)
    _add_populations_argument(p)
    if name in ("freeze", "prepare-development", "run"):
        add_executor_arguments(
            p,
            what="population labelling" + (" and broad fits" if name == "run" else ""),
            default_help="the config's executor, local unless it says ray",
        )


def _status(status: argparse.ArgumentParser) -> None:
    status.add_argument("study_output", metavar="DIR", help=f"study directory (holds {FREEZE_RECEIPT})")
    status.add_argument("--json", action="store_true", help="print the table as one JSON object")
    _add_populations_argument(status)


def _export(export: argparse.ArgumentParser) -> None:
    export.add_argument("study_output", metavar="STUDY", help=f"study directory (holds {FREEZE_RECEIPT})")
    # dest is not "output": the CLI's clean-up of a refused command's new --output directory is
    # for directories; this is one file, published whole or not at all.
    export.add_argument("--output", dest="export_output", metavar="FILE", required=True, help="the new file")
    export.add_argument(
        "--format", dest="export_format", choices=("parquet", "csv"), default=None, help="default: from FILE's suffix"
    )
    export.add_argument("--table", dest="export_table", choices=("cells", "scenes"), default="cells")


def _replicate(replicate: argparse.ArgumentParser) -> None:
    replicate.add_argument("replicate_study", metavar="STUDY", help="the finished original study directory")
    replicate.add_argument("--train-seed", type=int, required=True, metavar="A", help="the fresh TRAIN's seed")
    replicate.add_argument(
        "--validation-seed", type=int, required=True, metavar="B", help="the fresh validation population's seed"
    )
    replicate.add_argument(
        "--seeds",
        dest="training_seeds",
        type=int,
        nargs=2,
        default=None,
        metavar=("S1", "S2"),
        help="fresh training seeds for every fit (default: the original's); none the original, its pilot or "
        "its tuning fitted",
    )
    # dest is not "output": as for a study, a replication's directory outlives a failed step.
    replicate.add_argument("--output", dest="replicate_output", metavar="DIR", required=True, help="new directory")
    replicate.add_argument("--workers", type=int, default=None, help="parallel fits (does not change results)")
    _add_populations_argument(replicate)
    add_executor_arguments(replicate, what="population labelling and fits", default_help="the study config's executor")


def _lanes(lanes: argparse.ArgumentParser) -> None:
    lanes.add_argument("lane_a", metavar="A", help="lane A's finished study directory")
    lanes.add_argument("lane_b", metavar="B", help="lane B's finished study directory")
    lanes.add_argument("--output", required=True, metavar="DIR", help="new directory for the lane report")
    lanes.add_argument(
        "--margin",
        type=float,
        default=None,
        help="TOST equivalence margin on regret_H (in the reward's unit); default: --margin-mde-multiple x the "
        "study's regret MDE (lane A's largest D_reg MDE)",
    )
    lanes.add_argument(
        "--margin-mde-multiple",
        type=float,
        default=1.0,
        metavar="K",
        help="without --margin, the margin is K x the study's regret MDE (default 1)",
    )
    _add_populations_argument(lanes)


def _add_populations_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--populations",
        metavar="ROOT",
        action="append",
        default=[],
        help="a directory the study's populations were copied to (repeatable; as for "
        "`qhlab verify`); ~/.cache/qhlab/populations is always searched",
    )
