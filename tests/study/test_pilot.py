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
from qhlab.statistics.replication import pooled_difference, seed_effect_sd
from qhlab.statistics.variance import draw_effect_dof, draw_effect_sd
from record_forgery import reseal, reshaped_copy

STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"
# Three arms keep the pilot small: 3 arms x 2 seeds on TRAIN 7, and x 2 seeds on TRAIN 11 and 12.
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
        document.update({key: record[key] for key in ("seed_variance", "train_draw")})

    reseal(directory / "pilot.receipt.json", variance if body else None)


def _fits(directory: Path) -> list:
    record = json.loads((directory / "pilot.json").read_text())
    return [(f["arm"], f["draw"], f["seed"], f["final_state_sha256"], f["regret"]) for f in record["fits"]]


# ----------------------------------------------------------------- the arithmetic, pure


def test_the_draw_effect_is_recovered_and_clamped_at_zero():
    rng = np.random.default_rng(0)
    draws, seeds, scenes, omega, tau = 400, 3, 50, 0.01, 0.004
    table = (
        rng.normal(0, omega, (draws, 1, 1))
        + rng.normal(0, tau, (draws, seeds, 1))
        + rng.normal(0, 0.02, (draws, seeds, scenes))
    )
    assert draw_effect_sd(table) == pytest.approx(omega, rel=0.15)
    # Without a draw effect the estimate is near 0; a negative moment estimate is clamped to 0.
    without = rng.normal(0, tau, (draws, seeds, 1)) + rng.normal(0, 0.02, (draws, seeds, scenes))
    assert draw_effect_sd(without) < 0.003
    assert draw_effect_sd(np.array([[[0.0], [1.0]], [[0.0], [1.0]]])) == 0.0
    for bad in (np.zeros((1, 2, 3)), np.zeros((2, 1, 3)), np.zeros((2, 3))):
        with pytest.raises(ValueError, match=r"table.shape=.*allowed: \[draws >= 2, seeds >= 2, scenes >= 1\]"):
            draw_effect_sd(bad)


def test_a_pilots_draw_component_widens_the_pooled_interval_undivided():
    d = np.random.default_rng(1).normal(0.01, 0.02, (2, 40))
    seed_only = pooled_difference(d, seed_sd=0.003, seed_sd_source="pilot p", seed_sd_dof=5)
    with_draw = pooled_difference(
        d, seed_sd=0.003, seed_sd_source="pilot p", seed_sd_dof=5, draw_sd=0.004, draw_sd_dof=2
    )
    assert seed_only.sources == ("scenes", "training seed") and seed_only.draw_sd is None
    assert with_draw.sources == ("scenes", "training seed", "TRAIN draw") and with_draw.draw_sd == 0.004
    assert with_draw.se == pytest.approx(np.sqrt(seed_only.se**2 + 0.004**2))
    assert with_draw.high - with_draw.low > seed_only.high - seed_only.low and with_draw.mde > seed_only.mde
    with pytest.raises(Exception, match="draw_sd"):
        pooled_difference(d, draw_sd=0.004, draw_sd_dof=2)  # a draw term needs the pilot's seed term
    with pytest.raises(Exception, match="draw_sd/draw_sd_dof"):
        pooled_difference(d, seed_sd=0.003, seed_sd_source="pilot p", seed_sd_dof=5, draw_sd=0.004)


def _simulated_study(rng, delta: float, tau: float, omega: float, seeds, draw: float | None = None):
    """[len(seeds), 120] paired differences on one TRAIN draw: delta + w + u_s + (wu)_ds + v_i + e.

    ``seeds`` are the seeds' own effects u_s, shared by every draw they are fitted on (a seed's
    initial weights); (wu)_ds, as large, is what a seed does on this draw alone (its batches)."""
    w = rng.normal(0.0, omega) if draw is None else draw
    u = np.asarray(seeds, dtype=np.float64)[:, None] + rng.normal(0.0, tau / np.sqrt(2), (len(seeds), 1))
    return delta + w + u + rng.normal(0.0, 0.012, (1, 120)) + rng.normal(0.0, 0.010, (len(seeds), 120))


