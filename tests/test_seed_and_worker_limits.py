"""Seeds and worker counts are refused at the config or the command line, never deep in a run.

A training seed (a study's ``seeds``, a recipe's ``seed``, a pilot's ``seeds`` and ``draw_seeds``,
a tuning's ``objective.seeds`` and ``sampler_seed``, the bootstrap's ``seed``) reaches Lightning's
``seed_everything`` or numpy's seeding, which take [0, 2**32): a larger one is refused when the
config is read, naming the field, the value and the range. A population seed only feeds qhlab's
own scene sampler and keeps its 63 bits. Every worker count (``--workers``, ``--threads``) has a
bound checked before any population is drawn: exit 2, one error line, nothing written.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from qhlab.cli import main
from qhlab.design.config_files import load_recipe
from qhlab.design.e0_config import read_e0_config
from qhlab.design.pilot_config import read_pilot_config
from qhlab.design.study_config import read_study_config
from qhlab.design.tuning_config import read_tuning_config
from qhlab.evidence import (
    MAX_WORKERS,
    POPULATION_SEED_LIMIT,
    TRAINING_SEED_LIMIT,
    QhInputError,
    require_seed,
    require_workers,
    seed_problem,
)
from qhlab.execution import JobRunner, executor_choice
from qhlab.scenes import generate_population
from qhlab.scenes.sampler import scene_seed

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RANGE = "an integer in [0, 2**32), i.e. 0 to 4294967295"
HUGE = 10**30


def _study() -> dict:
    raw = tomllib.loads((EXAMPLES / "first-study.toml").read_text())
    raw.pop("preparation")
    raw["population_cache"] = "pops"
    return raw


def _pilot() -> dict:
    return {
        "name": "limits-pilot",
        "study": "study.toml",
        "seeds": [2, 3],
        "population_cache": "pops",
        "train": {"preset": "tiny", "seed": 7},
        "validation": {"preset": "tiny", "seed": 9},
    }


def _e0() -> dict:
    return {"name": "limits-e0", "study": "study.toml", "train_seeds": [21, 22, 23], "population_cache": "pops"}


def _tune() -> dict:
    return {**tomllib.loads((EXAMPLES / "tiny-tune.toml").read_text()), "population_cache": "pops"}


def _recipe() -> dict:
    return tomllib.loads((EXAMPLES / "tiny-recipe.toml").read_text())


KINDS = {
    "study": ("study.toml", _study, read_study_config),
    "pilot": ("pilot.toml", _pilot, read_pilot_config),
    "e0": ("e0.toml", _e0, read_e0_config),
    "tune": ("tune.toml", _tune, read_tuning_config),
    "recipe": ("recipe.toml", _recipe, load_recipe),
}


def _write(directory: Path, kind: str, document: dict) -> Path:
    """The kind's file in ``directory``, with the study and recipe it names beside it (a pilot's study
    declares the pilot's layout where its seeds are in range: out of range, the pilot's own field is refused
    before its study is read)."""
    study = _study()
    if kind == "pilot":
        draws = [document["train"]["seed"], *document.get("train_draws", [])]
        seeds = [document["seeds"], *document.get("draw_seeds", [])]
        if all(isinstance(s, int) and 0 <= s < TRAINING_SEED_LIMIT for group in seeds for s in group):
            study["preparation"] = {"pilot_layout": {"draws": draws, "seeds": seeds}}
    (directory / "study.toml").write_text(tomli_w.dumps(study))
    shutil.copy(EXAMPLES / "tiny-recipe.toml", directory / "tiny-recipe.toml")
    name = KINDS[kind][0]
    (directory / name).write_text(tomli_w.dumps(document))
    return directory / name


def _set(document: dict, path: tuple, value) -> dict:
    node = document
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return document


def _command(argv: list[str]) -> tuple[int, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


# (kind, field path, its value with one seed past 32 bits, the field the refusal names)
TRAINING_SEEDS = [
    ("study", ("seeds",), [TRAINING_SEED_LIMIT, 1], "seeds=[4294967296, 1]"),
    ("study", ("bootstrap", "seed"), TRAINING_SEED_LIMIT, "bootstrap.seed=4294967296"),
    ("recipe", ("seed",), TRAINING_SEED_LIMIT, "seed=4294967296"),
    ("pilot", ("seeds",), [2, TRAINING_SEED_LIMIT], "seeds=[2, 4294967296]"),
    ("tune", ("objective", "seeds"), [TRAINING_SEED_LIMIT], "objective.seeds=[4294967296]"),
    ("tune", ("sampler_seed",), 2**63 - 1, "sampler_seed=9223372036854775807"),
]


@pytest.mark.parametrize(
    "kind, path, value, named", TRAINING_SEEDS, ids=[f"{k}-{'.'.join(p)}" for k, p, *_ in TRAINING_SEEDS]
)
def test_a_training_seed_past_32_bits_is_refused_by_its_field(tmp_path, kind, path, value, named) -> None:
    _, base, reader = KINDS[kind]
    file = _write(tmp_path, kind, _set(base(), path, value))
    with pytest.raises(QhInputError) as refused:
        reader(file)
    message = str(refused.value)
    assert f"{named} is not allowed" in message and RANGE in message and "seed_everything" in message, message
    # The largest seed Lightning takes is accepted in its place.
    top = TRAINING_SEED_LIMIT - 1
    accepted = [min(v, top) for v in value] if isinstance(value, list) else top
    reader(_write(tmp_path, kind, _set(base(), path, accepted)))


def test_a_pilots_draw_seeds_are_training_seeds_and_its_train_draws_population_seeds(tmp_path) -> None:
    document = {**_pilot(), "train_draws": [40, 41], "draw_seeds": [[4, 5], [6, TRAINING_SEED_LIMIT]]}
    with pytest.raises(QhInputError, match=r"draw_seeds\[1\]=\[6, 4294967296\] is not allowed") as refused:
        read_pilot_config(_write(tmp_path, "pilot", document))
    assert RANGE in str(refused.value)
    # A TRAIN draw is a population seed: only the scene sampler reads it, so 63 bits stay allowed.
    wide = {**document, "train_draws": [2**40, 2**62], "draw_seeds": [[4, 5], [6, 7]]}
    assert read_pilot_config(_write(tmp_path, "pilot", wide))[0].train_draws == (2**40, 2**62)


def test_population_seeds_keep_their_63_bits(tmp_path) -> None:
    config, _, _ = read_e0_config(_write(tmp_path, "e0", {**_e0(), "train_seeds": [2**32, 2**40, 2**63 - 1]}))
    assert config.train_seeds == (2**32, 2**40, 2**63 - 1)
    study = _set(_set(_study(), ("train", "seed"), 2**62), ("validation", "seed"), 2**32)
    assert read_study_config(_write(tmp_path, "study", study))[0].train.seed == 2**62
    assert scene_seed("train", 2**63 - 1, 0) >= 0
    with pytest.raises(
        QhInputError, match=r"scenes: seed=9223372036854775808 is not allowed; allowed: an integer in \[0, 2\*\*63\)"
    ):
        scene_seed("train", POPULATION_SEED_LIMIT, 0)


def test_the_shared_seed_and_worker_checks() -> None:
    assert seed_problem("seed", TRAINING_SEED_LIMIT - 1) is None and seed_problem("seed", 0) is None
    for bad in (-1, TRAINING_SEED_LIMIT, True, 1.0, "3"):
        why = "(Lightning's seed_everything and numpy's seeding take no larger seed)"
        assert seed_problem("seed", bad) == f"seed={bad!r} is not allowed; allowed: {RANGE} {why}"
    with pytest.raises(
        QhInputError, match=r"^c: s=4294967296 is not allowed; allowed: an integer in \[0, 2\*\*32\).*HINT: h$"
    ):
        require_seed("c", "s", TRAINING_SEED_LIMIT, hint="h")
    assert require_seed("c", "s", TRAINING_SEED_LIMIT, limit=POPULATION_SEED_LIMIT, hint="h") == TRAINING_SEED_LIMIT
    assert require_workers("c", "w", MAX_WORKERS, hint="h") == MAX_WORKERS
    for bad in (0, MAX_WORKERS + 1, HUGE, True, 2.0):
        with pytest.raises(
            QhInputError, match=rf"^c: w={bad!r} is not allowed; allowed: an integer from 1 to {MAX_WORKERS}\. HINT: h$"
        ):
            require_workers("c", "w", bad, hint="h")


def test_a_study_freeze_refuses_a_seed_past_32_bits_before_anything_is_drawn(tmp_path) -> None:
    config = _write(tmp_path, "study", _set(_study(), ("seeds",), [4294967296, 1]))
    code, text = _command(["study", "freeze", str(config), "--output", str(tmp_path / "study")])
    assert code == 2 and text.count("error:") == 1 and "Traceback" not in text, text
    assert "seeds=[4294967296, 1] is not allowed" in text and RANGE in text, text
    assert not (tmp_path / "study").exists() and not (tmp_path / "pops").exists()


def test_a_pilot_refuses_a_seed_past_32_bits_before_anything_is_drawn(tmp_path) -> None:
    config = _write(tmp_path, "pilot", {**_pilot(), "seeds": [TRAINING_SEED_LIMIT, 1]})
    code, text = _command(["pilot", str(config), "--output", str(tmp_path / "out")])
    assert code == 2 and text.count("error:") == 1 and "seeds=[4294967296, 1] is not allowed" in text, text
    assert not (tmp_path / "out").exists() and not (tmp_path / "pops").exists()


def _worker_commands(directory: Path) -> dict[str, list[str]]:
    out = str(directory / "out")
    files = {kind: str(_write(directory, kind, KINDS[kind][1]())) for kind in ("pilot", "e0", "tune", "recipe")}
    return {
        "pilot": ["pilot", files["pilot"], "--output", out, "--workers", str(HUGE)],
        "e0-check": ["e0-check", files["e0"], "--output", out, "--workers", str(HUGE)],
        "tune": ["tune", files["tune"], "--output", out, "--workers", str(HUGE)],
        "study run": ["study", "run", str(directory / "study.toml"), "--output", out, "--workers", str(HUGE)],
        "study replicate": [
            "study",
            "replicate",
            str(directory),
            "--train-seed",
            "1",
            "--validation-seed",
            "2",
            "--output",
            out,
            "--workers",
            str(HUGE),
        ],  # fmt: skip
        "scenes generate": [
            "scenes",
            "generate",
            "--preset",
            "tiny",
            "--split",
            "train",
            "--seed",
            "0",
            "--out",
            out,
            "--workers",
            str(HUGE),
            "--no-progress",
        ],  # fmt: skip
        "fit --threads": [
            "fit",
            files["recipe"],
            "--profile",
            "cpu-fp32",
            "--output",
            out,
            "--threads",
            str(HUGE),
            "--no-progress",
        ],  # fmt: skip
    }


@pytest.mark.parametrize(
    "name", ["pilot", "e0-check", "tune", "study run", "study replicate", "scenes generate", "fit --threads"]
)
def test_an_absurd_worker_count_is_refused_before_anything_is_drawn(tmp_path, name) -> None:
    argv = _worker_commands(tmp_path)[name]
    code, text = _command(argv)
    flag = argv[argv.index("--threads" if "threads" in name else "--workers")]
    assert code == 2 and text.count("error:") == 1 and "Traceback" not in text, text
    bound = 256 if flag == "--threads" else MAX_WORKERS
    assert f"{flag}={HUGE} is not allowed; allowed: an integer from 1 to {bound}. HINT:" in text, text
    assert not (tmp_path / "out").exists() and not (tmp_path / "pops").exists()


def test_a_worker_count_past_the_bound_is_refused_by_the_api_before_drawing(tmp_path) -> None:
    with pytest.raises(
        QhInputError,
        match=rf"generate_population: workers={HUGE} is not allowed; allowed: an integer from 1 to {MAX_WORKERS}",
    ):
        generate_population("tiny", "train", 0, tmp_path / "pop", workers=HUGE)
    assert not (tmp_path / "pop").exists()
    with pytest.raises(QhInputError, match=rf"JobRunner: workers={MAX_WORKERS + 1} is not allowed"):
        JobRunner(executor_choice("local", None, call="t"), MAX_WORKERS + 1, call="t")
