"""The pages that describe qhlab's code name only code that exists, and all of it.

``docs/guide/layout.md`` lists every sub-package of ``src/qhlab`` (and nothing that is not one) and
gives the import chain in the order of ``pyproject.toml``'s layer contract; every dotted
``qhlab.x.y`` name a page cites is a real module or attribute; the config reference is what the
models give now and has a section for every config a command reads.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "qhlab"
DOCS = ROOT / "docs"
LAYOUT = DOCS / "guide" / "layout.md"
# A dotted name starting at qhlab (not a path such as ``src/qhlab`` or ``~/.cache/qhlab``).
DOTTED = re.compile(r"(?<![\w./~-])qhlab(?:\.[A-Za-z_]\w*)+")


def _layout_entries() -> dict[str, str]:
    """{path the layout block lists: its whole text}, from the fenced block under "## Layout"."""
    block = LAYOUT.read_text(encoding="utf-8").split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    path = None
    for line in block.splitlines():
        if line and not line[0].isspace():
            path, _, text = line.partition(" ")
            entries[path] = text
        elif path is not None:
            entries[path] += " " + line.strip()
    return entries


def _sub_packages() -> list[Path]:
    """Every package directory below ``src/qhlab`` (``__init__.py``), relative to it."""
    return sorted(p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def test_the_layout_lists_every_sub_package_and_names_only_real_files():
    entries = _layout_entries()
    listed = {Path(p).relative_to("src/qhlab") for p in entries if p.startswith("src/qhlab/")}
    packages = _sub_packages()
    top = {p for p in packages if len(p.parts) == 1}
    assert listed == top, f"listed but no package: {sorted(listed - top)}; a package not listed: {sorted(top - listed)}"
    for nested in (p for p in packages if len(p.parts) > 1):
        # A nested package is named in its top package's entry, as "name/".
        assert f"{nested.name}/" in entries[f"src/qhlab/{nested.parts[0]}/"], nested
    for path, text in entries.items():
        assert (ROOT / path).exists(), path
        if not path.startswith("src/qhlab/"):
            continue
        package = ROOT / path
        # Every module file (``jobs.py``) and sub-path (``studies/architecture_study``) it names.
        for module in re.findall(r"\b(\w+\.py)\b", text):
            assert list(package.rglob(module)), f"{path}: names {module}, which is not in it"
        for sub in re.findall(r"\b(\w+/\w*)", text):
            head, _, tail = sub.partition("/")
            target = package / head / tail if tail else package / head
            assert target.is_dir() or target.with_suffix(".py").is_file(), f"{path}: names {sub}, which is not in it"
    scripts = entries["scripts/"]
    for script in (ROOT / "scripts").iterdir():
        assert script.name in scripts, f"scripts/{script.name} is not on the layout page"


def _chain_on_the_page() -> list[set[str]]:
    """The layout page's import chain, lowest layer first: each layer's package names."""
    text = " ".join(LAYOUT.read_text(encoding="utf-8").split())
    sentence = text.split("Imports point one way:", 1)[1].split("The layers are", 1)[0]
    # A layer's packages are its names in backticks, outside the parenthesis that says what it is.
    return [set(re.findall(r"`([\w.]+)`", re.sub(r"\([^)]*\)", "", layer))) for layer in sentence.split("<-")]


def _chain_of_the_contract() -> list[set[str]]:
    """``pyproject.toml``'s layers contract, lowest layer first; the science core's modules as one."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == "Imports point one way"]
    layers = []
    for layer in reversed(contract["layers"]):
        names = {n.strip().removeprefix("qhlab.") for n in re.split(r"[|:]", layer)}
        # The science core is listed module by module so that its studies package can sit on top.
        core = len(names) > 1 and all(n.startswith("finite_horizon.") for n in names)
        layers.append({"finite_horizon"} if core else names)
    return layers


def test_the_layout_gives_the_import_chain_of_the_layer_contract():
    assert _chain_on_the_page() == _chain_of_the_contract()


def _module_of(name: str) -> tuple[str, list[str]] | None:
    """The longest prefix of ``name`` that is a qhlab module file, and the attributes after it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = SRC.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts[:end]), parts[end:]
    return None


def _cited_names() -> dict[str, set[str]]:
    """{dotted qhlab name: the pages under docs/ that cite it}."""
    cited: dict[str, set[str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for match in DOTTED.finditer(page.read_text(encoding="utf-8")):
            cited.setdefault(match.group(), set()).add(str(page.relative_to(ROOT)))
    return cited


def test_every_dotted_qhlab_name_the_docs_cite_resolves():
    cited = _cited_names()
    assert len(cited) > 50  # the pattern finds the names the pages cite
    wrong = []
    for name, pages in sorted(cited.items()):
        found = _module_of(name)
        if found is None:
            wrong.append(f"{name} (no such module; cited in {sorted(pages)})")
            continue
        module, attributes = found
        value = importlib.import_module(module) if attributes else None
        for attribute in attributes:
            if not hasattr(value, attribute):
                wrong.append(f"{name} ({module} has no {'.'.join(attributes)}; cited in {sorted(pages)})")
                break
            value = getattr(value, attribute)
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_a_name_that_does_not_exist():
    assert _module_of("qhlab.finite_horizon.arm_source") == ("qhlab.finite_horizon", ["arm_source"])
    assert not hasattr(importlib.import_module("qhlab.finite_horizon"), "arm_source")
    assert _module_of("qhlab.nothing_here") == ("qhlab", ["nothing_here"])
    assert DOTTED.findall("see `qhlab.report.records`, src/qhlab/report and ~/.cache/qhlab.x") == [
        "qhlab.report.records"
    ]


@pytest.fixture(scope="module")
def reference_hook():
    """``docs/hooks/reference.py``, the generator of the reference pages, as a module."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_current_and_has_every_config(reference_hook):
    page = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    assert page == reference_hook._config_page(), "regenerate it with `python docs/hooks/reference.py`"
    # Every config model a command reads: the design package's and the recipe.
    models = ["QhRecipe"]
    for path in sorted((PACKAGE / "design").glob("*_config.py")):
        models += re.findall(r"^class (Qh\w+Config)\(", path.read_text(encoding="utf-8"), re.M)
    assert {"QhPlanConfig", "QhPilotConfig", "QhTuningConfig", "QhE0CheckConfig"} <= set(models)
    for model in models:
        assert f"### `{model}`\n" in page, model
    assert "## Plan config" in page and "| `target` | `PlanTarget` |" in page
