"""End-to-end tests of `fit_recipe` and `qhlab fit` on the tiny preset populations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qhlab.cli import main
from qhlab.design.config_files import load_recipe
from qhlab.evidence import LockHeldError, QhInputError, read_receipt
from qhlab.evidence.envelope import Receipt
from qhlab.finite_horizon.data import load_population
from qhlab.finite_horizon.fit import FitRequest, fit_recipe
from qhlab.finite_horizon.records import EvaluationReceipt
from qhlab.scenes import generate_population
from qhlab.training.execution_profile import WandbAttempt
from qhlab.training.records import FitReceipt, WandbAttemptReceipt
from qhlab.training.tensor_state import load_tensor_state
from wandb_records import read_offline_run

_CUDA = torch.cuda.is_available()
_MPS = torch.backends.mps.is_available()

_RECIPE = """\
name = "fit-test"
seed = {seed}
horizon = {horizon}
batch_size = 4
huber_delta = 0.05
updates = {updates}

[architecture]
arm = "{arm}"
encoder = {{ depth = 1, width = 16, heads = 2 }}

[optimizer]
lr = {lr}

[target_update]
kind = "hard"
interval = 3
"""


def _recipe(tmp: Path, name: str = "recipe.toml", *, seed=0, horizon=2, updates=8, arm="baseline", lr=3e-3) -> Path:
    path = tmp / name
    path.write_text(_RECIPE.format(seed=seed, horizon=horizon, updates=updates, arm=arm, lr=lr))
    return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Tiny TRAIN (seed 0) and validation (seed 1) populations, generated once per session."""
    root = tmp_path_factory.mktemp("tiny-pops")
    return {
        "train": generate_population("tiny", "train", 0, root / "train", workers=1),
        "validation": generate_population("tiny", "validation", 1, root / "validation", workers=1),
    }


def _cli(recipe: Path, out: Path, tiny: dict[str, Path], *extra: str) -> list[str]:
    return [
        "fit",
        str(recipe),
        "--profile",
        "cpu-fp32",
        "--output",
        str(out),
        "--train",
        str(tiny["train"]),
        "--validation",
        str(tiny["validation"]),
        "--no-progress",
        *extra,
    ]


def test_cli_fit_publishes_verified_segment(tmp_path, tiny, capsys):
    recipe = _recipe(tmp_path)
    out = tmp_path / "out"
    started = time.perf_counter()
    assert main(_cli(recipe, out, tiny)) == 0
    wall = time.perf_counter() - started
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    segment = Path(summary["output_directory"])
    assert segment.parent == out / "fit-test-s0"
    names = {p.name for p in segment.iterdir()}
    assert {
        "cold_init.safetensors",
        "cold_init.json",
        "cold_init.receipt.json",
        "final_state.safetensors",
        "final_state.json",
        "fit.receipt.json",
        "evaluation.receipt.json",
        "wandb_attempt.receipt.json",
        "wandb",
    } <= names
    assert list((segment / "wandb").glob("offline-run-*"))
    fit = read_receipt(segment / "fit.receipt.json", FitReceipt).body_record()
    assert fit["observed_updates"] == fit["update_budget"] == 8
    assert fit["profile"] == "cpu-fp32" and fit["recipe"]["accelerator"] == "cpu"
    # A hard target (every 3 updates): the successor values were a table, built at the start and
    # after the refreshes at updates 3 and 6.
    train = load_population(tiny["train"], split="train")
    assert fit["target_values"] == {
        "cached": True,
        "table_builds": 3,
        "successor_states": int(torch.unique(train.successor[train.is_chain]).numel()),
        "table_bytes": train.successor.shape[0] * 1 * 1 * 4,
    }
    tensors, structure = load_tensor_state(
        segment / "final_state.safetensors", expected_sha256=fit["final_state_sha256"]
    )
    steps = {int(v) for k, v in tensors.items() if k.endswith(".step")}
    assert steps == {8} and structure["observed_updates"] == 8
    assert any(k.startswith("target.") for k in tensors) and any(k.startswith("online.") for k in tensors)
    evaluation = read_receipt(segment / "evaluation.receipt.json", EvaluationReceipt).body_record()
    assert evaluation["horizon"] == 2 and len(evaluation["mae"]) == 2 and len(evaluation["regret"]) == 2
    assert evaluation["final_state_sha256"] == fit["final_state_sha256"]
    assert evaluation["population"]["split"] == "validation"
    assert len(evaluation["per_scene"]["mae"]) == evaluation["counts"]["n_scenes"] == 3
    assert "constant_reference" not in evaluation  # the TRAIN-only constant is a study's development step's
    wandb = read_receipt(segment / "wandb_attempt.receipt.json", WandbAttemptReceipt).body_record()
    assert wandb["publication"]["cloud_publication"].startswith("not published")
    assert set(wandb["files"]) >= {"fit_receipt", "final_state", "evaluation_receipt"}
    assert main(["verify", str(segment)]) == 0
    # What wandb itself recorded for a lone fit: grouped by its logical run, job type "fit".
    (run_file,) = sorted(segment.glob("wandb/offline-run-*/run-*.wandb"))
    run = read_offline_run(run_file)
    assert run["group"] == "fit-test-s0" and run["job_type"] == "fit"
    assert run["tags"] == ["baseline", "seed-0", "cpu-fp32"]
    assert run["config"]["recipe"]["horizon"] == 2 and run["config"]["recipe_digest"] == fit["recipe_digest"]
    assert run["config"]["populations"]["validation"]["manifest_sha256"] == evaluation["population"]["digest"]
    assert run["summary"]["final_state_sha256"] == fit["final_state_sha256"]
    assert run["config"]["qhlab"]["source_package_sha256"] == fit["source_package"]["sha256"]
    assert run["config"]["qhlab"]["version"] == fit["source_package"]["version"]
    assert run["summary"]["val_mae_h2"] == pytest.approx(evaluation["mae"][1])
    assert (segment / "fit.log").is_file()
    print(f"\nqhlab fit wall time on tiny (8 updates, in-process CLI): {wall:.2f} s")


