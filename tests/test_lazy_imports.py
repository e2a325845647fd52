"""An import of a qhlab module inside a function is there for start-up cost only, and says so.

Read from the source with ``ast``. A module-level import of a qhlab module is the default; one
inside a function is allowed only when moving it to module level would make the importing
module load a costly third-party package it does not load today (``COSTLY``), and it carries a
``# Lazy:`` comment on the line above it (or above the first of a run of such imports) that says
why. No import is lazy to hide an import cycle: ``test_import_cycles`` counts function-level
imports too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import qhlab

ROOT = Path(qhlab.__file__).resolve().parent
# Third-party packages whose import a command that never trains, fits statistics or plots should
# not pay. Measured on the 2-core host, each in a fresh process: lightning.pytorch 5.0 s (torch
# included), torch 1.6 s, scipy.stats 1.2 s, wandb 1.1 s, matplotlib.pyplot 0.8 s, optuna 0.3 s,
# pyarrow 0.2 s, numpy 0.15 s (and `qhlab verify` must stay numpy-free); pymunk (0.04 s) and
# safetensors (under 0.01 s) are not worth a lazy import.
COSTLY = frozenset(
    {"torch", "lightning", "wandb", "ray", "matplotlib", "optuna", "scipy", "numpy", "pyarrow", "sqlalchemy"}
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not node.module:
        return []
    return [node.module, *(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)]


def _top_level(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    nodes = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            nodes.append(node)
        elif isinstance(node, ast.Try):
            nodes += [n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return nodes


def _graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(qhlab modules each module imports at module level, costly packages it imports directly)."""
    edges, costly = {}, {}
    for name, path in modules.items():
        edges[name], costly[name] = set(), set()
        for node in _top_level(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, modules):
                if target.split(".")[0] in COSTLY:
                    costly[name].add(target.split(".")[0])
                parts = target.split(".")
                edges[name] |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(modules)
    return edges, costly


def _loads(name: str, edges: dict[str, set[str]], costly: dict[str, set[str]]) -> set[str]:
    """The costly packages importing ``name`` loads (through module-level imports)."""
    seen, stack, found = {name}, [name], set()
    while stack:
        current = stack.pop()
        found |= costly[current]
        for nxt in edges[current] - seen:
            seen.add(nxt)
            stack.append(nxt)
    return found


def _lazy_imports(modules: dict[str, Path]):
    """Every function-level import of a qhlab module: (module, line, node, source lines)."""
    for name, path in sorted(modules.items()):
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    t.startswith("qhlab.") or t == "qhlab" for t in _targets(node, modules)
                ):
                    yield name, node, lines


def _reason(node: ast.AST, lines: list[str]) -> str | None:
    """The ``# Lazy:`` comment above ``node``, or above the run of imports it ends."""
    index = node.lineno - 2
    while index >= 0:
        text = lines[index].strip()
        if text.startswith("# Lazy:"):
            return text
        if not text or not (text.startswith(("from ", "import ", "#")) or text.endswith((",", "(", ")"))):
            return None
        index -= 1
    return None


def test_every_lazy_qhlab_import_saves_a_costly_package_and_says_so() -> None:
    modules = _modules()
    edges, costly = _graph(modules)
    offences = []
    for name, node, lines in _lazy_imports(modules):
        targets = [t for t in _targets(node, modules) if t in modules]
        saved = set().union(*(_loads(t, edges, costly) for t in targets)) - _loads(name, edges, costly)
        where = f"{modules[name].relative_to(ROOT.parent)}:{node.lineno}"
        if not saved:
            offences.append(
                f"{where}: {lines[node.lineno - 1].strip()} loads nothing costly; import it at module level"
            )
        elif _reason(node, lines) is None:
            offences.append(f"{where}: a lazy import (it saves {sorted(saved)}) without a '# Lazy:' reason above it")
    assert offences == []


def test_the_check_sees_a_needless_lazy_import(tmp_path, monkeypatch) -> None:
    package = tmp_path / "qhlab"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "light.py").write_text("X = 1\n")
    (package / "heavy.py").write_text("import torch\n")
    (package / "user.py").write_text(
        "def f():\n    from qhlab.light import X\n    return X\n\n"
        "def g():\n    # Lazy: torch costs seconds to import.\n    from qhlab.heavy import torch\n\n"
        "def h():\n    from qhlab.heavy import torch\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", package)
    modules = _modules()
    edges, costly = _graph(modules)
    verdicts = {}
    for name, node, lines in _lazy_imports(modules):
        saved = set().union(*(_loads(t, edges, costly) for t in _targets(node, modules) if t in modules))
        verdicts[node.lineno] = (sorted(saved - _loads(name, edges, costly)), _reason(node, lines) is not None)
    assert verdicts == {2: ([], False), 7: (["torch"], True), 10: (["torch"], False)}
