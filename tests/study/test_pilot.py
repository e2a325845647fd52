"""`qhlab pilot`: the variance components, the config's refusals, resume, verify and the freeze binding."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
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


def _study(
    directory: Path,
    cache: Path,
    *,
    pilot: Path | None = None,
    validation_seed: int = 8,
    extra: str = "",
    broad_updates: int = 30,
) -> Path:
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    text = text.replace("broad_updates = 30", f"broad_updates = {broad_updates}").replace(
        '[validation]\npreset = "tiny"\nseed = 8', f'[validation]\npreset = "tiny"\nseed = {validation_seed}'
    )
    text = text[: text.index("[[experiment.arms]]")] + _ARMS
    if pilot is not None:
        text += f'\n[preparation]\npilot = "{pilot / "pilot.json"}"\n'
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.toml").write_text(text + extra)
    return directory / "study.toml"


def _pilot_config(directory: Path, cache: Path, **replace: str) -> Path:
    _study(directory, cache)
    text = _PILOT.format(cache=cache)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
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
    assert pooled.se == pytest.approx(max(pooled.scene_se**2 + g, pooled.scene_se**2 / 2) ** 0.5)
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


# ----------------------------------------------------------------- a real pilot


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """One finished tiny pilot, on one worker."""
    root = tmp_path_factory.mktemp("pilot-reference")
    assert main(["pilot", str(_pilot_config(root / "c", cache)), "--output", str(root / "out")]) == 0
    return root / "out"


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
    cases.append((overlapping, "seeds the pilot did not fit (it fitted [2])"))
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
        assert pooled["seed_sd"] == own["noise"][row["metric"]]["tau"]
        assert pooled["draw_sd"] == own["noise"][row["metric"]]["omega"]
    assert "Each comparison's interval carries its own components" in (study / "report" / "report.md").read_text()
    capsys.readouterr()
    assert main(["verify", str(study)]) == 0
    assert "preparation/pilot: 4 comparisons'" in capsys.readouterr().out


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
