"""`qhlab e0-check`: the config's refusals, the record, verify, copies, forgeries and the freeze binding."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import canonical_json, sha256_bytes, sha256_file
from record_forgery import reseal, reshaped_copy

STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"
# Three fresh TRAIN draws of the tiny preset; the tiny study trains on seed 7.
_CHECK = """name = "tiny-e0"
study = "study.toml"
train_seeds = [21, 22, 23]
min_pass_share = 1.0
workers = 1
population_cache = "{cache}"
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    from qhlab.scenes import cached_population

    root = tmp_path_factory.mktemp("e0-cache")
    for seed in (7, 21, 22, 23):
        cached_population("tiny", "train", seed, root, workers=1)
    return root


def _study(directory: Path, cache: Path, *, e0: Path | None = None, replace: dict | None = None) -> Path:
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    # The tiny gate at 600 canary updates (the tiny study's is 1500) passes some of these draws
    # and fails others, so one record holds both outcomes.
    text = text.replace("canary_updates = 1500", "canary_updates = 600")
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    if e0 is not None:
        text += f'\n[preparation]\ne0 = "{e0 / "e0.json"}"\n'
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.toml").write_text(text)
    return directory / "study.toml"


def _check_config(directory: Path, cache: Path, **replace: str) -> Path:
    _study(directory, cache)
    text = _CHECK.format(cache=cache)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    (directory / "e0.toml").write_text(text)
    return directory / "e0.toml"


def _reseal(directory: Path, *, body: bool = True) -> None:
    """Reseal e0.receipt.json over the files as they are now; with ``body`` its body also takes
    the record's values (a reshaped record may not carry them)."""
    record = json.loads((directory / "e0.json").read_text())

    def counts(document: dict) -> None:
        document.update({key: record[key] for key in ("draws", "passed", "meets_min_pass_share")})

    reseal(directory / "e0.receipt.json", counts if body else None)


def _forge(directory: Path, edit) -> None:
    record = json.loads((directory / "e0.json").read_text())
    edit(record)
    (directory / "e0.json").write_bytes(canonical_json(record))
    _reseal(directory)


