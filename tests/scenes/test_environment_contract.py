"""The environment contract at generation: each breach is one refusal, exit 2, nothing written.

Every case runs ``qhlab scenes generate`` on a preset whose environment lives outside the
repository (``user_environment.HOPPER``), broken in one way, and checks the one ``error:`` line:
it names the environment, the method and the cause, and no population directory appears.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qhlab.cli import main
from qhlab.evidence import QhInputError
from qhlab.scenes import generate_population, read_manifest
from qhlab.scenes.audit import audit_population
from qhlab.scenes.environment import Environment, EnvironmentSpec
from user_environment import write_hopper


def _generate(preset, out) -> list[str]:
    return ["scenes", "generate", "--preset", str(preset), "--split", "train", "--seed", "0", "--out", str(out)]


@pytest.mark.parametrize(
    "fault, method, cause",
    [
        ("nondeterministic_scene", "sample_scene(seed)", "another scene for the same seed (not deterministic)"),
        ("scene_not_json", "sample_scene(seed)", "a scene that is not JSON"),
        ("nondeterministic_step", "step(scene, state, 0)", "another successor or reward for the same inputs"),
        # Deterministic on the initial state, not on its successors: the probes step two deep.
        ("nondeterministic_second_step", "step(scene, state, 0)", "another successor or reward for the same inputs"),
        # Steps by the scene it was last reset to, not the one it is passed.
        ("remembers_scene", "step(scene, state, ", "after other scenes and steps (hidden state"),
        # The same in one process, another in the next (str hashes are salted per interpreter).
        ("process_hash", "step(scene, state, action)", "in a fresh interpreter for the same inputs"),
        ("too_many_candidates", "candidates(scene, state)", "returned 6; allowed: an int in 1..5"),
        ("nan_reward", "step(scene, state, 0)", "returned reward nan; allowed: a finite number"),
        ("infinite_state", "step(scene, state, 0)", "returned a state with a non-finite value"),
        ("float32_objects", "observe(scene, state)", "returned objects of float32"),
        ("short_features", "observe(scene, state)", "candidate_features of float64 (4, 1); allowed: float64 [4x2]"),
        ("raises", "sample_scene(seed) raised RuntimeError: the stones are wet", "hopper.py, line"),
    ],
)
def test_a_contract_breach_is_one_refusal_and_writes_nothing(tmp_path, capsys, fault, method, cause) -> None:
    preset = write_hopper(tmp_path / "env", options=f'fault = "{fault}"')
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "hopper" in err and method in err and cause in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["env"]


def test_a_scene_id_beyond_int64_is_one_refusal(tmp_path, capsys) -> None:
    preset = write_hopper(tmp_path / "env")
    source = tmp_path / "env" / "hopper.py"
    source.write_text(
        source.read_text().replace(
            "    def initial_state(self, scene):",
            "    def scene_id(self, scene, *, split, seed, scene_index):\n        return 2**64 + scene_index\n\n"
            "    def initial_state(self, scene):",
        )
    )
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "scene_id(scene, ...)" in err and "allowed: an int in [0, 2**63)" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "body, cause",
    [
        ("return {'draws': {1, 2}}", "generator_record(preset, ...) returned no JSON object"),
        ("return ['not', 'a', 'record']", "generator_record(preset, ...) returned no JSON object"),
        ("raise KeyError('layout')", "generator_record(preset, ...) raised KeyError"),
    ],
    ids=["a set inside", "a list", "raises"],
)
def test_an_own_generator_record_that_is_no_json_object_is_one_refusal(tmp_path, capsys, body, cause) -> None:
    preset = write_hopper(tmp_path / "env")
    source = tmp_path / "env" / "hopper.py"
    source.write_text(
        source.read_text().replace(
            "    def initial_state(self, scene):",
            f"    def generator_record(self, preset, *, split, seed):\n        {body}\n\n"
            "    def initial_state(self, scene):",
        )
    )
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and cause in err and "Traceback" not in err, err
    assert not out.exists()


def test_an_exception_in_user_code_names_the_users_file_and_line(tmp_path, capsys) -> None:
    preset = write_hopper(tmp_path / "env", options='fault = "raises"')
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    lines = (tmp_path / "env" / "hopper.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "wet" in text)
    assert f"{tmp_path / 'env' / 'hopper.py'}, line {line}: raise RuntimeError" in err, err


@pytest.mark.parametrize(
    "edit, cause",
    [
        (lambda text: text.replace("def make(options):", "def build(options):"), "'make' is missing or not callable"),
        (lambda text: text + "\nmake = 3\n", "'make' is missing or not callable"),
        (
            lambda text: text.replace("    return Hopper(options)", "    raise KeyError('pull')"),
            "make(options) raised KeyError: 'pull'",
        ),
        (
            lambda text: text.replace("object_features = 2", "object_features = 0"),
            "breaks the environment contract: object_features=0",
        ),
        (lambda text: "import stones_helper\n" + text, "imports 'stones_helper', a module beside it"),
        # A state column named like one of the states table's own columns (ArrowInvalid, before).
        (
            lambda text: text.replace('state_column = "position"', 'state_column = "goal"'),
            "state_column='goal' (allowed: an identifier other than chain_id",
        ),
        # A reference candidate named like a card policy (the card's uniform row would be candidate 0's).
        (
            lambda text: text.replace('reference_candidate = "wait"', 'reference_candidate = "uniform"'),
            "reference_candidate='uniform' (allowed: an identifier other than best_fixed_index",
        ),
        # The class itself passes a check of its members; its methods then fail for want of self.
        (
            lambda text: text.replace("    return Hopper(options)", "    return Hopper"),
            "make(options) returned the class 'Hopper'; allowed: an environment object",
        ),
        # A declared K far above what a state holds would size every load and verify by it.
        (
            lambda text: text.replace("max_candidates = 5", "max_candidates = 300000"),
            "max_candidates=300000 (allowed: an int in [1, 4096])",
        ),
    ],
)
def test_a_bad_factory_is_one_refusal_and_writes_nothing(tmp_path, capsys, edit, cause) -> None:
    preset = write_hopper(tmp_path / "env")
    (tmp_path / "env" / "stones_helper.py").write_text("WET = True\n")
    source = tmp_path / "env" / "hopper.py"
    source.write_text(edit(source.read_text()))
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "hopper.py:make" in err and cause in err, err
    assert not out.exists()


def test_a_sibling_module_reachable_on_the_path_is_refused_not_run_unbound(tmp_path, monkeypatch, capsys) -> None:
    # With the user's directory on sys.path the bare import would succeed from the live file.
    preset = write_hopper(tmp_path / "env")
    (tmp_path / "env" / "stones_helper.py").write_text("WET = True\n")
    source = tmp_path / "env" / "hopper.py"
    source.write_text("import stones_helper\n" + source.read_text())
    monkeypatch.syspath_prepend(str(tmp_path / "env"))
    assert main([*_generate(preset, tmp_path / "pop"), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "imported module 'stones_helper'" in err, err
    assert "not in its frozen source" in err and err.count("HINT") == 1, err
    assert not (tmp_path / "pop").exists()


def test_a_user_environment_population_binds_its_source_and_audits_through_the_copy(tmp_path, monkeypatch) -> None:
    preset = write_hopper(tmp_path / "env")
    population = generate_population(preset, "train", 3, tmp_path / "pop", workers=2)
    manifest = read_manifest(population)
    source = manifest["generator"]["environment"]["source"]
    assert (population / "environment" / "hopper.py").read_bytes() == (tmp_path / "env" / "hopper.py").read_bytes()
    assert manifest["files"]["environment/hopper.py"] == source["files"]["hopper.py"]
    assert manifest["K"] == 5 and manifest["features"]["candidates"][0] == {"name": "candidate_0", "unit": "1"}
    # Candidate counts vary with the scene; candidate 0 acts on no object.
    import pyarrow.parquet as pq

    candidates = pq.read_table(population / "candidates.parquet").to_pydict()
    per_state = np.bincount(candidates["state_id"])
    assert len(set(per_state.tolist())) > 1
    assert {o for c, o in zip(candidates["candidate"], candidates["object"], strict=True) if c == 0} == {-1}
    assert manifest["difficulty"]["regret_H"]["wait"] >= 0
    # The user's file changes, then disappears: the audit imports only the copy inside the population.
    (tmp_path / "env" / "hopper.py").write_text("raise SystemExit('the live file ran')\n")
    assert audit_population(population, states=None)["environment"] == {"name": "hopper", "user_code": True}
    (tmp_path / "env" / "hopper.py").unlink()
    assert audit_population(population, states=2)["result"] == "passed"
    # The same arguments give the same bytes, on one worker or two.
    write_hopper(tmp_path / "env2")
    again = generate_population(tmp_path / "env2" / "hopper.toml", "train", 3, tmp_path / "again", workers=1)
    for name in ("scenes.parquet", "states.parquet", "candidates.parquet"):
        assert (again / name).read_bytes() == (population / name).read_bytes()


def test_the_audit_refuses_a_frozen_copy_edited_after_generation(tmp_path, capsys) -> None:
    population = generate_population(write_hopper(tmp_path / "env"), "train", 1, tmp_path / "pop", workers=1)
    copy = population / "environment" / "hopper.py"
    copy.chmod(0o644)
    copy.write_text(copy.read_text().replace("self.pull * (", "0.5 * ("))
    for argv in (["verify", str(population)], ["scenes", "audit", str(population)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "environment/hopper.py" in err, err


def test_a_builtin_factory_is_imported_never_copied_and_a_malformed_one_is_refused() -> None:
    made = Environment.make(EnvironmentSpec("qhlab.scenes.tanks:make", {"tanks": [3, 4]}))
    assert made.name == "tanks" and made.source_files is None and made.reference_candidate == "wait"
    with pytest.raises(QhInputError, match="no module 'qhlab.scenes.nothing'"):
        Environment.make(EnvironmentSpec("qhlab.scenes.nothing:make"))
    with pytest.raises(QhInputError, match=r"tank network: options \['valves'\] are not allowed"):
        Environment.make(EnvironmentSpec("qhlab.scenes.tanks:make", {"valves": 3}))


def test_the_tank_network_keeps_its_contract_on_its_own_scenes() -> None:
    from qhlab.scenes.probes import check_contract
    from qhlab.scenes.sampler import scene_seed

    made = Environment.make(EnvironmentSpec("qhlab.scenes.tanks:make", {}))
    checked = check_contract(made, tuple(scene_seed("train", 0, i) for i in range(12)))
    assert checked["scenes"] == 12 and checked["steps"] > 12
    counts, volumes = set(), []
    for i in range(12):
        scene = json.loads(json.dumps(made.sample_scene(scene_seed("train", 0, i))))
        state = made.initial_state(scene)
        k = made.candidates(scene, state)
        counts.add(k)
        objects, goal, features, acts_on = made.observe(scene, state)
        assert acts_on[0] == -1 and (acts_on[1:] >= 0).all()
        total = float(np.dot(state, scene["area"]))
        for action in range(k):
            after, _ = made.step(scene, state, action)
            # Water is conserved by valves and pumps alike; levels stay within their tanks.
            volumes.append(abs(float(np.dot(after, scene["area"])) - total))
            assert (after >= 0).all() and (after <= np.array(scene["capacity"]) + 1e-12).all()
    assert len(counts) > 1 and max(volumes) < 1e-9


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("fault", ["remembers_scene", "process_hash"])
def test_hidden_state_is_refused_whatever_the_workers(tmp_path, capsys, fault, workers) -> None:
    # Labels computed by other processes (2 workers) or in another order would differ from one
    # process's: refused before any label is computed, with one worker or with two.
    preset = write_hopper(tmp_path / "env", options=f'fault = "{fault}"')
    out = tmp_path / "pop"
    assert main([*_generate(preset, out), "--workers", workers, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "hidden state" in err, err
    assert not out.exists()
