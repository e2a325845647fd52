"""`qhlab plan`: predictions from a real tiny pilot, its alternatives, verify, and a study that binds it."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from markdown_tables import table_mismatches
from qhlab.cli import main
from qhlab.design.plan_record import plan_document, row_key
from qhlab.evidence import QhInputError, canonical_json
from qhlab.statistics.bootstrap import MIN_SCENES_TO_DECIDE
from qhlab.statistics.replication import planned_difference
from qhlab.statistics.variance import FitNoise, variance_components
from record_forgery import reseal

STUDY_TEMPLATE = Path(__file__).resolve().parent / "tiny-study.toml"
TINY_PRESET = Path(__file__).resolve().parents[2] / "src" / "qhlab" / "scenes" / "presets" / "tiny.toml"
# The tiny preset with the fewest scenes a study decides on: a plan refuses a study of fewer.
DECIDING_PRESET = "tiny-30.toml"
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
preset = "{preset}"
seed = 9
"""
# The layout the study fixes for _PILOT before it runs.
_LAYOUT = "\n[preparation.pilot_layout]\ndraws = [7, 11, 12]\nseeds = [[2, 3], [4, 5], [6, 7]]\n"
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
validation_scenes = [60, 120]
target = {{ d_reg = {d_reg}, d_mae = {d_mae} }}
"""


def _study(directory: Path, cache: Path, preparation: str = "", *, validation: str = DECIDING_PRESET) -> Path:
    """A tiny study of two arms in ``directory``, validated on ``validation`` (a preset written beside it:
    the tiny preset at ``MIN_SCENES_TO_DECIDE`` scenes; "tiny": three scenes, a study that cannot decide)."""
    text = STUDY_TEMPLATE.read_text().replace('population_cache = "populations"', f'population_cache = "{cache}"')
    text = text.replace('[validation]\npreset = "tiny"', f'[validation]\npreset = "{validation}"')
    text = text[: text.index("[[experiment.arms]]")] + _ARMS + _LAYOUT + preparation
    directory.mkdir(parents=True, exist_ok=True)
    preset = TINY_PRESET.read_text().replace('name = "tiny"', 'name = "tiny-30"')
    (directory / DECIDING_PRESET).write_text(preset.replace("scenes = 3 ", f"scenes = {MIN_SCENES_TO_DECIDE} "))
    (directory / "study.toml").write_text(text)
    return directory / "study.toml"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A tiny study's pilot and an "mde" tuning of its margins, made once."""
    root = tmp_path_factory.mktemp("plan")
    cache = root / "pops"
    _study(root, cache)
    # The pilot scores on as many scenes as the study decides on, on a population of its own (seed 9).
    (root / "pilot.toml").write_text(_PILOT.format(cache=cache, preset=root / DECIDING_PRESET))
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


def _margins_and_recipe(noise, *, members: int) -> tuple[list[dict], dict]:
    """One variant's two retention margins, and the study's own recipe carrying ``noise`` for both."""
    rows = [
        {"kind": "margin", "variant": "v", "margin": m, "metric": k} for m, k in (("D_reg", "regret"), ("D_mae", "mae"))
    ]
    recipe = {
        "recipe": "study",
        "params": None,
        "updates": 100,
        "members": members,
        "batch_size": 8,
        "cell_seconds": {"a": 10.0, "b": 20.0},
        "noise": {row_key(r): noise.as_dict() for r in rows},
        "draw_from_pilot": False,
    }
    return rows, recipe


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
    rows, recipe = _margins_and_recipe(noise, members=2)
    options = dict(
        rows=rows,
        recipes=[recipe],
        pilot_noise=recipe["noise"],
        seeds=2,
        validation_scenes=480,
        min_scenes_to_decide=MIN_SCENES_TO_DECIDE,
    )
    plan = plan_document(
        **options, sizes=[960], confidence=0.95, target={"d_reg": 1.0, "d_mae": 1.0}, validation_seconds_per_scene=0.5
    )
    assert [d["validation_scenes"] for d in plan["designs"]] == [480, 960] and plan["planned"] == 0
    assert plan["designs"][0]["rows"]["D_reg v"]["mde"] == planned_difference(noise, n_seeds=2, n_scenes=480)["mde"]
    # Each row names its variance parts, those of the design's own scenes.
    assert plan["designs"][1]["rows"]["D_reg v"]["variance"] == variance_components(noise, n_seeds=2, n_scenes=960)
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


