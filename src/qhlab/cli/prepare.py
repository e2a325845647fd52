"""``qhlab tune``, ``qhlab pilot``, ``qhlab e0-check`` and ``qhlab plan``: the preparation tools.

Owns: each fitting tool's command (``PREPARATION``: its name, help, description and what its
workers run) and turning its arguments into one call of its runner: ``CONFIG.toml --output DIR
[--workers N] [--executor local|ray --ray-address HOST:PORT]`` (and the pilot's ``--adopt-from``);
and ``PLAN`` (``CONFIG.toml --output DIR``: a plan fits nothing). Does not own: the configs, records and checks
(``qhlab.design``), running the tools (``qhlab.preparation``), error printing and exit codes
(``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from qhlab.cli.command import Command
from qhlab.evidence import require_workers
from qhlab.execution import add_executor_arguments, executor_choice

__all__ = ["E0_CHECK", "PILOT", "PLAN", "PREPARATION", "TUNE", "run"]


@dataclass(frozen=True)
class _Tool:
    """One preparation command: its name, texts, output, what its workers run, and its runner."""

    name: str
    help: str
    description: str
    output: str
    workers: str

    def exit_code(self, record: dict) -> int:
        """0, except when the record's gate failed (1): a tuning without an admissible trial, or an
        E0 check whose pass share fell short of its minimum. Either record is published, and no
        study can freeze against it."""
        if self.name == "tune":
            return 1 if record["winner"]["number"] is None else 0
        if self.name == "e0-check":
            return 0 if record["meets_min_pass_share"] else 1
        return 0

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        """``CONFIG.toml --output DIR [--workers N] [--executor ... --ray-address ...]``."""
        parser.add_argument("config", type=Path, metavar="CONFIG.toml")
        parser.add_argument("--output", required=True, type=Path, help=self.output)
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help=f"jobs at once on the local executor ({self.workers}; default: the config's workers)",
        )
        add_executor_arguments(parser, what=self.workers, default_help="the config's executor")
        if self.name == "pilot":
            parser.add_argument(
                "--adopt-from",
                type=Path,
                default=None,
                metavar="PILOT_DIR",
                help="an earlier finished pilot of the same study (e.g. before an arm was added): its finished "
                "fits of the same cells (same recipe, seed, populations) are copied in and adopted, so only "
                "the new cells are fitted",
            )
        parser.set_defaults(tool=self.name)

    def command(self) -> Command:
        """The tool's row of the command table."""
        return Command(self.name, help=self.help, description=self.description, arguments=self.arguments, run=run)


PREPARATION = {
    "tune": _Tool(
        "tune",
        "search a recipe space with Optuna on the tuning population; write tuning.json and recipe.toml",
        "Run the trials of a tuning config as real fits (one per objective seed) on its declared tuning population, "
        "with Optuna's SQLite storage at OUTPUT/trials.db; publish OUTPUT/tuning.json (the record, with its receipt) "
        "and OUTPUT/recipe.toml (the winner by the config's rule). The same config gives the same trials with any "
        "worker count or executor; an interrupted run resumes when the same command runs again. Exit status 1 when "
        "no trial is admissible.",
        "the tuning directory",
        "the trials' fits",
    ),
    "pilot": _Tool(
        "pilot",
        "fit every arm of a study with extra seeds and TRAIN draws on the tuning population; write pilot.json",
        "Fit every arm of the study a pilot config names, with the pilot's seeds on its TRAIN population and with "
        "each further TRAIN draw's own seeds on that draw, all scored on the pilot's tuning validation population; "
        "publish OUTPUT/pilot.json (every fit's per-scene metrics, and each comparison's and retention margin's own "
        "seed and TRAIN-draw components, which the study's intervals carry one by one) with its receipt. A study "
        "names it in [preparation] pilot. An interrupted run resumes when the same command runs again.",
        "the pilot directory",
        "the pilot's fits",
    ),
    "e0-check": _Tool(
        "e0-check",
        "run a study's E0 gate on fresh TRAIN draws, each frozen as a study of its own; write e0.json",
        "Freeze the study a check config names once per fresh TRAIN seed of its TRAIN preset (the study's settings "
        "with only the TRAIN seed changed, without its [preparation]), select each draw's canary row and run its "
        "canaries: the study's own E0 gate. Publish OUTPUT/e0.json (every draw's row, labels, canary predictions and "
        "outcome, the pass share and whether it reached the config's minimum) with its receipt. A study names it in "
        "[preparation] e0; its freeze refuses a check of another gate design or one that fell short. Exit status 1 "
        "when the pass share falls short of min_pass_share (the record is published). An interrupted run resumes "
        "when the same command runs again.",
        "the check directory",
        "the draws' TRAIN labelling and gates",
    ),
}


def run(args: argparse.Namespace) -> int:
    """Run the preparation tool named on the command line; returns its exit status."""
    tool = PREPARATION[args.tool]
    call = f"qhlab {tool.name}"
    if args.workers is not None:
        require_workers(call, "--workers", args.workers, hint="one job per core is the fastest.")
    choice = None
    if args.executor is not None or args.ray_address is not None:
        choice = executor_choice(args.executor, args.ray_address, call=call)
    # Lazy: the tools import numpy, optuna and the study pipeline, which `qhlab --help` never needs.
    from qhlab.preparation import e0_check, pilot, tune
    from qhlab.preparation.fits import ToolRun

    runner = {"tune": tune.run_tuning, "pilot": pilot.run_pilot, "e0-check": e0_check.run_e0_check}[tool.name]
    adopt = getattr(args, "adopt_from", None)
    return tool.exit_code(
        runner(ToolRun(args.config, args.output, workers=args.workers, executor=choice, adopt_from=adopt))
    )


TUNE, PILOT, E0_CHECK = (PREPARATION[name].command() for name in ("tune", "pilot", "e0-check"))


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, metavar="CONFIG.toml")
    parser.add_argument("--output", required=True, type=Path, help="the plan directory")


def _plan(args: argparse.Namespace) -> int:
    """Make the plan a config names; 0 when a design reaches its target, 1 when none does (published)."""
    # Lazy: the plan reads numpy, scipy and the study pipeline, which `qhlab --help` never needs.
    from qhlab.preparation.fits import ToolRun
    from qhlab.preparation.plan import run_plan

    return 0 if run_plan(ToolRun(args.config, args.output))["chosen"] is not None else 1


PLAN = Command(
    "plan",
    help="predict a study's MDEs from its pilot before its fits, weigh its alternatives; write plan.json",
    description="Predict every comparison's and retention margin's minimum detectable effect (80% power, two-sided "
    "at the study's level) for the study a plan config names, from its pilot record's components, before any of "
    "its fits; weigh the alternatives (the validation sizes the config lists and, with a tuning record of metric "
    "'mde', each trial's recipe), each with its compute cost measured from the pilot's and the trials' own fits; "
    "name the cheapest design that reaches the config's target. Publish OUTPUT/plan.json, OUTPUT/plan.md and a "
    "receipt. A study names it in [preparation] plan; its report shows planned against achieved MDEs. Exit status "
    "1 when no design weighed reaches the target (the plan is published).",
    arguments=_plan_arguments,
    run=_plan,
)
