"""Every config kind, fuzzed: an input is accepted, or refused with exit 2, one ``error:`` line
and nothing written; never a traceback.

Each example takes a real example config (the study, tuning, pilot, plan, E0 check, recipe, preset
and Gymnasium preset kinds; a preset is read with its environment made from its options), replaces
one of its values, found anywhere in it, with an arbitrary TOML value, and reads it with the kind's
own reader. A refused example is then run through its command, which must exit 2 with one error
line and leave its output unmade. An accepted plan is run too (it fits nothing): it publishes its
plan (exit 0, or 1 when no design reaches the target) or refuses in one line. An accepted pilot is
run up to its fits, which are replaced by a stop: every check the command makes before it fits
runs on the edited config. Numbers get one rule in every kind: a boolean or a quoted number is
never one. Hypothesis runs derandomized, so the examples are the same on every run.
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

from config_mutations import TOML_VALUES, alike, cartpole_preset, leaves, replaced
from qhlab.cli import main
from qhlab.design.config_files import load_recipe
from qhlab.design.e0_config import read_e0_config
from qhlab.design.pilot_config import read_pilot_config
from qhlab.design.plan_config import read_plan_config
from qhlab.design.study_config import read_study_config
from qhlab.design.tuning_config import read_tuning_config
from qhlab.evidence import QhError, QhInputError
from qhlab.scenes import load_preset
from qhlab.scenes.environment import Environment
from qhlab.scenes.population import environment_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PRESETS = ROOT / "src" / "qhlab" / "scenes" / "presets"

PILOT = {"name": "fuzz-pilot", "study": "study.toml", "seeds": [2, 3], "workers": 1, "population_cache": "pops"}
PILOT.update(train={"preset": "tiny", "seed": 7}, validation={"preset": "tiny", "seed": 9})
E0 = {"name": "fuzz-e0", "study": "study.toml", "train_seeds": [21, 22, 23], "min_pass_share": 0.5, "workers": 1}
# The demo study's plan, its records named by absolute path (the file is written elsewhere).
PLAN = {
    "name": "fuzz-plan",
    "study": str(EXAMPLES / "default-study.toml"),
    "pilot": str(EXAMPLES / "preparation" / "demo-pilot" / "pilot.json"),
    "tuning": str(EXAMPLES / "preparation" / "demo-tune" / "tuning.json"),
    "validation_scenes": [960, 1920],
    "target": {"d_reg": 0.003, "d_mae": 0.005},
}


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
    "plan": ("plan.toml", lambda: dict(PLAN), read_plan_config, lambda f, out: ["plan", f, "--output", out]),
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
    "gymnasium": (
        "preset.toml",
        cartpole_preset,
        lambda file: Environment.make(environment_spec(load_preset(file))),
        lambda f, out: ["scenes", "generate", "--preset", f, "--split", "train", "--seed", "0", "--out", out],
    ),
}


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


_FITS_STOPPED = "fuzz: the pilot reached its fits"


def _stop_at_the_fits(*args, **kwargs):
    """Stands in for the pilot's fits: everything before them has run (``run_fits``)."""
    raise QhError(_FITS_STOPPED)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One population cache for every example, so that a pilot labels its tiny populations once."""
    return tmp_path_factory.mktemp("population-cache")


def _run_accepted(kind: str, file: Path, output: Path, label: tuple) -> None:
    """Run an accepted plan or pilot: published, stopped at the fits, or refused in one line."""
    code, err = _command(KINDS[kind][3](str(file), str(output)))
    assert "Traceback" not in err and err.count("error:") <= 1, (*label, err)
    if code == 2:
        assert err.count("error:") == 1 and not output.exists(), (*label, err)
    elif kind == "pilot":
        assert code == 1 and _FITS_STOPPED in err, (*label, code, err)
    else:
        # A plan is published whether or not a design reaches its target (exit 1 when none does).
        assert code in (0, 1) and err == "" and (output / "plan.json").is_file(), (*label, code, err)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_edited_config_is_accepted_or_refused_in_one_line(
    tmp_path_factory, monkeypatch, shared_cache, kind, data
) -> None:
    monkeypatch.setattr("qhlab.preparation.pilot.run_fits", _stop_at_the_fits)
    _, base, reader, command = KINDS[kind]
    document = base()
    if "population_cache" in document:
        document["population_cache"] = str(shared_cache)
    paths = [path for path, _ in leaves(document)]
    path = data.draw(st.sampled_from(paths), label="field")
    value = data.draw(st.one_of(TOML_VALUES, alike(dict(leaves(document))[path])), label="value")
    directory = tmp_path_factory.mktemp(kind)
    file = _write(directory, kind, replaced(document, path, value))
    output = directory / "out"
    try:
        reader(file)
    except QhInputError:
        if command is None:
            return
        code, err = _command(command(str(file), str(output)))
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, (path, value, err)
        assert not output.exists(), (path, value)
        return
    if kind in ("plan", "pilot"):
        _run_accepted(kind, file, output, (path, value))


# A Gymnasium task's own arguments (``gymnasium.make``'s kwargs, ``reset(options=...)``): passed
# through as TOML typed them, for the task to read; their types are the task's, not qhlab's.
_TASKS_OWN = {("environment", "options", "kwargs"), ("environment", "options", "reset")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_boolean_or_a_quoted_number_is_never_a_number(tmp_path, kind) -> None:
    _, base, reader, _ = KINDS[kind]
    document = base()
    numbers = [
        (p, v)
        for p, v in leaves(document)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and p[:3] not in _TASKS_OWN
    ]
    assert numbers, kind
    for path, value in numbers:
        for fake in (True, str(value)):
            file = _write(tmp_path, kind, replaced(document, path, fake))
            with pytest.raises(QhInputError) as info:
                reader(file)
            assert ".".join(str(p) for p in path[-1:]) in str(info.value), (path, fake, str(info.value))
