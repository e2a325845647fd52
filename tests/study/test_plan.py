"""`qhlab plan`: predictions from a real tiny pilot, its alternatives, verify, and a study that binds it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from markdown_tables import table_mismatches
from qhlab.cli import main
from qhlab.design.plan_record import plan_document, row_key
from qhlab.evidence import canonical_json
from qhlab.statistics.replication import planned_difference
from qhlab.statistics.variance import FitNoise
from record_forgery import reseal

STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"
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
workers = 2
population_cache = "{cache}"

[train]
preset = "tiny"
seed = 7

[validation]
preset = "tiny"
seed = 9
"""
_TUNE = """name = "tiny-mde"
recipe = "{recipe}"
trials = 2
batch = 2
sampler = "grid"
workers = 2
population_cache = "{cache}"

[train]
preset = "tiny"
seed = 7

[validation]
preset = "tiny"
seed = 9

[space]
"target_update.interval" = {{ choices = [10, 20] }}

[objective]
metric = "mde"
seeds = [2, 3, 4]
study = "study.toml"
"""
_PLAN = """name = "tiny-plan"
study = "study.toml"
pilot = "pilot/pilot.json"
{tuning}
validation_scenes = [30, 120]
target = {{ d_reg = {d_reg}, d_mae = {d_mae} }}
"""


def _study(directory: Path, cache: Path, preparation: str = "") -> Path:
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    text = text[: text.index("[[experiment.arms]]")] + _ARMS + preparation
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.toml").write_text(text)
    return directory / "study.toml"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A tiny study's pilot and an "mde" tuning of its margins, made once."""
    root = tmp_path_factory.mktemp("plan")
    cache = root / "pops"
    _study(root, cache)
    (root / "pilot.toml").write_text(_PILOT.format(cache=cache))
    assert main(["pilot", str(root / "pilot.toml"), "--output", str(root / "pilot")]) == 0
    # The tuning's base recipe is the study's own (its recipe is inline in the tiny study).
    recipe = root / "recipe.toml"
    recipe.write_text(
        'name = "tiny"\nhorizon = 2\nbatch_size = 8\nhuber_delta = 0.05\nupdates = 30\n'
        'architecture = { arm = "baseline", encoder = { depth = 1, width = 16, heads = 2 } }\n'
        'optimizer = { lr = 3e-3 }\ntarget_update = { kind = "hard", interval = 10 }\n'
    )
    (root / "tune.toml").write_text(_TUNE.format(recipe=recipe, cache=cache))
    assert main(["tune", str(root / "tune.toml"), "--output", str(root / "tune")]) == 0
    return root


def _plan(root: Path, name: str, *, tuning: bool, d_reg: float = 1.0, d_mae: float = 1.0) -> Path:
    text = _PLAN.format(tuning='tuning = "tune/tuning.json"' if tuning else "", d_reg=d_reg, d_mae=d_mae)
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


