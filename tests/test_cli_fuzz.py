"""Command lines and environments, fuzzed: accepted, or refused with one ``error:`` line; never a traceback.

The command-line family draws a command from qhlab's own parser and gives its arguments and
options arbitrary values (numbers, negative numbers, words, paths that do not exist, empty
strings); the run must end with an exit status and, when it refuses, exactly one ``error:`` line
(argparse's own usage errors exit 2 too) and no traceback. The environment family writes the
researcher's own environment (``user_environment.HOPPER``) with one contract member replaced by an
arbitrary value, and generates from it: a population, or one refusal naming the environment. The
preset family gives ``qhlab env check`` a preset file (the tiny puck preset, and the CartPole
preset of docs/how-to/gymnasium.md) with one value replaced: it prints its checks and card, or
refuses in one line, and writes nothing. Hypothesis runs derandomized, so the examples are the
same on every run.
"""

from __future__ import annotations

import contextlib
import io
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from config_mutations import TOML_VALUES, alike, cartpole_preset, leaves, replaced
from qhlab.cli import build_parser, main
from qhlab.evidence import QhInputError
from qhlab.scenes import load_preset
from user_environment import write_hopper

TINY = Path(__file__).resolve().parents[1] / "src" / "qhlab" / "scenes" / "presets" / "tiny.toml"

# Commands whose every run with arbitrary arguments stays short: each either refuses its input
# or reads a directory that does not exist. (Commands that would train on a valid draw are left
# to the config fuzz, which feeds them refused configs only.)
_COMMANDS = [
    ["scenes", "generate"],
    ["scenes", "describe"],
    ["scenes", "audit"],
    ["env", "check"],
    ["plan"],
    ["pilot"],
    ["study", "status"],
    ["study", "report"],
    ["study", "export"],
    ["verify"],
    ["sign"],
    ["profiles"],
]
_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", "-1", "0", "nan", "inf", "1e309", "tiny", "train", "none", "--", "\x7f", "ü"]),
    st.text(alphabet="abc/._-~", min_size=1, max_size=12).map(lambda t: "/nonexistent/" + t),
)


def _options(words: list[str]) -> list[str]:
    """The option strings of the subparser ``words`` names."""
    parser = build_parser()
    for word in words:
        action = next(a for a in parser._actions if getattr(a, "choices", None) and word in a.choices)
        parser = action.choices[word]
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_arbitrary_command_line_exits_with_one_line_never_a_traceback(tmp_path, monkeypatch, data) -> None:
    monkeypatch.chdir(tmp_path)
    words = data.draw(st.sampled_from(_COMMANDS))
    options = _options(words)
    argv = list(words) + data.draw(st.lists(_VALUES, max_size=2))
    for option in data.draw(st.lists(st.sampled_from(options), max_size=3, unique=True)) if options else []:
        argv += [option, data.draw(_VALUES)]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    assert isinstance(code, int), (argv, code)
    if code != 0:
        assert text.count("error:") == 1, (argv, text)
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")], argv


# Contract members and what replaces them: arbitrary values of the wrong kind, sizes out of range,
# a method that is not callable.
_MEMBERS = ["object_features", "goal_features", "candidate_features", "max_objects", "max_candidates",
            "identity", "state_column", "reference_candidate", "reward_unit", "sample_scene", "step"]  # fmt: skip
_REPLACEMENTS = st.one_of(
    st.integers(min_value=-5, max_value=10**7),
    st.sampled_from(["None", "True", "1.5", "'x'", "''", "{}", "{'name': 1}", "[1, 2]", "float('nan')", "'uniform'"]),
)


@pytest.mark.parametrize("member", _MEMBERS)
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_REPLACEMENTS)
def test_an_environment_with_a_broken_member_is_generated_or_refused_in_one_line(tmp_path_factory, member, value):
    root = tmp_path_factory.mktemp("env")
    preset = write_hopper(root / "env")
    source = root / "env" / "hopper.py"
    # The member set once more after the class body (last assignment wins), whatever its value.
    text = source.read_text().replace("\ndef make(options):", f"\nHopper.{member} = {value}\n\n\ndef make(options):")
    source.write_text(text)
    out = root / "pop"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["scenes", "generate", "--preset", str(preset), "--split", "train", "--seed", "0",
                     "--out", str(out), "--workers", "1", "--no-progress"])  # fmt: skip
    text = err.getvalue()
    assert "Traceback" not in text, text
    if code == 0:
        assert (out / "manifest.json").is_file()
    else:
        assert code == 2 and text.count("error:") == 1 and not out.exists(), text


# The presets the family edits, each as a TOML document.
_PRESETS = {"tiny": lambda: tomllib.loads(TINY.read_text()), "cartpole": cartpole_preset}


@pytest.mark.parametrize("preset", sorted(_PRESETS))
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_env_check_of_an_edited_preset_exits_with_one_line_never_a_traceback(tmp_path_factory, preset, data):
    document = _PRESETS[preset]()
    paths = [path for path, _ in leaves(document)]
    path = data.draw(st.sampled_from(paths), label="field")
    # Values like the field's first: most of them pass the reader, so that the check runs.
    value = data.draw(st.one_of(alike(dict(leaves(document))[path]), TOML_VALUES), label="value")
    directory = tmp_path_factory.mktemp("preset")
    file = directory / "preset.toml"
    file.write_text(tomli_w.dumps(replaced(document, path, value)))
    try:
        edited = load_preset(str(file))
    except QhInputError:
        pass
    else:
        # A preset that labels more than its base does (a longer horizon, longer or more chains)
        # is not drawn: its labels would cost far more than a check, and say nothing new.
        assume(edited.horizon <= document["horizon"])
        assume(edited.steps * edited.chains_per_scene <= document["steps"] * document["chains_per_scene"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["env", "check", str(file), "--scenes", "2"])
    text = err.getvalue()
    assert "Traceback" not in text, (path, value, text)
    assert code in (0, 1, 2), (path, value, code)
    assert text.count("error:") == (code != 0), (path, value, text)
    assert sorted(p.name for p in directory.iterdir()) == ["preset.toml"], (path, value)
