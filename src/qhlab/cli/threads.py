"""``--threads N``: the torch intra-op thread count of a fitting command (``fit``, ``commission``).

Owns: ``add_torch_threads_argument``, ``checked_torch_threads`` and ``apply_torch_threads`` (through the
launcher's ``use_torch_threads``, the one place qhlab sets the count). A leaf module, so that the
command modules that use it never import the top-level parser back.
"""

from __future__ import annotations

import argparse

from qhlab.evidence import MAX_TORCH_THREADS, input_error

__all__ = ["add_torch_threads_argument", "apply_torch_threads", "checked_torch_threads"]


def add_torch_threads_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--threads N`` (torch intra-op threads of this fit process, default 1)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch intra-op threads for this fit (default 1: the small scorers run fastest on "
        "one thread, and CPU results are bit-identical only for the same thread count, which "
        "the fit receipt records)",
    )


def checked_torch_threads(args: argparse.Namespace) -> int:
    """``args.threads``, refused outside [1, ``MAX_TORCH_THREADS``] (``qhlab fit`` passes it to its fit)."""
    if not 1 <= args.threads <= MAX_TORCH_THREADS:
        raise input_error(
            f"qhlab {args.command}",
            "--threads",
            args.threads,
            f"an integer from 1 to {MAX_TORCH_THREADS}",
            "one thread is the default and fastest for the demo scorers.",
        )
    return args.threads


def apply_torch_threads(args: argparse.Namespace) -> None:
    """Set this process's torch intra-op threads from ``args.threads`` (``checked_torch_threads``)."""
    threads = checked_torch_threads(args)
    # Lazy: only fit commands need torch and Lightning.
    from qhlab.training.launcher import use_torch_threads

    use_torch_threads(threads)