@pytest.mark.parametrize(
    "replace, field, allowed",
    [
        ({"train_seeds = [21, 22, 23]": "train_seeds = [7, 22, 23]"}, "train_seeds", "fresh seeds of tiny"),
        ({"train_seeds = [21, 22, 23]": "train_seeds = [21, 22]"}, "train_seeds", "at least 3 items"),
        ({"train_seeds = [21, 22, 23]": "train_seeds = [21, 21, 23]"}, "train_seeds", "distinct integers >= 0"),
        ({"min_pass_share = 1.0": "min_pass_share = 0"}, "min_pass_share", "greater than 0"),
        ({"workers = 1": "workers = 1\ncanary_updates = 900"}, "canary_updates", "Extra inputs are not permitted"),
    ],
)
def test_bad_e0_check_config_is_refused_with_nothing_written(tmp_path, cache, capsys, replace, field, allowed):
    output = tmp_path / "out"
    assert main(["e0-check", str(_check_config(tmp_path / "c", cache, **replace)), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and field in err and allowed in err, err
    assert not output.exists()


def test_an_output_that_can_never_be_this_checks_is_refused_before_anything_is_drawn(tmp_path, cache, capsys):
    config = _check_config(tmp_path / "c", cache)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.toml").write_text("another config's bytes")
    for output, allowed in (
        (afile, "allowed: a new directory, or this config's check. HINT"),
        (afile / "sub", f"allowed: a new directory, or this config's check (it lies below the file {str(afile)!r})"),
        (other, "allowed: a new directory, or one begun with this config"),
    ):
        assert main(["e0-check", str(config), "--output", str(output)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: qhlab e0-check: --output={str(output)!r} is not allowed; {allowed}"), line
    assert afile.read_text() == "mine" and sorted(p.name for p in other.iterdir()) == ["config.toml"]


def test_a_study_naming_a_missing_e0_record_is_refused_by_its_field(tmp_path, cache, capsys):
    missing = tmp_path / "nothing"
    config = _study(tmp_path / "s", cache, e0=missing)
    assert main(["study", "freeze", str(config), "--output", str(tmp_path / "study")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"preparation.e0={str(missing / 'e0.json')!r} is not allowed; allowed: an existing e0.json" in line, line
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize(
    "replace, expected",
    [
        (
            {"horizon = 2": "horizon = 3"},
            "allowed: a study whose TRAIN preset has the horizon its recipe learns (H=3). HINT: its TRAIN preset "
            "'tiny' has H=2",
        ),
        (
            {'[validation]\npreset = "tiny"': '[validation]\npreset = "tanks-tiny"'},
            "allowed: a study whose validation preset is of its TRAIN's environment ('qhlab.scenes.puck:make'). "
            "HINT: its validation preset 'tanks-tiny' names 'qhlab.scenes.tanks:make'",
        ),
    ],
)
def test_a_check_no_draw_could_freeze_is_refused_before_any_train_is_drawn(tmp_path, cache, capsys, replace, expected):
    # Fresh seeds, not yet in the cache: a late refusal would have drawn them.
    config = _check_config(tmp_path / "c", cache, **{"train_seeds = [21, 22, 23]": "train_seeds = [31, 32, 33]"})
    _study(tmp_path / "c", cache, replace=replace)
    drawn = sorted(p.name for p in cache.iterdir())
    output = tmp_path / "out"
    assert main(["e0-check", str(config), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: qhlab e0-check: study={str(config.parent / 'study.toml')!r} is not allowed")
    assert expected in line, line
    assert not output.exists() and sorted(p.name for p in cache.iterdir()) == drawn


def test_an_output_holding_anything_the_check_does_not_write_is_refused_and_left_as_found(tmp_path, cache, capsys):
    config = _check_config(tmp_path / "c", cache, **{"train_seeds = [21, 22, 23]": "train_seeds = [31, 32, 33]"})
    output = tmp_path / "mine"
    (output / "notes").mkdir(parents=True)
    drawn = sorted(p.name for p in cache.iterdir())
    assert main(["e0-check", str(config), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "HINT: it holds 'notes', which qhlab e0-check does not write; nothing was written" in line, line
    assert [p.name for p in output.iterdir()] == ["notes"] and sorted(p.name for p in cache.iterdir()) == drawn


# ----------------------------------------------------------------- a real check


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """One finished tiny check on three draws, on one worker, requiring every draw to pass."""
    root = tmp_path_factory.mktemp("e0-reference")
    # Its gate falls short of min_pass_share 1.0: exit 1, as for any failed gate, record published.
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["e0-check", str(_check_config(root / "c", cache)), "--output", str(root / "out")]) == 1
    (root / "printed.txt").write_text(printed.getvalue())
    record = json.loads((root / "out" / "e0.json").read_text())
    # The tiny gate at 600 updates passes on some of these draws and not on others, so one record
    # shows both outcomes; were that to change, the binding tests below would lose a case.
    assert 1 <= record["passed"] <= 2, [o["reason"] for o in record["outcomes"]]
    return root / "out"


@pytest.mark.slow
def test_the_record_holds_each_draws_gate_as_its_sub_study_decided_it(reference, capsys):
    from qhlab.design.e0_record import check_record
    from qhlab.design.study_records import StudyE0Receipt, StudyFreezeReceipt
    from qhlab.evidence import read_receipt

    record = json.loads((reference / "e0.json").read_text())
    assert [o["train_seed"] for o in record["outcomes"]] == [21, 22, 23]
    assert record["design"]["canary_updates"] == 600 and record["design"]["seeds"] == [0, 1]
    assert record["design"]["train_preset"] == "tiny" and record["design"]["recipe"]["updates"] == 600
    for outcome in record["outcomes"]:
        study = reference / outcome["directory"]
        e0 = read_receipt(study / "canaries" / "e0.receipt.json", StudyE0Receipt).body
        assert (e0.passed, e0.selection["selected"]) == (outcome["passed"], outcome["selected"])
        assert sha256_file(study / "canaries" / "e0.receipt.json") == outcome["e0_receipt_sha256"]
        frozen = read_receipt(study / "freeze.receipt.json", StudyFreezeReceipt).body
        assert frozen.train["declared"]["seed"] == outcome["train_seed"]
        assert frozen.config["resolved"]["canary_updates"] == 600 and frozen.config["resolved"]["preparation"] is None
    passed = sum(o["passed"] for o in record["outcomes"])
    assert (record["passed"], record["pass_share"], record["meets_min_pass_share"]) == (passed, passed / 3, False)
    # Each failed draw's line says why: its gate's reason, naming the canary and the horizon.
    printed = " ".join((reference.parent / "printed.txt").read_text().split())  # unwrapped
    for outcome in record["outcomes"]:
        if not outcome["passed"]:
            assert f"TRAIN {outcome['train_seed']}: E0 FAILED" in printed
            assert " ".join(outcome["reason"].split()) in printed, printed
    assert check_record(reference) == {"draws": 3, "passed": passed, "studies_checked": 3, "studies_absent": 0}
    # A finished directory is re-read, not run again; its gate still fell short.
    assert main(["e0-check", str(reference.parent / "c" / "e0.toml"), "--output", str(reference)]) == 1
    assert "already finished" in capsys.readouterr().out


@pytest.mark.slow
def test_verify_recomputes_the_gates_and_refuses_forgeries_and_nested_copies(tmp_path, reference, capsys):
    assert main(["verify", str(reference)]) == 0
    assert "3 sub-studies' E0 receipts and freezes compared" in capsys.readouterr().out
    moved = tmp_path / "moved"
    shutil.copytree(reference, moved)
    assert main(["verify", str(moved)]) == 0
    capsys.readouterr()
    failed = next(
        i for i, o in enumerate(json.loads((reference / "e0.json").read_text())["outcomes"]) if not o["passed"]
    )

    # A failed draw called passed, counts resealed: its canaries' predictions say otherwise.
    def flip(record: dict) -> None:
        record["outcomes"][failed]["passed"] = True
        record["passed"] += 1
        record["pass_share"] = record["passed"] / 3

    flipped = tmp_path / "flipped"
    shutil.copytree(reference, flipped)
    _forge(flipped, flip)
    assert main(["verify", str(flipped)]) == 2
    assert "outcome is not what its canaries give" in capsys.readouterr().err

    # Predictions forged to recover the row, every rule recomputed to agree: the sub-study's own
    # E0 receipt says otherwise.
    def recover(record: dict) -> None:
        import numpy as np

        from qhlab.design.canary import canary_recovery

        outcome = record["outcomes"][failed]
        labels = np.asarray(outcome["selected"]["labels"])
        mask = np.asarray(outcome["selected"]["candidate_mask"])
        for canary in outcome["canaries"]:
            canary["per_horizon"] = canary_recovery(labels.copy(), labels, mask, record["design"]["tie_band"])
            canary["recovered"] = True
        flip(record)

    forged = tmp_path / "forged"
    shutil.copytree(reference, forged)
    _forge(forged, recover)
    assert main(["verify", str(forged)]) == 2
    assert "row, canaries or outcome are not its E0 receipt's" in capsys.readouterr().err

    # The record's config edited and its digests recomputed: its bound config.toml says otherwise.
    def lower_the_bar(record: dict) -> None:
        from qhlab.design.e0_config import QhE0CheckConfig, e0_digest

        record["config"]["min_pass_share"] = 0.3
        record["meets_min_pass_share"] = record["pass_share"] >= 0.3
        record["config_sha256"] = e0_digest(QhE0CheckConfig.model_validate(record["config"]), record["design"])

    lowered = tmp_path / "lowered"
    shutil.copytree(reference, lowered)
    _forge(lowered, lower_the_bar)
    receipt = json.loads((lowered / "e0.receipt.json").read_text())
    receipt["body"]["config_sha256"] = json.loads((lowered / "e0.json").read_text())["config_sha256"]
    receipt.pop("content_sha256")
    receipt["content_sha256"] = sha256_bytes(canonical_json(receipt))
    (lowered / "e0.receipt.json").write_bytes(canonical_json(receipt))
    assert main(["verify", str(lowered)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "differs from its bound config.toml in min_pass_share" in err, err

    # A sub-study copied to another place inside the check: a file made there would have two places.
    nested = tmp_path / "nested"
    shutil.copytree(reference, nested)
    shutil.copytree(nested / "studies" / "tiny-e0-21", nested / "elsewhere" / "tiny-e0-21")
    assert main(["verify", str(nested)]) == 2
    assert "(a nested copy)" in capsys.readouterr().err


@pytest.mark.slow
def test_freeze_binds_a_check_that_met_its_share_and_refuses_what_disagrees(tmp_path, cache, reference, capsys):
    from qhlab.report import preparation_section

    passed = json.loads((reference / "e0.json").read_text())["passed"]
    # The same draws re-derived with a minimum they meet: a copy of the check, its record removed;
    # its sub-studies are adopted (authenticated in the copy), so nothing is refitted.
    met = tmp_path / "met"
    shutil.copytree(reference, met)
    for name in ("config.toml", "e0.json", "e0.receipt.json"):
        (met / name).unlink()
    config = _check_config(tmp_path / "m", cache, **{"min_pass_share = 1.0": f"min_pass_share = {passed / 3}"})
    assert main(["e0-check", str(config), "--output", str(met)]) == 0
    assert "adopted" in capsys.readouterr().out
    again = json.loads((met / "e0.json").read_text())
    assert again["meets_min_pass_share"] is True
    assert [o["e0_receipt_sha256"] for o in again["outcomes"]] == [
        o["e0_receipt_sha256"] for o in json.loads((reference / "e0.json").read_text())["outcomes"]
    ]

    refused = tmp_path / "refused"
    cases = [
        (_study(tmp_path / "a", cache, e0=reference), "an E0 check that reached its minimum pass share"),
        (
            _study(tmp_path / "b", cache, e0=met, replace={"canary_updates = 600": "canary_updates = 700"}),
            "it differs in canary_updates, recipe",
        ),
        (
            _study(tmp_path / "c", cache, e0=met, replace={"seed = 7": "seed = 22"}),
            "a TRAIN seed the E0 check did not gate (it gated [21, 22, 23])",
        ),
    ]
    for study, expected in cases:
        assert main(["study", "freeze", str(study), "--output", str(refused)]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and ("preparation.e0=" in err or "train.seed=" in err), err
        assert expected in err, err
        assert not refused.exists()
    frozen = tmp_path / "study"
    assert main(["study", "freeze", str(_study(tmp_path / "d", cache, e0=met)), "--output", str(frozen)]) == 0
    body = json.loads((frozen / "freeze.receipt.json").read_text())["body"]["preparation"]["e0"]
    assert body["record_sha256"] == sha256_file(met / "e0.json") == sha256_file(frozen / "preparation/e0/e0.json")
    assert (body["passed"], body["draws"], body["train_seeds"]) == (passed, 3, [21, 22, 23])
    assert body["gate"] == {"canary_updates": 600, "canary_gap_multiple": 10.0, "tie_band": 0.001, "seeds": [0, 1]}
    lines = "\n".join(preparation_section._e0_lines(body, " m"))
    assert f"{passed} of 3 passed (share {passed / 3:.2f}" in lines and "| 21 |" in lines
    assert "tie_band 0.001 m," in lines
    capsys.readouterr()
    assert main(["verify", str(frozen)]) == 0
    assert "preparation/e0: every row selection" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    "reshape",
    [
        pytest.param(lambda r: r.update(outcomes={}), id="outcomes-a-mapping"),
        pytest.param(lambda r: r["outcomes"][0].pop("passed"), id="an-outcome-without-passed"),
        pytest.param(lambda r: r["outcomes"][0].update(selected=[1, 2]), id="a-selected-row-a-list"),
        pytest.param(lambda r: r.update(design=[]), id="the-design-a-list"),
    ],
)
def test_a_reshaped_e0_record_is_one_clear_refusal_not_a_traceback(tmp_path, reference, capsys, reshape):
    reshaped = reshaped_copy(reference, tmp_path / "reshaped", "e0.json", reshape)
    _reseal(reshaped, body=False)
    capsys.readouterr()
    assert main(["verify", str(reshaped)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "e0.json" in err and "Traceback" not in err, err
