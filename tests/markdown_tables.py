"""A reader's check of markdown tables: every row has as many cells as its header names.

Owns: ``markdown_tables`` (every pipe table of a markdown text, as its lines' cells) and
``table_mismatches`` (each table line whose cell count is not its header's). Shared by the tests
that render ``report.md`` (``pythonpath = ["tests"]``). Does not own: what a table says.
"""

from __future__ import annotations

import re

__all__ = ["markdown_tables", "row_cells", "table_mismatches"]

# A cell boundary: a pipe that is neither escaped (``\|``) nor inside a code span.
_CODE_SPAN = re.compile(r"`[^`]*`")


def row_cells(line: str) -> list[str]:
    """The cells of one table line ``| a | b |`` (a pipe in a code span or escaped is text)."""
    # Blank out code spans and escaped pipes (keeping their length) so that only boundaries remain.
    masked = _CODE_SPAN.sub(lambda m: "x" * len(m.group()), line.replace("\\|", "xx"))
    bounds = [i for i, char in enumerate(masked) if char == "|"]
    stripped = line.strip()
    if not stripped.startswith("|") or not stripped.endswith("|") or len(bounds) < 2:
        return [line.strip()]
    return [line[a + 1 : b].strip() for a, b in zip(bounds, bounds[1:])]


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table of ``text`` (outside fenced code): a list of its lines' cells, header first."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.lstrip().startswith("|"):
            current.append(row_cells(line))
            continue
        if current:
            tables.append(current)
            current = []
    return tables


def table_mismatches(text: str) -> list[str]:
    """Each table line of ``text`` whose cell count differs from its header's (empty: all agree)."""
    problems = []
    for number, rows in enumerate(markdown_tables(text), start=1):
        header = rows[0]
        if len(rows) < 2 or not all(re.fullmatch(r":?-{3,}:?", cell) for cell in rows[1]):
            problems.append(f"table {number} ({header}): no separator line under its header")
        for row in rows[1:]:
            if len(row) != len(header):
                problems.append(f"table {number} ({header}): {len(row)} cells in {row}, {len(header)} headers")
    return problems