def _coverage(draws: int, tau: float, omega: float, rng, n: int = 600) -> dict[str, float]:
    """How often the pooled interval covers delta, with and without the pilot's draw term; each
    simulated study has its own simulated pilot: 6 seeds on one draw, and 2 of them on each of
    ``draws`` (the same two seeds on every draw, as ``qhlab pilot`` fits them)."""
    delta, covered = 0.002, {"draw": 0, "seed only": 0}
    for _ in range(n):
        d = _simulated_study(rng, delta, tau, omega, rng.normal(0.0, tau / np.sqrt(2), 2))
        w = rng.normal(0.0, omega, draws)
        own = rng.normal(0.0, tau / np.sqrt(2), 6)
        main_fits = _simulated_study(rng, 0.0, tau, omega, own, draw=w[0])
        table = np.stack([main_fits[:2], *(_simulated_study(rng, 0.0, tau, omega, own[:2], draw=x) for x in w[1:])])
        pilot = {"seed_sd": seed_effect_sd(main_fits), "seed_sd_source": "simulated pilot", "seed_sd_dof": 5}
        with_draw = pooled_difference(d, **pilot, draw_sd=draw_effect_sd(table), draw_sd_dof=draw_effect_dof(table))
        seed_only = pooled_difference(d, **pilot)
        covered["draw"] += with_draw.low <= delta <= with_draw.high
        covered["seed only"] += seed_only.low <= delta <= seed_only.high
    return {k: v / n for k, v in covered.items()}


# In 3000 simulated studies a setting, the draw term's intervals covered 0.947-0.965 from 5 draws
# and 0.930-0.966 from 3 (docs/concepts/statistics.md).
BOUND_FIVE, BOUND_THREE = 0.925, 0.91


def test_the_draw_term_restores_coverage_that_seed_only_intervals_lose():
    # Every seed of a study shares one TRAIN draw, so a draw effect omega shifts all of them: an
    # interval that carries only scenes and seeds covers far less than 95% once omega matters.
    # The figures of 3000 simulated studies a setting are on the statistics page; 600 here, so
    # the bounds leave about two standard errors.
    rng = np.random.default_rng(20261204)
    for tau, omega in ((0.003, 0.0), (0.003, 0.004), (0.003, 0.01), (0.001, 0.003)):
        five, three = _coverage(5, tau, omega, rng), _coverage(3, tau, omega, rng)
        assert five["draw"] >= BOUND_FIVE and three["draw"] >= BOUND_THREE, (tau, omega, five, three)
        if omega >= 0.003:
            assert five["seed only"] <= 0.8 and three["seed only"] <= 0.8, (tau, omega, five, three)
        else:
            assert five["seed only"] >= 0.91, (tau, omega, five)  # nothing to carry: both cover


# ----------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "replace, field, allowed",
    [
        ({"seeds = [2, 3]": "seeds = [0, 3]"}, "seeds", "seeds the study does not use"),
        ({"seed = 9": "seed = 8"}, "validation", "a tuning population the study never scores on"),
        ({"train_draws = [11, 12]": "train_draws = [11]"}, "train_draws", "none, or two or more"),
        ({"train_draws = [11, 12]": "train_draws = [7, 12]"}, "train_draws", "other TRAIN seeds of the preset"),
        ({"workers = 1": "workers = 1\ndraw_seeds = [2, 5]"}, "draw_seeds", "two or more of seeds"),
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


@pytest.mark.slow
def test_the_record_holds_the_design_and_its_components_recompute(reference):
    from qhlab.design.pilot_record import check_record, components_of

    record = json.loads((reference / "pilot.json").read_text())
    # 3 arms x seeds [2, 3] on TRAIN 7, and 3 arms x draw seeds [2, 3] on TRAIN 11 and 12.
    assert len(record["fits"]) == 18 and record["draws"] == [7, 11, 12] and record["draw_seeds"] == [2, 3]
    assert [(c["arm"], c["against"]) for c in record["comparisons"]] == [
        ("baseline", "control_global_readout"),
        ("variant_cross_attention", "control_global_readout"),
        ("variant_cross_attention", "baseline"),
    ]
    assert record["seed_variance"]["seeds"] == 2 and record["train_draw"]["draws"] == 3
    every = record["comparisons"] + record["margins"]
    assert record["seed_variance"]["regret"] == max(c["tau"]["regret"] for c in every)
    assert record["train_draw"]["mae"] == max(c["draw_sd"]["mae"] for c in every)
    again = components_of(
        record["design"], record["fits"], main_draw=7, seeds=[2, 3], draws=[7, 11, 12], draw_seeds=[2, 3]
    )
    assert again["comparisons"] == record["comparisons"] and again["train_draw"] == record["train_draw"]
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
        json.loads((output / "pilot.json").read_text())["seed_variance"]
        == json.loads((reference / "pilot.json").read_text())["seed_variance"]
    )


