"""The ``qhlab`` command line: top-level parser, dispatch, error-to-exit-code mapping.

Owns: ``main(argv) -> int``, the command table, printing one ``error:`` line per failure, and
the "writes nothing" safety net (an output directory that a failed command created is removed
when the failure was bad input). Does not own: any command's arguments or behaviour; each
lives in its own module as a ``qhlab.cli.command.Command``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import shutil
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from qhlab import __version__
from qhlab.evidence import RECEIPT_SUFFIX, QhError, QhInputError
from qhlab.evidence.publish import storage_error
from qhlab.execution.signals import handling
from qhlab.training.console import configure_console

__all__ = ["build_parser", "main"]

# The command table: command -> "module:NAME" of its ``Command``. Only the invoked command's
# module is imported, so `qhlab verify` stays torch-free and fast.
_COMMANDS = {
    "profiles": "qhlab.cli.profiles:COMMAND",
    "scenes": "qhlab.cli.scenes:COMMAND",
    "env": "qhlab.cli.env:COMMAND",
    "fit": "qhlab.cli.fit:COMMAND",
    "commission": "qhlab.cli.commission:COMMAND",
    "study": "qhlab.cli.study:COMMAND",
    "tune": "qhlab.cli.prepare:TUNE",
    "pilot": "qhlab.cli.prepare:PILOT",
    "e0-check": "qhlab.cli.prepare:E0_CHECK",
    "plan": "qhlab.cli.prepare:PLAN",
    "verify": "qhlab.cli.verify:COMMAND",
    "sign": "qhlab.cli.sign:COMMAND",
}
_OUTPUT_ARGUMENTS = ("output", "out")
# Exit status of a command ended by SIGTERM (128 + SIGTERM, as a shell reports one it killed).
TERMINATED_EXIT = 143
# Exit status when the reader of stdout went away (`qhlab verify S | head -1`): 128 + SIGPIPE,
# what a shell reports for a program that a closed pipe ended, without a traceback.
BROKEN_PIPE_EXIT = 141


def _parser(groups: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qhlab",
        description="Finite-horizon Q-learning on physical scenes, with evidence that checks itself.",
    )
    parser.add_argument("--version", action="version", version=f"qhlab {__version__}")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="anywhere on the line: show third-party "
        "banners, tips, warnings and Lightning's progress bar (quiet by default)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in groups:
        module, _, name = _COMMANDS[group].partition(":")
        getattr(importlib.import_module(module), name).add_to(subparsers)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command line's parser, every command group imported (the docs' CLI reference)."""
    return _parser(list(_COMMANDS))


def _new_output_dirs(args: argparse.Namespace) -> list[Path]:
    paths = []
    for name in _OUTPUT_ARGUMENTS:
        value = getattr(args, name, None)
        if value is not None and not Path(value).exists():
            paths.append(Path(value))
    return paths


def os_error_message(call: str, exc: OSError) -> str:
    """The ``error:`` text of an OS error that reached the CLI: the path and the OS error."""
    where = exc.filename if exc.filename is not None else "a file"
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    return str(storage_error(call, where, exc))


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the command unwinds: its pool workers are
    stopped, its locks released and its staged files removed, as after Ctrl-C."""


_terminating = False


def _raise_terminated(signum: int, frame: object) -> None:
    # Once: a later SIGTERM would break the unwinding it started (stopping workers, releasing
    # locks), so it is ignored; SIGKILL still ends the process. A flag, not SIG_DFL, because a
    # fit's Lightning re-installs the handler it found when it tears down.
    global _terminating
    if not _terminating:
        _terminating = True
        raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run one qhlab command.

    Args:
        argv: arguments without the program name; None reads ``sys.argv[1:]``.

    Returns:
        The exit status: 0 success, 1 runtime failure (an OS error too: read-only or full
        storage), 2 bad input or failed authentication, 3 writer lock held by another
        process, 130 interrupted (Ctrl-C), 141 stdout closed by its reader (quiet, as a program
        ended by SIGPIPE), 143 terminated (SIGTERM; its pool workers are stopped first).
    """
    global _terminating
    argv = list(sys.argv[1:] if argv is None else argv)
    # --verbose may stand anywhere (before or after the command words).
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    groups = [argv[0]] if argv and argv[0] in _COMMANDS else list(_COMMANDS)
    try:
        parser = _parser(groups)
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    fresh_outputs = _new_output_dirs(args)

    configure_console(verbose)
    try:
        # SIGTERM unwinds the command (its pool workers stopped, its locks released) instead of
        # ending the process where it stands, which would orphan its workers.
        with handling(signal.SIGTERM, _raise_terminated):
            status = int(args.handler(args) or 0)
        # Flush here, not at interpreter exit, so a closed stdout is seen by the handler below.
        sys.stdout.flush()
        return status
    except BrokenPipeError as exc:
        if not _stdout_closed():
            print(f"error: {os_error_message(f'qhlab {args.command}', exc)}", file=sys.stderr)
            return 1
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except OSError as exc:
        # The storage refused (read-only file system, full disk, a file where a directory was
        # expected): one line naming the path and the OS error. Published files are write-once
        # through temporary names, so nothing half-written carries a published name.
        print(f"error: {os_error_message(f'qhlab {args.command}', exc)}", file=sys.stderr)
        return 1
    except QhError as exc:
        if isinstance(exc, QhInputError):
            for path in fresh_outputs:
                # Only what this refused command may have started: a directory that meanwhile
                # holds evidence was published by another process (a concurrent run) and stays.
                if path.exists() and not any(path.rglob(f"*{RECEIPT_SUFFIX}")):
                    shutil.rmtree(path, ignore_errors=True)
        if verbose and exc.__cause__ is not None:
            # An error raised in the user's own code: the whole traceback, then the one line.
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("error: terminated", file=sys.stderr)
        return TERMINATED_EXIT
    finally:
        _terminating = False
