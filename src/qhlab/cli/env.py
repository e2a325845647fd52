"""``qhlab env check PRESET``: try an environment before drawing a population from it.

Owns: the command's arguments and what it prints. Does not own: the checks
(``qhlab.scenes.check.check_environment``) or the card's text (``qhlab.scenes.difficulty``).
"""

from __future__ import annotations

import argparse
import json

from qhlab.cli.command import Command

__all__ = ["COMMAND", "run_check"]


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", metavar="PRESET", help="a built-in preset's name or a preset file")
    parser.add_argument("--scenes", type=int, default=8, help="scenes to probe and draw the card from (default 8)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")


def run_check(args: argparse.Namespace) -> int:
    """Check the preset's environment; print what was checked, its step time and its card; return 0."""
    # Lazy: keeps `qhlab --help` and every other command free of numpy and pyarrow.
    from qhlab.scenes.check import check_environment
    from qhlab.scenes.difficulty import card_lines

    result = check_environment(args.preset, scenes=args.scenes)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "described"}, sort_keys=True))
        return 0
    contract, timing = result["contract"], result["step_seconds"]
    fresh = (
        "and once more in a fresh interpreter"
        if contract["fresh_process"]
        else "(a built-in environment pinned by qhlab's own tests: not again in a fresh interpreter)"
    )
    print(
        f"environment {result['environment']}: the contract holds on {contract['scenes']} scenes; "
        f"{contract['steps'] // 3} (state, action) pairs, two deep, each stepped twice in a row, again in another "
        f"order {fresh}, gave the same successor and reward"
        + (
            f"; {contract['rollout_steps']} more repeated each action to the episode's end"
            if contract.get("rollout_steps")
            else ""
        )
    )
    starts = result["starts"]
    if starts["distinct"] == 1 and starts["drawn"] > 1:
        print(
            f"warning: starts: every one of the {starts['drawn']} scenes drawn starts in the same state: a "
            "validation drawn from this preset repeats TRAIN's scenes, and a study refuses it. HINT: spread the "
            "start (the task's reset options or kwargs)"
        )
    elif starts["distinct"] < starts["drawn"]:
        print(
            f"warning: starts: {starts['drawn']} scenes drawn start in only {starts['distinct']} distinct states: "
            f"too few for {starts['preset_scenes']} held-out scenes; a study refuses a validation whose scenes "
            "repeat each other's or TRAIN's starts. HINT: spread the start, or draw fewer scenes"
        )
    else:
        print(f"starts: the {starts['drawn']} scenes drawn start in {starts['distinct']} distinct states")
    optional = result["optional"]
    print(
        f"optional members: {', '.join(optional['declared']) or 'none'} declared; "
        f"{', '.join(optional['defaults']) or 'none'} left to qhlab's defaults (qhlab.scenes.contract.OptionalMembers)"
    )
    print(
        f"step time: median {timing['median'] * 1e3:.3f} ms, max {timing['max'] * 1e3:.3f} ms over "
        f"{timing['steps']} steps"
    )
    print("\n".join(card_lines(result["described"])))
    print("nothing was written: the card's population was drawn in a temporary directory and removed")
    return 0


COMMAND = Command(
    "env",
    help="try an environment before drawing a population from it",
    description="Checks on an environment a preset names, without publishing anything.",
    dest="env_command",
    subcommands=(
        Command(
            "check",
            help="run the contract, the determinism probes, a step timing and the card on a few scenes",
            description="Make the preset's environment and run the checks generation runs (the contract's members, "
            "shapes and dtypes; every step two deep taken twice, again in another order after other scenes, and for "
            "an environment qhlab does not pin, each action repeated to the episode's end and everything in a fresh "
            "interpreter), count the distinct starts of the preset's scenes, time its step, then draw a small "
            "population in a temporary directory to print its difficulty card and the tie_band, huber_delta and "
            "canary gap it suggests for a study; the directory is removed. This runs the environment's code.",
            arguments=_check_arguments,
            run=run_check,
        ),
    ),
)
