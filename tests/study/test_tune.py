"""`qhlab tune`: the config's refusals, the winner rule, determinism, resume, verify and freeze."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.design.tuning_rule import pick_winner, trial_score
from qhlab.evidence import canonical_json, sha256_file
from record_forgery import reseal, reshaped_copy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    from qhlab.scenes import cached_population

    root = tmp_path_factory.mktemp("tune-cache")
    cached_population("tiny", "train", 7, root, workers=1)
    cached_population("tiny", "validation", 9, root, workers=1)
    return root


def _config(directory: Path, cache: Path, **replace: str) -> Path:
    text = (EXAMPLES / "tiny-tune.toml").read_text()
    text = text.replace('recipe = "tiny-recipe.toml"', f'recipe = "{EXAMPLES / "tiny-recipe.toml"}"')
    text = text.replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{cache}"')
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tune.toml"
    path.write_text(text)
    return path


def _tune(config: Path, output: Path, *extra: str) -> int:
    return main(["tune", str(config), "--output", str(output), *extra])


def _trials(directory: Path) -> tuple[list, dict]:
    """What must not depend on workers or interruptions: every trial's parameters, state and
    fit results (final-state digests included), and the winner."""
    record = json.loads((directory / "tuning.json").read_text())
    trials = [
        (
            t["number"],
            t["params"],
            t["state"],
            t["mean"],
            t["seed_sd"],
            [(f["seed"], f["regret"], f["mae"], f["final_state_sha256"]) for f in t["fits"]],
        )
        for t in record["trials"]
    ]
    return trials, record["winner"]


def _reseal(directory: Path) -> None:
    """Reseal tuning.receipt.json over the files as they are now (a forger's reseal)."""
    reseal(directory / "tuning.receipt.json")


# ----------------------------------------------------------------- the rule, pure


def test_trial_score_is_the_mean_and_sample_sd_over_seeds():
    assert trial_score([0.1]) == {"mean": 0.1, "seed_sd": None}
    score = trial_score([1.0, 3.0])
    assert score["mean"] == 2.0 and score["seed_sd"] == pytest.approx(2**0.5)
    with pytest.raises(ValueError, match="finite"):
        trial_score([float("nan")])


def test_the_cheaper_trial_within_the_band_wins_and_spread_limits_admission():
    trials = [
        {"number": 0, "state": "complete", "mean": 0.100, "seed_sd": 0.01, "cost": 4000},
        {"number": 1, "state": "complete", "mean": 0.1004, "seed_sd": 0.01, "cost": 2000},
        {"number": 2, "state": "complete", "mean": 0.090, "seed_sd": 0.05, "cost": 2000},
        {"number": 3, "state": "pruned", "mean": None, "seed_sd": None, "cost": 9000},
    ]
    assert pick_winner(trials, band=0.0, max_seed_sd=None)["number"] == 2
    limited = pick_winner(trials, band=0.0005, max_seed_sd=0.02)
    assert limited["number"] == 1 and limited["tied"] == [1, 0] and limited["admissible"] == [0, 1]
    assert limited["margin"] == pytest.approx(0.100 - 0.1004)
    assert pick_winner(trials, band=0.0, max_seed_sd=0.02)["number"] == 0
    assert pick_winner(trials[3:], band=0.0, max_seed_sd=None) == {
        "number": None,
        "admissible": [],
        "tied": [],
        "margin": None,
    }


# ----------------------------------------------------------------- bad input: exit 2, nothing written


@pytest.mark.parametrize(
    "space, field, allowed",
    [
        ('"optimizer.momentum" = { low = 0.1, high = 0.9 }', "space.optimizer.momentum", "a scalar field"),
        ('precision = { choices = ["32-true", "bf16-mixed"] }', "'precision'", "backend field"),
        ("seed = { choices = [1, 2] }", "'seed'", "seed search"),
        ("huber_delta = { low = 0.1, high = 0.1 }", "space.huber_delta", "low < high"),
        ("huber_delta = { low = 0.5, high = 0.1 }", "space.huber_delta", "low < high"),
        ("batch_size = { low = 0, high = 16 }", "space.batch_size=0", "valid recipe"),
        # Valid at both ends, invalid inside: refused before the first fit, not after three.
        (
            '"architecture.encoder.heads" = { low = 1, high = 4 }',
            "the trial architecture.encoder.heads=3",
            "not divisible by heads=3",
        ),
    ],
)
def test_bad_space_is_refused_with_nothing_written(tmp_path, cache, capsys, space, field, allowed):
    config = _config(tmp_path / "c", cache, **{"batch_size = { choices = [8, 16] }": space})
    output = tmp_path / "out"
    assert _tune(config, output) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err and allowed in err
    assert not output.exists()


def test_a_sealed_validation_population_is_refused_and_fit_warns(tmp_path, cache, capsys):
    from qhlab.scenes.seals import mark_sealed

    seal_cache = tmp_path / "seal-cache"
    from qhlab.scenes import cached_population

    validation = cached_population("tiny", "validation", 9, cache, workers=1)
    mark_sealed(
        seal_cache,
        sha256_file(validation / "manifest.json"),
        study="held-out-study",
        freeze_receipt_sha256="ab" * 32,
        path=validation,
    )
    config = _config(tmp_path / "c", seal_cache)
    output = tmp_path / "out"
    assert _tune(config, output) == 2
    err = capsys.readouterr().err
    assert "validation=" in err and "held-out-study" in err and "no study has sealed" in err
    assert not output.exists()
    # Refused before the TRAIN population was drawn: the cache holds the seal and the validation only.
    assert not list(seal_cache.glob("tiny-train-*")), sorted(p.name for p in seal_cache.iterdir())
    # qhlab fit scores on it, with one warning line.
    train = cached_population("tiny", "train", 7, seal_cache, workers=1)
    validation_copy = cached_population("tiny", "validation", 9, seal_cache, workers=1)
    assert (
        main(
            [
                "fit",
                str(EXAMPLES / "tiny-recipe.toml"),
                "--profile",
                "cpu-fp32",
                "--output",
                str(tmp_path / "fit"),
                "--train",
                str(train),
                "--validation",
                str(validation_copy),
                "--no-progress",
            ]
        )
        == 0
    )
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "held-out-study" in warnings[0]


def test_a_corrupt_or_foreign_trials_db_is_refused_and_kept(tmp_path, cache, capsys):
    import optuna

    config = _config(tmp_path / "c", cache)
    output = tmp_path / "out"
    output.mkdir()
    db = output / "trials.db"
    db.write_bytes(b"not a database" * 100)
    before = db.read_bytes()
    assert _tune(config, output) == 2
    assert "trials.db" in capsys.readouterr().err and db.read_bytes() == before
    db.unlink()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="tiny-tune", storage=f"sqlite:///{db}").set_user_attr("config_sha256", "0" * 64)
    before = db.read_bytes()
    assert _tune(config, output) == 2
    err = capsys.readouterr().err
    assert "another config" in err and db.read_bytes() == before
    assert sorted(p.name for p in output.iterdir()) == ["trials.db"]