@pytest.mark.slow
def test_verify_recomputes_and_refuses_a_resealed_edit(tmp_path, reference, capsys):
    assert main(["verify", str(reference)]) == 0
    assert "4 comparisons' and margins' variance components" in capsys.readouterr().out
    # An edited tau, resealed: the fits' per-scene values give another one.
    edited = tmp_path / "edited"
    shutil.copytree(reference, edited)
    record = json.loads((edited / "pilot.json").read_text())
    record["comparisons"][0]["tau"]["regret"] += 0.01  # tau may be 0 (clamped): an added 1 cm is an edit
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
    record.update(
        components_of(record["design"], record["fits"], main_draw=7, seeds=[2, 3], draws=[7, 11, 12], draw_seeds=[2, 3])
    )
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
        # A typed [seed_variance] that disagrees with the record.
        (
            _study(
                tmp_path / "c",
                cache,
                pilot=reference,
                extra='\n[seed_variance]\nregret = 0.5\nmae = 0.5\nseeds = 2\nsource = "typed"\n',
            ),
            "the pilot record's values",
        ),
    ]
    # A study that reports one of the pilot's seeds.
    overlapping = _study(tmp_path / "e", cache, pilot=reference)
    overlapping.write_text(overlapping.read_text().replace("seeds = [0, 1]", "seeds = [1, 2]", 1))
    cases.append((overlapping, "seeds the pilot did not fit (it fitted [2])"))
    # A pilot whose TRAIN population is of another preset (forged, resealed): another distribution's variance.
    other = tmp_path / "other-preset"
    shutil.copytree(reference, other)
    record = json.loads((other / "pilot.json").read_text())
    record["populations"]["train"]["preset"] = "demo-train"
    (other / "pilot.json").write_bytes(canonical_json(record))
    _reseal(other)
    cases.append((_study(tmp_path / "f", cache, pilot=other), "train population is of the study's preset 'tiny'"))
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
    pooled = report["replication"][0]["pooled"]
    recorded = json.loads((reference / "pilot.json").read_text())
    assert pooled["sources"] == ["scenes", "training seed", "TRAIN draw"]
    assert pooled["seed_sd"] == recorded["seed_variance"]["regret"]
    assert pooled["draw_sd"] == recorded["train_draw"]["regret"]
    assert (
        "The seed-pooled intervals below carry: scenes, training seed, TRAIN draw."
        in (study / "report" / "report.md").read_text()
    )
    capsys.readouterr()
    assert main(["verify", str(study)]) == 0
    assert "preparation/pilot: 4 comparisons'" in capsys.readouterr().out


@pytest.mark.parametrize(
    "reshape",
    [
        pytest.param(lambda r: r.update(fits={}), id="fits-a-mapping"),
        pytest.param(lambda r: r["fits"][0].pop("arm"), id="a-fit-without-its-arm"),
        pytest.param(lambda r: r.update(seed_variance="small"), id="the-seed-variance-text"),
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