def test_same_seed_same_final_state(tmp_path, tiny):
    recipe = load_recipe(_recipe(tmp_path))
    kwargs = dict(
        profile="cpu-fp32", output=tmp_path / "out", train=tiny["train"], validation=tiny["validation"], progress=False
    )
    first = fit_recipe(FitRequest(recipe=recipe, **kwargs))
    second = fit_recipe(FitRequest(recipe=recipe, **kwargs))
    assert first.output_directory != second.output_directory
    assert first.final_state_sha256 == second.final_state_sha256
    assert first.metrics == second.metrics
    assert first.observed_updates == 8 and first.resumed_from is None


def test_fit_from_population_copies_binds_the_originals_and_matches(tmp_path, tiny):
    """What a Ray worker does: read byte-identical copies in its own directory, name the originals."""
    import shutil

    recipe = load_recipe(_recipe(tmp_path))
    copies = {role: shutil.copytree(tiny[role], tmp_path / "worker" / role) for role in ("train", "validation")}
    kwargs = dict(profile="cpu-fp32", progress=False)
    direct = fit_recipe(
        FitRequest(
            recipe=recipe, output=tmp_path / "direct", train=tiny["train"], validation=tiny["validation"], **kwargs
        )
    )
    copied = fit_recipe(
        FitRequest(
            recipe=recipe,
            output=tmp_path / "copied",
            train=copies["train"],
            validation=copies["validation"],
            recorded_populations=tiny,
            **kwargs,
        )
    )
    assert copied.final_state_sha256 == direct.final_state_sha256 and copied.metrics == direct.metrics
    shutil.rmtree(tmp_path / "worker")  # gone, as a finished Ray task's directory is
    for name, roles in (("fit.receipt.json", ("train", "validation")), ("evaluation.receipt.json", ("validation",))):
        document = read_receipt(copied.output_directory / name, Receipt).record()
        assert {k for k in document["inputs"] if k.endswith("_manifest")} == {f"{role}_manifest" for role in roles}
        for role in roles:
            assert document["inputs"][f"{role}_manifest"]["path"] == (tiny[role] / "manifest.json").as_posix()
    assert read_receipt(copied.fit_receipt, FitReceipt).body_record()["execution"]["executor"] == "local"
    with pytest.raises(QhInputError, match="recorded_populations=\\['test'\\] is not allowed"):
        fit_recipe(
            FitRequest(
                recipe=recipe,
                output=tmp_path / "bad",
                train=tiny["train"],
                validation=tiny["validation"],
                recorded_populations={"test": tiny["train"]},
                **kwargs,
            )
        )
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    ("recipe_kwargs", "profile", "message"),
    [
        ({"arm": "no-such-arm"}, "cpu-fp32", "architecture"),
        ({"lr": -0.1}, "cpu-fp32", "optimizer.lr=-0.1 is not allowed"),
        ({"horizon": 3}, "cpu-fp32", "horizon"),
        # ids without "cuda": scripts/device-check selects the CUDA tests with -k cuda
        pytest.param(
            {},
            "cuda-amp",
            "cuda-amp",
            id="gpu-lane-without-its-device",
            marks=pytest.mark.skipif(_CUDA, reason="a CUDA device is present, so cuda-amp is admitted here"),
        ),
        pytest.param(
            {},
            "mps-fp32",
            "mps-fp32",
            id="mac-lane-without-its-device",
            marks=pytest.mark.skipif(_MPS, reason="an MPS device is present, so mps-fp32 is admitted here"),
        ),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, tiny, capsys, recipe_kwargs, profile, message):
    recipe = _recipe(tmp_path, **recipe_kwargs)
    out = tmp_path / "out"
    argv = _cli(recipe, out, tiny)
    argv[argv.index("cpu-fp32")] = profile
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err
    assert not out.exists()


