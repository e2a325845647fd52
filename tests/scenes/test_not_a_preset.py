"""Another config kind where a preset file belongs is one line that says where its presets are.

``qhlab env check`` takes a preset (a built-in name or a preset file). Given a study, tuning,
pilot, E0 check, plan or recipe TOML, it says which kind of config that is and where that
config's presets are named, instead of listing every preset field the file lacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import QhInputError
from qhlab.scenes import load_preset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "example, says",
    [
        ("first-study.toml", "this is a study config, not a preset; its presets are named in [train] preset and "
         "[validation] preset; check one with `qhlab env check tiny`."),
        ("demo-pilot.toml", "this is a pilot config, not a preset; its presets are named in [train] preset and "
         "[validation] preset; check one with `qhlab env check demo-train`."),
        ("tiny-tune.toml", "this is a tuning config, not a preset"),
        ("tiny-e0.toml", "this is an E0 check config, not a preset; its study config (study = 'first-study.toml') "
         "names the presets in [train] preset and [validation] preset."),
        ("demo-plan.toml", "this is a plan config, not a preset; its study config (study = 'default-study.toml')"),
        ("tiny-recipe.toml", "this is a recipe config, not a preset; a recipe names no environment"),
    ],
)  # fmt: skip
def test_env_check_on_another_config_is_one_line_naming_its_presets(capsys, example, says) -> None:
    assert main(["env", "check", str(EXAMPLES / example)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: qhlab env check: preset="), err
    assert "allowed: a preset file (name, scenes, chains_per_scene, steps, horizon, [environment]) or a " in err, err
    assert f"HINT: {says}" in err, err


def test_a_study_naming_a_preset_file_shows_where_it_lies(tmp_path) -> None:
    (tmp_path / "mine.toml").write_text((EXAMPLES / "first-study.toml").read_text().replace('"tiny"', '"hop.toml"', 1))
    with pytest.raises(QhInputError, match=rf"check one with `qhlab env check {tmp_path / 'hop.toml'}`"):
        load_preset(tmp_path / "mine.toml", call="qhlab env check")


def test_a_preset_missing_fields_names_each_without_the_whole_file(tmp_path) -> None:
    (tmp_path / "p.toml").write_text('name = "p"\n[environment]\nfactory = "qhlab.scenes.puck:make"\n')
    with pytest.raises(QhInputError) as refused:
        load_preset(tmp_path / "p.toml")
    message = str(refused.value)
    assert "  - scenes is missing\n" in message and "  - horizon is missing\n" in message, message
    assert "{" not in message, message
