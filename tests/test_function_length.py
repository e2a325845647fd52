"""No function of qhlab is over 100 lines.

A long function is split into named steps, so that each reads top to bottom on one screen.
The length is counted from the ``def`` line to the function's last line (a nested function counts
in its enclosing one too), from the source's own syntax tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "qhlab"
LIMIT = 100


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """``"<path>:<line> <name> (<n> lines)"`` for every function in ``root``'s modules over ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_qhlab_is_over_100_lines():
    found = long_functions(SRC)
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_the_count_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n", encoding="utf-8")
    (found,) = long_functions(tmp_path)
    assert found.endswith(f"long ({LIMIT + 1} lines)")
    assert long_functions(tmp_path, limit=LIMIT + 1) == []
