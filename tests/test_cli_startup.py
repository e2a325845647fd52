"""The command line starts without torch, Lightning or W&B wherever it trains nothing.

Each command runs in a fresh interpreter (``qhlab.cli.main``), which then prints the heavy
packages it loaded: ``qhlab --help``, ``--version`` and every ``--help`` build their parsers
from torch-free modules; ``qhlab verify`` and ``qhlab study status`` read receipts only.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qhlab.cli import build_parser

HEAVY = ("torch", "lightning", "wandb")
_PROBE = """
import contextlib, io, json, sys
from qhlab.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "loaded": sorted(m for m in HEAVY if m in sys.modules)}))
""".replace("HEAVY", repr(HEAVY))


def _loaded(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _every_help() -> list[list[str]]:
    """``--help`` of every command and every study step, as the parser has them."""
    parser = build_parser()
    groups = next(a for a in parser._actions if a.dest == "command").choices
    helps = [["--help"], ["--version"]]
    for name, sub in groups.items():
        helps.append([name, "--help"])
        for action in sub._actions:
            if getattr(action, "choices", None) and action.dest.endswith("command"):
                helps += [[name, step, "--help"] for step in action.choices]
    return helps


@pytest.mark.parametrize("argv", _every_help(), ids=" ".join)
def test_help_and_version_import_no_torch_lightning_or_wandb(argv: list[str]) -> None:
    result = _loaded(*argv)
    assert result == {"code": 0, "loaded": []}


def test_the_probe_sees_a_command_that_does_load_torch(tmp_path) -> None:
    # A fit's profile admission imports torch: the probe must report it (the check can fail).
    result = _loaded("profiles")
    assert "torch" in result["loaded"]


def test_a_command_row_is_either_a_command_or_a_group() -> None:
    from qhlab.cli.command import Command

    def run(args):
        return 0

    with pytest.raises(ValueError, match=r"Command\('x'\): run=None with 0 subcommands"):
        Command("x", help="h", description="d")
    with pytest.raises(ValueError, match="allowed: a run and no subcommands"):
        Command("x", help="h", description="d", run=run, subcommands=(Command("y", "h", "d", run=run),), dest="w")
    with pytest.raises(ValueError, match="dest=None"):
        Command("x", help="h", description="d", subcommands=(Command("y", "h", "d", run=run),))


def test_the_table_builds_every_command_and_a_group_dispatches_to_its_subcommand() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert sorted(commands) == [
        "commission",
        "e0-check",
        "env",
        "fit",
        "pilot",
        "plan",
        "profiles",
        "scenes",
        "sign",
        "study",
        "tune",
        "verify",
    ]
    from qhlab.cli import scenes

    args = parser.parse_args(["scenes", "describe", "POP", "--json"])
    assert (args.scenes_command, args.population, args.json, args.handler) == (
        "describe",
        "POP",
        True,
        scenes.run_describe,
    )
    args = parser.parse_args(["pilot", "p.toml", "--output", "o"])
    assert (args.tool, args.handler.__module__) == ("pilot", "qhlab.cli.prepare")