def test_a_design_is_predicted_from_each_rows_components_and_the_cheapest_reaching_one_is_chosen():
    noise = FitNoise(
        fits=15,
        draws=5,
        n_scenes=480,
        ms_within=2.0e-6,
        dof_within=10,
        ms_between=3.0e-6,
        dof_between=4,
        n0=3.0,
        residual=6.0e-4,
        residual_dof=7000,
        scene_variance=1.0e-4,
    )
    rows = [
        {"kind": "margin", "variant": "v", "margin": m, "metric": k} for m, k in (("D_reg", "regret"), ("D_mae", "mae"))
    ]
    recipe = {
        "recipe": "study",
        "params": None,
        "updates": 100,
        "members": 2,
        "batch_size": 8,
        "cell_seconds": {"a": 10.0, "b": 20.0},
        "noise": {row_key(r): noise.as_dict() for r in rows},
        "draw_from_pilot": False,
    }
    options = dict(rows=rows, recipes=[recipe], pilot_noise=recipe["noise"], seeds=2, validation_scenes=480)
    plan = plan_document(
        **options, sizes=[960], confidence=0.95, target={"d_reg": 1.0, "d_mae": 1.0}, validation_seconds_per_scene=0.5
    )
    assert [d["validation_scenes"] for d in plan["designs"]] == [480, 960] and plan["planned"] == 0
    assert plan["designs"][0]["rows"]["D_reg v"]["mde"] == planned_difference(noise, n_seeds=2, n_scenes=480)["mde"]
    # More scenes lower the scene part only; both reach a loose target and the cheaper (fewer scenes) wins.
    assert plan["designs"][1]["largest"]["D_reg"] < plan["designs"][0]["largest"]["D_reg"]
    assert plan["designs"][0]["cost"] == {
        "fit_compute": 2 * 2 * 100 * 2 * 8,
        "cell_seconds": 60.0,
        "validation_seconds": 240.0,
        "seconds": 300.0,
    }
    assert plan["chosen"] == 0
    # A target only the larger design reaches: it is chosen; one neither reaches: none is.
    between = (plan["designs"][0]["largest"]["D_reg"] + plan["designs"][1]["largest"]["D_reg"]) / 2
    tight = plan_document(
        **options,
        sizes=[960],
        confidence=0.95,
        target={"d_reg": between, "d_mae": 1.0},
        validation_seconds_per_scene=0.5,
    )
    assert tight["chosen"] == 1
    none = plan_document(
        **options, sizes=[960], confidence=0.95, target={"d_reg": 1e-9, "d_mae": 1.0}, validation_seconds_per_scene=None
    )
    assert none["chosen"] is None and none["designs"][0]["cost"]["validation_seconds"] is None


def _plan_naming(root: Path, pilot: str) -> Path:
    """A plan config in ``root`` (beside a tiny study) whose pilot field names ``pilot``."""
    _study(root, root / "pops")
    (root / "plan.toml").write_text(_PLAN.format(tuning="", d_reg=1.0, d_mae=1.0).replace("pilot/pilot.json", pilot))
    return root / "plan.toml"