def _noise(**changes) -> FitNoise:
    """Components of five draws of three seeds, the TRAIN draw's part the largest unless ``changes`` say otherwise."""
    base = dict(
        fits=15, draws=5, n_scenes=480, ms_within=2.0e-6, dof_within=10, ms_between=3.0e-5, dof_between=4, n0=3.0,
        residual=6.0e-4, residual_dof=7000, scene_variance=1.0e-4,
    )  # fmt: skip
    return FitNoise(**{**base, **changes})


def test_each_rows_variance_is_split_into_scene_seed_and_draw_parts_and_the_dominant_one_named():
    noise = _noise()
    split = variance_components(noise, n_seeds=2, n_scenes=480)
    parts = split["parts"]
    # The parts are the prediction's variance before its floor: the scene part and the fits' part.
    planned = planned_difference(noise, n_seeds=2, n_scenes=480)
    assert sum(p["variance"] for p in parts.values()) == pytest.approx(planned["scene_part"] + planned["fit_part"])
    assert parts["scene"]["variance"] == pytest.approx(planned["scene_part"])
    assert parts["seed"]["variance"] == pytest.approx(noise.seed_variance / 2)
    assert parts["draw"]["variance"] == pytest.approx(noise.draw_variance)
    assert split["dominant"] == "draw" and sum(p["share"] for p in parts.values()) == pytest.approx(1.0)
    # Its dof: the study's scenes less one for the scenes' part; a difference of mean squares has fewer
    # than the pilot's draws less one.
    assert parts["scene"]["dof"] == 479.0 and 0 < parts["draw"]["dof"] < noise.dof_between
    # The TRAIN draw's part: neither more scenes nor more seeds shrink it; the scenes' part falls with scenes.
    for more in (dict(n_seeds=2, n_scenes=1920), dict(n_seeds=8, n_scenes=480)):
        again = variance_components(noise, **more)["parts"]
        assert again["draw"]["variance"] == parts["draw"]["variance"]
    assert (
        variance_components(noise, n_seeds=2, n_scenes=1920)["parts"]["scene"]["variance"]
        < (parts["scene"]["variance"])
    )
    # A part estimated below zero has no share: the shares are of the non-negative parts.
    below = variance_components(_noise(ms_between=1.0e-6), n_seeds=2, n_scenes=480)["parts"]
    assert below["draw"]["variance"] < 0 and below["draw"]["share"] == 0.0
    assert below["scene"]["share"] + below["seed"]["share"] == pytest.approx(1.0)
    # One draw measures no TRAIN draw; a tuning trial's one-draw noise carries the pilot's.
    one = _noise(fits=3, draws=1, dof_within=2, ms_between=None, dof_between=0, n0=None)
    assert variance_components(one, n_seeds=2, n_scenes=480)["parts"]["draw"] is None
    carried = variance_components(one, n_seeds=2, n_scenes=480, draw=noise)["parts"]["draw"]
    assert carried["variance"] == pytest.approx(noise.draw_variance)
    with pytest.raises(QhInputError, match=r"n_seeds/n_scenes=\(2, 1\) is not allowed"):
        variance_components(noise, n_seeds=2, n_scenes=1)


