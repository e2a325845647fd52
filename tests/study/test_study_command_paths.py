"""``qhlab study SUBCOMMAND`` and ``python -m qhlab.finite_horizon.studies.architecture_study
SUBCOMMAND``: one table of command rows, so every subcommand parses, refuses and prints alike."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qhlab.cli import main
from qhlab.cli.study import STUDY_COMMANDS
from qhlab.finite_horizon.studies import architecture_study
from qhlab.study.arguments import STUDY_SUBCOMMANDS

MODULE = "qhlab.finite_horizon.studies.architecture_study"


def _bad_input(name: str, tmp_path) -> tuple[list[str], str]:
    """One refused command line of subcommand ``name`` and a phrase its one error line holds."""
    missing = str(tmp_path / "missing.toml")
    new = str(tmp_path / "new")
    if name == "run-fit":
        return [missing, "--output", new, "--variant", "baseline", "--seed", "0"], "an existing TOML file"
    if name == "run":
        return [missing, "--output", new, "--workers", "0"], "--workers=0 is not allowed"
    if name in STUDY_SUBCOMMANDS[:7]:
        return [missing, "--output", new], "an existing TOML file"
    if name == "status":
        return [str(tmp_path)], "allowed: a study output directory"
    if name == "export":
        return [str(tmp_path), "--output", str(tmp_path / "x.csv")], "allowed: a finished study directory"
    if name == "replicate":
        args = [str(tmp_path), "--train-seed", "1", "--validation-seed", "2", "--output", new]
        return args, "the freeze receipt is missing"
    return [str(tmp_path), str(tmp_path), "--output", new], "the freeze receipt is missing"


def _through_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["study", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _through_module(argv: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["architecture_study", *argv])
    with pytest.raises(SystemExit) as done:
        architecture_study.main()
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_the_rows_are_every_subcommand_once() -> None:
    assert tuple(c.name for c in STUDY_COMMANDS) == STUDY_SUBCOMMANDS
    assert all(c.run is not None and c.arguments is not None for c in STUDY_COMMANDS)


@pytest.mark.parametrize("name", STUDY_SUBCOMMANDS)
def test_every_subcommand_helps_and_refuses_alike_both_ways(name, tmp_path, capsys, monkeypatch) -> None:
    helps = []
    for run in (lambda a: _through_cli(a, capsys), lambda a: _through_module(a, capsys, monkeypatch)):
        code, out, err = run([name, "--help"])
        assert code == 0 and out.startswith(f"usage: qhlab study {name}") and err == ""
        helps.append(out)
    assert helps[0] == helps[1]

    argv, phrase = _bad_input(name, tmp_path)
    before = sorted(tmp_path.iterdir())
    for run in (lambda a: _through_cli(a, capsys), lambda a: _through_module(a, capsys, monkeypatch)):
        code, out, err = run([name, *argv])
        assert code == 2, err
        assert err.count("error:") == 1 and phrase in err and "Traceback" not in err, err
        assert sorted(tmp_path.iterdir()) == before  # bad input writes nothing


def test_the_module_runs_as_a_program(tmp_path) -> None:
    # `python -m` enters through the module's own `if __name__ == "__main__"`.
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "export", str(tmp_path), "--output", str(tmp_path / "x.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and "allowed: a finished study directory" in done.stderr
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []
