"""A study on the researcher's own environment, and preparation of a study with a user arm.

The environment is written outside the repository (``user_environment.HOPPER``); its populations
hold the frozen copy of its source, every study step imports that copy, ``qhlab verify`` never
imports it, and ``qhlab scenes audit`` does (and says so). Then ``qhlab pilot`` and ``qhlab
e0-check`` run on a tiny study with a user arm, and the pilot binds the arm's source.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence import sha256_file
from qhlab.evidence.layout import FAMILY_DIR, FREEZE_RECEIPT
from user_environment import write_hopper

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAM = "import sys; from qhlab.cli import main; sys.exit(main(sys.argv[1:]))"

STUDY = """name = "hopper-study"
profile = "cpu-fp32"
seeds = [0, 1]
canary_updates = 600
broad_updates = 30
tie_band = 0.001
regret_fraction = 0.9
mae_fraction = 1.1
workers = 2
population_cache = "populations"

[train]
preset = "{preset}"
seed = 7

[validation]
preset = "{preset}"
seed = 8

[bootstrap]
resamples = 199
seed = 0

[experiment.recipe]
name = "hopper"
horizon = 3
batch_size = 8
huber_delta = 0.05
architecture = {{ arm = "baseline", encoder = {{ depth = 1, width = 16, heads = 2 }} }}
optimizer = {{ lr = 3e-3 }}
target_update = {{ kind = "hard", interval = 10 }}