def test_more_pilot_draws_are_weighed_as_more_dof_on_the_same_mean_squares_with_their_cost():
    # A TRAIN-draw part that dominates, estimated on the pilot's 4 between-draw dof.
    noise = _noise()
    rows, recipe = _margins_and_recipe(noise, members=2)
    target = {"d_reg": 1.0, "d_mae": 1.0}
    options = dict(rows=rows, recipes=[recipe], pilot_noise=recipe["noise"], seeds=2, validation_scenes=480)
    common = dict(sizes=[], confidence=0.95, validation_seconds_per_scene=None, min_scenes_to_decide=30)
    plan = plan_document(**options, **common, target=target, levers=True)
    draws = plan["levers"]["pilot_draws"]
    assert [o["draws"] for o in draws] == [10, 20]
    # Twice the draws: the same mean squares on 9 between-draw dof, 20 within, twice the residual's.
    doubled = FitNoise(**{**asdict(noise), "fits": 30, "draws": 10, "dof_within": 20, "dof_between": 9,
                          "residual_dof": 14000})  # fmt: skip
    assert draws[0]["rows"]["D_reg v"] == planned_difference(doubled, n_seeds=2, n_scenes=480)["mde"]
    # Only the quantile moves: a smaller MDE than today's, never below the scene-and-component floor.
    today = plan["designs"][0]["rows"]["D_reg v"]["mde"]
    assert draws[1]["rows"]["D_reg v"] < draws[0]["rows"]["D_reg v"] < today
    # Cost: each extra pilot seed fits every arm (two arms here, at 10 s and 20 s).
    assert (draws[0]["extra_fits"], draws[0]["seconds"]) == (2 * 15, 15 * 30.0)
    assert (draws[1]["extra_fits"], draws[1]["seconds"]) == (2 * 45, 45 * 30.0)
    # A target between today's MDE and the 20-draw one is reached by more draws alone.
    between = {"d_reg": (draws[1]["largest"]["D_reg"] + today) / 2, "d_mae": 1.0}
    reached = plan_document(**options, **common, target=between, levers=True)
    assert reached["chosen"] is None and [o["reaches_target"] for o in reached["levers"]["pilot_draws"]] == [
        draws[0]["largest"]["D_reg"] <= between["d_reg"],
        True,
    ]
    assert plan["levers"]["train_size"]["measured"] is False
    # A one-draw pilot measured no draw term: no more draws are weighed. A plan without levers has none.
    one = _noise(fits=3, draws=1, dof_within=2, ms_between=None, dof_between=0, n0=None)
    rows, single = _margins_and_recipe(one, members=2)
    alone = plan_document(**{**options, "rows": rows, "recipes": [single], "pilot_noise": single["noise"]},
                          **common, target=target, levers=True)  # fmt: skip
    assert alone["levers"]["pilot_draws"] == []
    assert "levers" not in plan_document(**options, **common, target=target)


def test_the_cheapest_design_that_reaches_the_target_is_never_one_that_cannot_decide():
    noise = _noise()
    rows, recipe = _margins_and_recipe(noise, members=1)
    few = 3
    options = dict(
        rows=rows,
        recipes=[recipe],
        pilot_noise=recipe["noise"],
        seeds=2,
        validation_scenes=few,
        confidence=0.95,
        target={"d_reg": 1.0, "d_mae": 1.0},
        validation_seconds_per_scene=0.5,
    )
    plan = plan_document(**options, sizes=[MIN_SCENES_TO_DECIDE, 60], min_scenes_to_decide=MIN_SCENES_TO_DECIDE)
    sizes = [d["validation_scenes"] for d in plan["designs"]]
    assert sizes == [few, MIN_SCENES_TO_DECIDE, 60] and plan["planned"] == 0
    # The 3-scene design is the cheapest and within the loose target, but a study of it is always undecided.
    assert plan["designs"][0]["cost"]["seconds"] < plan["designs"][1]["cost"]["seconds"]
    assert plan["designs"][0]["largest"]["D_reg"] < 1.0 and not plan["designs"][0]["reaches_target"]
    assert plan["chosen"] == 1 and plan["min_scenes_to_decide"] == MIN_SCENES_TO_DECIDE
    # None can decide: none is chosen, whatever the target.
    assert plan_document(**options, sizes=[], min_scenes_to_decide=MIN_SCENES_TO_DECIDE)["chosen"] is None
    # A plan recorded before the rule recomputes by its own: it chose the 3-scene design, and names no parts.
    older = plan_document(**options, sizes=[MIN_SCENES_TO_DECIDE, 60], min_scenes_to_decide=None)
    assert older["chosen"] == 0 and all("variance" not in p for d in older["designs"] for p in d["rows"].values())


