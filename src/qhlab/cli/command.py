"""One row of the command table: a command's name, texts, arguments and what runs it.

Owns: ``Command`` and adding one to an argparse parser. Does not own: which commands exist
(``qhlab.cli._COMMANDS``), any command's arguments or behaviour (each command's module), error
printing or exit codes (``qhlab.cli.main``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """A command of the ``qhlab`` line, or a group of subcommands.

    Attributes:
        name: the word that names it (``fit``, ``generate``).
        help: one line for the list of commands.
        description: what its ``--help`` says it does.
        arguments: adds its positional arguments and options to its parser.
        run: what runs it with the parsed arguments and returns the exit status; None for a group.
        subcommands: a group's commands, chosen by the word after its name (``dest`` names it).
        dest: the namespace attribute that holds the chosen subcommand's name.
    """

    name: str
    help: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[argparse.Namespace], int] | None = None
    subcommands: Sequence[Command] = ()
    dest: str | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (not self.subcommands) or (self.subcommands and self.dest is None):
            raise ValueError(
                f"Command({self.name!r}): run={self.run!r} with {len(self.subcommands)} subcommands and "
                f"dest={self.dest!r} is not allowed; allowed: a run and no subcommands, or subcommands, a "
                "dest and no run. HINT: a group runs what its chosen subcommand runs."
            )

    def add_to(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add this command (and its subcommands) to ``subparsers``; returns its parser."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description)
        if self.arguments is not None:
            self.arguments(parser)
        if self.subcommands:
            words = parser.add_subparsers(dest=self.dest, metavar="SUBCOMMAND", required=True)
            for command in self.subcommands:
                command.add_to(words)
        else:
            parser.set_defaults(handler=self.run)
        return parser