def test_a_pilot_field_naming_no_pilot_record_says_what_to_name(tmp_path, capsys):
    (tmp_path / "a-plan").mkdir()
    (tmp_path / "a-plan" / "plan.json").write_text('{"kind": "plan_record"}')
    (tmp_path / "renamed.json").write_text('{"kind": "plan_record"}')
    (tmp_path / "a-pilot").mkdir()
    (tmp_path / "a-pilot" / "pilot.json").write_text('{"kind": "pilot_record"}')
    wanted = "name the pilot.json that `qhlab pilot CONFIG --output DIR` wrote (DIR/pilot.json)"
    cases = [
        ("a-plan/plan.json", "HINT: it is a plan record (plan.json, what `qhlab plan` writes), not a pilot record; "),
        ("renamed.json", "HINT: it is a plan record (plan.json, what `qhlab plan` writes), not a pilot record; "),
        ("a-plan", "HINT: it is a directory holding no pilot.json; "),
        ("a-plan/plan.receipt.json", "HINT: it names the receipt of a plan record, not a pilot record; "),
    ]
    for named, hint in cases:
        output = tmp_path / "out"
        assert main(["plan", str(_plan_naming(tmp_path, named)), "--output", str(output)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"error: qhlab plan: pilot={str(tmp_path / named)!r} is not allowed; allowed: the path of a pilot record "
            "(pilot.json)."
        ), line
        assert line.endswith(hint + wanted), line
        assert not output.exists()
    # A directory holding a pilot.json: that file is named; a missing one: how to make it.
    assert main(["plan", str(_plan_naming(tmp_path, "a-pilot")), "--output", str(tmp_path / "out")]) == 2
    assert f"HINT: it is a directory; name the pilot.json in it: {tmp_path / 'a-pilot' / 'pilot.json'}" in (
        capsys.readouterr().err
    )
    assert main(["plan", str(_plan_naming(tmp_path, "none/pilot.json")), "--output", str(tmp_path / "out")]) == 2
    assert (
        "allowed: an existing pilot.json (a pilot record). HINT: no file is there; run `qhlab pilot CONFIG --output "
        "DIR` and name DIR/pilot.json" in capsys.readouterr().err
    )


def test_a_study_naming_a_plan_as_its_pilot_is_refused_by_its_field_with_what_to_name(tmp_path, capsys):
    (tmp_path / "a-plan").mkdir()
    plan = tmp_path / "a-plan" / "plan.json"
    plan.write_text('{"kind": "plan_record"}')
    study = _study(tmp_path / "s", tmp_path / "pops", f'\n[preparation]\npilot = "{plan}"\n')
    assert main(["study", "freeze", str(study), "--output", str(tmp_path / "study")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"preparation.pilot={str(plan)!r} is not allowed; allowed: the path of a pilot record (pilot.json)" in line
    assert (
        "HINT: it is a plan record (plan.json, what `qhlab plan` writes), not a pilot record; name the pilot.json "
        "that `qhlab pilot CONFIG --output DIR` wrote (DIR/pilot.json)" in line
    ), line
    assert not (tmp_path / "study").exists()


@pytest.mark.slow
def test_plan_predicts_every_row_weighs_the_trials_and_verifies(prepared, capsys, tmp_path):
    root = prepared
    assert main(["plan", str(_plan(root, "loose", tuning=True)), "--output", str(root / "plan")]) == 0
    said = capsys.readouterr().out
    assert "plan tiny-plan: the study's design (study recipe, 3 validation scenes, 2 seeds) predicts MDE D_reg" in said
    assert "the cheapest design that reaches it" in said
    # Every MDE and target carries the reward's unit (metres in the puck world).
    assert re.search(r"predicts MDE D_reg \d+\.\d{4} m, D_mae \d+\.\d{4} m \(target 1\.0000 m, 1\.0000 m\)", said), said
    assert re.search(r"reaches it: .+ \(\d+ CPU s; D_reg \d+\.\d{4} m, D_mae \d+\.\d{4} m\)", said), said
    markdown = (root / "plan" / "plan.md").read_text()
    assert "| comparison or margin | predicted se (m) | dof | predicted MDE (m) |" in markdown
    assert "(target: largest MDE D_reg <= 1.0000 m, D_mae <= 1.0000 m)" in markdown
    assert "| MDE D_reg (m) | MDE D_mae (m) |" in markdown and "the reward's unit" not in markdown
    record = json.loads((root / "plan" / "plan.json").read_text())
    pilot = json.loads((root / "pilot" / "pilot.json").read_text())
    # Every comparison (both metrics) and margin, each from its own row of the pilot.
    assert len(record["rows"]) == 2 * len(pilot["comparisons"]) + 2 * len(pilot["margins"])
    study = record["recipes"][0]
    first = pilot["comparisons"][0]
    assert study["noise"][f"{first['arm']} - {first['against']} (regret)"] == first["noise"]["regret"]
    # The study's recipe and both trials, each at the study's 3 scenes and at 30 and 120.
    assert [r["recipe"] for r in record["recipes"]] == ["study", "trial 1", "trial 2"]
    assert len(record["designs"]) == 3 * 3 and record["designs"][record["planned"]]["validation_scenes"] == 3
    assert all(d["cost"]["cell_seconds"] > 0 for d in record["designs"])
    assert (root / "plan" / "plan.md").read_text().startswith("# Power plan `tiny-plan` for study `tiny-study`")
    assert main(["verify", str(root / "plan")]) == 0
    assert "plan: " in capsys.readouterr().out
    # A forged prediction, resealed: verify recomputes it from the components.
    forged = tmp_path / "forged"
    shutil.copytree(root / "plan", forged)
    record["designs"][0]["largest"]["D_reg"] /= 2
    (forged / "plan.json").chmod(0o644)
    (forged / "plan.json").write_bytes(canonical_json(record))
    reseal(forged / "plan.receipt.json")
    assert main(["verify", str(forged)]) == 2
    assert "the recorded designs is not what its components give" in capsys.readouterr().err
    # An unreachable target: exit 1, the plan published all the same.
    assert main(["plan", str(_plan(root, "tight", tuning=False, d_reg=1e-9)), "--output", str(root / "tight")]) == 1
    assert json.loads((root / "tight" / "plan.json").read_text())["chosen"] is None


@pytest.mark.slow
def test_a_plan_into_another_tools_or_the_users_directory_is_refused_and_leaves_it_as_found(prepared, capsys):
    root = prepared
    unrelated = root / "mine"
    unrelated.mkdir(exist_ok=True)
    (unrelated / "draft.md").write_text("mine")
    for output, hint in (
        (root / "pilot", "HINT: it is the output of `qhlab pilot` (pilot.json); nothing was written"),
        (unrelated, "HINT: it holds 'draft.md', which qhlab plan does not write; nothing was written"),
    ):
        before = sorted((p.relative_to(output), p.stat().st_mtime_ns) for p in output.rglob("*"))
        assert main(["plan", str(_plan(root, "elsewhere", tuning=False)), "--output", str(output)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"error: qhlab plan: --output={str(output)!r} is not allowed; allowed: a new or empty directory, or this "
            "config's plan directory (to resume or re-read it)."
        ), line
        assert hint in line, line
        assert sorted((p.relative_to(output), p.stat().st_mtime_ns) for p in output.rglob("*")) == before


@pytest.mark.slow
def test_a_study_binds_its_plan_and_reports_planned_against_achieved(prepared, capsys):
    root = prepared
    assert main(["plan", str(_plan(root, "bound", tuning=False)), "--output", str(root / "bound-plan")]) == 0
    preparation = (
        f'\n[preparation]\npilot = "{root / "pilot" / "pilot.json"}"\nplan = "{root / "bound-plan" / "plan.json"}"\n'
    )
    study = _study(root / "s", root / "pops", preparation)
    assert main(["study", "run", str(study), "--output", str(root / "s" / "out")]) == 0
    report = json.loads((root / "s" / "out" / "report" / "report.json").read_text())
    plan = json.loads((root / "bound-plan" / "plan.json").read_text())
    planned = plan["designs"][plan["planned"]]["rows"]
    for row in report["replication"]:
        assert row["planned_mde"] == planned[f"{row['arm']} - {row['against']} ({row['metric']})"]["mde"]
    for entry in report["retention"]:
        assert entry["pooled_margins"]["D_reg"]["planned_mde"] == planned[f"D_reg {entry['variant']}"]["mde"]
    text = (root / "s" / "out" / "report" / "report.md").read_text()
    assert "planned MDE" in text and "The power plan `tiny-plan`" in text
    # The planned MDE has its header in both tables, as every other cell has.
    assert table_mismatches(text) == [], table_mismatches(text)
    # A plan of another pilot is refused at the freeze, nothing written.
    other = root / "other-pilot"
    shutil.copytree(root / "pilot", other)
    refused = _study(
        root / "r", root / "pops", preparation.replace(str(root / "pilot" / "pilot.json"), str(other / "pilot.json"))
    )
    (other / "pilot.json").chmod(0o644)
    data = json.loads((other / "pilot.json").read_text())
    data["name"] = "another-pilot"
    (other / "pilot.json").write_bytes(canonical_json(data))
    reseal(other / "pilot.receipt.json", lambda body: body.update(name="another-pilot"))
    capsys.readouterr()
    assert main(["study", "freeze", str(refused), "--output", str(root / "r" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "preparation.plan" in err and "a plan made from the pilot record" in err, err
    assert not (root / "r" / "out").exists()
