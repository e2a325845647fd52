"""Step 5, benchmarks: time each finished cell's final scorer and publish one receipt per cell.

Owns: ``benchmark_cells`` (on an authenticated study: every declared cell, or one; finished
receipts are verified and skipped; each new one runs
``qhlab.finite_horizon.benchmark.benchmark_scorer`` on the cell's attempt with the study's
thread count and publishes ``benchmarks/<cell>.receipt.json`` once). Does not own: the
measurement (``qhlab.finite_horizon.benchmark``).
"""

from __future__ import annotations

from collections.abc import Callable

from qhlab.design.study_records import StudyBenchmarkReceipt
from qhlab.evidence import PublishConflictError, input_error, read_receipt, write_receipt
from qhlab.evidence.layout import CELLS_DIR, benchmark_receipt_path, cell_name
from qhlab.finite_horizon.benchmark import benchmark_scorer
from qhlab.study.authentication import FrozenStudy, authenticate_development, read_cell_receipts

__all__ = ["benchmark_cells"]


def benchmark_cells(
    frozen: FrozenStudy,
    variant: str | None,
    seed: int | None,
    *,
    on_result: Callable[[str, int, dict], None] | None = None,
) -> None:
    """Benchmark one cell (``variant`` and ``seed``) or every declared cell (both None).

    For every cell, a benchmark receipt that already exists is authenticated and skipped; a
    single named cell is always benchmarked (and refused if already done).

    Args:
        frozen: the authenticated study (its development record is authenticated once on it).
        variant: a declared arm, or None with ``seed`` None.
        seed: a declared seed, or None with ``variant`` None.
        on_result: called as ``on_result(arm, seed, result)`` after each new benchmark.
    """
    if (variant is None) != (seed is None):
        raise input_error(
            "benchmark", "--variant/--seed", (variant, seed), "both or neither", "omit both to benchmark every cell"
        )
    authenticate_development(frozen, "benchmark")
    wanted = [(variant, seed)] if variant is not None else list(frozen.config.cells)
    for arm, s in wanted:
        path = benchmark_receipt_path(frozen.output, arm, s)
        if path.exists() and variant is None:
            read_receipt(path, StudyBenchmarkReceipt)
            continue
        result = _benchmark_cell(frozen, arm, s)
        if on_result is not None:
            on_result(arm, s, result)


def _benchmark_cell(frozen: FrozenStudy, arm: str, seed: int) -> dict:
    """Benchmark one finished broad cell and publish ``benchmarks/<cell>.receipt.json``.

    Returns:
        The ``benchmark_scorer`` result (the receipt body without the cell's identity).

    Raises:
        PublishConflictError: the cell is already benchmarked.
    """
    # Lazy: keeps importing this module free of torch.
    from qhlab.training.launcher import use_torch_threads

    cells = read_cell_receipts(frozen, [(arm, seed)], "benchmark")
    cell = cell_name(arm, seed)
    path = benchmark_receipt_path(frozen.output, arm, seed)
    if path.exists():
        raise PublishConflictError(f"benchmark: {path} already exists; cell {cell} is benchmarked once.")
    document = cells[(arm, seed)]["document"]
    attempt = frozen.output / CELLS_DIR / cell / document.body.attempt
    use_torch_threads(frozen.config.torch_threads)
    result = benchmark_scorer(attempt, frozen.train_population())
    path.parent.mkdir(exist_ok=True)
    write_receipt(
        path,
        StudyBenchmarkReceipt,
        body={"cell": cell, "arm": arm, "seed": seed, **result},
        inputs={"freeze": frozen.receipt_path, "cell": cells[(arm, seed)]["path"]},
    )
    return result
