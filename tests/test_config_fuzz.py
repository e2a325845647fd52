"""Every config kind, fuzzed: an input is accepted, or refused with exit 2, one ``error:`` line
and nothing written; never a traceback.

Each example takes a real example config (the study, tuning, pilot, E0 check, recipe and preset
kinds; a preset is read with its environment made from its options), replaces one of its values,
found anywhere in it, with an arbitrary TOML value, and reads it with the kind's own reader. A
refused example is then run through its command, which must exit 2 with one error line and leave
its output unmade. Numbers get one rule in every kind: a boolean or a quoted number is never one.
Hypothesis runs derandomized, so the examples are the same on every run.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qhlab.cli import main
from qhlab.design.e0_config import read_e0_config
from qhlab.design.pilot_config import read_pilot_config
from qhlab.design.study_config import read_study_config
from qhlab.design.tuning_config import read_tuning_config
from qhlab.evidence import QhInputError
from qhlab.finite_horizon.recipe import load_recipe
from qhlab.scenes import load_preset
from qhlab.scenes.environment import Environment
from qhlab.scenes.population import environment_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PRESETS = ROOT / "src" / "qhlab" / "scenes" / "presets"

PILOT = {"name": "fuzz-pilot", "study": "study.toml", "seeds": [2, 3], "workers": 1, "population_cache": "pops"}
PILOT.update(train={"preset": "tiny", "seed": 7}, validation={"preset": "tiny", "seed": 9})
E0 = {"name": "fuzz-e0", "study": "study.toml", "train_seeds": [21, 22, 23], "min_pass_share": 0.5, "workers": 1}


def _study() -> dict:
    raw = tomllib.loads((EXAMPLES / "first-study.toml").read_text())
    raw["population_cache"] = "pops"
    return raw


# kind: (file name, base document, reader, command that reads the file and writes --output)
KINDS = {
    "study": ("study.toml", _study, read_study_config, lambda f, out: ["study", "freeze", f, "--output", out]),
    "tune": (
        "tune.toml",
        lambda: {**tomllib.loads((EXAMPLES / "tiny-tune.toml").read_text()), "population_cache": "pops"},
        read_tuning_config,
        lambda f, out: ["tune", f, "--output", out],
    ),
    "pilot": ("pilot.toml", lambda: dict(PILOT), read_pilot_config, lambda f, out: ["pilot", f, "--output", out]),
    "e0": ("e0.toml", lambda: dict(E0), read_e0_config, lambda f, out: ["e0-check", f, "--output", out]),
    "recipe": (
        "recipe.toml",
        lambda: tomllib.loads((EXAMPLES / "tiny-recipe.toml").read_text()),
        load_recipe,
        None,
    ),
    "preset": (
        "preset.toml",
        lambda: tomllib.loads((PRESETS / "tiny.toml").read_text()),
        lambda file: Environment.make(environment_spec(load_preset(file))),
        lambda f, out: ["scenes", "generate", "--preset", f, "--split", "train", "--seed", "0", "--out", out],
    ),
}


def _leaves(node, path=()):
    """Every (path, value) of a TOML document's scalars and lists of scalars."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path, node


def _replaced(document: dict, path: tuple, value) -> dict:
    copy = tomllib.loads(tomli_w.dumps(document))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


def _write(directory: Path, kind: str, document: dict) -> Path:
    """The kind's file in ``directory``, with what it names beside it."""
    name = KINDS[kind][0]
    if kind in ("pilot", "e0"):
        (directory / "study.toml").write_text(tomli_w.dumps(_study()))
    if kind == "tune":
        shutil.copy(EXAMPLES / "tiny-recipe.toml", directory / "tiny-recipe.toml")
    (directory / name).write_text(tomli_w.dumps(document))
    return directory / name


def _command(argv: list[str]) -> tuple[int, str]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    return code, err.getvalue()


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


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_edited_config_is_accepted_or_refused_in_one_line(tmp_path_factory, kind, data) -> None:
    _, base, reader, command = KINDS[kind]
    document = base()
    paths = [path for path, _ in _leaves(document)]
    path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(TOML_VALUES, label="value")
    directory = tmp_path_factory.mktemp(kind)
    file = _write(directory, kind, _replaced(document, path, value))
    try:
        reader(file)
    except QhInputError:
        if command is None:
            return
        output = directory / "out"
        code, err = _command(command(str(file), str(output)))
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, (path, value, err)
        assert not output.exists(), (path, value)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_boolean_or_a_quoted_number_is_never_a_number(tmp_path, kind) -> None:
    _, base, reader, _ = KINDS[kind]
    document = base()
    numbers = [(p, v) for p, v in _leaves(document) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers, kind
    for path, value in numbers:
        for fake in (True, str(value)):
            file = _write(tmp_path, kind, _replaced(document, path, fake))
            with pytest.raises(QhInputError) as info:
                reader(file)
            assert ".".join(str(p) for p in path[-1:]) in str(info.value), (path, fake, str(info.value))
