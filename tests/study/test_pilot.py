"""`qhlab pilot`: the variance components, the config's refusals, resume, verify and the freeze binding."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from qhlab.cli import main
from qhlab.evidence import canonical_json, sha256_file
from qhlab.statistics.replication import pooled_difference
from qhlab.statistics.variance import FitNoise, fit_noise, study_noise_terms
from record_forgery import reseal, reshaped_copy

STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"
# Three arms keep the pilot small: 3 arms x seeds 2, 3 on TRAIN 7, 4, 5 on TRAIN 11 and 6, 7 on TRAIN 12.
_ARMS = """[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "variant_cross_attention"
role = "variant"
control = "control_global_readout"
"""
_PILOT = """name = "tiny-pilot"
study = "study.toml"
seeds = [2, 3]
train_draws = [11, 12]
draw_seeds = [[4, 5], [6, 7]]
workers = 1
population_cache = "{cache}"

[train]
preset = "tiny"
seed = 7

[validation]
preset = "tiny"
seed = 9
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    from qhlab.scenes import cached_population

    root = tmp_path_factory.mktemp("pilot-cache")
    for split, seed in (("train", 7), ("validation", 8), ("validation", 9), ("train", 11), ("train", 12)):
        cached_population("tiny", split, seed, root, workers=1)
    return root


# The layout every tiny study here declares for its pilot: _PILOT's.
_DECLARED = "\n[preparation.pilot_layout]\ndraws = [7, 11, 12]\nseeds = [[2, 3], [4, 5], [6, 7]]\n"


def _layout_of(pilot_text: str) -> str:
    """The [preparation.pilot_layout] of a pilot config's text (``_DECLARED`` where it has no readable layout)."""
    try:
        pilot = tomllib.loads(pilot_text)
        draws = [pilot["train"]["seed"], *pilot.get("train_draws", [])]
        seeds = [pilot["seeds"], *pilot.get("draw_seeds", [])]
        # The tiny study's own seeds: its config would refuse the layout before the pilot's own check.
        if {0, 1} & {s for group in seeds for s in group}:
            return _DECLARED
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return _DECLARED
    return f"\n[preparation.pilot_layout]\ndraws = {draws}\nseeds = {seeds}\n"


def _study(
    directory: Path,
    cache: Path,
    *,
    pilot: Path | None = None,
    validation_seed: int = 8,
    extra: str = "",
    broad_updates: int = 30,
    layout: str = _DECLARED,
) -> Path:
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    text = text.replace("broad_updates = 30", f"broad_updates = {broad_updates}").replace(
        '[validation]\npreset = "tiny"\nseed = 8', f'[validation]\npreset = "tiny"\nseed = {validation_seed}'
    )
    text = text[: text.index("[[experiment.arms]]")] + _ARMS + layout
    if pilot is not None:
        text += f'\n[preparation]\npilot = "{pilot / "pilot.json"}"\n'
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.toml").write_text(text + extra)
    return directory / "study.toml"


def _pilot_config(directory: Path, cache: Path, **replace: str) -> Path:
    """A pilot config with ``replace`` applied, beside a study that declares its layout."""
    text = _PILOT.format(cache=cache)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    _study(directory, cache, layout=_layout_of(text))
    (directory / "pilot.toml").write_text(text)
    return directory / "pilot.toml"


def _reseal(directory: Path, *, body: bool = True) -> None:
    """Reseal pilot.receipt.json over the files as they are now; with ``body`` its body also takes
    the record's values (a reshaped record may not carry them)."""
    record = json.loads((directory / "pilot.json").read_text())

    def variance(document: dict) -> None:
        document.update(
            fits=len(record["fits"]),
            draws=len(record["layout"]),
            components=len(record["comparisons"]) + len(record["margins"]),
        )

    reseal(directory / "pilot.receipt.json", variance if body else None)


def _fits(directory: Path) -> list:
    record = json.loads((directory / "pilot.json").read_text())
    return [(f["arm"], f["draw"], f["seed"], f["final_state_sha256"], f["regret"]) for f in record["fits"]]


# ----------------------------------------------------------------- the arithmetic, pure


def _nested(rng, draws: int, seeds: int, omega: float, tau: float, scenes: int = 60, sigma: float = 0.02):
    """[draws * seeds, scenes] fit values of a nested design, and each fit's draw."""
    w = np.repeat(rng.normal(0.0, omega, draws), seeds)
    u = rng.normal(0.0, tau, draws * seeds)
    v = rng.normal(0.0, 0.01, scenes)
    values = (w + u)[:, None] + v[None, :] + rng.normal(0.0, sigma, (draws * seeds, scenes))
    return values, [d for d in range(draws) for _ in range(seeds)]


def test_fit_noise_estimates_each_component_without_bias_and_without_clamping():
    rng = np.random.default_rng(0)
    omega, tau, sigma, scenes = 0.004, 0.003, 0.02, 60
    found = [fit_noise(*_nested(rng, 5, 3, omega, tau, scenes, sigma)) for _ in range(2000)]
    assert np.mean([f.draw_variance for f in found]) == pytest.approx(omega**2, rel=0.08)
    assert np.mean([f.seed_variance for f in found]) == pytest.approx(tau**2, rel=0.06)
    assert np.mean([f.residual for f in found]) == pytest.approx(sigma**2, rel=0.01)
    # With no seed or draw effect the estimates straddle 0: negative ones are kept (a clamp would bias).
    nothing = [fit_noise(*_nested(rng, 5, 3, 0.0, 0.0, scenes, sigma)) for _ in range(400)]
    assert min(f.seed_variance for f in nothing) < 0 < max(f.seed_variance for f in nothing)
    assert abs(np.mean([f.seed_variance for f in nothing])) < 0.2 * sigma**2 / scenes
    one = nothing[0]
    assert (one.fits, one.draws, one.n_scenes, one.dof_within, one.dof_between, one.n0) == (15, 5, 60, 10, 4, 3.0)
    assert one.as_dict()["tau"] == max(0.0, one.seed_variance) ** 0.5
    assert FitNoise.from_dict(one.as_dict()) == one


def test_fit_noise_refuses_what_it_cannot_estimate():
    values, draws = _nested(np.random.default_rng(1), 3, 2, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"draws \[2\] have one fit"):
        fit_noise(values[:5], draws[:5])
    with pytest.raises(ValueError, match=r"values.shape=\(6, 60\) with 5 draws"):
        fit_noise(values, draws[:5])
    bad = values.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        fit_noise(bad, draws)


def test_the_studys_variance_adds_this_comparisons_terms_to_its_scene_variance():
    rng = np.random.default_rng(2)
    noise = fit_noise(*_nested(rng, 4, 3, 0.004, 0.003))
    terms = study_noise_terms(noise, 2)
    assert [name for name, _, _ in terms] == ["between draws", "within draws", "residual"]
    # G = omega^2 + tau^2 / 2, term by term.
    g = sum(value for _, value, _ in terms)
    assert g == pytest.approx(noise.draw_variance + noise.seed_variance / 2)
    study = rng.normal(0.01, 0.02, (2, 80))
    pooled = pooled_difference(study, noise=noise, noise_source="pilot p")
    assert pooled.sources == ("scenes", "training seed", "TRAIN draw")
    assert pooled.se == pytest.approx(max(pooled.scene_se**2 + g, pooled.scene_se**2) ** 0.5)
    assert pooled.dof < 79 and pooled.distribution.startswith("t(") and pooled.seed_sd_source == "pilot: pilot p"
    # One TRAIN draw: the seed term only, and the interval says it does not carry the draw.
    single = fit_noise(*_nested(rng, 1, 4, 0.0, 0.003))
    one_draw = pooled_difference(study, noise=single, noise_source="pilot q")
    assert one_draw.sources == ("scenes", "training seed") and one_draw.draw_sd is None
    assert [name for name, _, _ in study_noise_terms(single, 2)] == ["within draws", "residual"]
    with pytest.raises(Exception, match="noise_source"):
        pooled_difference(study, noise=noise)
    with pytest.raises(Exception, match="seed_sd"):
        pooled_difference(study, noise=noise, noise_source="p", seed_sd=0.001, seed_sd_source="t", seed_sd_dof=3)


# ----------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "replace, field, allowed",
    [
        ({"seeds = [2, 3]": "seeds = [0, 3]"}, "seeds", "seeds the study does not use"),
        ({"seed = 9": "seed = 8"}, "validation", "a tuning population the study never scores on"),
        (
            {"train_draws = [11, 12]\ndraw_seeds = [[4, 5], [6, 7]]": "train_draws = [11]\ndraw_seeds = [[4, 5]]"},
            "train_draws",
            "none, or two or more",
        ),
        ({"train_draws = [11, 12]": "train_draws = [7, 12]"}, "train_draws", "other TRAIN seeds of the preset"),
        ({"[[4, 5], [6, 7]]": "[[4, 5]]"}, "draw_seeds", "one list of seeds per TRAIN draw"),
        ({"[[4, 5], [6, 7]]": "[[4, 5], [6]]"}, "draw_seeds", "two or more seeds"),
        ({"[[4, 5], [6, 7]]": "[[4, 5], [3, 7]]"}, "seeds and draw_seeds", "distinct integers"),
        ({"[[4, 5], [6, 7]]": "[[4, 5], [1, 7]]"}, "seeds", "seeds the study does not use"),
        ({"workers = 1": 'workers = 1\naccelerator = "cpu"'}, "accelerator", "Extra inputs are not permitted"),
    ],
)
def test_bad_pilot_config_is_refused_with_nothing_written(tmp_path, cache, capsys, replace, field, allowed):
    output = tmp_path / "out"
    assert main(["pilot", str(_pilot_config(tmp_path / "c", cache, **replace)), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and field in err and allowed in err, err
    assert not output.exists()


def test_a_pilot_of_another_layout_than_its_study_declares_is_refused_before_anything_is_drawn(tmp_path, cache, capsys):
    # The study fixed seeds 6 and 7 on its third draw; this pilot fits 6 and 8 (a second try).
    config = _pilot_config(tmp_path / "c", cache)
    config.write_text(config.read_text().replace("[[4, 5], [6, 7]]", "[[4, 5], [6, 8]]"))
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    line = " ".join(capsys.readouterr().err.split())
    assert line.count("error:") == 1 and "seeds/train_draws/draw_seeds: the layout" in line, line
    assert "is not the study's" in line
    assert "{'draw': 12, 'seeds': [6, 7]}" in line and not output.exists()
    # A study that declares no layout cannot be piloted: nothing fixes which pilot it gets.
    config = _pilot_config(tmp_path / "d", cache)
    study = config.parent / "study.toml"
    study.write_text(study.read_text().replace(_DECLARED, ""))
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    line = " ".join(capsys.readouterr().err.split())
    assert (
        line.count("error:") == 1 and "declares no [preparation.pilot_layout]" in line and "draws = [7, 11, 12]" in line
    ), line
    assert not output.exists()


def test_the_studys_validation_named_by_a_path_is_refused_before_anything_is_drawn(tmp_path, cache, capsys):
    # A copy of the population the study names by preset and seed: the same scenes, another name.
    held_out = next(cache.glob("tiny-validation-seed8-*"))
    alias = tmp_path / "alias"
    shutil.copytree(held_out, alias)
    config = _pilot_config(
        tmp_path / "c",
        cache,
        **{'[validation]\npreset = "tiny"\nseed = 9': f'[validation]\npath = "{alias}"'},
    )
    drawn = sorted(p.name for p in cache.iterdir())
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "it is the study's validation population (by content" in err, err
    assert not output.exists() and sorted(p.name for p in cache.iterdir()) == drawn


def test_a_directory_begun_with_another_config_is_refused_and_kept(tmp_path, cache, capsys):
    # Its record would bind a config copy it was not made from.
    output = tmp_path / "out"
    output.mkdir()
    (output / "config.toml").write_text('name = "another-pilot"\n')
    assert main(["pilot", str(_pilot_config(tmp_path / "c", cache)), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--output=" in err and "is another config's" in err, err
    assert (output / "config.toml").read_text() == 'name = "another-pilot"\n'
    assert not (output / "fits").exists() and not (output / "pilot.json").exists()


_TINY = (Path(__file__).resolve().parents[2] / "src" / "qhlab" / "scenes" / "presets" / "tiny.toml").read_text()
_CARTPOLE = """name = "cartpole"
scenes = 6
chains_per_scene = 1
steps = 3
horizon = 3

[environment]
factory = "qhlab.scenes.gymnasium:make"

[environment.options]
env_id = "CartPole-v1"
reset = { low = -0.1, high = 0.1 }
reward_unit = "steps"
"""


def _preset(**replace: str) -> str:
    """The tiny preset's text with whole lines replaced (e.g. another name or horizon)."""
    text = _TINY
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


_UNSERVABLE = {
    # The red team's case: the tiny puck preset against a Gymnasium study (another environment and H).
    "puck-pilot-of-a-gymnasium-study": (
        {
            'preset = "tiny"\nseed = 7': 'preset = "cartpole.toml"\nseed = 7',
            'preset = "tiny"\nseed = 8': 'preset = "cartpole.toml"\nseed = 8',
            "horizon = 2": "horizon = 3",
        },
        {"cartpole.toml": _CARTPOLE},
        {},
        [
            "train.preset='tiny' is not allowed",
            "the study's TRAIN distribution (",
            "CartPole-v1, H=3)",
            "HINT: it is drawn from puck world, the study's TRAIN population from CartPole-v1",
        ],
    ),
    "another-environment": (
        {},
        {},
        {'[train]\npreset = "tiny"': '[train]\npreset = "tanks-tiny"'},
        [
            "train.preset='tanks-tiny' is not allowed",
            "allowed: a population of the study's TRAIN distribution ('tiny': puck world, H=2)",
            "HINT: it is drawn from tanks, the study's TRAIN population from puck world",
        ],
    ),
    "another-horizon": (
        {},
        {"tiny-h3.toml": _preset(**{'name = "tiny"': 'name = "tiny-h3"', "horizon = 2": "horizon = 3"})},
        {'[train]\npreset = "tiny"': '[train]\npreset = "tiny-h3.toml"'},
        [
            "tiny-h3.toml' is not allowed; allowed: a population of H=2, the horizon the study's recipe learns",
            "HINT: it has H=3, and no fit of H=2 can be made on it",
        ],
    ),
    "other-options": (
        {},
        {
            "tiny-blocked.toml": _preset(
                **{'name = "tiny"': 'name = "tiny-blocked"', "blocker_probability = 0.5": "blocker_probability = 0.9"}
            )
        },
        {'[validation]\npreset = "tiny"': '[validation]\npreset = "tiny-blocked.toml"'},
        [
            "validation.preset=",
            "tiny-blocked.toml' is not allowed; allowed: a population of the study's validation distribution ('tiny'",
            "HINT: its environment's options, source or versions, the preset's sizes or its actor differ",
        ],
    ),
    "the-studys-validation-renamed": (
        {},
        {"tiny-copy.toml": _preset(**{'name = "tiny"': 'name = "tiny-copy"'})},
        {'[validation]\npreset = "tiny"\nseed = 9': '[validation]\npreset = "tiny-copy.toml"\nseed = 8'},
        [
            "validation.preset=",
            "allowed: a tuning population the study never scores on",
            "HINT: it is the study's validation population (by content, whatever its path)",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(_UNSERVABLE))
def test_a_pilot_that_cannot_serve_its_study_is_refused_before_any_population_is_drawn(tmp_path, cache, capsys, case):
    study_replace, files, replace, expected = _UNSERVABLE[case]
    config = _pilot_config(tmp_path / "c", cache, **replace)
    study = config.parent / "study.toml"
    text = study.read_text()
    for old, new in study_replace.items():
        assert old in text, old
        text = text.replace(old, new)
    study.write_text(text)
    for name, content in files.items():
        (config.parent / name).write_text(content)
    drawn = sorted(p.name for p in cache.iterdir())
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: qhlab pilot: ") and all(part in line for part in expected), line
    # Nothing written: no output, no lock, and no population drawn into the cache.
    assert not output.exists() and sorted(p.name for p in cache.iterdir()) == drawn


def test_the_studys_train_as_the_pilots_validation_is_refused_before_any_population_is_drawn(tmp_path, cache, capsys):
    train = next(cache.glob("tiny-train-seed7-*"))
    config = _pilot_config(
        tmp_path / "c", cache, **{'[validation]\npreset = "tiny"\nseed = 9': f'[validation]\npath = "{train}"'}
    )
    # A fresh cache: the pilot's TRAIN draws would be drawn into it first were the refusal late.
    empty = tmp_path / "fresh-cache"
    empty.mkdir()
    config.write_text(config.read_text().replace(f'population_cache = "{cache}"', f'population_cache = "{empty}"'))
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        f"validation.path={str(train)!r} is not allowed; allowed: a validation population (split 'validation')" in line
    )
    assert "HINT: it is the study's own TRAIN population" in line, line
    assert not output.exists() and list(empty.iterdir()) == []


def _thirty_scene_study(study: Path) -> None:
    """Give the study at ``study`` a 30-scene validation of the tiny distribution (a preset file of
    its own beside it: the generator identity leaves the name and the scene count out)."""
    (study.parent / "tiny30.toml").write_text(
        _preset(**{'name = "tiny"': 'name = "tiny30"', "scenes = 3": "scenes = 30"})
    )
    text = study.read_text()
    assert '[validation]\npreset = "tiny"' in text
    study.write_text(text.replace('[validation]\npreset = "tiny"', '[validation]\npreset = "tiny30.toml"'))


def test_the_pilots_validation_minimum_is_thirty_scenes_or_the_studys_own():
    from qhlab.design.pilot_config import min_validation_scenes
    from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE

    assert MIN_SCENES_TO_DECIDE == 30
    # A tiny study's 3 scenes ask no more of its pilot; a large one's, no more than a study decides on;
    # a study whose validation is not generated yet, the minimum that serves any study.
    assert [min_validation_scenes(n) for n in (3, 29, 30, 480, None)] == [3, 29, 30, 30, 30]


@pytest.mark.parametrize("named_by", ["preset", "path"])
def test_a_pilot_on_fewer_validation_scenes_than_its_study_needs_is_refused_before_any_population_is_drawn(
    tmp_path, cache, capsys, named_by
):
    # The tiny preset's 3 scenes for a study of 30: the same distribution, too few scenes to measure it.
    tiny = next(cache.glob("tiny-validation-seed9-*"))
    replace = (
        {} if named_by == "preset" else {'[validation]\npreset = "tiny"\nseed = 9': f'[validation]\npath = "{tiny}"'}
    )
    config = _pilot_config(tmp_path / "c", cache, **replace)
    _thirty_scene_study(config.parent / "study.toml")
    # A fresh cache: the pilot's populations would be drawn into it were the refusal late.
    empty = tmp_path / "fresh-cache"
    empty.mkdir()
    config.write_text(config.read_text().replace(f'population_cache = "{cache}"', f'population_cache = "{empty}"'))
    drawn = sorted(p.name for p in cache.iterdir())
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    value = "'tiny'" if named_by == "preset" else repr(str(tiny))
    assert line.startswith(f"error: qhlab pilot: validation.{named_by}={value} is not allowed; "), line
    assert (
        "allowed: a pilot validation population of at least 30 scenes, min(MIN_SCENES_TO_DECIDE=30, the study's 30 "
        "validation scenes). HINT: it has 3 scenes" in line
    ), line
    assert "name a larger validation preset (the study's validation preset " in line and "tiny30.toml" in line, line
    assert not output.exists() and list(empty.iterdir()) == []
    assert sorted(p.name for p in cache.iterdir()) == drawn


def test_an_output_holding_anything_the_pilot_does_not_write_is_refused_and_left_as_found(tmp_path, cache, capsys):
    config = _pilot_config(tmp_path / "c", cache)
    drawn = sorted(p.name for p in cache.iterdir())
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("mine")
    planned = tmp_path / "a-plan"
    planned.mkdir()
    for name in ("plan.json", "plan.md", "plan.receipt.json", "config.toml"):
        (planned / name).write_text("{}")
    for output, hint in (
        (unrelated, "HINT: it holds 'notes.txt', which qhlab pilot does not write; nothing was written"),
        (planned, "HINT: it is the output of `qhlab plan` (plan.json); nothing was written"),
    ):
        before = sorted((p.name, p.read_text()) for p in output.iterdir())
        assert main(["pilot", str(config), "--output", str(output)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"error: qhlab pilot: --output={str(output)!r} is not allowed; allowed: a new or empty directory, or "
            "this config's pilot directory (to resume or re-read it)"
        ), line
        assert hint in line, line
        assert sorted((p.name, p.read_text()) for p in output.iterdir()) == before
    assert sorted(p.name for p in cache.iterdir()) == drawn


def test_the_pilots_fits_are_counted_one_way_in_the_report_and_the_intervals():
    from qhlab.design.pilot_record import fits_words
    from qhlab.report import preparation_section

    assert fits_words(18, 6, 3) == "18 fits (3 arms x 6 seeds, each seed on one of 3 TRAIN draws)"
    assert fits_words(8, 4, 1) == "8 fits (2 arms x 4 seeds, on one TRAIN draw)"
    # A comparison's components hold its (draw, seed) pairs, one per seed: the interval's note
    # counts them as seeds, never as the pilot's fits.
    values, draws = _nested(np.random.default_rng(3), 3, 2, 0.004, 0.003)
    note = pooled_difference(np.zeros((2, 60)) + 0.01, noise=fit_noise(values, draws), noise_source="p").note
    assert "(6 seeds on 3 TRAIN draws, each seed one fit of every arm it pairs)" in note and "fits on" not in note
    noise = {"tau": 0.001, "omega": 0.002, "dof_within": 3, "dof_between": 2}
    pilot = {
        "name": "p",
        "record_sha256": "0" * 64,
        "copy": "preparation/pilot",
        "populations": {
            "train": {"preset": "tiny", "seed": 7, "manifest_sha256": "1" * 64},
            "validation": {"preset": "tiny", "seed": 9, "manifest_sha256": "2" * 64},
        },
        "layout": [{"draw": d, "seeds": s} for d, s in _LAYOUT],
        "fits": 18,
        "comparisons": [{"arm": "a", "against": "b", "noise": {"regret": noise, "mae": noise}}],
        "margins": [],
    }
    e0 = {
        "gate": {"canary_updates": 10, "canary_gap_multiple": 2.0, "tie_band": 0.001, "seeds": [0, 1]},
        "name": "e",
        "record_sha256": "3" * 64,
        "copy": "preparation/e0",
        "draws": 1,
        "passed": 1,
        "pass_share": 1.0,
        "min_pass_share": 1.0,
        "outcomes": [{"train_seed": 21, "passed": True, "state_id": 4, "min_gap": 0.5}],
    }
    for unit in ("m", "steps"):
        report = {
            "unit": unit,
            "preparation": {"tuning": None, "pilot": pilot, "typed_seed_variance": None, "plan": None, "e0": e0},
        }
        text = "\n".join(preparation_section.markdown(report))
        assert "; 18 fits (3 arms x 6 seeds, each seed on one of 3 TRAIN draws)." in text
        # The E0 table's gap column carries the study's own unit, never metres by default.
        assert f"| smallest label gap ({unit}) |" in text


# ----------------------------------------------------------------- a real pilot


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """One finished tiny pilot, on one worker."""
    root = tmp_path_factory.mktemp("pilot-reference")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["pilot", str(_pilot_config(root / "c", cache)), "--output", str(root / "out")]) == 0
    # What it printed, for the console's own test (outside the record's directory).
    (root / "printed.txt").write_text(printed.getvalue())
    return root / "out"


@pytest.mark.slow
def test_the_pilots_console_gives_every_value_its_unit_and_counts_fits_as_the_record_does(reference):
    printed = (reference.parent / "printed.txt").read_text().splitlines()
    fits = [line for line in printed if line.startswith("fit ")]
    assert len(fits) == 18 and all(re.search(r"regret_2 \d\.\d{4} m, MAE \d\.\d{4} m \(", f) for f in fits), fits
    components = [line for line in printed if line.startswith("  ")]
    assert len(components) == 4 and all(
        re.fullmatch(r"  .+: regret tau \d\.\d{5} m, omega \d\.\d{5} m; mae tau \d\.\d{5} m, omega \d\.\d{5} m", c)
        for c in components
    ), components
    # The same count as the record's 18 fits and the study report's section.
    assert any("from 18 fits (3 arms x 6 seeds, each seed on one of 3 TRAIN draws); " in line for line in printed)


_LAYOUT = [(7, [2, 3]), (11, [4, 5]), (12, [6, 7])]


@pytest.mark.slow
def test_the_record_holds_the_design_and_its_components_recompute(reference):
    from qhlab.design.pilot_record import check_record, components_of

    record = json.loads((reference / "pilot.json").read_text())
    # 3 arms x seeds 2, 3 on TRAIN 7, 4, 5 on TRAIN 11 and 6, 7 on TRAIN 12: each seed on one draw.
    assert len(record["fits"]) == 18
    assert record["layout"] == [{"draw": d, "seeds": s} for d, s in _LAYOUT]
    assert [(c["arm"], c["against"]) for c in record["comparisons"]] == [
        ("baseline", "control_global_readout"),
        ("variant_cross_attention", "control_global_readout"),
        ("variant_cross_attention", "baseline"),
    ]
    noise = record["comparisons"][0]["noise"]["regret"]
    assert (noise["fits"], noise["draws"], noise["dof_within"], noise["dof_between"]) == (6, 3, 3, 2)
    # Each comparison's components are its own: from its arms' fits alone, not a maximum over rows.
    values = {(f["arm"], f["draw"], f["seed"]): np.asarray(f["regret"]) for f in record["fits"]}
    fits = [(d, s) for d, seeds in _LAYOUT for s in seeds]
    table = np.stack([values[("baseline", d, s)] - values[("control_global_readout", d, s)] for d, s in fits])
    assert fit_noise(table, [d for d, _ in fits]).as_dict() == pytest.approx(noise)
    again = components_of(record["design"], record["fits"], layout=_LAYOUT)
    assert again["comparisons"] == record["comparisons"] and again["margins"] == record["margins"]
    assert check_record(reference) == {"fits": 18, "comparisons": 4, "fits_recomputed": 18, "fits_absent": 0}
    # A finished directory is re-read, not refitted.
    assert main(["pilot", str(reference.parent / "c" / "pilot.toml"), "--output", str(reference)]) == 0


_ADDED_ARM = """
[[experiment.arms]]
arm = "variant_deep"
role = "variant"
control = "control_global_readout"
"""


@pytest.mark.slow
def test_an_arm_added_after_the_pilot_is_the_only_arm_refitted(tmp_path, cache, reference, capsys):
    from qhlab.design.pilot_record import check_record

    config = _pilot_config(tmp_path / "c", cache)
    study = tmp_path / "c" / "study.toml"
    study.write_text(study.read_text().replace(_ARMS, _ARMS + _ADDED_ARM))
    before = {p.relative_to(reference): p.read_bytes() for p in reference.rglob("*") if p.is_file()}
    capsys.readouterr()
    output = tmp_path / "out"
    assert main(["pilot", str(config), "--output", str(output), "--adopt-from", str(reference)]) == 0
    fits = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fit ")]
    # 4 arms x 6 seeds: the earlier pilot's 18 cells adopted, the added arm's 6 fitted.
    assert len(fits) == 24
    fitted = [line for line in fits if not line.endswith("(adopted)")]
    assert len(fitted) == 6 and all(" variant_deep draw " in line for line in fitted), fitted
    # The adopted fits are the earlier pilot's own (same final states), copied into this pilot, which
    # verifies on its own; the earlier pilot is left as it was.
    old = {f[:3]: f[3] for f in _fits(reference)}
    new = {f[:3]: f[3] for f in _fits(output)}
    assert {k: new[k] for k in old} == old and len(new) == 24
    assert check_record(output) == {"fits": 24, "comparisons": 7, "fits_recomputed": 24, "fits_absent": 0}
    assert {p.relative_to(reference): p.read_bytes() for p in reference.rglob("*") if p.is_file()} == before


def test_adopting_from_what_is_not_a_finished_pilot_is_refused_with_nothing_written(tmp_path, cache, capsys):
    config = _pilot_config(tmp_path / "c", cache)
    (tmp_path / "empty").mkdir()
    for earlier in (tmp_path / "empty", tmp_path / "out"):
        assert main(["pilot", str(config), "--output", str(tmp_path / "out"), "--adopt-from", str(earlier)]) == 2
        err = capsys.readouterr().err
        assert "--adopt-from" in err and "a finished pilot's directory other than --output" in err, err
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sigkill_then_resume_completes_to_the_same_record(tmp_path, cache, reference):
    config = _pilot_config(tmp_path / "c", cache)
    output = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "qhlab.cli", "pilot", str(config), "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (output / "fits" / "control_global_readout-d7-s2").is_dir():
            break
        time.sleep(0.05)
    assert process.poll() is None, "the pilot ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (output / "pilot.json").exists()
    assert main(["pilot", str(config), "--output", str(output)]) == 0
    assert _fits(output) == _fits(reference)
    assert (
        json.loads((output / "pilot.json").read_text())["comparisons"]
        == json.loads((reference / "pilot.json").read_text())["comparisons"]
    )


@pytest.mark.slow
def test_a_foreign_finished_fit_in_a_pilot_cell_refuses_the_resumed_pilot(tmp_path, cache, reference, capsys):
    """The one adopt rule on a pilot's fit: the cell's finished attempt is adopted only when it is
    the cell's own fit, and another cell's finished fit put in its place is refused, not fitted beside."""
    config = _pilot_config(tmp_path / "c", cache)
    output = tmp_path / "out"
    shutil.copytree(reference, output)
    # An unfinished run of this config: its record and receipt not yet written.
    for name in ("pilot.json", "pilot.receipt.json"):
        (output / name).unlink()
    cell, other = output / "fits" / "control_global_readout-d7-s2", output / "fits" / "baseline-d7-s2"
    (own,) = [p for p in cell.iterdir() if p.is_dir()]
    shutil.rmtree(own)
    (foreign,) = [p for p in other.iterdir() if p.is_dir()]
    shutil.copytree(foreign, cell / foreign.name)
    capsys.readouterr()
    assert main(["pilot", str(config), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"attempt={str(cell / foreign.name)!r} is not allowed" in err and "binds another recipe_digest" in err, err
    assert [p.name for p in cell.iterdir()] == [foreign.name] and not (output / "pilot.json").exists()
    # With the foreign fit moved out, the cell is fitted again and the record is the reference's.
    shutil.rmtree(cell / foreign.name)
    assert main(["pilot", str(config), "--output", str(output)]) == 0
    assert _fits(output) == _fits(reference)


@pytest.mark.slow
def test_verify_recomputes_and_refuses_a_resealed_edit(tmp_path, reference, capsys):
    assert main(["verify", str(reference)]) == 0
    assert "4 comparisons' and margins' fit-noise components" in capsys.readouterr().out
    # An edited mean square, resealed: the fits' per-scene values give another one.
    edited = tmp_path / "edited"
    shutil.copytree(reference, edited)
    record = json.loads((edited / "pilot.json").read_text())
    record["comparisons"][0]["noise"]["regret"]["ms_within"] /= 10
    (edited / "pilot.json").write_bytes(canonical_json(record))
    _reseal(edited)
    assert main(["verify", str(edited)]) == 2
    assert "the recorded comparisons is not what its fits give" in capsys.readouterr().err
    # An edited fit value with every component recomputed to match: its evaluation receipt says otherwise.
    from qhlab.design.pilot_record import components_of

    forged = tmp_path / "forged"
    shutil.copytree(reference, forged)
    record = json.loads((forged / "pilot.json").read_text())
    record["fits"][0]["regret"] = [0.0 for _ in record["fits"][0]["regret"]]
    record.update(components_of(record["design"], record["fits"], layout=_LAYOUT))
    (forged / "pilot.json").write_bytes(canonical_json(record))
    _reseal(forged)
    assert main(["verify", str(forged)]) == 2
    assert "other per-scene regret values than its evaluation receipt" in capsys.readouterr().err


@pytest.mark.slow
def test_freeze_binds_the_pilot_and_refuses_what_disagrees(tmp_path, cache, reference, capsys):
    refused = tmp_path / "refused"
    cases = [
        # The study's validation is the pilot's validation population.
        (_study(tmp_path / "a", cache, pilot=reference, validation_seed=9), "the pilot's validation population"),
        # Another design: the pilot's fits do not measure this study's cells.
        (_study(tmp_path / "b", cache, pilot=reference, broad_updates=40), "it differs in broad_updates, recipes"),
        # A typed [seed_variance] beside the record.
        (
            _study(
                tmp_path / "c",
                cache,
                pilot=reference,
                extra='\n[seed_variance]\nregret = 0.5\nmae = 0.5\nseeds = 2\nsource = "typed"\n',
            ),
            "no typed [seed_variance] beside a pilot record",
        ),
    ]
    # A study that reports one of the pilot's seeds.
    overlapping = _study(tmp_path / "e", cache, pilot=reference)
    overlapping.write_text(overlapping.read_text().replace("seeds = [0, 1]", "seeds = [1, 2]", 1))
    cases.append((overlapping, "preparation.pilot_layout.seeds holds [2], the study's own seeds"))
    # A study that declares another layout than the record's: a second pilot of the design.
    shopped = _study(
        tmp_path / "g",
        cache,
        pilot=reference,
        layout=_DECLARED.replace("[[2, 3], [4, 5], [6, 7]]", "[[2, 3], [4, 5], [6, 8]]"),
    )
    cases.append((shopped, "a pilot of the layout preparation.pilot_layout declares"))
    # A study that binds a pilot and declares no layout.
    undeclared = _study(tmp_path / "h", cache, pilot=reference, layout="")
    cases.append((undeclared, "preparation.pilot_layout is missing"))
    # A pilot whose TRAIN population is of another distribution (its generator forged, resealed).
    other = tmp_path / "other-generator"
    shutil.copytree(reference, other)
    record = json.loads((other / "pilot.json").read_text())
    record["populations"]["train"]["generator_sha256"] = "0" * 64
    (other / "pilot.json").write_bytes(canonical_json(record))
    _reseal(other)
    cases.append((_study(tmp_path / "f", cache, pilot=other), "its train population's generator 000000000000"))
    for config, expected in cases:
        assert main(["study", "freeze", str(config), "--output", str(refused)]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and expected in err, err
        assert not refused.exists()
    # The study of the pilot's design on another validation seed: frozen, the record copied in and bound.
    study = tmp_path / "study"
    assert main(["study", "run", str(_study(tmp_path / "d", cache, pilot=reference)), "--output", str(study)]) == 0
    pilot = json.loads((study / "freeze.receipt.json").read_text())["body"]["preparation"]["pilot"]
    assert pilot["record_sha256"] == sha256_file(reference / "pilot.json")
    report = json.loads((study / "report" / "report.json").read_text())
    assert report["summary"]["pilot_recorded"] is True
    recorded = json.loads((reference / "pilot.json").read_text())
    for row in report["replication"]:
        # Each comparison carries its own row's components.
        own = next(c for c in recorded["comparisons"] if (c["arm"], c["against"]) == (row["arm"], row["against"]))
        pooled = row["pooled"]
        assert pooled["sources"] == ["scenes", "training seed", "TRAIN draw"]
        # The study's own seeds checked this row's seed component; where they contradict it, the
        # interval carries their seed term instead.
        check = pooled["seed_check"]
        assert check["dof_observed"] == 1 and 0 <= check["p_value"] <= 1
        assert check["contradicts"] == (check["p_value"] < 0.05)
        tau = check["study_seed_variance"] if check["contradicts"] else own["noise"][row["metric"]]["tau"] ** 2
        assert pooled["seed_sd"] == pytest.approx(max(0.0, tau) ** 0.5)
        assert pooled["draw_sd"] == own["noise"][row["metric"]]["omega"]
        assert pooled["se"] >= pooled["scene_se"]
    assert report["summary"]["seed_check"]["rows"] == len(report["replication"]) + 2 * len(report["retention"])
    markdown = (study / "report" / "report.md").read_text()
    assert "Each comparison's interval carries its own components" in markdown
    assert "The study's own seeds checked the pilot's seed component of each of its" in markdown
    # The pilot's fits counted one way: 18 fits in the section, 6 seeds (not "6 fits") in each interval.
    assert "; 18 fits (3 arms x 6 seeds, each seed on one of 3 TRAIN draws)." in markdown
    for row in report["replication"]:
        assert "(6 seeds on 3 TRAIN draws, each seed one fit of every arm it pairs)" in row["pooled"]["note"]
        assert "18 fits (3 arms x 6 seeds" in row["pooled"]["seed_sd_source"], row["pooled"]["seed_sd_source"]
    capsys.readouterr()
    assert main(["verify", str(study)]) == 0
    assert "preparation/pilot: 4 comparisons'" in capsys.readouterr().out


@pytest.mark.slow
def test_freeze_refuses_a_pilot_scored_on_fewer_validation_scenes_than_the_study_needs(
    tmp_path, cache, reference, capsys
):
    # The tiny pilot (3 validation scenes; a tiny study binds it: min(30, 3) = 3) bound by a study of
    # the same design and distributions whose validation has 30 scenes.
    study = _study(tmp_path / "s", cache, pilot=reference)
    _thirty_scene_study(study)
    refused = tmp_path / "refused"
    assert main(["study", "freeze", str(study), "--output", str(refused)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"error: freeze_study: preparation.pilot={str(reference / 'pilot.json')!r} is not allowed; allowed: a pilot "
        "validation population of at least 30 scenes, min(MIN_SCENES_TO_DECIDE=30, the study's 30 validation scenes)"
    ), line
    assert "HINT: it has 3 scenes" in line and "run `qhlab pilot` again with a larger validation preset" in line, line
    assert not refused.exists()


@pytest.mark.parametrize(
    "reshape",
    [
        pytest.param(lambda r: r.update(fits={}), id="fits-a-mapping"),
        pytest.param(lambda r: r["fits"][0].pop("arm"), id="a-fit-without-its-arm"),
        pytest.param(lambda r: r.update(layout="small"), id="the-layout-text"),
        pytest.param(lambda r: r.update(comparisons=None), id="no-comparisons"),
        pytest.param(lambda r: r["design"].pop("mae_fraction"), id="a-design-without-its-mae-fraction"),
    ],
)
def test_a_reshaped_pilot_record_is_one_clear_refusal_not_a_traceback(tmp_path, reference, capsys, reshape):
    reshaped = reshaped_copy(reference, tmp_path / "reshaped", "pilot.json", reshape)
    _reseal(reshaped, body=False)
    capsys.readouterr()
    assert main(["verify", str(reshaped)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "pilot.json" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_the_smallest_pilot_never_narrows_an_interval_and_the_report_names_where_the_study_disagrees(tmp_path, cache):
    # The smallest layout `qhlab pilot` admits: two seeds on one TRAIN draw (6 fits). Seeds 6 and 7
    # give negative seed-variance estimates on most rows, and on one row (the variant's MAE against
    # its control) a tiny one that the study's own seeds 0 and 1 contradict (F 40.7 on 1 and 2 dof).
    layout = "\n[preparation.pilot_layout]\ndraws = [7]\nseeds = [[6, 7]]\n"
    _study(tmp_path / "c", cache, layout=layout)
    pilot = tmp_path / "c" / "pilot.toml"
    pilot.write_text(
        f'name = "smallest"\nstudy = "study.toml"\nseeds = [6, 7]\nworkers = 2\npopulation_cache = "{cache}"\n\n'
        '[train]\npreset = "tiny"\nseed = 7\n\n[validation]\npreset = "tiny"\nseed = 9\n'
    )
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["pilot", str(pilot), "--output", str(tmp_path / "pilot")]) == 0
        bound = _study(tmp_path / "s", cache, pilot=tmp_path / "pilot", layout=layout)
        assert main(["study", "run", str(bound), "--output", str(tmp_path / "study")]) == 0
    record = json.loads((tmp_path / "pilot" / "pilot.json").read_text())
    assert record["layout"] == [{"draw": 7, "seeds": [6, 7]}]
    report = json.loads((tmp_path / "study" / "report" / "report.json").read_text())
    rows = [r["pooled"] for r in report["replication"]]
    rows += [m for e in report["retention"] for m in e["pooled_margins"].values()]
    negative = [p for p in rows if p["seed_check"]["pilot_seed_variance"] < 0]
    assert len(negative) >= 3 and all(p["floored"] for p in negative), negative
    # No interval is narrower than the study's own scene-only one (same Student's t on n - 1 dof at
    # most), and a negative estimate never shrinks one.
    for p in rows:
        assert p["se"] >= p["scene_se"] and p["dof"] <= p["n_scenes"] - 1, p
    contradicted = [r for r in report["replication"] if r["pooled"]["seed_check"]["contradicts"]]
    assert [(r["arm"], r["against"], r["metric"]) for r in contradicted] == [
        ("variant_cross_attention", "control_global_readout", "mae")
    ]
    check = contradicted[0]["pooled"]["seed_check"]
    assert check["p_value"] < 0.05 and contradicted[0]["pooled"]["se"] > 2 * contradicted[0]["pooled"]["scene_se"]
    markdown = " ".join((tmp_path / "study" / "report" / "report.md").read_text().split())
    assert (
        "they contradict it on variant_cross_attention - control_global_readout (mae) "
        f"(F {check['statistic']:.3g} on 1 and {check['dof_predicted']:.1f} dof, p {check['p_value']:.3g}), "
        "whose intervals carry the study's own seed term instead"
    ) in markdown, markdown
    # The answer names each margin's MDE and what its interval's variance is: on the floor, the scenes alone.
    for entry, question in zip(report["retention"], report["question"], strict=True):
        for name, margin in entry["pooled_margins"].items():
            said = f"{name} {margin['mde']:.4f} m, " + (
                "scenes alone (the pilot's fit-noise estimate fell below 0, so the interval is the scene-only one)"
                if margin["floored"]
                else "mostly"
            )
            assert said in question["answer"]["text"], (said, question["answer"]["text"])