def test_a_second_tune_on_the_same_directory_exits_3(tmp_path, cache, capsys):
    from qhlab.evidence import exclusive_lock

    config = _config(tmp_path / "c", cache)
    output = tmp_path / "out"
    output.mkdir()
    with exclusive_lock(output / ".tune.lock"):
        assert _tune(config, output) == 3
    assert "held by another process" in capsys.readouterr().err
    assert not (output / "trials.db").exists()


def _tiny_preset(**replace: str) -> str:
    """The tiny preset's text with whole lines replaced (e.g. another name)."""
    text = (Path(__file__).resolve().parents[2] / "src" / "qhlab" / "scenes" / "presets" / "tiny.toml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


_MDE = {'metric = "regret"\nseeds = [2, 3]\nband = 0.0005': 'metric = "mde"\nseeds = [2, 3, 4]\nstudy = "study.toml"'}


@pytest.mark.parametrize(
    "replace, files, expected",
    [
        pytest.param(
            {'[train]\npreset = "tiny"': '[train]\npreset = "tanks-tiny"'},
            {},
            [
                "train.preset='tanks-tiny' is not allowed; allowed: a population of H=2, the horizon the tuning's "
                "recipe learns",
                "HINT: it has H=3",
            ],
            id="another-horizon",
        ),
        pytest.param(
            {**_MDE, '[train]\npreset = "tiny"': '[train]\npreset = "tanks-tiny"'},
            {},
            [
                "train.preset='tanks-tiny' is not allowed; allowed: a population of the study's TRAIN distribution "
                "('tiny': puck world, H=2)",
                "HINT: it is drawn from tanks, the study's TRAIN population from puck world; a tuning's numbers",
            ],
            id="mde-of-a-study-of-another-environment",
        ),
        pytest.param(
            {**_MDE, '[validation]\npreset = "tiny"\nseed = 9': '[validation]\npreset = "tiny-copy.toml"\nseed = 8'},
            {"tiny-copy.toml": _tiny_preset(**{'name = "tiny"': 'name = "tiny-copy"'})},
            [
                "tiny-copy.toml' is not allowed; allowed: a tuning population the study never scores on",
                "HINT: it is the study's validation population (by content, whatever its path); a tuning must not",
            ],
            id="mde-on-the-studys-validation-renamed",
        ),
    ],
)
def test_a_tuning_that_cannot_serve_is_refused_before_any_population_is_drawn(
    tmp_path, cache, capsys, replace, files, expected
):
    config = _config(tmp_path / "c", cache, **replace)
    (config.parent / "study.toml").write_text(
        STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    )
    for name, content in files.items():
        (config.parent / name).write_text(content)
    drawn = sorted(p.name for p in cache.iterdir())
    output = tmp_path / "out"
    assert _tune(config, output) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: qhlab tune: ") and all(part in line for part in expected), line
    assert not output.exists() and sorted(p.name for p in cache.iterdir()) == drawn


def test_a_train_population_as_the_tunings_validation_is_refused_before_any_population_is_drawn(
    tmp_path, cache, capsys
):
    train = next(cache.glob("tiny-train-seed7-*"))
    fresh = tmp_path / "fresh-cache"
    fresh.mkdir()
    config = _config(
        tmp_path / "c",
        fresh,
        **{'[validation]\npreset = "tiny"\nseed = 9': f'[validation]\npath = "{train}"'},
    )
    assert _tune(config, tmp_path / "out") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"validation.path={str(train)!r} is not allowed; allowed: a validation population (split 'validation')" in (
        line
    )
    assert "HINT: it is a TRAIN population (its manifest's split is 'train')" in line, line
    assert not (tmp_path / "out").exists() and list(fresh.iterdir()) == []


def test_an_output_holding_anything_the_tuning_does_not_write_is_refused_and_left_as_found(tmp_path, cache, capsys):
    config = _config(tmp_path / "c", cache)
    output = tmp_path / "mine"
    output.mkdir()
    (output / "results.csv").write_text("a,b\n")
    assert _tune(config, output) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: qhlab tune: --output={str(output)!r} is not allowed; allowed: a new or empty"), line
    assert "HINT: it holds 'results.csv', which qhlab tune does not write; nothing was written" in line, line
    assert [(p.name, p.read_text()) for p in output.iterdir()] == [("results.csv", "a,b\n")]


# ----------------------------------------------------------------- real tunings


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """One finished tiny tuning, on one worker."""
    root = tmp_path_factory.mktemp("tune-reference")
    output = root / "out"
    assert _tune(_config(root / "c", cache), output, "--workers", "1") == 0
    return output


@pytest.mark.slow
def test_two_workers_give_the_same_trials_and_recipe(tmp_path, cache, reference):
    output = tmp_path / "out"
    assert _tune(_config(tmp_path / "c", cache), output, "--workers", "2") == 0
    assert _trials(output) == _trials(reference)
    assert (output / "recipe.toml").read_bytes() == (reference / "recipe.toml").read_bytes()
    # Running it again re-reads the finished record.
    assert _tune(_config(tmp_path / "c", cache), output) == 0


@pytest.mark.slow
def test_the_winning_recipe_is_a_recipe_file_of_the_winner(reference):
    from qhlab.design.config_files import load_recipe

    record = json.loads((reference / "tuning.json").read_text())
    winner = record["winner"]
    assert winner["number"] == pick_winner(record["trials"], band=0.0005, max_seed_sd=None)["number"]
    recipe = load_recipe(reference / "recipe.toml")
    assert recipe.optimizer.lr == winner["params"]["optimizer.lr"]
    assert recipe.batch_size == winner["params"]["batch_size"]
    assert len(record["trials"]) == 4 and all(len(t["fits"]) == 2 for t in record["trials"])
    assert record["populations"]["validation"]["seed"] == 9


@pytest.mark.slow
def test_sigkill_then_resume_completes_to_the_same_record(tmp_path, cache, reference):
    config = _config(tmp_path / "c", cache)
    output = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "qhlab.cli", "tune", str(config), "--output", str(output), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    # Killed mid-run: after the first batch is stored, while the second batch fits.
    while time.monotonic() < deadline and process.poll() is None:
        if (output / "fits" / "t0002-s2").is_dir():
            break
        time.sleep(0.05)
    assert process.poll() is None, "the tuning ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    with sqlite3.connect(output / "trials.db") as connection:
        stored = connection.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    assert 0 < stored < 4 and not (output / "tuning.json").exists()
    assert _tune(config, output, "--workers", "1") == 0
    assert _trials(output) == _trials(reference)
    assert (output / "recipe.toml").read_bytes() == (reference / "recipe.toml").read_bytes()


@pytest.mark.slow
def test_a_trials_db_edited_before_a_resume_is_refused_not_published(tmp_path, cache, reference, capsys):
    import shutil

    # A finished tuning whose record is gone: the next run resumes from trials.db and fits/.
    config = _config(tmp_path / "c", cache)
    output = tmp_path / "out"
    shutil.copytree(reference, output)
    for name in ("tuning.json", "tuning.receipt.json", "recipe.toml"):
        (output / name).unlink()
    with sqlite3.connect(output / "trials.db") as connection:
        (value,) = connection.execute(
            "SELECT value_json FROM trial_user_attributes WHERE trial_id = 2 AND key = 'qhlab'"
        ).fetchone()
        stored = json.loads(value)
        stored["params"]["optimizer.lr"] = 0.5
        connection.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = 2 AND key = 'qhlab'",
            (json.dumps(stored),),
        )
    capsys.readouterr()
    assert _tune(config, output, "--workers", "1") == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "trials.db trial 2 params" in err and "sealed fits" in err, err
    assert not (output / "tuning.json").exists() and not (output / "recipe.toml").exists()