def test_a_plan_that_would_weigh_a_design_that_cannot_decide_is_refused_and_writes_nothing(tmp_path, capsys):
    output = tmp_path / "out"
    # The study's own validation: three scenes.
    _study(tmp_path / "few", tmp_path / "pops", validation="tiny")
    (tmp_path / "few" / "plan.toml").write_text(_PLAN.format(tuning="", d_reg=1.0, d_mae=1.0))
    assert main(["plan", str(tmp_path / "few" / "plan.toml"), "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"error: qhlab plan: study={str(tmp_path / 'few' / 'study.toml')!r} is not allowed; allowed: a study of at "
        f"least MIN_SCENES_TO_DECIDE={MIN_SCENES_TO_DECIDE} validation scenes (its validation, preset 'tiny', has 3)."
    ), line
    assert "HINT: a study of fewer scenes is always undecided" in line, line
    assert not output.exists()
    # An alternative below the minimum: the config's field, its value and the minimum, in its one error.
    _study(tmp_path / "alt", tmp_path / "pops")
    text = _PLAN.format(tuning="", d_reg=1.0, d_mae=1.0).replace("[60, 120]", "[3, 120]")
    (tmp_path / "alt" / "plan.toml").write_text(text)
    assert main(["plan", str(tmp_path / "alt" / "plan.toml"), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: plan config {str(tmp_path / 'alt' / 'plan.toml')!r}: 1 invalid field(s):"
    ], err
    assert (
        f"validation_scenes=[3, 120] is not allowed; allowed: distinct sizes in [{MIN_SCENES_TO_DECIDE}, 1000000] "
        f"(MIN_SCENES_TO_DECIDE={MIN_SCENES_TO_DECIDE}: a study of fewer scenes is always undecided" in err
    ), err
    assert not output.exists()


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
    assert "plan tiny-plan: the study's design (study recipe, 30 validation scenes, 2 seeds) predicts MDE D_reg" in said
    assert "the cheapest design that reaches it" in said
    # The worst margin's dominant variance part, its share and dof, and what moves it.
    worst = re.search(
        r"worst margin (D_reg|D_mae) variant_cross_attention: MDE \d+\.\d{4} m, \d+% (validation scenes|training seeds|"
        r"TRAIN draw) \(\d+\.\d dof\); (more validation scenes shrink it|more seeds shrink it|more validation scenes "
        r"or seeds do not shrink it \(a study fits one TRAIN draw; TRAIN size is unmeasured; more pilot draws give it "
        r"more dof\))$",
        said,
        re.M,
    )
    assert worst, said
    # Every MDE and target carries the reward's unit (metres in the puck world).
    assert re.search(r"predicts MDE D_reg \d+\.\d{4} m, D_mae \d+\.\d{4} m \(target 1\.0000 m, 1\.0000 m\)", said), said
    assert re.search(r"reaches it: .+ \(\d+ CPU s; D_reg \d+\.\d{4} m, D_mae \d+\.\d{4} m\)", said), said
    markdown = (root / "plan" / "plan.md").read_text()
    assert "| comparison or margin | predicted se (m) | dof | predicted MDE (m) |" in markdown
    assert "(target: largest MDE D_reg <= 1.0000 m, D_mae <= 1.0000 m)" in markdown
    assert "| MDE D_reg (m) | MDE D_mae (m) |" in markdown and "the reward's unit" not in markdown
    assert "| variance shares (scenes / seeds / TRAIN draw) | dominant part (its dof) |" in markdown
    assert f"The worst margin, {worst.group(1)} variant_cross_attention (MDE " in markdown
    assert table_mismatches(markdown) == [], table_mismatches(markdown)
    record = json.loads((root / "plan" / "plan.json").read_text())
    # Every row of every design names its parts; the dominant one has the largest share.
    assert record["min_scenes_to_decide"] == MIN_SCENES_TO_DECIDE
    for design in record["designs"]:
        for row in design["rows"].values():
            parts, dominant = row["variance"]["parts"], row["variance"]["dominant"]
            assert parts[dominant]["share"] == max(p["share"] for p in parts.values() if p is not None)
    pilot = json.loads((root / "pilot" / "pilot.json").read_text())
    # Every comparison (both metrics) and margin, each from its own row of the pilot.
    assert len(record["rows"]) == 2 * len(pilot["comparisons"]) + 2 * len(pilot["margins"])
    study = record["recipes"][0]
    first = pilot["comparisons"][0]
    assert study["noise"][f"{first['arm']} - {first['against']} (regret)"] == first["noise"]["regret"]
    # The study's recipe and both trials, each at the study's 30 scenes and at 60 and 120.
    assert [r["recipe"] for r in record["recipes"]] == ["study", "trial 1", "trial 2"]
    assert len(record["designs"]) == 3 * 3 and record["designs"][record["planned"]]["validation_scenes"] == 30
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
    # A forged minimum would recompute a forged choice of a design that cannot decide: refused as such.
    record["designs"][0]["largest"]["D_reg"] *= 2
    record["min_scenes_to_decide"] = 3
    (forged / "plan.json").write_bytes(canonical_json(record))
    reseal(forged / "plan.receipt.json")
    assert main(["verify", str(forged)]) == 2
    assert f"its min_scenes_to_decide=3 is not MIN_SCENES_TO_DECIDE={MIN_SCENES_TO_DECIDE}" in capsys.readouterr().err
    # A cheaper pilot-draw lever, resealed: recomputed too.
    record["min_scenes_to_decide"] = MIN_SCENES_TO_DECIDE
    record["levers"]["pilot_draws"][0]["seconds"] /= 2
    (forged / "plan.json").write_bytes(canonical_json(record))
    reseal(forged / "plan.receipt.json")
    assert main(["verify", str(forged)]) == 2
    assert "the recorded levers is not what its components give" in capsys.readouterr().err
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
    # An undecided variant's answer names what would decide it: the plan's cheapest deciding design.
    undecided = [q for q in report["question"] if q["decision"] == "undecided"]
    assert undecided, [q["decision"] for q in report["question"]]
    cheapest = plan["designs"][plan["chosen"]]
    assert cheapest == min((d for d in plan["designs"] if d["reaches_target"]), key=lambda d: d["cost"]["seconds"])
    step = (
        f"the plan's cheapest next step that would decide it is the {cheapest['recipe']} recipe with "
        f"{cheapest['validation_scenes']} validation scenes ({cheapest['cost']['seconds']:.0f} CPU s)"
    )
    for q in undecided:
        assert step in q["answer"]["text"] and step in text, q["answer"]["text"]
    # A plan no design of which reaches its target names no next step, and says so.
    unreachable = _plan(root, "unreachable", tuning=False, d_reg=1e-9)
    assert main(["plan", str(unreachable), "--output", str(root / "unreachable")]) == 1
    tight = _study(root / "t", root / "pops", preparation.replace("bound-plan", "unreachable"))
    capsys.readouterr()
    assert main(["study", "run", str(tight), "--output", str(root / "t" / "out")]) == 0, capsys.readouterr().err
    answers = json.loads((root / "t" / "out" / "report" / "report.json").read_text())["question"]
    assert any(q["decision"] == "undecided" for q in answers)
    # Nor would the plan's largest pilot: its cost and the MDE it would give are named.
    largest = json.loads((root / "unreachable" / "plan.json").read_text())["levers"]["pilot_draws"][-1]
    for q in answers:
        if q["decision"] == "undecided":
            assert "no design the plan weighed reaches its target of D_reg 1e-09 m" in q["answer"]["text"], q
            assert "so the plan names no next step that would decide it" in q["answer"]["text"], q
            assert (
                f"nor would a pilot of {largest['draws']} TRAIN draws ({largest['extra_fits']} more pilot fits, "
                f"{largest['seconds']:.0f} CPU s: D_reg MDE {largest['rows']['D_reg ' + q['variant']]:.4f} m)"
            ) in q["answer"]["text"], q
    assert "## Levers the designs do not weigh" in (root / "unreachable" / "plan.md").read_text()
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


def test_an_undecided_answer_names_the_cheapest_pilot_that_would_decide_or_says_none_would():
    from qhlab.report.answer import _next_step

    def plan(d_reg_options: list[float]) -> dict:
        rows = {"D_reg v": {"mde": 0.005, "variance": {"dominant": "draw"}}, "D_mae v": {"mde": 0.002}}
        return {
            "chosen": None,
            "target": {"d_reg": 0.003, "d_mae": 0.005},
            "planned": {"rows": rows},
            "levers": {
                "pilot_draws": [
                    {"draws": 5 * 2**i, "extra_fits": 75 * (2**i - 1), "seconds": 5000.0 * (2**i - 1),
                     "rows": {"D_reg v": mde, "D_mae v": 0.002}}
                    for i, mde in enumerate(d_reg_options, start=1)
                ]
            },
        }  # fmt: skip

    # The 20-draw pilot reaches 3 mm and the 10-draw one does not: the cheapest that does is named.
    said = _next_step(plan([0.0035, 0.0029]), "v", " m")
    assert "but a pilot of 20 TRAIN draws would (225 more pilot fits, 15000 CPU s): planned MDE D_reg 0.0029 m" in said
    # Both reach it: the cheaper.
    assert "a pilot of 10 TRAIN draws would (75 more pilot fits, 5000 CPU s)" in _next_step(
        plan([0.0029, 0.0028]), "v", " m"
    )
    # Neither: the plan names no next step, the dominant part and what the largest pilot would give.
    none = _next_step(plan([0.0048, 0.0046]), "v", " m")
    assert "so the plan names no next step that would decide it: its D_reg MDE here was planned at 0.0050 m" in none
    assert "the draw part dominates its variance (neither seeds nor scenes shrink it, and what a larger TRAIN" in none
    assert none.endswith("; nor would a pilot of 20 TRAIN draws (225 more pilot fits, 15000 CPU s: D_reg MDE 0.0046 m)")
    # A plan recorded before the levers: no pilot is named.
    old = plan([0.0029])
    del old["levers"]
    assert "pilot of" not in _next_step(old, "v", " m")