def test_concurrent_fit_of_same_logical_run_fails_at_once(tmp_path, tiny):
    out = tmp_path / "out"
    holder = WandbAttempt(run_id="holder", offline=True, logical_run_id="fit-test-s0")
    with holder.local_writer_lock(out) as lock:
        with pytest.raises(LockHeldError, match=str(lock)):
            fit_recipe(
                FitRequest(
                    recipe=load_recipe(_recipe(tmp_path)),
                    profile="cpu-fp32",
                    output=out,
                    train=tiny["train"],
                    validation=tiny["validation"],
                    progress=False,
                )
            )
    assert not (out / "fit-test-s0").exists()


def test_resume_of_unknown_or_finished_segment_is_refused(tmp_path, tiny):
    recipe = load_recipe(_recipe(tmp_path))
    kwargs = dict(
        profile="cpu-fp32", output=tmp_path / "out", train=tiny["train"], validation=tiny["validation"], progress=False
    )
    done = fit_recipe(FitRequest(recipe=recipe, **kwargs))
    with pytest.raises(QhInputError, match="already finished"):
        fit_recipe(FitRequest(recipe=recipe, resume=done.local_attempt_id, **kwargs))
    with pytest.raises(QhInputError, match="does not exist"):
        fit_recipe(FitRequest(recipe=recipe, resume="nope", **kwargs))
    assert [p.name for p in done.output_directory.parent.iterdir()] == [done.local_attempt_id]