@pytest.mark.slow
def test_verify_recomputes_and_refuses_a_resealed_edit(tmp_path, reference, capsys):
    import shutil

    assert main(["verify", str(reference)]) == 0
    out = capsys.readouterr().out
    assert "4 trials' scores and the winner" in out and "8 fits' metrics recomputed" in out
    # An edited metric (the trial's mean edited to match) with the receipt resealed: the fit's
    # evaluation receipt still says otherwise.
    edited = tmp_path / "edited"
    shutil.copytree(reference, edited)
    record = json.loads((edited / "tuning.json").read_text())
    trial = record["trials"][1]
    trial["fits"][0]["regret"] = 0.0
    trial.update(trial_score([f["regret"] for f in trial["fits"]]))
    (edited / "tuning.json").write_bytes(canonical_json(record))
    _reseal(edited)
    assert main(["verify", str(edited)]) == 2
    assert "evaluation receipt says" in capsys.readouterr().err
    # A trial's parameters edited (a trial that did not win), its fits untouched: they ran others.
    params = tmp_path / "params"
    shutil.copytree(reference, params)
    record = json.loads((params / "tuning.json").read_text())
    loser = next(t for t in record["trials"] if t["number"] != record["winner"]["number"])
    loser["params"]["optimizer.lr"] = loser["params"]["optimizer.lr"] * 2
    (params / "tuning.json").write_bytes(canonical_json(record))
    _reseal(params)
    assert main(["verify", str(params)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "did not run the trial's parameters" in err and "optimizer" in err, err
    # A moved copy without its fits: the winner is still recomputed, so an edited winner fails.
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tuning.json", "tuning.receipt.json", "config.toml", "recipe.toml"):
        shutil.copy(reference / name, bare / name)
    assert main(["verify", str(bare)]) == 0
    assert "8 fits absent" in capsys.readouterr().out
    record = json.loads((bare / "tuning.json").read_text())
    record["winner"]["number"] = (record["winner"]["number"] + 1) % 4
    (bare / "tuning.json").write_bytes(canonical_json(record))
    # Resealed over the old body, the receipt's summary names the old winner; resealed with the
    # body edited too, the winner is recomputed by the rule.
    _reseal(bare)
    assert main(["verify", str(bare)]) == 2
    assert "tuning.receipt.json and its tuning.json disagree on winner." in capsys.readouterr().err
    reseal(bare / "tuning.receipt.json", lambda body: body.update(winner=record["winner"]["number"]))
    assert main(["verify", str(bare)]) == 2
    assert "is not the rule's" in capsys.readouterr().err


def _study_config(
    directory: Path, cache: Path, reference: Path, *, validation_seed: int = 8, recipe_file: bool = True
) -> Path:
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    text = text.replace("broad_updates = 30", "broad_updates = 40").replace(
        '[validation]\npreset = "tiny"\nseed = 8', f'[validation]\npreset = "tiny"\nseed = {validation_seed}'
    )
    start, end = text.index("[experiment.recipe]"), text.index("[[experiment.arms]]")
    preparation = f'[preparation]\ntuning = "{reference / "tuning.json"}"\n\n'
    if recipe_file:
        text = text[:start] + preparation + f'[experiment]\nrecipe = "{reference / "recipe.toml"}"\n\n' + text[end:]
    else:
        text = text[:start] + preparation + text[start:]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "study.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_freeze_binds_the_record_and_refuses_the_tuning_validation(tmp_path, cache, reference, capsys):
    # The study's validation is the tuning's validation population: refused, nothing written.
    refused = tmp_path / "refused"
    assert (
        main(
            [
                "study",
                "freeze",
                str(_study_config(tmp_path / "a", cache, reference, validation_seed=9)),
                "--output",
                str(refused),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "validation=" in err and "the tuning's validation population" in err and not refused.exists()
    # A recipe other than the winner: refused, naming the differing fields.
    assert (
        main(
            [
                "study",
                "freeze",
                str(_study_config(tmp_path / "b", cache, reference, recipe_file=False)),
                "--output",
                str(refused),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "experiment.recipe=" in err and "optimizer.lr=" in err and not refused.exists()
    # The winner's recipe file on another validation seed: frozen, with the record copied in and bound.
    frozen = tmp_path / "frozen"
    assert main(["study", "freeze", str(_study_config(tmp_path / "c", cache, reference)), "--output", str(frozen)]) == 0
    body = json.loads((frozen / "freeze.receipt.json").read_text())["body"]
    tuning = body["preparation"]["tuning"]
    assert tuning["record_sha256"] == sha256_file(reference / "tuning.json")
    assert tuning["winner"]["number"] == json.loads((reference / "tuning.json").read_text())["winner"]["number"]
    capsys.readouterr()
    assert main(["verify", str(frozen)]) == 0
    assert "preparation/tuning: 4 trials' scores and the winner" in capsys.readouterr().out
    # The rest of the study: its report draws the tuning's two figures and logs them to its W&B run.
    assert main(["study", "run", str(tmp_path / "c" / "study.toml"), "--output", str(frozen)]) == 0
    report = frozen / "report"
    figures = ("tuning_history.png", "tuning_importances.png")
    assert all((report / name).read_bytes().startswith(b"\x89PNG") for name in figures)
    assert all(f"`{name}`" in (report / "report.md").read_text() for name in figures)
    receipt = json.loads((report / "report.receipt.json").read_text())
    bound = [entry["path"] for entry in receipt["outputs"].values()]
    assert all(any(path.endswith(name) for path in bound) for name in figures), bound
    (run,) = (frozen / "wandb-report").iterdir()
    logged = {p.name.rsplit("_", 2)[0] for p in run.glob("**/files/media/images/report/*.png")}
    assert {"tuning_history", "tuning_importances"} <= logged, logged
    # A replication may not draw the tuning's validation population (seed 9): refused, nothing written.
    replica = tmp_path / "replica"
    argv = ["study", "replicate", str(frozen), "--train-seed", "27", "--validation-seed", "9", "--output", str(replica)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "validation seed 9 is the seed of the tuning validation" in err and "refused: [7, 8, 9]" in err, err
    assert not replica.exists()


# ----------------------------------------------------------------- the pruner


def test_the_pruner_stops_a_trial_worse_than_the_median_of_earlier_complete_trials():
    from qhlab.design.tuning_rule import prune_at, running_means

    median = {"kind": "median", "percentile": None, "startup_trials": 2}
    earlier = [{"mean": m, "intermediate": {"1": m}} for m in (0.10, 0.20, 0.30)]
    assert running_means([0.3, 0.1, 0.2], [1, 2]) == {"1": 0.3, "2": 0.2}
    assert prune_at(median, earlier, {"1": 0.25}, 1) is True
    assert prune_at(median, earlier, {"1": 0.20}, 1) is False  # the median itself is kept
    assert prune_at(median, earlier[:1], {"1": 9.0}, 1) is False  # fewer than startup_trials complete
    quarter = {"kind": "percentile", "percentile": 25.0, "startup_trials": 2}
    assert prune_at(quarter, earlier, {"1": 0.16}, 1) is True and prune_at(quarter, earlier, {"1": 0.14}, 1) is False


@pytest.mark.parametrize(
    "pruner, field, allowed",
    [
        ('kind = "median"\nrungs = [2]', "pruner.rungs", "fit counts below the objective's 2 seeds"),
        ('kind = "median"\nrungs = [1, 1]', "rungs", "increasing fit counts"),
        ('kind = "median"\npercentile = 30.0\nrungs = [1]', "percentile", "with kind 'percentile' only"),
        ('kind = "hyperband"\nrungs = [1]', "pruner.kind", "'median' or 'percentile'"),
    ],
)
def test_a_bad_pruner_is_refused_with_nothing_written(tmp_path, cache, capsys, pruner, field, allowed):
    config = _config(tmp_path / "c", cache)
    config.write_text(config.read_text() + f"\n[pruner]\n{pruner}\n")
    output = tmp_path / "out"
    assert _tune(config, output) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and field in err and allowed in err, err
    assert not output.exists()


_PRUNED = {
    "trials = 4": "trials = 6",
    "seeds = [2, 3]": "seeds = [2, 3, 4]",
    'sampler = "tpe"': 'sampler = "random"',
    '"optimizer.lr" = { low = 1e-3, high = 1e-2, log = true }': '"optimizer.lr" = { low = 1e-4, high = 1e-2, log = true }',  # noqa: E501 - one literal, kept whole
}


def _pruned_config(directory: Path, cache: Path) -> Path:
    config = _config(directory, cache, **_PRUNED)
    config.write_text(config.read_text() + '\n[pruner]\nkind = "median"\nrungs = [1, 2]\nstartup_trials = 2\n')
    return config


@pytest.mark.slow
def test_pruned_trials_are_the_same_with_one_or_two_workers_and_verify_recomputes_them(tmp_path, cache, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert _tune(_pruned_config(tmp_path / "c", cache), one, "--workers", "1") == 0
    assert _tune(_pruned_config(tmp_path / "c", cache), two, "--workers", "2") == 0
    assert _trials(one) == _trials(two)
    record = json.loads((one / "tuning.json").read_text())
    pruned = [t for t in record["trials"] if t["state"] == "pruned"]
    # Batch 1 (trials 1-2) has nothing to compare with; later batches are judged against it and each other.
    assert pruned and all(t["batch"] >= 1 and 1 <= len(t["fits"]) < 3 and t["mean"] is None for t in pruned)
    assert all(t["reason"].startswith(f"median pruner after {len(t['fits'])} of its fits") for t in pruned)
    assert [t["state"] for t in record["trials"][:2]] == ["complete", "complete"]
    capsys.readouterr()
    assert main(["verify", str(one)]) == 0
    assert f"{sum(len(t['fits']) for t in record['trials'])} fits' metrics recomputed" in capsys.readouterr().out

    # A complete trial called pruned after one fit (its later fits dropped), resealed: the pruner keeps it.
    kept = next(t for t in record["trials"] if t["state"] == "complete" and t["batch"] >= 1)
    forged = dict(
        record,
        trials=[
            dict(
                t,
                state="pruned",
                fits=t["fits"][:1],
                mean=None,
                seed_sd=None,
                intermediate={"1": t["intermediate"]["1"]},
                reason="median pruner after 1 of its fits",
            )
            if t["number"] == kept["number"]
            else t
            for t in record["trials"]
        ],
    )
    (one / "tuning.json").write_bytes(canonical_json(forged))
    _reseal(one)
    assert main(["verify", str(one)]) == 2
    assert (
        f"trial {kept['number'] + 1} is pruned after 1 fits, but the median pruner does not stop it after 1"
        in capsys.readouterr().err
    )


def test_a_tuning_without_an_admissible_trial_has_a_receipt_body_without_a_winner():
    # Every trial over the cost limit or pruned: the record publishes no recipe and its receipt no winner.
    from qhlab.design.tuning_record import TuningReceipt

    body = TuningReceipt.body_model().model_validate(
        {"name": "t", "config_sha256": "0" * 64, "trials": 3, "winner": None}
    )
    assert body.winner is None


@pytest.mark.parametrize(
    "reshape",
    [
        pytest.param(lambda r: r.update(trials={}), id="trials-a-mapping"),
        pytest.param(lambda r: r["trials"][0].pop("fits"), id="a-trial-without-fits"),
        pytest.param(lambda r: r["trials"][0].update(mean="low"), id="a-mean-that-is-text"),
        pytest.param(lambda r: r["trials"][0]["fits"][0].update(seed=None), id="a-fit-without-its-seed"),
        pytest.param(lambda r: r.update(winner=[]), id="the-winner-a-list"),
        pytest.param(lambda r: r.update(objective="regret"), id="the-objective-a-string"),
    ],
)
def test_a_reshaped_record_is_one_clear_refusal_not_a_traceback(tmp_path, reference, capsys, reshape):
    reshaped = reshaped_copy(reference, tmp_path / "reshaped", "tuning.json", reshape)
    _reseal(reshaped)
    capsys.readouterr()
    assert main(["verify", str(reshaped)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "tuning.json" in err and "Traceback" not in err, err
