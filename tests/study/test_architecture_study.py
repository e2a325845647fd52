"""The architecture study's API, order, validation closure, tampering and report."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest

from qhlab.design.canary import canary_recovery, select_canary_row
from qhlab.design.study_config import read_study_config
from qhlab.design.study_records import (
    StudyCellReceipt,
    StudyDevelopmentReceipt,
    StudyE0Receipt,
    StudyFreezeReceipt,
    StudyReportReceipt,
)
from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    OrderError,
    PublishConflictError,
    QhInputError,
    read_receipt,
    source_package_digest,
)
from qhlab.evidence.layout import BENCHMARK_DIR, REPORT_DIR
from qhlab.finite_horizon.studies import architecture_study as study
from qhlab.finite_horizon.studies.architecture_study import (
    QhArchitectureStudyConfig,
    admit_canaries,
    benchmark_scorer,
    freeze_study,
    prepare_development,
    report_study,
    run_fit,
)
from qhlab.study import authentication
from qhlab.training.records import FitReceipt

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_NONE = inspect.Parameter.empty
# (name, kind, default) of every parameter, exactly as the API reference declares them.
SEED_SIGNATURES = {
    "admit_canaries": [("config_path", _POSITIONAL, _NONE), ("output", _POSITIONAL, _NONE)],
    "benchmark_scorer": [("fit", _POSITIONAL, _NONE), ("train", _POSITIONAL, _NONE)],
    "freeze_study": [("config_path", _POSITIONAL, _NONE), ("output", _POSITIONAL, _NONE)],
    "main": [],
    "prepare_development": [("config_path", _POSITIONAL, _NONE), ("output", _POSITIONAL, _NONE)],
    "report_study": [("config_path", _POSITIONAL, _NONE), ("output", _POSITIONAL, _NONE)],
    "run_fit": [
        ("config_path", _POSITIONAL, _NONE),
        ("output", _POSITIONAL, _NONE),
        ("variant", _KEYWORD, _NONE),
        ("seed", _KEYWORD, _NONE),
        ("canary_role", _KEYWORD, None),
    ],
}
SEED_ATTRIBUTES = (
    "train",
    "validation",
    "experiment",
    "seeds",
    "canary_updates",
    "broad_updates",
    "tie_band",
    "regret_fraction",
    "mae_fraction",
    "max_allocated_bytes",
)
ARMS = ("baseline", "control_global_readout", "control_no_interaction", "variant_cross_attention", "variant_deep")


# ------------------------------------------------------------------------------ API surface


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_signature_matches_seed(name):
    signature = inspect.signature(getattr(study, name))
    assert [(p.name, p.kind, p.default) for p in signature.parameters.values()] == SEED_SIGNATURES[name]
    assert name in study.__all__
    # Typed: every parameter and the return value carry an annotation.
    assert all(p.annotation is not _NONE for p in signature.parameters.values())
    assert signature.return_annotation is not inspect.Signature.empty


def test_config_attributes_and_cells(tiny_config):
    assert set(SEED_ATTRIBUTES) <= set(QhArchitectureStudyConfig.model_fields)
    config, _, _ = read_study_config(tiny_config)
    assert config.seeds == (0, 1)
    assert config.cells == tuple((a, s) for a in ARMS for s in (0, 1))


def test_variants_alter_only_architecture(tiny_config):
    config, _, _ = read_study_config(tiny_config)
    base = config.cell_recipe("baseline", 0, 30).model_dump()
    for arm in ARMS[1:]:
        other = config.cell_recipe(arm, 0, 30).model_dump()
        assert {k for k in base if base[k] != other[k]} == {"architecture", "name"}
    assert config.cell_recipe("variant_deep", 0, 30).architecture.encoder.depth == 2
    assert config.cell_recipe("variant_deep", 0, 30).architecture.encoder.width == 16


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("seeds = [0, 1]", "seeds = [0]", "exactly two distinct"),
        ("seeds = [0, 1]", "seeds = [3, 3]", "exactly two distinct"),
        ('control = "control_global_readout"', 'control = "baseline"', "a declared control"),
        ('name = "tiny"', 'name = "tiny"\nseed = 3', "seed (set by the study's seeds)"),
        ("tie_band = 0.001", "tie_band = -1.0", "tie_band"),
        ('preset = "tiny"\nseed = 7', 'preset = "nope"\nseed = 7', "preset='nope' is not allowed"),
        # A pilot's tau without its seed count cannot carry its own uncertainty.
        (
            "resamples = 999\nseed = 0",
            'resamples = 999\nseed = 0\n[seed_variance]\nregret = 0.004\nmae = 0.003\nsource = "pilot"',
            "seed_variance.seeds",
        ),
        (
            "resamples = 999\nseed = 0",
            'resamples = 999\nseed = 0\n[seed_variance]\nregret = 0.004\nmae = 0.003\nseeds = 1\nsource = "pilot"',
            "seed_variance.seeds=1 is not allowed",
        ),
    ],
)
def test_bad_config_refused_before_anything_is_written(config_writer, tmp_path, population_cache, old, new, message):
    config = config_writer(tmp_path / "cfg", population_cache, **{old: new})
    with pytest.raises(QhInputError, match="HINT") as info:
        freeze_study(config, tmp_path / "out")
    assert message in str(info.value)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ freeze and order


@pytest.fixture(scope="module")
def frozen_study(tmp_path_factory, tiny_config):
    output = tmp_path_factory.mktemp("frozen") / "study"
    body = freeze_study(tiny_config, output)
    return {"output": output, "body": body, "config": tiny_config}


def test_freeze_records_train_support_arms_and_source(frozen_study):
    body = frozen_study["body"]
    receipt = read_receipt(frozen_study["output"] / "freeze.receipt.json", StudyFreezeReceipt).record()
    assert receipt["body"] == body
    assert body["train"]["support"] == {
        "scenes": 3,
        "chain_states": 6,
        "successor_states": body["train"]["support"]["successor_states"],
        "candidates": 36,
        "K": 6,
        "H": 2,
    }
    chain = body["train"]["canonical_first_chain"]
    from qhlab.finite_horizon.data import load_population

    train = load_population(body["train"]["path"], split="train")
    keys = sorted(zip(train.scene_id[train.is_chain].tolist(), train.chain_id[train.is_chain].tolist()))
    assert (chain["scene_id"], chain["chain_id"]) == keys[0]
    assert [int(train.step[r]) for r in chain["rows"]] == [0, 1]
    assert [a["arm"] for a in body["arms"]] == list(ARMS)
    assert {a["arm"]: a["role"] for a in body["arms"]}["variant_deep"] == "variant"
    assert {a["arm"]: a["control"] for a in body["arms"]}["variant_deep"] == "control_no_interaction"
    assert body["seeds"] == [0, 1] and len(body["cells"]) == 10
    assert body["validation"]["opened"] is False
    assert body["source_package"]["sha256"] == source_package_digest()["sha256"]
    assert any(name.startswith("train/") for name in receipt["inputs"])


def test_freeze_twice_refused(frozen_study):
    with pytest.raises(PublishConflictError, match="frozen once"):
        freeze_study(frozen_study["config"], frozen_study["output"])


def test_steps_before_freeze_refused(tmp_path, tiny_config):
    for step in (admit_canaries, prepare_development, report_study):
        with pytest.raises(OrderError, match="freeze receipt is missing"):
            step(tiny_config, tmp_path / "nothing")
    with pytest.raises(OrderError, match="freeze receipt is missing"):
        run_fit(tiny_config, tmp_path / "nothing", variant="baseline", seed=0)


def test_prepare_before_e0_refused(frozen_study):
    with pytest.raises(OrderError, match="E0 gate receipt is missing"):
        prepare_development(frozen_study["config"], frozen_study["output"])


def test_broad_fit_before_development_refused(frozen_study):
    with pytest.raises(OrderError, match=r"development receipt \(validation not sealed\) is missing"):
        run_fit(frozen_study["config"], frozen_study["output"], variant="baseline", seed=0)
    assert not (frozen_study["output"] / "cells").exists()


def test_canary_before_selection_refused(frozen_study):
    with pytest.raises(OrderError, match="canary row is not selected"):
        run_fit(frozen_study["config"], frozen_study["output"], variant="baseline", seed=0, canary_role="e0")


@pytest.mark.parametrize(
    ("variant", "seed", "message"),
    [
        ("variant_wide", 0, "variant='variant_wide' is not allowed"),
        ("baseline", 2, "seed=2 is not allowed"),
    ],
)
def test_undeclared_cell_refused(frozen_study, variant, seed, message):
    with pytest.raises(QhInputError, match=message):
        run_fit(frozen_study["config"], frozen_study["output"], variant=variant, seed=seed)


def test_report_before_development_refused(frozen_study):
    with pytest.raises(OrderError, match="development receipt"):
        report_study(frozen_study["config"], frozen_study["output"])


def test_validation_is_not_opened_by_freeze(config_writer, tmp_path, population_cache):
    missing = tmp_path / "validation-made-later"
    config = config_writer(
        tmp_path / "cfg",
        population_cache,
        **{'[validation]\npreset = "tiny"\nseed = 8': f'[validation]\npath = "{missing}"'},
    )
    body = freeze_study(config, tmp_path / "out")
    assert body["validation"] == {
        "declared": {"preset": None, "seed": None, "path": str(missing)},
        "opened": False,
        "preset": None,
        "preset_file": None,
    }


# ------------------------------------------------------------------------------ tampering


def test_changed_config_after_freeze_refused(tmp_path, frozen_study):
    edited = tmp_path / "tiny-study.toml"
    edited.write_text(Path(frozen_study["config"]).read_text().replace("broad_updates = 30", "broad_updates = 31"))
    with pytest.raises(
        EvidenceError, match=r"\(changed: broad_updates\)\. HINT: a frozen study's config cannot change"
    ):
        admit_canaries(edited, frozen_study["output"])


def test_execution_fields_may_change_after_freeze_and_nothing_else(tmp_path, frozen_study):
    original = Path(frozen_study["config"]).read_text()
    assert "workers = 1" in original
    edited = tmp_path / "tiny-study.toml"
    # Where and how many fits run is execution, not science: the freeze binds the rest.
    edited.write_text(
        original.replace("workers = 1", 'workers = 2\nexecutor = "ray"\nray_address = "10.0.0.5:6379"')
        + "\n# a comment added after the freeze\n"
    )
    frozen = authentication.authenticate_freeze(edited, frozen_study["output"], "test")
    assert (frozen.config.workers, frozen.config.executor, frozen.config.ray_address) == (2, "ray", "10.0.0.5:6379")
    assert frozen.body.config["execution_fields_not_frozen"] == ["workers", "executor", "ray_address"]
    edited.write_text(original.replace("tie_band = 0.001", "tie_band = 0.002").replace("workers = 1", "workers = 2"))
    with pytest.raises(EvidenceError, match=r"\(changed: tie_band\)"):
        authentication.authenticate_freeze(edited, frozen_study["output"], "test")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ('executor = "cluster"', "executor='cluster' is not allowed; allowed: Input should be 'local' or 'ray'"),
        (
            'ray_address = "10.0.0.5:6379"',
            "ray_address='10.0.0.5:6379' is not allowed; allowed: only with executor ray",
        ),
        ('executor = "ray"\nray_address = "10.0.0.5"', "ray_address='10.0.0.5' is not allowed; allowed: HOST:PORT"),
    ],
)
def test_bad_executor_fields_are_refused_before_anything_is_written(
    config_writer, tmp_path, population_cache, line, text
):
    config = config_writer(tmp_path / "cfg", population_cache, **{"workers = 1": f"workers = 1\n{line}"})
    with pytest.raises(QhInputError) as caught:
        freeze_study(config, tmp_path / "out")
    assert text in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_config_executor_is_independent_of_the_environment_and_cli_overrides_it(
    config_writer, tmp_path, population_cache, monkeypatch
):
    from qhlab.execution import ExecutorChoice

    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")  # valid for `ray job`, not a GCS address
    config = config_writer(
        tmp_path / "cfg",
        population_cache,
        **{"workers = 1": 'workers = 1\nexecutor = "ray"\nray_address = "10.0.0.5:6379"'},
    )
    parsed, _, _ = read_study_config(config)
    assert parsed.executor_choice() == ExecutorChoice("ray", "10.0.0.5:6379")
    # --executor ray without --ray-address keeps the config's cluster; --ray-address wins; local is local.
    assert parsed.executor_choice("ray", None) == ExecutorChoice("ray", "10.0.0.5:6379")
    assert parsed.executor_choice(None, "10.0.0.6:6379") == ExecutorChoice("ray", "10.0.0.6:6379")
    assert parsed.executor_choice("local", None) == ExecutorChoice("local", None)


def test_study_run_with_an_unreachable_cluster_exits_2_and_writes_nothing(tiny_config, tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray", reason="ray is installed by the test extra")
    from qhlab.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    output = tmp_path / "study"
    code = main(["study", "run", str(tiny_config), "--output", str(output), "--ray-address", "127.0.0.1:1"])
    assert code == 2
    err = capsys.readouterr().err
    assert (
        "qhlab study run: --ray-address='127.0.0.1:1' is not allowed; allowed: the address of a running Ray "
        "cluster. HINT: nothing answered there" in err
    )
    assert not output.exists() and list(tmp_path.iterdir()) == []


def test_study_run_refuses_an_output_that_is_not_its_own_and_leaves_it_as_it_was(
    config_writer, tiny_config, tmp_path, population_cache, capsys
):
    from qhlab.cli import main

    afile = tmp_path / "afile"
    afile.write_text("mine")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    for output, allowed in (
        (afile, "allowed: a new or empty directory. HINT"),
        (afile / "sub", f"allowed: a new or empty directory (it lies below the file {str(afile)!r})"),
        (occupied, "allowed: a new or empty directory. HINT"),
    ):
        assert main(["study", "run", str(tiny_config), "--output", str(output)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: freeze_study: output={str(output)!r} is not allowed; {allowed}"), line
    assert afile.read_text() == "mine" and sorted(p.name for p in occupied.iterdir()) == ["notes.txt"]
    # A run refused after its lock was taken (its TRAIN is missing) in the user's own empty directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = config_writer(tmp_path / "cfg", population_cache, **{'preset = "tiny"\nseed = 7': 'path = "nowhere"'})
    assert main(["study", "run", str(missing), "--output", str(empty)]) == 2
    assert "nowhere" in capsys.readouterr().err and list(empty.iterdir()) == []


def test_train_byte_tampering_refused(config_writer, tmp_path, population_cache):
    from qhlab.scenes import cached_population

    source = cached_population("tiny", "train", 7, population_cache, workers=1)
    train = tmp_path / "train-copy"
    shutil.copytree(source, train)
    config = config_writer(
        tmp_path / "cfg", population_cache, **{'[train]\npreset = "tiny"\nseed = 7': f'[train]\npath = "{train}"'}
    )
    freeze_study(config, tmp_path / "out")
    target = train / "states.parquet"
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="states.parquet"):
        admit_canaries(config, tmp_path / "out")


def test_frozen_receipt_tampering_refused(tmp_path, frozen_study):
    output = tmp_path / "study"
    shutil.copytree(frozen_study["output"], output)
    receipt = output / "freeze.receipt.json"
    receipt.chmod(0o644)
    original = receipt.read_bytes()
    assert original.count(b'"broad_updates": 30') >= 1
    receipt.write_bytes(original.replace(b'"broad_updates": 30', b'"broad_updates": 31'))
    with pytest.raises(DigestMismatchError, match="freeze.receipt.json"):
        admit_canaries(frozen_study["config"], output)


def test_package_code_change_after_freeze_refused(tmp_path, frozen_study, monkeypatch):
    package = tmp_path / "qhlab"
    shutil.copytree(Path(study.__file__).resolve().parents[2], package, ignore=shutil.ignore_patterns("__pycache__"))
    original = source_package_digest(package)
    (package / "finite_horizon" / "evaluation.py").write_text(
        (package / "finite_horizon" / "evaluation.py").read_text() + "\n# a change\n"
    )
    changed = source_package_digest(package)
    assert changed["sha256"] != original["sha256"]
    monkeypatch.setattr(authentication, "source_package_digest", lambda: changed)
    with pytest.raises(EvidenceError, match="package code changed after freeze"):
        admit_canaries(frozen_study["config"], frozen_study["output"])


# ------------------------------------------------------------------------------ end to end (slow)


@pytest.mark.slow
def test_run_finishes_every_step(finished_study):
    output = finished_study["output"]
    assert "finished" in finished_study["stdout"]
    e0 = read_receipt(output / "canaries" / "e0.receipt.json", StudyE0Receipt).record()
    assert e0["body"]["passed"] is True
    assert [c["seed"] for c in e0["body"]["canaries"]] == [0, 1]
    for arm in ARMS:
        for seed in (0, 1):
            cell = read_receipt(output / "cells" / f"{arm}-s{seed}" / "cell.receipt.json", StudyCellReceipt).record()
            assert cell["body"]["observed_updates"] == 30
            assert len(cell["body"]["evaluation"]["mae"]) == 2
    report = read_receipt(output / "report" / "report.receipt.json", StudyReportReceipt).record()
    assert len([k for k in report["inputs"] if k.startswith("cell/")]) == 10
    for name in ("report.json", "report.md", "arms.png", "paired_differences.png", "learning_curves.png"):
        assert name in report["outputs"]
    assert (output / "report" / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Every fit of the study, the E0 canaries (one row, 1500 updates) and the cells (30 updates),
    # kept its hard target's successor values as a table: built once, then after every copy.
    receipts = sorted(output.glob("c*/*/*/fit.receipt.json"))
    assert len(receipts) == 12, receipts
    for path in receipts:
        fit = read_receipt(path, FitReceipt).body_record()
        interval = fit["recipe"]["target_update"]["interval"]
        assert fit["target_values"]["cached"], path
        assert fit["target_values"]["table_builds"] == 1 + fit["observed_updates"] // interval, path


@pytest.mark.slow
def test_second_run_only_verifies(finished_study, capsys):
    from qhlab.cli import main

    before = sorted(p.relative_to(finished_study["output"]) for p in finished_study["output"].rglob("*"))
    code = main(["study", "run", str(finished_study["config"]), "--output", str(finished_study["output"])])
    out = capsys.readouterr().out
    assert code == 0
    assert "is complete" in out and "nothing was run" in out
    after = sorted(p.relative_to(finished_study["output"]) for p in finished_study["output"].rglob("*"))
    assert before == after


@pytest.mark.slow
def test_report_shows_every_arm_and_seed(finished_study):
    report_dir = finished_study["output"] / "report"
    text = (report_dir / "report.md").read_text()
    report = json.loads((report_dir / "report.json").read_text())
    for arm in ARMS:
        for seed in (0, 1):
            assert any(line.startswith(f"| {arm} | ") and f" | {seed} | " in line for line in text.splitlines())
    assert "TRAIN constant" in text
    assert [(c["arm"], c["seed"]) for c in report["cells"]] == [(a, s) for a in ARMS for s in (0, 1)]
    assert {r["variant"] for r in report["retention"]} == {"variant_cross_attention", "variant_deep"}
    for r in report["retention"]:
        for decision in r["per_seed"].values():
            assert decision["retained"] == (decision["d_reg"]["estimate"] <= 0 and decision["d_mae"]["estimate"] <= 0)
            # 3 validation scenes < 30: no seed decides, and the reading says why.
            assert decision["decision"] == "undecided" and decision["n_scenes"] == 3
            assert decision["reason"].startswith("fewer than 30 validation scenes (n_scenes=3)")
        assert r["seeds_disagree"] == (len({d["retained"] for d in r["per_seed"].values()}) > 1)
    assert report["n_scenes"] == 3 and report["horizon"] == 2
    # One plain sentence near the top (before the first table) says so.
    sentence = (
        "There are fewer than 30 validation scenes (3), so no seed's reading decides: every seed reads undecided."
    )
    assert sentence in text and text.index(sentence) < text.index("## Every arm and seed")


@pytest.mark.slow
def test_the_report_answers_first_in_words_that_cannot_contradict(finished_study):
    from qhlab.report.answer import ANSWER_DECISIONS

    output = finished_study["output"]
    report = json.loads((output / "report" / "report.json").read_text())
    text = (output / "report" / "report.md").read_text()
    regret = report["summary"]["regret_primary"]
    h = report["primary_horizon"]
    for q in report["question"]:
        answer = q["answer"]
        assert answer["decision"] in ANSWER_DECISIONS
        # The seed-pooled difference from the baseline is the mean over seeds of the cells' own
        # (each cell's regret_H is its mean over the same scenes).
        pooled = answer["against_baseline"]["regret"]
        expected = sum(regret[f"{q['variant']}-s{s}"] - regret[f"baseline-s{s}"] for s in report["seeds"]) / 2
        assert pooled["estimate"] == pytest.approx(expected, abs=1e-12)
        assert pooled["low"] <= pooled["estimate"] <= pooled["high"]
        assert f"`{q['variant']}` against `baseline`: regret_{h} {pooled['estimate']:+.4f} m" in answer["text"]
        # Three scenes can confirm nothing: the rule's point reading never reads as a decision.
        assert answer["decision"] == "undecided" and "fewer than 30 validation scenes" in answer["why"]
        assert f"- {answer['text']}" in text.split("## How each seed reads the rule")[0]
        # No pilot: the answer says that two seeds alone cannot decide, and what would.
        assert "two seeds alone cannot decide" in answer["why"] and "`qhlab pilot`" in answer["why"]
        assert "two seeds alone cannot decide" in text and "`qhlab plan` predicts the MDE it gives" in text
        # How often it wins a scene, in [0, 1], with its scene interval.
        wins = answer["probability_of_improvement"]["regret"]
        assert 0.0 <= wins["low"] <= wins["estimate"] <= wins["high"] <= 1.0
        assert len(q["regret_profile"]) == report["n_scenes"] and q["regret_profile"] == sorted(q["regret_profile"])
    # No Python value leaks into the report's text.
    for leak in ("None", "True", "False", "{'", "nan"):
        assert leak not in text, leak


@pytest.mark.slow
def test_report_shows_heuristic_references_and_headline_first(finished_study):
    output = finished_study["output"]
    report = json.loads((output / "report" / "report.json").read_text())
    lines = (output / "report" / "report.md").read_text().splitlines()
    sealed = read_receipt(output / "development.receipt.json", StudyDevelopmentReceipt).body_record()["references"]
    best = sealed["best_fixed_index"]
    assert best["chosen_on"] == "train"
    assert best["train_regret_by_index"][best["index"]] == min(
        v for v in best["train_regret_by_index"] if v is not None
    )
    assert sealed["candidate_0"]["index"] == 0 and sealed["myopic_oracle"]["oracle"] is True
    baseline = {c["seed"]: c["regret"][-1] for c in report["cells"] if c["arm"] == "baseline"}
    assert set(report["references"]) == {"best_fixed_index", "candidate_0", "myopic_oracle"}
    for name, ref in report["references"].items():
        assert ref["regret"] == pytest.approx(sealed[name]["regret"])
        assert ref["regret_interval"]["estimate"] == pytest.approx(ref["regret"][-1])
        assert [p["seed"] for p in ref["paired"]] == [0, 1]
        for p in ref["paired"]:
            assert p["interval"]["estimate"] == pytest.approx(baseline[p["seed"]] - ref["regret"][-1])
    headline = report["headline"]
    for row in headline["per_seed"]:
        assert row["ratio"] == pytest.approx(
            baseline[row["seed"]] / report["references"]["best_fixed_index"]["regret"][-1]
        )
        assert row["beats"] == (row["baseline_regret"] < row["heuristic_regret"] and row["high"] < 0)
    assert headline["beats_every_seed"] == all(r["beats"] for r in headline["per_seed"])
    # The researcher's question leads (one line per variant, then the family table); the
    # heuristic headline is the first paragraph after it, then the references table marks the oracle.
    assert lines[0].startswith("# Architecture study") and lines[1] == ""
    assert lines[2] == "## The answer: is each variant better than the baseline?"
    assert [line.split("`")[1] for line in lines[4:6]] == ["variant_cross_attention", "variant_deep"]
    family = lines.index("### The family")
    assert [row.split(" | ")[0].lstrip("| ") for row in lines[family + 4 : family + 9]] == [
        "baseline",
        "control_global_readout",
        "control_no_interaction",
        "variant_cross_attention",
        "variant_deep",
    ]
    assert lines[family + 10].startswith("Wall time is the fit's") and lines[family + 12] == headline["text"]
    assert any(line.startswith("| myopic oracle (argmax Q*_1) (oracle: reads validation labels) |") for line in lines)


@pytest.mark.slow
def test_report_before_all_cells_refused(study_copy, finished_study):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    shutil.rmtree(output / "cells" / "variant_deep-s1")
    with pytest.raises(OrderError, match="1 of 10 charged cells have no final receipt: variant_deep-s1"):
        report_study(finished_study["config"], output)
    assert not (output / "report").exists()


@pytest.mark.slow
def test_report_is_published_whole_and_never_over_content(study_copy, finished_study):
    output = study_copy(REPORT_DIR)
    stray = output / REPORT_DIR / "notes.txt"
    stray.parent.mkdir()
    stray.write_text("by hand")
    with pytest.raises(PublishConflictError, match="holds a partial report"):
        report_study(finished_study["config"], output)
    assert [p.name for p in (output / REPORT_DIR).iterdir()] == ["notes.txt"]
    assert not any(p.name.startswith(f".{REPORT_DIR}") for p in output.iterdir())
    stray.unlink()
    # An empty report/ is replaced by the published directory, receipt inside with relative paths.
    report_study(finished_study["config"], output)
    receipt = read_receipt(output / REPORT_DIR / "report.receipt.json", StudyReportReceipt).record()
    assert receipt["outputs"]["report.json"]["path"] == "report.json"
    assert not any(p.name.startswith(f".{REPORT_DIR}") for p in output.iterdir())


@pytest.mark.slow
def test_cell_state_tampering_refused(study_copy, finished_study):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    cell = read_receipt(output / "cells" / "baseline-s1" / "cell.receipt.json", StudyCellReceipt).record()
    state = output / "cells" / "baseline-s1" / cell["body"]["attempt"] / "final_state.safetensors"
    state.chmod(0o644)
    data = bytearray(state.read_bytes())
    data[-3] ^= 0x10
    state.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="final_state"):
        report_study(finished_study["config"], output)


@pytest.mark.slow
def test_finished_cell_never_rerun_and_crashed_cell_gets_new_attempt(study_copy, finished_study):
    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    with pytest.raises(PublishConflictError, match="cell baseline-s0 is finished"):
        run_fit(finished_study["config"], output, variant="baseline", seed=0)
    shutil.rmtree(output / "cells" / "control_global_readout-s0")
    crashed = output / "cells" / "control_global_readout-s0" / "crashed-attempt"
    crashed.mkdir(parents=True)
    (crashed / "cold_init.safetensors").write_bytes(b"partial")
    body = run_fit(finished_study["config"], output, variant="control_global_readout", seed=0)
    assert body["previous_attempts"] == ["crashed-attempt"]
    assert body["attempt"] != "crashed-attempt" and body["observed_updates"] == 30


@pytest.mark.slow
def test_benchmark_scorer_fields(finished_study):
    output = finished_study["output"]
    cell = read_receipt(
        output / "cells" / "variant_cross_attention-s0" / "cell.receipt.json", StudyCellReceipt
    ).record()
    attempt = output / "cells" / "variant_cross_attention-s0" / cell["body"]["attempt"]
    result = benchmark_scorer(
        attempt, read_receipt(output / "freeze.receipt.json", StudyFreezeReceipt).body_record()["train"]["path"]
    )
    assert result["warmup_forwards"] == 10 and result["timed_forwards"] == 20
    assert len(result["forward_seconds"]) == 20 and result["median_forward_seconds"] > 0
    assert result["rows"] == 2 and result["updates_applied"] == 0
    assert any(n.startswith("fusion.") for n in result["parameters_receiving_gradients"])
    assert any(n.startswith("readout.") for n in result["parameters_receiving_gradients"])
    timings = result["module_timings"]
    assert timings["encoder_seconds"] > 0 and timings["readout_seconds"] > 0
    assert timings["fusion_seconds"] is None and timings["additive"] is False
    assert "max_rss_bytes" in result["memory"]
    assert result["final_state_sha256"] == cell["body"]["final_state_sha256"]


@pytest.mark.slow
def test_validation_opens_only_at_development(config_writer, tmp_path, population_cache):
    from qhlab.scenes import generate_population

    missing = tmp_path / "validation-made-later"
    config = config_writer(
        tmp_path / "cfg",
        population_cache,
        **{'[validation]\npreset = "tiny"\nseed = 8': f'[validation]\npath = "{missing}"'},
    )
    output = tmp_path / "out"
    freeze_study(config, output)
    assert admit_canaries(config, output)["passed"] is True
    with pytest.raises(
        QhInputError, match="validation.path=.*is not allowed; allowed: an existing population directory"
    ):
        prepare_development(config, output)
    assert not (output / "development.receipt.json").exists()
    generate_population("tiny", "validation", 8, missing, workers=1)
    body = prepare_development(config, output)
    assert body["validation"]["path"] == str(missing)
    assert len(body["train_constant"]) == 2


def test_a_failed_e0_names_every_failing_canary_and_canaries_anchor_their_successors(
    config_writer, tmp_path, population_cache, capsys
):
    """One optimizer update cannot recover the optimal action: E0 fails, and says how."""
    from qhlab.cli import main
    from qhlab.finite_horizon.recipe import recipe_digest
    from qhlab.training.execution_profile import execution_profile

    config = config_writer(tmp_path / "cfg", population_cache, **{"canary_updates = 1500": "canary_updates = 1"})
    output = tmp_path / "out"
    freeze = freeze_study(config, output)
    code = main(["study", "admit-canaries", str(config), "--output", str(output)])
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 1, captured.err
    e0 = read_receipt(output / "canaries" / "e0.receipt.json", StudyE0Receipt).body_record()
    assert e0["passed"] is False
    selected = e0["selection"]["selected"]
    labels = selected["labels"]  # [K][H] original labels of the canary row

    # (a) The study recipe has successor_label_rows = 0 (the default); each canary still
    # anchored its row's successors at Q_1..Q_{H-1}, and its receipt says so and why.
    study_config, _, _ = read_study_config(config)
    for seed in (0, 1):
        frozen = study_config.cell_recipe("baseline", seed, 1)
        assert frozen.successor_label_rows == 0
        assert recipe_digest(frozen) == freeze["recipes"]["baseline"][str(seed)]["1"]
        canary_recipe = frozen.model_copy(update={"successor_label_rows": 1})
        cell = read_receipt(
            output / "canaries" / f"e0-baseline-s{seed}" / "cell.receipt.json", StudyCellReceipt
        ).body_record()
        training = cell["canary"]["successor_training"]
        assert training["successor_label_rows"] == 1 and training["study_successor_label_rows"] == 0
        assert "bootstrap through" in training["why"]
        assert training["canary_recipe_digest"] == recipe_digest(canary_recipe)
        assert training["frozen_recipe_digest"] == recipe_digest(frozen)
        assert cell["recipe_digest"] == recipe_digest(canary_recipe) != recipe_digest(frozen)
        # The fit itself ran that recipe (on the profile's backend fields).
        assert cell["fit_recipe_digest"] == recipe_digest(execution_profile("cpu-fp32").apply(canary_recipe))

    # (b) The reason names, per failing canary and horizon, the chosen and the optimal
    # candidates with their predicted and true values; the CLI prints it.
    failing = [(c, h) for c in e0["canaries"] for h in c["canary"]["per_horizon"] if not h["recovered"]]
    assert failing and len(e0["failures"]) == len(failing)
    assert e0["reason"].startswith("a canary did not recover the optimal action within tie_band=0.001: ")
    for (c, h), record in zip(failing, e0["failures"]):
        i = h["horizon"] - 1
        best = selected["best_action"][i]
        assert record["chosen"] == h["chosen"] and record["optimal"] == best
        assert record["chosen_true"] == [labels[a][i] for a in h["chosen"]]
        chosen = ", ".join(str(a) for a in h["chosen"])
        predicted = ", ".join(f"{h['predicted'][a]:.4f}" for a in h["chosen"])
        true = ", ".join(f"{labels[a][i]:.4f}" for a in h["chosen"])
        text = (
            f"{c['cell']} (seed {c['seed']}) at H={h['horizon']} chose candidate(s) {chosen} "
            f"(predicted {predicted}; true {true}); "
            f"the optimal candidate is {best} (predicted {h['predicted'][best]:.4f}; "
            f"true {labels[best][i]:.4f})"
        )
        assert text in e0["reason"]
        assert text in printed
    assert f"E0 failed: {e0['reason']}; broad fits will not run." in printed
    with pytest.raises(OrderError, match="the E0 gate did not pass"):
        prepare_development(config, output)


def test_cli_refuses_out_of_order_with_exit_2(tmp_path, tiny_config, capsys):
    from qhlab.cli import main

    code = main(["study", "prepare-development", str(tiny_config), "--output", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: prepare_development: the freeze receipt is missing")
    assert not (tmp_path / "none").exists()


def test_module_main_parses_sys_argv(tmp_path, tiny_config, monkeypatch, capsys):
    monkeypatch.setattr(
        "sys.argv", ["architecture_study", "report", str(tiny_config), "--output", str(tmp_path / "none")]
    )
    with pytest.raises(SystemExit) as info:
        study.main()
    assert info.value.code == 2
    assert "report_study: the freeze receipt is missing" in capsys.readouterr().err


# ------------------------------------------------------------------------------ pure rules


def _toy_population(q, mask):
    import types

    import torch

    s = len(q)
    return types.SimpleNamespace(
        q=torch.tensor(q, dtype=torch.float32),
        candidate_mask=torch.tensor(mask),
        horizon=2,
        state_id=torch.arange(s) + 100,
        scene_id=torch.zeros(s, dtype=torch.int64),
        chain_id=torch.zeros(s, dtype=torch.int64),
        step=torch.arange(s),
    )


def test_canary_row_rule_takes_first_state_unique_at_every_horizon():
    q = [
        [[1.0, 2.0], [0.5, 2.0005], [0.0, 0.0]],  # best at h=2 within 0.001 of runner-up: skipped
        [[1.0, 2.0], [0.5, 1.0], [0.9, 1.5]],  # best action 0 by > tie_band at both horizons
        [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]],
    ]
    mask = [[True, True, True]] * 3
    selected = select_canary_row(_toy_population(q, mask), [{"rows": [0, 1, 2]}], 0.001)
    assert selected["row"] == 1 and selected["state_id"] == 101
    assert selected["best_action"] == [0, 0]
    assert selected["gaps"] == pytest.approx([0.1, 0.5])
    assert select_canary_row(_toy_population(q[:1], mask[:1]), [{"rows": [0]}], 0.001) is None
    # A multiple of the band: row 1's 0.1 gap at h=1 is not > 200 x 0.001, so row 2 (3.0 at both
    # horizons) is the first to qualify; nothing beats 5000 x 0.001.
    assert select_canary_row(_toy_population(q, mask), [{"rows": [0, 1, 2]}], 0.001, gap_multiple=200)["row"] == 2
    assert select_canary_row(_toy_population(q, mask), [{"rows": [0, 1, 2]}], 0.001, gap_multiple=5000) is None
    # The search goes on chain by chain, in the order given.
    later = select_canary_row(_toy_population(q, mask), [{"rows": [0]}, {"rows": [1, 2]}], 0.001, gap_multiple=50)
    assert later["row"] == 1 and later["gaps"] == pytest.approx([0.1, 0.5])


def test_canary_recovery_requires_the_optimal_action_alone_within_tie_band():
    import numpy as np

    labels = np.array([[1.0, 2.0], [0.5, 1.0], [0.9, 1.5]])
    mask = np.array([True, True, True])
    good = canary_recovery(np.array([[0.8, 1.9], [0.1, 0.2], [0.7, 1.0]]), labels, mask, 0.001)
    assert [h["recovered"] for h in good] == [True, True] and good[0]["chosen"] == [0]
    tied = canary_recovery(np.array([[0.8, 1.9], [0.1, 0.2], [0.8, 1.0]]), labels, mask, 0.001)
    assert [h["recovered"] for h in tied] == [False, True] and tied[0]["chosen"] == [0, 2]
    masked = canary_recovery(
        np.array([[0.8, 1.9], [0.1, 0.2], [5.0, 5.0]]), labels, np.array([True, True, False]), 0.001
    )
    assert [h["recovered"] for h in masked] == [True, True]


# ------------------------------------------------------------------------------ heuristic references

_BOOTSTRAP = {"resamples": 999, "seed": 0, "confidence": 0.95}
_SCENES = [11, 12, 13, 14, 15, 16]


def _references(best_h: list[float], straight_h: list[float], oracle_h: list[float], index: int = 3) -> dict:
    """Hand-made development references on six scenes, H=2 (regret_1 is 0.1 everywhere)."""

    def entry(values_h, **fields):
        per_scene = [[0.1, v] for v in values_h]
        return {**fields, "per_scene": {"scene_id": list(_SCENES), "regret": per_scene}}

    return {
        "best_fixed_index": entry(best_h, policy="best fixed", oracle=False, index=index, chosen_on="train"),
        "candidate_0": entry(straight_h, policy="slot 0", oracle=False, index=0),
        "myopic_oracle": entry(oracle_h, policy="argmax Q*_1", oracle=True, reads="validation labels"),
    }


def _baseline(values_h: list[float]):
    import numpy as np

    return np.array([[0.05, v] for v in values_h])


def test_reference_comparisons_paired_intervals_and_headline():
    import numpy as np

    from qhlab.report.references import reference_comparisons

    best = [1.0, 2.0, 1.5, 1.0, 3.0, 2.5]  # mean 1.8333
    straight = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]  # mean 2 (zero spread: point interval)
    oracle = [0.5, 0.2, 0.4, 0.1, 0.3, 0.5]  # mean 0.3333
    seed0 = [0.2, 0.4, 0.3, 0.1, 0.6, 0.5]  # below best on every scene
    seed1 = [2.0, 2.5, 1.0, 3.0, 3.5, 2.0]  # worse than best on average
    result = reference_comparisons(
        _references(best, straight, oracle),
        {0: _baseline(seed0), 1: _baseline(seed1)},
        scene_ids=_SCENES,
        bootstrap=_BOOTSTRAP,
        baseline_arm="baseline",
    )
    refs = result["references"]
    assert list(refs) == ["best_fixed_index", "candidate_0", "myopic_oracle"]
    assert refs["myopic_oracle"]["oracle"] is True
    assert refs["myopic_oracle"]["note"] == "(oracle: reads validation labels)"
    assert refs["best_fixed_index"]["note"] is None and refs["best_fixed_index"]["index"] == 3
    assert refs["best_fixed_index"]["label"] == "best fixed index (TRAIN-chosen: index 3)"
    for name, values in (("best_fixed_index", best), ("candidate_0", straight), ("myopic_oracle", oracle)):
        ref = refs[name]
        np.testing.assert_allclose(ref["regret"], [0.1, np.mean(values)])
        assert ref["regret_interval"]["estimate"] == pytest.approx(np.mean(values))
        assert ref["regret_interval"]["statistic"] == "mean" and ref["regret_interval"]["n_resamples"] == 999
        assert [p["seed"] for p in ref["paired"]] == [0, 1]
        for p, seed_values in zip(ref["paired"], (seed0, seed1)):
            assert p["relation"] == "baseline minus reference" and p["horizon"] == 2 and p["arm"] == "baseline"
            interval = p["interval"]
            assert interval["estimate"] == pytest.approx(np.mean(seed_values) - np.mean(values))
            assert interval["low"] <= interval["estimate"] <= interval["high"]
            assert interval["statistic"] == "mean difference" and interval["confidence"] == 0.95
    assert refs["candidate_0"]["regret_interval"]["method"] == "point"

    headline = result["headline"]
    assert headline["heuristic"] == "best_fixed_index" and headline["index"] == 3
    assert headline["heuristic_regret"] == pytest.approx(np.mean(best))
    per_seed = {r["seed"]: r for r in headline["per_seed"]}
    assert per_seed[0]["beats"] is True and per_seed[0]["high"] < 0
    assert per_seed[0]["ratio"] == pytest.approx(np.mean(seed0) / np.mean(best))
    assert per_seed[1]["beats"] is False and per_seed[1]["ratio"] == pytest.approx(np.mean(seed1) / np.mean(best))
    assert headline["beats_every_seed"] is False
    text = headline["text"]
    assert text.startswith(
        "The learned baseline does not beat the best TRAIN-chosen heuristic "
        "(fixed candidate index 3) on both seeds at H=2 (it does on 1 of 2): "
    )
    assert "seed 0: baseline regret_2 0.35 vs heuristic 1.833" in text
    assert ": beats;" in text and text.endswith(": does not beat.")
    assert f"ratio {np.mean(seed0) / np.mean(best):.3g}" in text
    json.dumps(result, allow_nan=False)


def test_reference_comparisons_beating_needs_the_whole_interval_below_zero():
    from qhlab.report.references import reference_comparisons

    best = [1.0] * 5 + [1.2]
    # Lower on every scene for seed 0; seed 1 is lower on average (-0.1333) but one scene is far
    # worse, so resamples with it twice have a positive mean and the upper bound crosses 0.
    below = [0.5, 0.6, 0.4, 0.5, 0.5, 0.9]
    crossing = [0.5, 0.5, 0.5, 0.5, 0.5, 3.2]
    both = reference_comparisons(
        _references(best, best, best),
        {0: _baseline(below), 1: _baseline(below)},
        scene_ids=_SCENES,
        bootstrap=_BOOTSTRAP,
    )
    assert both["headline"]["beats_every_seed"] is True
    assert both["headline"]["text"].startswith("The learned baseline beats the best TRAIN-chosen heuristic")
    mixed = reference_comparisons(
        _references(best, best, best),
        {0: _baseline(below), 1: _baseline(crossing)},
        scene_ids=_SCENES,
        bootstrap=_BOOTSTRAP,
    )
    seed1 = mixed["headline"]["per_seed"][1]
    assert seed1["baseline_regret"] < seed1["heuristic_regret"] and seed1["high"] > 0
    assert seed1["beats"] is False and mixed["headline"]["beats_every_seed"] is False
    # A heuristic with zero regret cannot be beaten and has no ratio.
    zero = reference_comparisons(
        _references([0.0] * 6, best, best),
        {0: _baseline(below), 1: _baseline(below)},
        scene_ids=_SCENES,
        bootstrap=_BOOTSTRAP,
    )
    assert [r["ratio"] for r in zero["headline"]["per_seed"]] == [None, None]
    assert "ratio undefined" in zero["headline"]["text"] and zero["headline"]["beats_every_seed"] is False


def test_reference_comparisons_refuse_other_scenes_and_missing_references():
    from qhlab.report.references import reference_comparisons

    refs = _references([1.0] * 6, [1.0] * 6, [1.0] * 6)
    with pytest.raises(EvidenceError, match="reference best_fixed_index was evaluated on other scenes"):
        reference_comparisons(refs, {0: _baseline([0.5] * 6)}, scene_ids=list(reversed(_SCENES)), bootstrap=_BOOTSTRAP)
    del refs["myopic_oracle"]
    with pytest.raises(QhInputError, match="references=.*is not allowed; allowed: exactly"):
        reference_comparisons(refs, {0: _baseline([0.5] * 6)}, scene_ids=_SCENES, bootstrap=_BOOTSTRAP)
    with pytest.raises(QhInputError, match=r"baseline_regret\[0\]='shape \(5, 2\)'"):
        reference_comparisons(
            _references([1.0] * 6, [1.0] * 6, [1.0] * 6),
            {0: _baseline([0.5] * 5)},
            scene_ids=_SCENES,
            bootstrap=_BOOTSTRAP,
        )
    # A yardstick not chosen on TRAIN, or an oracle that does not say so, never reaches a report.
    for name, field, bad in (("best_fixed_index", "chosen_on", "validation"), ("myopic_oracle", "oracle", False)):
        refs = _references([1.0] * 6, [1.0] * 6, [1.0] * 6)
        refs[name][field] = bad
        with pytest.raises(EvidenceError, match=rf"references\['{name}'\]\.{field}={bad!r} is not allowed"):
            reference_comparisons(refs, {0: _baseline([0.5] * 6)}, scene_ids=_SCENES, bootstrap=_BOOTSTRAP)


@pytest.mark.slow
def test_refused_run_fit_leaves_the_cell_lock_file_untouched(study_copy, finished_study, capsys):
    import fcntl
    import os

    from qhlab.cli import main

    output = study_copy(REPORT_DIR, BENCHMARK_DIR)
    lock = output / "cells" / ".baseline-s0.lock"
    assert lock.is_file()
    lock.write_bytes(b"12345\n")
    os.utime(lock, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    before = (lock.read_bytes(), lock.stat().st_mtime_ns)
    argv = [
        "study",
        "run-fit",
        str(finished_study["config"]),
        "--output",
        str(output),
        "--variant",
        "baseline",
        "--seed",
        "0",
    ]
    assert main(argv) == 2  # the cell is finished
    err = capsys.readouterr().err
    assert err.startswith("error: run_fit: cell baseline-s0 is finished") and "Traceback" not in err
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
    fd = os.open(lock, os.O_RDONLY)  # another writer holds the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(argv) == 3
        assert f"lock: {lock} is held by another process (pid 12345)" in capsys.readouterr().err
    finally:
        os.close(fd)
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