_RUN_CLI = "import sys; from qhlab.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow
def test_sigint_then_resume_into_new_segment(tmp_path, tiny):
    recipe = _recipe(tmp_path, updates=60)
    out = tmp_path / "out"
    cell = out / "fit-test-s0"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN_CLI, *_cli(recipe, out, tiny, "--checkpoint-every", "5")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not list(cell.glob("*/segment_checkpoint_u*.receipt.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    first = next(cell.iterdir())
    assert "--resume " + first.name in err
    assert not (first / "final_state.safetensors").exists()
    # another seed (same cell) is refused by the cold-init lineage check, writing nothing
    other = _recipe(tmp_path, "other.toml", seed=5, updates=60)
    assert main(_cli(other, out, tiny, "--cell", "fit-test-s0", "--resume", first.name)) == 2
    assert len(list(cell.iterdir())) == 1
    resumed = fit_recipe(
        FitRequest(
            recipe=load_recipe(recipe),
            profile="cpu-fp32",
            output=out,
            train=tiny["train"],
            validation=tiny["validation"],
            resume=first.name,
            progress=False,
        )
    )
    fit = read_receipt(resumed.fit_receipt, FitReceipt).body_record()
    assert resumed.observed_updates == 60 and resumed.output_directory != first
    assert fit["lineage"]["kind"] == "resumed" and fit["lineage"]["previous_local_attempt_id"] == first.name
    assert fit["lineage"]["cold_initialization"]["seed"] == 0
    assert fit["logical_run_id"] == "fit-test-s0"
    # The resumed segment rebuilt the successor-value table from its restored target, then after
    # each of its own refreshes (every 3 updates).
    start = fit["segment_start_updates"]
    assert fit["target_values"]["cached"] and fit["target_values"]["table_builds"] == 1 + 60 // 3 - start // 3
    assert main(["verify", str(resumed.output_directory)]) == 0
    # optimizer moments and the batch stream continue exactly: same bytes as one uninterrupted fit
    straight = fit_recipe(
        FitRequest(
            recipe=load_recipe(recipe),
            profile="cpu-fp32",
            output=tmp_path / "straight",
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )
    assert straight.final_state_sha256 == resumed.final_state_sha256


def test_a_successor_value_table_over_its_budget_is_refused_before_anything_is_written(
    tmp_path, tiny, capsys, monkeypatch
):
    from qhlab.finite_horizon import q_learning

    rows = load_population(tiny["train"], split="train").successor.shape[0]
    monkeypatch.setattr(q_learning, "TARGET_TABLE_BUDGET_BYTES", rows * 4 - 1)
    out = tmp_path / "out"
    assert main(_cli(_recipe(tmp_path), out, tiny)) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert f"a TRAIN population of {rows:,} rows is not allowed with target_update.kind='hard'" in err
    assert "HINT: use a smaller population, fewer members, or target_update.kind='polyak'" in err
    assert not out.exists()
    monkeypatch.setattr(q_learning, "TARGET_TABLE_BUDGET_BYTES", rows * 4)  # exactly at the budget: admitted
    assert main(_cli(_recipe(tmp_path), out, tiny)) == 0


def test_fit_recipe_takes_one_request_object(tmp_path, tiny):
    with pytest.raises(QhInputError, match=r"fit_recipe: request='PosixPath' is not allowed; allowed: a FitRequest"):
        fit_recipe(_recipe(tmp_path))
    with pytest.raises(TypeError):
        FitRequest(_recipe(tmp_path), "cpu-fp32", tmp_path)  # keyword-only: fields are named at the call


def test_memory_ceiling_is_admitted_with_the_lane_before_anything_is_written(tmp_path, tiny):
    with pytest.raises(
        QhInputError, match=r"max_allocated_bytes=1073741824 is not allowed; allowed: None on a 'cpu' lane"
    ):
        fit_recipe(
            FitRequest(
                recipe=load_recipe(_recipe(tmp_path)),
                profile="cpu-fp32",
                output=tmp_path / "out",
                train=tiny["train"],
                validation=tiny["validation"],
                max_allocated_bytes=2**30,
                progress=False,
            )
        )
    assert not (tmp_path / "out").exists()


class _SigintAt:
    """A Lightning callback sending SIGINT to this process after ``at`` optimizer updates."""

    def __new__(cls, at: int):
        from lightning.pytorch import Callback

        from qhlab.training.optimizer_state import observed_optimizer_updates

        class _Sigint(Callback):
            sent = False

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if not self.sent and observed_optimizer_updates(trainer.optimizers[0]) == at:
                    self.sent = True
                    os.kill(os.getpid(), signal.SIGINT)

        return _Sigint()


def _interrupted_segment(tmp_path: Path, out: Path, tiny) -> Path:
    """An interrupted segment of cell fit-test-s0 under ``out`` (checkpoint at 3 of 8 updates)."""
    from qhlab.training.launcher import FitInterrupted

    with pytest.raises(FitInterrupted, match="--resume "):
        fit_recipe(
            FitRequest(
                recipe=load_recipe(_recipe(tmp_path)),
                profile="cpu-fp32",
                output=out,
                train=tiny["train"],
                validation=tiny["validation"],
                progress=False,
                extra_callbacks=[_SigintAt(3)],
                segment_checkpoint_every=100,
            )
        )
    (segment,) = (out / "fit-test-s0").iterdir()
    assert (segment / "segment_checkpoint_u00000003.receipt.json").is_file()
    return segment


def _tree(root: Path) -> dict[str, bytes]:
    import wandb

    # wandb-core still appends to a finished offline run's .wandb file; stopping the service
    # lands those writes first, so a difference can only be one the refused command made.
    wandb.teardown()
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir>")
        for p in sorted(root.rglob("*"))
    }


def test_resume_is_confined_to_the_output_root(tmp_path, tiny, capsys):
    elsewhere = _interrupted_segment(tmp_path, tmp_path / "elsewhere", tiny)
    out = tmp_path / "out"
    (out / "fit-test-s0").mkdir(parents=True)
    link = out / "fit-test-s0" / "innocent"
    link.symlink_to(elsewhere, target_is_directory=True)
    before = {"out": _tree(out), "elsewhere": _tree(elsewhere.parent)}
    recipe = _recipe(tmp_path)
    dotted = f"../../elsewhere/fit-test-s0/{elsewhere.name}"
    assert (out / "fit-test-s0" / dotted).resolve() == elsewhere  # the path did reach the other output
    for attempt, allowed in (
        (dotted, "allowed: one segment directory name of this cell (no '/', no '..', not hidden)"),
        ("..", "allowed: one segment directory name of this cell"),
        (
            "innocent",
            f"allowed: a segment directory inside {str(out.resolve())!r} (it resolves to "
            f"{str(elsewhere.resolve())!r}, through a symbolic link)",
        ),
    ):
        assert main(_cli(recipe, out, tiny, "--resume", attempt)) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        (line,) = err.splitlines()
        assert line.startswith(f"error: fit_recipe: --resume={attempt!r} is not allowed; {allowed}"), line
        assert "HINT: pass the local_attempt_id of an interrupted segment of this cell" in line
    assert {"out": _tree(out), "elsewhere": _tree(elsewhere.parent)} == before


def test_a_segment_is_continued_at_most_once(tmp_path, tiny, capsys):
    out = tmp_path / "out"
    interrupted = _interrupted_segment(tmp_path, out, tiny)
    recipe = _recipe(tmp_path)
    assert main(_cli(recipe, out, tiny, "--resume", interrupted.name)) == 0
    first = Path(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["output_directory"])
    fit = read_receipt(first / "fit.receipt.json", FitReceipt).record()
    assert fit["body"]["lineage"]["previous_local_attempt_id"] == interrupted.name
    assert json.loads((first / "continuation.json").read_bytes())["previous_local_attempt_id"] == interrupted.name
    assert fit["inputs"]["continuation"]["path"] == "continuation.json"
    assert main(["verify", str(first)]) == 0
    capsys.readouterr()
    before = _tree(out / "fit-test-s0")
    assert main(_cli(recipe, out, tiny, "--resume", interrupted.name)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith(
        f"error: resume: --resume={interrupted.name!r} is not allowed; allowed: an interrupted "
        f"segment that no segment continues yet; {interrupted.name!r} is already continued by "
        f"segment {first.name!r} ({str(first)!r}). HINT: a segment is continued at most once"
    ), line
    assert _tree(out / "fit-test-s0") == before


def test_a_loaded_population_fits_as_its_path_does(tmp_path, tiny):
    """A study hands fit_recipe the Population it authenticated once: same fit as from the path."""
    from qhlab.finite_horizon.data import load_population

    recipe = load_recipe(_recipe(tmp_path))
    train = load_population(tiny["train"], split="train")
    validation = load_population(tiny["validation"], split="validation")
    by_path = fit_recipe(
        FitRequest(
            recipe=recipe,
            profile="cpu-fp32",
            output=tmp_path / "a",
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )
    loaded = fit_recipe(
        FitRequest(
            recipe=recipe, profile="cpu-fp32", output=tmp_path / "b", train=train, validation=validation, progress=False
        )
    )
    assert loaded.final_state_sha256 == by_path.final_state_sha256
    assert loaded.metrics == by_path.metrics


def test_a_loaded_population_is_refused_when_stale_or_of_another_split(tmp_path, tiny):
    import shutil

    from qhlab.finite_horizon.data import load_population

    recipe = load_recipe(_recipe(tmp_path))
    validation = load_population(tiny["validation"], split="validation")
    with pytest.raises(QhInputError, match=r"fit_recipe: train=.*a validation population.*allowed: a train population"):
        fit_recipe(
            FitRequest(
                recipe=recipe,
                profile="cpu-fp32",
                output=tmp_path / "out",
                train=validation,
                validation=validation,
                progress=False,
            )
        )
    copy = tmp_path / "train-copy"
    shutil.copytree(tiny["train"], copy)
    train = load_population(copy, split="train")
    manifest = copy / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=3))  # same content, other bytes
    with pytest.raises(QhInputError, match=r"train.manifest_sha256=.*changed after it was loaded"):
        fit_recipe(
            FitRequest(
                recipe=recipe,
                profile="cpu-fp32",
                output=tmp_path / "out",
                train=train,
                validation=validation,
                progress=False,
            )
        )
    assert not (tmp_path / "out").exists()


def test_benchmark_refuses_a_population_of_another_horizon(tmp_path, tiny):
    import dataclasses

    from qhlab.finite_horizon.benchmark import benchmark_scorer
    from qhlab.finite_horizon.data import load_population

    result = fit_recipe(
        FitRequest(
            recipe=load_recipe(_recipe(tmp_path)),
            profile="cpu-fp32",
            output=tmp_path / "out",
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )
    train = load_population(tiny["train"], split="train")
    other = dataclasses.replace(train, horizon=train.horizon + 1)
    with pytest.raises(QhInputError, match=r"benchmark_scorer: train.horizon=3 is not allowed; allowed: 2"):
        benchmark_scorer(result, other)


def test_a_recipe_with_averaged_weights_is_evaluated_on_them(tmp_path, tiny):
    from qhlab.finite_horizon.benchmark import load_final_module
    from qhlab.finite_horizon.data import load_population
    from qhlab.finite_horizon.evaluation import evaluate_population
    from qhlab.finite_horizon.predict import predict_q

    path = _recipe(tmp_path, updates=12)
    path.write_text(path.read_text() + "\n[evaluation]\naverage_decay = 0.5\n")
    recipe = load_recipe(path)
    result = fit_recipe(
        FitRequest(
            recipe=recipe,
            profile="cpu-fp32",
            output=tmp_path / "out",
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )
    tensors, _ = load_tensor_state(Path(result.output_directory) / "final_state.safetensors")
    assert {k.split(".")[0] for k in tensors if not k.startswith("optim")} >= {"online", "target", "average"}
    val = load_population(tiny["validation"], split="validation")
    module = load_final_module(recipe, val, Path(result.output_directory) / "final_state.safetensors")
    body = read_receipt(result.evaluation_receipt, EvaluationReceipt).body_record()
    on_average = evaluate_population(predict_q(module.average, val), val, tie_band=recipe.evaluation.tie_band)
    on_online = evaluate_population(predict_q(module.online, val), val, tie_band=recipe.evaluation.tie_band)
    assert body["mae"] == on_average["mae"] and body["mae"] != on_online["mae"]
    fit = read_receipt(result.fit_receipt, FitReceipt).body_record()
    assert fit["recipe"]["evaluation"]["average_decay"] == 0.5
    assert main(["verify", str(result.output_directory)]) == 0
    # The same bytes read with a recipe that keeps no average: refused, not silently half-loaded.
    from qhlab.evidence import EvidenceError

    plain = recipe.model_copy(update={"evaluation": recipe.evaluation.model_copy(update={"average_decay": None})})
    with pytest.raises(EvidenceError, match=r"holds tensors average\.\* that the recipe 'fit-test' does not build"):
        load_final_module(plain, val, Path(result.output_directory) / "final_state.safetensors")


def test_an_ensemble_recipe_is_evaluated_on_its_members_mean_and_benchmarked(tmp_path, tiny):
    """ensemble_members = 2 end to end: receipts, the evaluated mean, verify and the scorer benchmark."""
    from qhlab.finite_horizon.benchmark import benchmark_scorer, load_final_module
    from qhlab.finite_horizon.data import load_population
    from qhlab.finite_horizon.evaluation import evaluate_population
    from qhlab.finite_horizon.predict import predict_q
    from qhlab.finite_horizon.scorer import scorer_members

    path = _recipe(tmp_path, updates=12)
    path.write_text(path.read_text().replace("horizon = 2\n", "horizon = 2\nensemble_members = 2\n", 1))
    recipe = load_recipe(path)
    assert recipe.ensemble_members == 2
    result = fit_recipe(
        FitRequest(
            recipe=recipe,
            profile="cpu-fp32",
            output=tmp_path / "out",
            train=tiny["train"],
            validation=tiny["validation"],
            progress=False,
        )
    )
    val = load_population(tiny["validation"], split="validation")
    state = Path(result.output_directory) / "final_state.safetensors"
    module = load_final_module(recipe, val, state)
    body = read_receipt(result.evaluation_receipt, EvaluationReceipt).body_record()
    tie = recipe.evaluation.tie_band
    assert body["mae"] == evaluate_population(predict_q(module.online, val), val, tie_band=tie)["mae"]
    alone = [evaluate_population(predict_q(m, val), val, tie_band=tie)["mae"] for m in scorer_members(module.online)]
    assert len(alone) == 2 and body["mae"] not in alone and alone[0] != alone[1]
    fit = read_receipt(result.fit_receipt, FitReceipt).body_record()
    assert fit["recipe"]["ensemble_members"] == 2
    assert main(["verify", str(result.output_directory)]) == 0
    bench = benchmark_scorer(result, load_population(tiny["train"], split="train"))
    assert bench["module_timings"]["encoder_seconds"] > 0 and bench["module_timings"]["readout_seconds"] > 0
    assert all(n.startswith(("members.0.", "members.1.")) for n in bench["parameters_receiving_gradients"])
    assert {n.split(".")[1] for n in bench["parameters_receiving_gradients"]} == {"0", "1"}
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"encoder"):
        load_final_module(recipe.model_copy(update={"ensemble_members": 1}), val, state)


def test_a_learning_curve_leaves_the_fit_bit_identical(tmp_path, tiny) -> None:
    from qhlab.evidence.layout import EVALUATION_RECEIPT
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    results = {}
    for name, curve in (("plain", ()), ("curve", (2, 4, 99))):
        results[name] = fit_recipe(
            FitRequest(
                recipe=load_recipe(Path(__file__).resolve().parents[2] / "examples" / "tiny-recipe.toml"),
                profile="cpu-fp32",
                output=tmp_path / name,
                train=tiny["train"],
                validation=tiny["validation"],
                progress=False,
                curve_updates=curve,
            )
        )
    assert results["plain"].final_state_sha256 == results["curve"].final_state_sha256
    plain = read_receipt(Path(results["plain"].output_directory) / EVALUATION_RECEIPT, EvaluationReceipt).body_record()
    body = read_receipt(Path(results["curve"].output_directory) / EVALUATION_RECEIPT, EvaluationReceipt).body_record()
    assert "curve" not in plain
    # 99 is past the budget (40): never reached, so not a point; the final evaluation closes the curve.
    assert [p["updates"] for p in body["curve"]] == [2, 4, 40]
    assert body["curve"][-1]["mae"] == body["mae"] and body["curve"][0]["mae"] != body["mae"]


def test_a_fit_reports_its_progress_to_the_sink_of_its_process(tmp_path, tiny, capsys):
    from qhlab.execution import progress_sink

    reports = []
    kwargs = dict(profile="cpu-fp32", train=tiny["train"], validation=tiny["validation"], progress=True)
    with progress_sink(lambda *report: reports.append(report)):
        result = fit_recipe(
            FitRequest(recipe=load_recipe(_recipe(tmp_path, updates=40)), output=tmp_path / "out", **kwargs)
        )
    label = reports[0][0]
    assert reports[0] == (label, 0, 40) and reports[-1] == (label, 40, 40), reports
    assert all(r[0] == label and r[2] == 40 for r in reports)
    assert [r[1] for r in reports] == sorted(r[1] for r in reports)
    assert result.observed_updates == 40
    # Reported, not drawn: a worker's fit leaves the console to the process that shows it.
    assert "updates" not in capsys.readouterr().out
    # Without a sink the same fit reports nothing.
    reports.clear()
    fit_recipe(FitRequest(recipe=load_recipe(_recipe(tmp_path, updates=40)), output=tmp_path / "again", **kwargs))
    assert reports == []


def _request(tmp_path: Path, tiny, out: Path, **options) -> FitRequest:
    return FitRequest(
        recipe=load_recipe(_recipe(tmp_path)),
        profile="cpu-fp32",
        output=out,
        train=tiny["train"],
        validation=tiny["validation"],
        progress=False,
        **options,
    )


@pytest.mark.parametrize("step", ["save_tensor_state", "publish_wandb_attempt"])
def test_a_fit_failing_after_training_closes_its_run_and_the_next_fit_runs(tmp_path, tiny, monkeypatch, step):
    """A full disk at the final state (after ``Trainer.fit``) or at the W&B receipt (publishing)."""
    import wandb

    from qhlab.training import launcher

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(launcher, step, full_disk)
        with pytest.raises(OSError, match="No space left on device"):
            fit_recipe(_request(tmp_path, tiny, tmp_path / "failed"))
    # Left open, the run would be taken over by the next fit, whose publication then refuses it.
    assert wandb.run is None
    result = fit_recipe(_request(tmp_path, tiny, tmp_path / "next"))
    attempt = read_receipt(result.wandb_receipt, WandbAttemptReceipt).body_record()
    assert result.observed_updates == 8 and attempt["attempt"]["local_attempt_id"] == result.local_attempt_id


def test_a_scorer_refused_in_the_seeded_process_leaves_no_segment_directory(tmp_path, tiny):
    from qhlab.evidence import EvidenceError

    out = tmp_path / "out"
    with pytest.raises(EvidenceError, match=r"has structure [0-9a-f]{16} .* not the 0000000000000000 its freeze"):
        fit_recipe(_request(tmp_path, tiny, out, expected_structure="0" * 64))
    # Only the logical run's writer lock: no cell or segment directory was made for the refused fit.
    assert [p.relative_to(out).parts[0] for p in out.rglob("*")] == [".locks"] * len(list(out.rglob("*")))


def test_a_continuation_refused_before_it_trains_leaves_the_segment_resumable(tmp_path, tiny, monkeypatch):
    from qhlab.evidence import EvidenceError
    from qhlab.training import launcher
    from qhlab.training.segments import continuation_of

    out = tmp_path / "out"
    interrupted = _interrupted_segment(tmp_path, out, tiny)

    def forged(*args, **kwargs):
        raise EvidenceError("cold initialization: forged for the test")

    with monkeypatch.context() as patch:
        patch.setattr(launcher, "verified_cold_initialization_lineage", forged)
        with pytest.raises(EvidenceError, match="forged for the test"):
            fit_recipe(_request(tmp_path, tiny, out, resume=interrupted.name))
    assert continuation_of(interrupted) is None
    resumed = fit_recipe(_request(tmp_path, tiny, out, resume=interrupted.name))
    assert resumed.observed_updates == 8 and continuation_of(interrupted) == resumed.output_directory


def test_the_fit_sets_the_thread_count_its_request_names_and_its_receipt_records_it(tmp_path, tiny):
    before = torch.get_num_threads()
    kwargs = dict(
        profile="cpu-fp32", output=tmp_path / "out", train=tiny["train"], validation=tiny["validation"], progress=False
    )
    try:
        torch.set_num_threads(1)
        result = fit_recipe(FitRequest(recipe=load_recipe(_recipe(tmp_path)), torch_threads=2, **kwargs))
        # The launcher set it beside the seeding, whatever the process had, and the receipt says so.
        assert torch.get_num_threads() == 2
        assert read_receipt(result.fit_receipt, FitReceipt).body.torch_num_threads == 2
        with pytest.raises(QhInputError, match="torch_threads=0 is not allowed; allowed: an integer >= 1"):
            fit_recipe(FitRequest(recipe=load_recipe(_recipe(tmp_path)), torch_threads=0, **kwargs))
    finally:
        torch.set_num_threads(before)


def test_only_the_launcher_sets_torch_threads():
    # One place sets the thread count of every fit: cells, preparation fits, Ray cells, benchmarks
    # and `qhlab fit` pass it to the launcher (``LaunchOptions.torch_threads`` or ``use_torch_threads``).
    src = Path(__file__).resolve().parents[2] / "src" / "qhlab"
    setters = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.py") if "set_num_threads(" in p.read_text())
    assert setters == ["training/launcher.py"]


def test_the_one_adopt_rule_takes_the_finished_fit_and_refuses_one_of_another_recipe_or_population(tmp_path, tiny):
    import shutil

    from qhlab.evidence import EvidenceError, sha256_file
    from qhlab.training.segments import finished_attempt, unbound

    kwargs = dict(
        profile="cpu-fp32", output=tmp_path / "out", train=tiny["train"], validation=tiny["validation"], progress=False
    )
    result = fit_recipe(FitRequest(recipe=load_recipe(_recipe(tmp_path)), cell="c", **kwargs))
    body = read_receipt(result.fit_receipt, FitReceipt).body
    binds = {
        "recipe_digest": body.recipe_digest,
        "train_manifest": sha256_file(tiny["train"] / "manifest.json"),
        "validation_manifest": sha256_file(tiny["validation"] / "manifest.json"),
    }
    cell = tmp_path / "out" / "c"
    assert finished_attempt(cell, evaluated=True, binds=binds) == result.output_directory
    assert unbound(result.output_directory, binds) == []
    # A finished fit of another recipe or population in the cell refuses the job: it is neither
    # adopted nor fitted beside.
    for name in ("recipe_digest", "train_manifest"):
        other = {**binds, name: "0" * 64}
        assert unbound(result.output_directory, other) == [name]
        with pytest.raises(EvidenceError, match=rf"attempt=.* is not allowed; .* binds another {name}\)"):
            finished_attempt(cell, evaluated=True, binds=other)
    # A fit not yet evaluated is not this cell's finished fit.
    (result.output_directory / "evaluation.receipt.json").rename(tmp_path / "evaluation.receipt.json")
    assert finished_attempt(cell, evaluated=True, binds=binds) is None
    assert finished_attempt(cell, evaluated=False, binds=binds) == result.output_directory
    # A hidden (staging) copy of a finished attempt is never an attempt.
    shutil.move(result.output_directory, cell / f".{result.output_directory.name}.tmp-1")
    assert finished_attempt(cell, evaluated=False, binds=binds) is None
