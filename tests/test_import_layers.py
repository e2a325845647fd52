"""No import cycle between qhlab's modules, counting imports inside functions.

Read from the source with ``ast`` (every ``import``/``from`` anywhere in a module, including
inside functions, and module names given as strings to ``importlib``), so a lazy import that
hides a cycle from Python is caught too. The layers themselves (imports point one way) are
import-linter's contracts in ``pyproject.toml``, which ``make test`` runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qhlab

ROOT = Path(qhlab.__file__).resolve().parent


def _module_graph() -> dict[str, set[str]]:
    """{qhlab module: the qhlab modules it imports anywhere in its file}. ``from pkg import name``
    is an edge to ``pkg.name`` when that is a module, else to ``pkg``; a string that names a
    qhlab module (``"module"`` or ``"module:NAME"``) is an edge too (``importlib.import_module``
    through a table of names)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # "module" or "module:NAME" (the command table's entries).
                edges.add(node.value.partition(":")[0])
        graph[name] = {e for e in edges if e in modules} - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_back_through_others() -> None:
    # Imports inside functions count: a lazy import hides a cycle from Python, not from readers.
    assert import_cycles(_module_graph()) == []


def test_the_graph_sees_a_module_imported_by_name() -> None:
    # qhlab.cli imports each command group through importlib, by the names in its table.
    assert "qhlab.cli.fit" in _module_graph()["qhlab.cli"]


def test_the_cycle_finder_sees_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_seed_api_study_path_is_a_thin_alias_of_the_application():
    import inspect
    import subprocess
    import sys

    from qhlab.application import architecture_study as application
    from qhlab.finite_horizon.studies import architecture_study as seed

    # Every public name is the application's own object (so the same signatures), and no code of its own.
    assert len(seed.__all__) == 8
    for name in seed.__all__:
        assert getattr(seed, name) is getattr(application, name), name
    assert inspect.signature(seed.run_fit) == inspect.signature(application.run_fit)
    defined = [n for n in ast.walk(ast.parse(Path(seed.__file__).read_text())) if isinstance(n, ast.FunctionDef)]
    assert defined == []
    # `python -m` on either path runs the same main: the same refusal, line and exit status.
    runs = [
        subprocess.run(
            [sys.executable, "-m", module, "freeze", "/nonexistent/study.toml", "--output", "/nonexistent/out"],
            capture_output=True,
            text=True,
        )
        for module in ("qhlab.finite_horizon.studies.architecture_study", "qhlab.application.architecture_study")
    ]
    assert runs[0].returncode == runs[1].returncode == 2, runs
    assert runs[0].stderr == runs[1].stderr and runs[0].stderr.startswith("error: architecture_study: config_path="), (
        runs[0].stderr
    )


def _toml_importers(sources: dict[str, str]) -> list[str]:
    """The names of the sources that import ``tomllib`` anywhere (a config file's parser)."""
    found = []
    for name, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                imported = [node.module or ""]
            if any(m == "tomllib" or m.startswith("tomllib.") for m in imported):
                found.append(name)
                break
    return found


def test_the_science_core_parses_no_config_file() -> None:
    core = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "finite_horizon").rglob("*.py")}
    assert len(core) > 20
    assert _toml_importers(core) == []
    # The kit in design is the parser, and a recipe file is read there.
    kit = (ROOT / "design" / "config_files.py").read_text(encoding="utf-8")
    assert _toml_importers({"config_files": kit}) == ["config_files"]
    assert "def load_recipe(" in kit
    # A lazy import inside a function is seen as well.
    assert _toml_importers({"lazy": "def f():\n    from tomllib import loads\n    return loads('')\n"}) == ["lazy"]
