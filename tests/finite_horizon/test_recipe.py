"""Recipe loading and validation: one QhInputError naming every bad field; digests; paths."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from qhlab.design.config_files import load_recipe
from qhlab.evidence import QhInputError, canonical_json, sha256_bytes
from qhlab.finite_horizon.architecture import ARMS
from qhlab.finite_horizon.recipe import (
    DataConfig,
    HardTargetUpdate,
    PolyakTargetUpdate,
    QhRecipe,
    recipe_digest,
    validate_recipe,
)
from tiny_recipe import TINY_RECIPE

EXAMPLES = TINY_RECIPE.parent


def _raw() -> dict:
    return tomllib.loads((EXAMPLES / "demo-recipe.toml").read_text())


def _error(raw: dict) -> str:
    with pytest.raises(QhInputError) as info:
        validate_recipe(raw)
    return str(info.value)


def test_examples_load_with_declared_values() -> None:
    demo = load_recipe(EXAMPLES / "demo-recipe.toml")
    assert demo.horizon == 3 and demo.batch_size == 64 and demo.updates == 2000
    assert demo.optimizer.schedule == "cosine" and demo.evaluation.average_decay is None
    assert demo.huber_delta == 0.25 and demo.successor_reward_rows == 4
    assert demo.architecture.encoder.width == 32 and demo.architecture.encoder.depth == 1
    assert demo.architecture.arm == "baseline"
    assert demo.architecture.encoder.kind == "attention"
    assert demo.architecture.readout == "local" and demo.architecture.fusion == "concat"
    assert demo.target_update == HardTargetUpdate(kind="hard", interval=25)
    assert demo.optimizer.betas == (0.9, 0.999)
    assert (demo.accelerator, demo.devices, demo.precision) == ("cpu", 1, "32-true")
    tiny = load_recipe(TINY_RECIPE)
    assert tiny.updates < 100 and tiny.horizon >= 1
    assert tiny.successor_reward_rows == 0  # the default: no successor reward term


def test_unknown_arm_lists_registered_arms() -> None:
    raw = _raw()
    raw["architecture"]["arm"] = "resnet"
    message = _error(raw)
    assert "1 invalid field" in message
    assert "architecture.arm" in message and "'resnet'" in message
    for arm in ARMS:
        assert arm in message
    assert "HINT" in message


def test_negative_lr_names_field_value_and_bound() -> None:
    raw = _raw()
    raw["optimizer"]["lr"] = -0.1
    message = _error(raw)
    assert "1 invalid field" in message
    assert "optimizer.lr=-0.1 is not allowed; allowed: a number > 0.0" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_float_is_refused(bad: float) -> None:
    raw = _raw()
    raw["huber_delta"] = bad
    message = _error(raw)
    assert "1 invalid field" in message
    assert f"huber_delta={bad!r}" in message and "finite" in message


def test_extra_field_is_refused_listing_known_fields() -> None:
    raw = _raw()
    raw["optimizer"]["momentum"] = 0.9
    message = _error(raw)
    assert "1 invalid field" in message
    assert "optimizer.momentum=0.9 is not allowed" in message
    assert "lr, weight_decay, betas, eps" in message


def test_missing_field_is_named() -> None:
    raw = _raw()
    del raw["huber_delta"]
    message = _error(raw)
    assert "1 invalid field" in message and "huber_delta is missing" in message


def test_all_errors_are_listed_at_once() -> None:
    raw = _raw()
    raw["seed"] = -1
    raw["optimizer"]["betas"] = [0.9, 1.0]
    raw["optimizer"]["eps"] = 0.0
    raw["target_update"] = {"kind": "polyak", "tau": 0.0}
    raw["devices"] = 2
    raw["precision"] = "bf16"
    raw["evaluation"]["tie_band"] = -1e-3
    message = _error(raw)
    assert "7 invalid field(s)" in message
    for fragment in (
        "seed=-1",
        "optimizer.betas.1=1.0",
        "optimizer.eps=0.0",
        "tau=0.0",
        "devices=2",
        "precision='bf16'",
        "evaluation.tie_band=-0.001",
    ):
        assert fragment in message


def test_target_update_kinds() -> None:
    raw = _raw()
    raw["target_update"] = {"kind": "polyak", "tau": 0.05}
    assert validate_recipe(raw).target_update == PolyakTargetUpdate(kind="polyak", tau=0.05)
    raw["target_update"] = {"kind": "hard", "interval": 0}
    assert "target_update.hard.interval=0" in _error(raw)
    raw["target_update"] = {"kind": "polyak", "tau": 0.1, "interval": 3}
    assert "target_update.polyak.interval=3 is not allowed; allowed: only the known fields (kind, tau)" in _error(raw)
    raw["target_update"] = {"kind": "soft"}
    assert "target_update" in _error(raw) and "'hard'" in _error(raw)


def test_arm_fills_structure_and_refuses_a_contradicting_one() -> None:
    raw = _raw()
    raw["architecture"] = {"arm": "control_no_interaction"}
    arch = validate_recipe(raw).architecture
    assert arch.encoder.kind == "deepsets" and arch.readout == "local"
    raw["architecture"] = {"arm": "variant_deep"}
    assert validate_recipe(raw).architecture.encoder.depth == 2
    raw["architecture"] = {"arm": "baseline", "readout": "global"}
    message = _error(raw)
    assert "readout='global'" in message and "requires 'local'" in message
    raw["architecture"] = {"arm": "baseline", "encoder": {"width": 30, "heads": 4}}
    assert "width=30 is not divisible by heads=4" in _error(raw)


def test_data_paths_resolve_relative_to_the_toml(tmp_path: Path) -> None:
    text = (
        (EXAMPLES / "demo-recipe.toml")
        .read_text()
        .replace('train = ""', 'train = "../pops/train"')
        .replace('validation = ""', 'validation = "/abs/val"')
    )
    sub = tmp_path / "configs"
    sub.mkdir()
    (sub / "r.toml").write_text(text)
    recipe = load_recipe(sub / "r.toml")
    assert recipe.data == DataConfig(train=str(tmp_path / "pops" / "train"), validation="/abs/val")


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(QhInputError, match="does not exist"):
        load_recipe(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(QhInputError, match="not valid TOML"):
        load_recipe(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text((EXAMPLES / "demo-recipe.toml").read_text().replace("lr = 3e-3", "lr = -1.0"))
    with pytest.raises(QhInputError, match=r"wrong\.toml.*\n.*optimizer\.lr=-1\.0"):
        load_recipe(wrong)


def test_q_head_init_defaults_to_random_and_refuses_other_values() -> None:
    raw = _raw()
    raw.pop("q_head_init", None)
    assert validate_recipe(raw).q_head_init == "random"
    raw["q_head_init"] = "zero"
    assert validate_recipe(raw).q_head_init == "zero"
    raw["q_head_init"] = "ones"
    assert "q_head_init='ones' is not allowed; allowed: Input should be 'random' or 'zero'" in _error(raw)


def test_ensemble_members_defaults_to_one_and_refuses_values_outside_1_to_8() -> None:
    raw = _raw()
    raw.pop("ensemble_members", None)
    assert validate_recipe(raw).ensemble_members == 1
    raw["ensemble_members"] = 2
    assert validate_recipe(raw).ensemble_members == 2
    for bad, allowed in ((0, "ensemble_members=0 is not allowed"), (9, "ensemble_members=9 is not allowed")):
        raw["ensemble_members"] = bad
        assert allowed in _error(raw) and "8" in _error(raw)


def test_digest_is_canonical_and_sensitive() -> None:
    recipe = load_recipe(EXAMPLES / "demo-recipe.toml")
    digest = recipe_digest(recipe)
    assert digest == sha256_bytes(canonical_json(recipe.model_dump(mode="json")))
    assert digest == recipe_digest(QhRecipe.model_validate(recipe.model_dump(mode="json")))
    assert recipe_digest(recipe.model_copy(update={"seed": 1})) != digest
    assert recipe_digest(recipe.model_copy(update={"precision": "16-mixed"})) != digest
    flipped = "zero" if recipe.q_head_init == "random" else "random"
    assert recipe_digest(recipe.model_copy(update={"q_head_init": flipped})) != digest
    assert recipe_digest(recipe.model_copy(update={"ensemble_members": recipe.ensemble_members + 1})) != digest
    assert len(digest) == 64


@pytest.mark.parametrize(
    ("section", "field", "bad", "allowed"),
    [
        (None, "huber_delta", "0.05", "a number (TOML float or integer, not a string)"),
        (None, "seed", True, "an integer (not a string, float or boolean)"),
        (None, "batch_size", "32", "an integer (not a string, float or boolean)"),
        ("optimizer", "lr", "3e-3", "a number (TOML float or integer, not a string)"),
    ],
)
def test_strings_and_booleans_are_never_coerced(section: str | None, field: str, bad, allowed: str) -> None:
    raw = _raw()
    (raw[section] if section else raw)[field] = bad
    message = _error(raw)
    path = f"{section}.{field}" if section else field
    assert "1 invalid field(s)" in message
    assert f"{path}={bad!r} is not allowed; allowed: {allowed}" in message


def test_strict_mode_keeps_ints_for_floats_and_lists_for_tuples() -> None:
    raw = _raw()
    raw["optimizer"]["lr"] = 1
    raw["huber_delta"] = 2
    recipe = validate_recipe(raw)
    assert recipe.optimizer.lr == 1.0 and isinstance(recipe.optimizer.lr, float)
    assert recipe.huber_delta == 2.0 and recipe.optimizer.betas == (0.9, 0.999)
    # the JSON form (lists) of a recipe validates back to the same recipe
    assert validate_recipe(recipe.model_dump(mode="json")) == recipe
    raw["architecture"]["encoder"]["width"] = "32"
    assert "architecture.encoder.width='32' is not allowed" in _error(raw)


def test_update_budget_is_bounded_by_the_study_cap() -> None:
    from qhlab.design.study_config import QhArchitectureStudyConfig
    from qhlab.finite_horizon.budget import MAX_UPDATES

    assert MAX_UPDATES == 10_000_000
    # One constant: the study's budgets carry the very bound the recipe does.
    for model, field in (
        (QhRecipe, "updates"),
        (QhArchitectureStudyConfig, "canary_updates"),
        (QhArchitectureStudyConfig, "broad_updates"),
    ):
        assert [m.le for m in model.model_fields[field].metadata if getattr(m, "le", None) is not None] == [MAX_UPDATES]
    assert validate_recipe({**_raw(), "updates": MAX_UPDATES}).updates == MAX_UPDATES
    message = _error({**_raw(), "updates": MAX_UPDATES + 1})
    assert "updates=10000001 is not allowed; allowed: an integer from 1 to 10000000" in message


@pytest.mark.parametrize("value", ["100000000000000000000", "1e20"])
def test_cli_refuses_a_huge_update_budget_and_writes_nothing(tmp_path: Path, capsys, value: str) -> None:
    from qhlab.cli import main

    text = TINY_RECIPE.read_text()
    assert "\nupdates = 40\n" in text
    recipe = tmp_path / "huge.toml"
    recipe.write_text(text.replace("\nupdates = 40\n", f"\nupdates = {value}\n"))
    output = tmp_path / "fits"
    assert main(["fit", str(recipe), "--profile", "cpu-fp32", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: recipe {str(recipe)!r}: 1 invalid field(s):"
    ]
    if value == "1e20":  # a TOML float is never an integer budget
        assert "  - updates=1e+20 is not allowed; allowed: an integer (not a string, float or boolean)" in err
    else:
        assert f"  - updates={value} is not allowed; allowed: an integer from 1 to 10000000" in err
    assert not output.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.toml"]
