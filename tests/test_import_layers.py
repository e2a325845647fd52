"""Imports point one way: evidence <- execution <- scenes / training <- finite_horizon <- cli.

Read from the source with ``ast`` (every ``import``/``from`` anywhere in a module, including
inside functions), so a lazy import that breaks the layering is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qhlab

ROOT = Path(qhlab.__file__).resolve().parent
# What each sub-package may import from qhlab (besides itself and the top-level ``qhlab``).
ALLOWED = {
    "evidence": set(),
    "execution": {"evidence"},
    "scenes": {"evidence", "execution"},
    "training": {"evidence", "execution"},
    "finite_horizon": {"evidence", "execution", "scenes", "training"},
    "cli": {"evidence", "execution", "scenes", "training", "finite_horizon"},
}


def _qhlab_imports(path: Path) -> set[str]:
    """The qhlab sub-packages a module imports; ``"<relative>"`` for a relative import (qhlab
    uses absolute imports only, so a relative one is reported rather than resolved)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("<relative>")
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "qhlab":
            names = [f"qhlab.{a.name}" for a in node.names]  # from qhlab import cli
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            names = []
        found |= {n.split(".")[1] for n in names if n.startswith("qhlab.")}
    return found


def test_every_subpackage_imports_only_the_layers_below_it() -> None:
    offences = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            # qhlab/__init__.py holds only the version: every layer may read it.
            for imported in _qhlab_imports(path) - allowed - {package, "__version__"}:
                offences.append(f"{path.relative_to(ROOT)} imports qhlab.{imported}")
    assert offences == []
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(ALLOWED)


def test_the_checker_sees_a_lazy_import_inside_a_function(tmp_path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from qhlab.cli import main\n    import qhlab.training.launcher\n"
                      "    from qhlab import scenes\n    from . import x\n    from qhlab import __version__\n")
    assert _qhlab_imports(module) == {"cli", "training", "scenes", "<relative>", "__version__"}