[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "variant_struck_mlp"
role = "variant"
builder = "my_arms.py:build_mlp"
control = "control_global_readout"
matched = "baseline"
options = {{ hidden = 24 }}
"""


def _run(*argv: str, mark: Path | None = None) -> subprocess.CompletedProcess:
    """A qhlab command in a fresh process (so that what it imports is its own doing)."""
    env = {**__import__("os").environ}
    if mark is not None:
        env["HOPPER_IMPORT_MARK"] = str(mark)
    return subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, env=env)


def test_a_study_on_ones_own_environment_runs_verifies_and_ignores_later_edits(tmp_path) -> None:
    home = tmp_path / "research"
    write_hopper(home, scenes=6)
    shutil.copy(EXAMPLES / "my_arms.py", home / "my_arms.py")
    config = home / "study.toml"
    config.write_text(STUDY.format(preset="hopper.toml"))
    output = tmp_path / "study"
    assert main(["study", "run", str(config), "--output", str(output)]) == 0
    report = (output / "report" / "report.md").read_text()
    assert "candidate 0 (wait) is the environment's reference candidate" in report
    freeze = json.loads((output / FREEZE_RECEIPT).read_text())["body"]
    train = Path(freeze["train"]["path"])
    assert freeze["train"]["environment_source"]["original"] == str(home / "hopper.py")
    assert (train / "environment" / "hopper.py").read_bytes() == (home / "hopper.py").read_bytes()

    # verify never imports the environment; the audit does, from the copy, and says so.
    mark = tmp_path / "imported.txt"
    verified = _run("verify", str(output), mark=mark)
    assert verified.returncode == 0, verified.stderr
    assert not mark.exists()
    assert "its environment is user code, which verify never imports" in verified.stdout
    assert f"qhlab scenes audit {train}" in verified.stdout
    # describe reads a stranger's population without running it; --audit runs it, and says so.
    described = _run("scenes", "describe", str(train), mark=mark)
    assert described.returncode == 0, described.stderr
    assert not mark.exists() and "checked without running its environment (user code)" in described.stdout
    audited = _run("scenes", "audit", str(train), mark=mark)
    assert audited.returncode == 0, audited.stderr
    assert mark.read_text() == "imported"
    assert "environment 'hopper', imported from the frozen copy inside the population" in audited.stdout

    # Editing the user's file changes no result: status says so, a re-run adopts every step.
    before = {p: sha256_file(p) for p in sorted(output.rglob("*.json")) if "wandb" not in p.parts[-3:]}
    (home / "hopper.py").write_text((home / "hopper.py").read_text().replace("self.pull * (", "0.1 * ("))
    status = _run("study", "status", str(output))
    assert status.returncode == 0, status.stderr
    assert f"environment: source {home / 'hopper.py'} changed since freeze" in status.stdout
    rerun = _run("study", "run", str(config), "--output", str(output))
    assert rerun.returncode == 0, rerun.stderr
    assert "is complete: every receipt authenticated" in rerun.stdout
    assert f"note: environment: source {home / 'hopper.py'} changed since freeze" in rerun.stdout
    assert {p: sha256_file(p) for p in before} == before
    assert (output / "report" / "report.md").read_text() == report

    # Tampering with the frozen copy inside the population is refused.
    copy = train / "environment" / "hopper.py"
    copy.chmod(0o644)
    copy.write_text(copy.read_text().replace("self.pull * (", "0.1 * ("))
    refused = _run("verify", str(output))
    assert refused.returncode == 2 and "environment/hopper.py" in refused.stderr, refused.stderr


def test_the_tank_study_runs_end_to_end_and_verifies(tmp_path) -> None:
    text = (EXAMPLES / "tanks-study.toml").read_text()
    config = tmp_path / "tanks-study.toml"
    config.write_text(
        text.replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{tmp_path / "pops"}"')
    )
    output = tmp_path / "study"
    assert main(["study", "run", str(config), "--output", str(output)]) == 0
    assert main(["verify", str(output)]) == 0
    report = json.loads((output / "report" / "report.json").read_text())
    references = report["references"]
    assert references["candidate_0"]["label"] == "wait (index 0)"


# ----------------------------------------------------------------- preparation with a user arm

_PILOT = """name = "byo-pilot"
study = "study.toml"
seeds = [2, 3]
workers = 2
population_cache = "{cache}"

[train]
preset = "tiny"
seed = 7

[validation]
preset = "tiny"
seed = 9
"""

_E0 = """name = "byo-e0"
study = "study.toml"
train_seeds = [21, 22, 23]
min_pass_share = 0.3
workers = 2
population_cache = "{cache}"
"""


def _byo_study(directory: Path, cache: Path, extra: str = "") -> Path:
    text = (EXAMPLES / "byo-study.toml").read_text()
    text = text.replace('population_cache = "~/.cache/qhlab/populations"', f'population_cache = "{cache}"')
    text = text.replace("broad_updates = 60", "broad_updates = 30")
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "my_arms.py", directory / "my_arms.py")
    # The layout of _PILOT, fixed by the study before the pilot runs.
    (directory / "study.toml").write_text(
        text + "\n[preparation.pilot_layout]\ndraws = [7]\nseeds = [[2, 3]]\n" + extra
    )
    return directory / "study.toml"


def test_pilot_and_e0_check_prepare_a_study_with_user_arms(tmp_path, capsys) -> None:
    cache = tmp_path / "pops"
    root = tmp_path / "prep"
    _byo_study(root, cache)
    (root / "pilot.toml").write_text(_PILOT.format(cache=cache))
    (root / "e0.toml").write_text(_E0.format(cache=cache))
    assert main(["pilot", str(root / "pilot.toml"), "--output", str(root / "pilot")]) == 0
    record = json.loads((root / "pilot" / "pilot.json").read_text())
    mlp = record["design"]["recipes"]["variant_struck_mlp"]["architecture"]
    frozen_copy = root / "pilot" / FAMILY_DIR / "variant_struck_mlp" / "my_arms.py"
    assert frozen_copy.read_bytes() == (root / "my_arms.py").read_bytes()
    assert mlp["builder"] == "my_arms.py:build_mlp" and len(mlp["source_sha256"]) == 64
    assert {f["arm"] for f in record["fits"]} >= {"variant_struck_mlp", "control_maxpool_sets"}
    code = main(["e0-check", str(root / "e0.toml"), "--output", str(root / "e0")])
    e0 = json.loads((root / "e0" / "e0.json").read_text())
    assert e0["draws"] == 3
    assert code == (0 if e0["meets_min_pass_share"] else 1)  # a gate that fell short is exit 1
    assert main(["verify", str(root / "pilot")]) == 0 and main(["verify", str(root / "e0")]) == 0
    capsys.readouterr()

    # A study binds the pilot of its arms' sources, and refuses it once an arm's file changed.
    study = _byo_study(tmp_path / "bound", cache, f'\n[preparation]\npilot = "{root / "pilot" / "pilot.json"}"\n')
    assert main(["study", "freeze", str(study), "--output", str(tmp_path / "bound" / "out")]) == 0
    edited = _byo_study(tmp_path / "edited", cache, f'\n[preparation]\npilot = "{root / "pilot" / "pilot.json"}"\n')
    arms = tmp_path / "edited" / "my_arms.py"
    arms.write_text(arms.read_text() + "\n# another version\n")
    capsys.readouterr()
    assert main(["study", "freeze", str(edited), "--output", str(tmp_path / "edited" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "preparation.pilot" in err and "recipes" in err, err
    assert not (tmp_path / "edited" / "out").exists()


# ----------------------------------------------------------------- preparation on one's own environment

_HOPPER_STUDY = """name = "hopper-prepared"
profile = "cpu-fp32"
seeds = [0, 1]
canary_updates = 600
broad_updates = 30
tie_band = 0.001
regret_fraction = 0.9
mae_fraction = 1.1
workers = 2
population_cache = "{cache}"

[train]
preset = "hopper.toml"
seed = 7

[validation]
preset = "hopper.toml"
seed = {validation}

[bootstrap]
resamples = 199
seed = 0

[experiment]
recipe = "recipe.toml"

[[experiment.arms]]
arm = "control_global_readout"
role = "control"

[[experiment.arms]]
arm = "variant_cross_attention"
role = "variant"
control = "control_global_readout"
{preparation}"""

_HOPPER_RECIPE = """name = "hopper"
seed = 0
horizon = 3
batch_size = 8
huber_delta = 0.05
updates = 30
architecture = { arm = "baseline", encoder = { depth = 1, width = 16, heads = 2 } }
optimizer = { lr = 3e-3 }
target_update = { kind = "hard", interval = 10 }
evaluation = { tie_band = 0.001 }
"""

# The layout of the hopper pilot, fixed by its study before the pilot runs.
_HOPPER_LAYOUT = "\n[preparation.pilot_layout]\ndraws = [7, 11, 12]\nseeds = [[2, 3], [4, 5], [6, 7]]\n"
_HOPPER_TOOLS = {
    "pilot.toml": """name = "hopper-pilot"
study = "study.toml"
seeds = [2, 3]
train_draws = [11, 12]
draw_seeds = [[4, 5], [6, 7]]
workers = 2
population_cache = "{cache}"

[train]
preset = "hopper.toml"
seed = 7

[validation]
preset = "hopper.toml"
seed = 9
""",
    "tune.toml": """name = "hopper-tune"
recipe = "recipe.toml"
trials = 2
batch = 2
sampler = "grid"
workers = 2
population_cache = "{cache}"

[train]
preset = "hopper.toml"
seed = 7

[validation]
preset = "hopper.toml"
seed = 9

[space]
"optimizer.lr" = {{ choices = [0.003, 0.006] }}

[objective]
seeds = [2]
""",
    "e0.toml": """name = "hopper-e0"
study = "study.toml"
train_seeds = [21, 22, 23]
min_pass_share = 0.3
workers = 2
population_cache = "{cache}"
""",
}


def test_a_study_on_a_preset_file_binds_its_tuning_pilot_and_e0_check(tmp_path, capsys) -> None:
    home = tmp_path / "research"
    write_hopper(home, scenes=6)
    cache = tmp_path / "pops"
    (home / "recipe.toml").write_text(_HOPPER_RECIPE)
    (home / "study.toml").write_text(_HOPPER_STUDY.format(cache=cache, validation=8, preparation=_HOPPER_LAYOUT))
    for name, text in _HOPPER_TOOLS.items():
        (home / name).write_text(text.format(cache=cache))
    assert main(["tune", str(home / "tune.toml"), "--output", str(home / "tune")]) == 0
    # The study takes the tuning's winner; its pilot and E0 check measure that recipe.
    (home / "recipe.toml").write_text((home / "tune" / "recipe.toml").read_text())
    assert main(["pilot", str(home / "pilot.toml"), "--output", str(home / "pilot")]) == 0
    e0 = main(["e0-check", str(home / "e0.toml"), "--output", str(home / "e0")])
    assert e0 == 0, json.loads((home / "e0" / "e0.json").read_text())["outcomes"]
    records = {
        "tuning": home / "tune" / "tuning.json",
        "pilot": home / "pilot" / "pilot.json",
        "e0": home / "e0" / "e0.json",
    }
    # Each record names the preset file by its generator, as the study does.
    for path in records.values():
        record = json.loads(path.read_text())
        identities = {p["generator_sha256"] for p in record.get("populations", {}).values()}
        assert all(len(i) == 64 for i in identities | {record.get("train_generator_sha256") or "0" * 64})
    # The study freezes with all three.
    preparation = _HOPPER_LAYOUT + "\n[preparation]\n" + "".join(f'{k} = "{v}"\n' for k, v in records.items())
    bound = home / "bound.toml"
    bound.write_text(_HOPPER_STUDY.format(cache=cache, validation=8, preparation=preparation))
    capsys.readouterr()
    assert main(["study", "freeze", str(bound), "--output", str(tmp_path / "bound")]) == 0, capsys.readouterr().err
    frozen = json.loads((tmp_path / "bound" / FREEZE_RECEIPT).read_text())["body"]["preparation"]
    assert {k for k, v in frozen.items() if v is not None} == {"tuning", "pilot", "e0"}
    # Scored on the tuning population: refused at the freeze, before any canary, nothing written.
    reused = home / "reused.toml"
    reused.write_text(_HOPPER_STUDY.format(cache=cache, validation=9, preparation=preparation))
    assert main(["study", "freeze", str(reused), "--output", str(tmp_path / "reused")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "the tuning's validation population" in err, err
    assert not (tmp_path / "reused").exists()
