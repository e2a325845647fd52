"""What the config fuzz tests edit and with what: a TOML document's values, and values to put there.

Owns: ``leaves`` (every scalar of a TOML document, by path), ``replaced`` (a copy with one of them
replaced), ``TOML_VALUES`` (arbitrary TOML values), ``alike`` (values of the kind a field has,
near it: most pass the reader, so that the command behind it runs) and ``cartpole_preset`` (the
CartPole preset ``docs/how-to/gymnasium.md`` shows, read from that page). Shared by
``test_config_fuzz.py`` and ``test_cli_fuzz.py`` (``pythonpath = ["tests"]``). Does not own: what
a test expects of a command.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import tomli_w
from hypothesis import strategies as st

__all__ = ["TOML_VALUES", "alike", "cartpole_preset", "leaves", "replaced"]

ROOT = Path(__file__).resolve().parents[1]

TOML_VALUES = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=12),
        st.sampled_from(["0.5", "1", "tiny", "x.toml", "../", "cpu-fp32", "uniform"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=2)),
    max_leaves=4,
)


def leaves(node, path=()):
    """Every (path, value) of a TOML document's scalars and lists of scalars."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))
    else:
        yield path, node


def replaced(document: dict, path: tuple, value) -> dict:
    """A copy of ``document`` with the value at ``path`` replaced by ``value``."""
    copy = tomllib.loads(tomli_w.dumps(document))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


def alike(value) -> st.SearchStrategy:
    """Values of the kind ``value`` has, near it: most pass the reader, so that the command runs them."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=-1, max_value=max(64, 2 * abs(value)))
    if isinstance(value, float):
        return st.floats(min_value=-0.5, max_value=max(1.0, 2 * abs(value)), allow_nan=False)
    if isinstance(value, str):
        # Never "ray": a pilot accepted with it would start a Ray cluster before its fits.
        return st.sampled_from([value, "", f"{value}-x", f"../{value}", "tiny", "local", "cpu-fp32"])
    numbers = isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if numbers and value:
        return st.lists(alike(value[0]), max_size=4)
    return TOML_VALUES


def cartpole_preset(scenes: int = 2) -> dict:
    """The ``cartpole.toml`` preset of docs/how-to/gymnasium.md, with ``scenes`` scenes."""
    page = (ROOT / "docs" / "how-to" / "gymnasium.md").read_text(encoding="utf-8")
    block = re.search(r"`cartpole\.toml`:\s*```toml\n(.*?)```", page, re.S)
    assert block is not None, "docs/how-to/gymnasium.md no longer shows cartpole.toml"
    return {**tomllib.loads(block.group(1)), "scenes": scenes}
