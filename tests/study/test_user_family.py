"""A study of the user's own arms: declared by builder path, frozen into the study, bound by digest.

Covers the builder contract checked at freeze and each of its refusals, the frozen copy (later
steps import only it, so editing the user's file changes nothing; tampering with the copy is
refused by every step and by verify), verify never importing user code, the fit receipt's
record of the builder, and ``examples/byo-study.toml`` end to end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.design.study_records import StudyCellReceipt, StudyFreezeReceipt
from qhlab.evidence import EvidenceError, read_receipt
from qhlab.evidence.layout import CELL_RECEIPT, CELLS_DIR, FAMILY_DIR, FREEZE_RECEIPT
from qhlab.study.authentication import authenticate_freeze
from qhlab.training.records import ColdInitializationReceipt, FitReceipt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MY_ARMS = EXAMPLES / "my_arms.py"
USER_ARMS = ("control_maxpool_sets", "variant_struck_mlp")

BAD_ARMS = """
import os
import torch
from torch import nn


class _Head(nn.Module):
    def __init__(self, dims, mode):
        super().__init__()
        self.mode = mode
        self.linear = nn.Linear(dims.candidate_features, dims.horizon)
        if mode == "random":
            generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
            self.extra = nn.Parameter(torch.randn(3, generator=generator))

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        q = self.linear(candidates)
        if self.mode == "shape":
            return q[..., 0]
        if self.mode == "nan":
            return q * float("nan")
        if self.mode == "detached":
            return torch.zeros_like(q)
        if self.mode == "mismatch":
            return self.linear(goal)  # the goal's width is not the candidates'
        return q


def build_raises(arch, dims):
    raise RuntimeError("this arm needs 3 heads")


def build_mismatch(arch, dims):
    return _Head(dims, "mismatch")


def build_dict(arch, dims):
    return {"q": _Head(dims, "plain")}


def build_shape(arch, dims):
    return _Head(dims, "shape")


def build_nan(arch, dims):
    return _Head(dims, "nan")


def build_detached(arch, dims):
    return _Head(dims, "detached")


def build_random(arch, dims):
    return _Head(dims, "random")


def build_not_a_module(arch, dims):
    return 42


def build_lazy(arch, dims):
    return nn.Sequential(nn.LazyLinear(dims.horizon))


def build_exits(arch, dims):
    import sys

    sys.exit(0)


def build_with_sibling(arch, dims):
    import helper_beside

    return helper_beside.head(dims)


class _ImportsWhenRun(_Head):
    def forward(self, *inputs):
        import helper_at_forward  # noqa: F401 - imported only when the arm runs

        return super().forward(*inputs)


def build_importing_at_forward(arch, dims):
    return _ImportsWhenRun(dims, "ok")


class _Wide(nn.Module):
    def __init__(self, dims, width):
        super().__init__()
        self.a = nn.Linear(dims.candidate_features, width)
        self.b = nn.Linear(width, dims.horizon)

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        return self.b(torch.relu(self.a(candidates)))


def build_env_width(arch, dims):
    return _Wide(dims, int(os.environ.get("QHLAB_TEST_ARM_WIDTH", "8")))


not_callable = 3
"""


@pytest.fixture
def byo(byo_writer, population_cache):
    """``byo(directory, *, arms=..., **replace)``: the byo example there, with ``bad_arms.py`` beside it."""

    def make(directory: Path, *, arms: str | None = None, **replace: str) -> Path:
        return byo_writer(
            directory, population_cache, files={"bad_arms.py": BAD_ARMS if arms is None else arms}, **replace
        )

    return make


def _freeze(config: Path, output: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["study", "freeze", str(config), "--output", str(output)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture(scope="module")
def frozen_byo(tmp_path_factory, population_cache, byo_writer) -> dict:
    """A byo study after freeze only."""
    directory = tmp_path_factory.mktemp("byo-frozen")
    config = byo_writer(directory, population_cache)
    output = directory / "study"
    assert main(["study", "freeze", str(config), "--output", str(output)]) == 0
    return {"config": config, "output": output, "directory": directory}


def test_freeze_copies_and_binds_each_user_source(frozen_byo) -> None:
    output = frozen_byo["output"]
    receipt = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt).record()
    arms = {a["arm"]: a for a in receipt["body"]["arms"]}
    for arm in USER_ARMS:
        copy = output / FAMILY_DIR / arm / "my_arms.py"
        assert copy.read_bytes() == MY_ARMS.read_bytes()
        assert f"{FAMILY_DIR}/{arm}/my_arms.py" in receipt["outputs"]
        source = arms[arm]["source"]
        assert source["kind"] == "file" and source["module"] == "my_arms"
        assert arms[arm]["architecture"]["source_sha256"] == source["sha256"]
        # The structure fields of built-in arms are never invented for a user arm.
        assert {"fusion", "readout"}.isdisjoint(arms[arm]["architecture"])
        assert "kind" not in arms[arm]["architecture"]["encoder"]
    assert arms["variant_struck_mlp"]["architecture"]["options"] == {"hidden": 48}
    assert arms["baseline"]["builder"] == "qhlab" and arms["baseline"]["source"] is None
    # Every arm's contract was checked on the canonical first TRAIN chain (B=2 rows, K=6, H=2).
    for a in arms.values():
        assert a["contract"]["output_shape"] == [2, 6, 2] and a["contract"]["parameters"] > 0
    # The struck-object MLP: options.hidden=48 -> (F+G+C)*48+48 + 48*2+2 parameters.
    assert arms["variant_struck_mlp"]["contract"]["parameters_receiving_gradients"] == 4


def test_freeze_prints_each_arm(tmp_path, byo, capsys) -> None:
    config = byo(tmp_path)
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 0, text
    assert "variant_struck_mlp (variant, builder my_arms.py:build_mlp)" in text
    assert "parameters per member" in text and '"hidden":48' in text.replace(" ", "")


def test_tampered_frozen_copy_is_refused_by_every_step_and_verify(tmp_path, frozen_byo, capsys) -> None:
    output = tmp_path / "study"
    shutil.copytree(frozen_byo["output"], output)
    assert main(["verify", str(output)]) == 0  # a moved copy is judged on its own family/ files
    copy = output / FAMILY_DIR / "variant_struck_mlp" / "my_arms.py"
    copy.write_text(copy.read_text() + "\n# edited\n")
    capsys.readouterr()
    assert main(["verify", str(output)]) == 2
    assert "my_arms.py" in capsys.readouterr().err
    with pytest.raises(EvidenceError, match="my_arms.py"):
        authenticate_freeze(frozen_byo["config"], output, "run_fit")


def test_copy_changed_after_authentication_is_refused_at_import(tmp_path, frozen_byo) -> None:
    """A copy replaced between a step's authentication and the arm's first import is refused."""
    from qhlab.execution.user_code import resolve_entry

    output = tmp_path / "study"
    shutil.copytree(frozen_byo["output"], output)
    frozen = authenticate_freeze(frozen_byo["config"], output, "run_fit")
    copy = output / FAMILY_DIR / "control_maxpool_sets" / "my_arms.py"
    copy.write_text(copy.read_text().replace("amax", "amin"))
    source = resolve_entry(
        "arm 'control_maxpool_sets'", "my_arms.py:build_maxpool_sets", frozen.sources["control_maxpool_sets"]
    )
    assert source.root == output / FAMILY_DIR / "control_maxpool_sets"
    with pytest.raises(
        EvidenceError,
        match="differs from the bound digests in control_maxpool_sets/my_arms.py|"
        "differs from the bound digests in my_arms.py",
    ):
        source.entry_function()


def test_verify_never_imports_user_code(tmp_path, byo) -> None:
    mark = tmp_path / "imported.txt"
    arms = MY_ARMS.read_text() + f'\nfrom pathlib import Path\nPath({str(mark)!r}).write_text("imported")\n'
    config = byo(tmp_path)
    (tmp_path / "my_arms.py").write_text(arms)
    output = tmp_path / "study"
    # The freeze runs in a fresh process too, so that its import is seen (and then undone).
    program = "import sys; from qhlab.cli import main; sys.exit(main(sys.argv[1:]))"
    frozen = subprocess.run(
        [sys.executable, "-c", program, "study", "freeze", str(config), "--output", str(output)],
        capture_output=True,
        text=True,
    )
    assert frozen.returncode == 0, frozen.stderr
    assert mark.read_text() == "imported"  # the freeze checks the contract by importing the copy
    mark.unlink()
    verified = subprocess.run([sys.executable, "-c", program, "verify", str(output)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    assert not mark.exists()
    # study status compares the user's file with the copy, but imports neither.
    status = subprocess.run(
        [sys.executable, "-c", program, "study", "status", str(output), "--json"], capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["sources"] == {}
    assert not mark.exists()


def test_status_says_the_user_source_changed(tmp_path, byo, capsys) -> None:
    config = byo(tmp_path)
    output = tmp_path / "study"
    assert main(["study", "freeze", str(config), "--output", str(output)]) == 0
    (tmp_path / "my_arms.py").write_text(MY_ARMS.read_text() + "\n# tuned after freeze\n")
    capsys.readouterr()
    assert main(["study", "status", str(output)]) == 0
    text = capsys.readouterr().out
    for arm in USER_ARMS:
        assert f"arm {arm}: source {tmp_path / 'my_arms.py'} changed since freeze; the frozen copy is used" in text
    # Freezing reads no user path again: the freeze receipt still authenticates.
    authenticate_freeze(config, output, "run_fit")


@pytest.mark.parametrize(
    ("builder", "cause"),
    [
        ("missing.py:build", "does not exist"),
        ("bad_arms.py:build_raises", "building it raised RuntimeError: this arm needs 3 heads"),
        ("bad_arms.py:no_such_function", "has no callable 'no_such_function'"),
        ("bad_arms.py:not_callable", "has no callable 'not_callable'"),
        ("bad_arms.py:build_not_a_module", "returned int; allowed: a torch.nn.Module"),
        ("bad_arms.py:build_dict", "returned dict; allowed: a torch.nn.Module"),
        ("bad_arms.py:build_shape", "output shape [2, 6] is not allowed; allowed: [B, K, H] = [2, 6, 2]"),
        ("bad_arms.py:build_nan", "non-finite values"),
        ("bad_arms.py:build_detached", "no parameter receives a gradient"),
        ("bad_arms.py:build_random", "initialisation is not deterministic"),
        ("bad_arms.py:build_lazy", "uninitialised (lazy) parameters or buffers: 0.bias, 0.weight"),
        ("bad_arms.py:build_with_sibling", "its source imports 'helper_beside', a module beside it"),
        ("bad_arms.py:build_exits", "building it exited SystemExit: 0"),
        ("no_such_package.models:build", "no module 'no_such_package'"),
        ("bad arms.py", "builder='bad arms.py' is not allowed"),
    ],
)
def test_bad_builder_is_one_error_line_and_writes_nothing(tmp_path, byo, capsys, builder, cause) -> None:
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': f'builder = "{builder}"'})
    (tmp_path / "helper_beside.py").write_text(HELPER)  # beside the arms, never on sys.path
    output = tmp_path / "study"
    code, text = _freeze(config, output, capsys)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 2, text
    assert len(errors) == 1 and "variant_struck_mlp" in text and cause in text, text
    if builder != "bad arms.py":  # a malformed string is one of the config's field errors instead
        assert f"arm 'variant_struck_mlp' (builder {builder!r})" in errors[0] and cause in errors[0]
    assert "Traceback" not in text
    assert not output.exists()


def test_a_module_that_exits_at_import_is_refused_not_frozen_with_exit_0(tmp_path, byo, capsys) -> None:
    config = byo(
        tmp_path,
        arms="import sys\nsys.exit(0)\n",
        **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build"'},
    )
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    assert "arm 'variant_struck_mlp' (builder 'bad_arms.py:build'): importing bad_arms.py failed: SystemExit: 0" in text
    assert not (tmp_path / "study").exists()


def test_import_error_of_the_module_is_refused_by_name(tmp_path, byo, capsys) -> None:
    config = byo(
        tmp_path,
        arms="raise ImportError('needs the package foo')\n",
        **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build"'},
    )
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2
    assert "arm 'variant_struck_mlp' (builder 'bad_arms.py:build')" in text
    assert "ImportError: needs the package foo" in text
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize(
    ("replace", "cause"),
    [
        ({'arm = "control_maxpool_sets"': 'arm = "control_global_readout"'}, "each arm may appear once"),
        (
            {'control = "control_global_readout"      # its regret': 'control = "control_nowhere" #'},
            "control='control_nowhere' is not allowed",
        ),
        (
            {
                'role = "variant"': 'role = "control"',
                'control = "control_global_readout"      # its regret margin is against this structural control': "",
                'matched = "baseline"                    # its MAE margin is against the baseline': "",
            },
            "needs at least one control and one variant",
        ),
        ({'arm = "variant_struck_mlp"': 'arm = "variant_deep"'}, "is not a built-in arm"),
        ({"options = { hidden = 48 }": "options = { hidden = [48] }"}, "options"),
        (
            {
                'builder = "my_arms.py:build_maxpool_sets"': 'builder = "my_arms.py:build_maxpool_sets"\nfusion = "concat"'  # noqa: E501 - one literal, kept whole
            },
            "Extra inputs",
        ),
    ],
)
def test_bad_family_is_refused_before_anything_is_written(tmp_path, byo, capsys, replace, cause) -> None:
    config = byo(tmp_path, **replace)
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    assert cause in text, text
    assert not (tmp_path / "study").exists()


@pytest.mark.slow
def test_a_cell_that_builds_another_network_than_the_freeze_is_refused(tmp_path, byo, capsys, monkeypatch) -> None:
    """An arm whose width reads an environment variable: frozen at width 8, its cells would train
    width 16; each fit refuses before its first update, naming both structures."""
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_env_width"'})
    output = tmp_path / "study"
    monkeypatch.delenv("QHLAB_TEST_ARM_WIDTH", raising=False)
    assert main(["study", "freeze", str(config), "--output", str(output)]) == 0
    monkeypatch.setenv("QHLAB_TEST_ARM_WIDTH", "16")
    capsys.readouterr()
    code = main(["study", "run", str(config), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the scorer built for arm 'variant_struck_mlp' has structure" in err and "its freeze recorded" in err, err
    assert not list((output / CELLS_DIR).glob(f"variant_struck_mlp-s*/{CELL_RECEIPT}"))
    assert not list((output / CELLS_DIR).glob("variant_struck_mlp-s*/*/fit.receipt.json"))


@pytest.mark.slow
def test_byo_study_end_to_end_verifies_and_ignores_later_edits(tmp_path, byo, capsys) -> None:
    """examples/byo-study.toml runs and verifies; a twin frozen before its user file is
    edited (into an arm that cannot even be built) gets bit-identical cells."""
    reference = byo(tmp_path / "reference")
    assert main(["study", "run", str(reference), "--output", str(tmp_path / "reference" / "study")]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "reference" / "study")]) == 0
    report = json.loads((tmp_path / "reference" / "study" / "report" / "report.json").read_text())
    assert [q["variant"] for q in report["question"]] == ["variant_struck_mlp"]
    assert [f["arm"] for f in report["family"]] == ["baseline", "control_global_readout", *USER_ARMS]
    cells = {c["arm"]: c for c in report["cells"]}
    # The MLP exposes no encoder or readout: the benchmark says so instead of crashing.
    assert cells["variant_struck_mlp"]["benchmark"]["encoder_seconds"] is None
    assert cells["control_maxpool_sets"]["benchmark"]["encoder_seconds"] > 0
    assert (
        (tmp_path / "reference" / "study" / "report" / "report.md")
        .read_text()
        .splitlines()[2]
        .startswith("## The answer")
    )

    twin = byo(tmp_path / "twin")
    output = tmp_path / "twin" / "study"
    assert main(["study", "freeze", str(twin), "--output", str(output)]) == 0
    (tmp_path / "twin" / "my_arms.py").write_text("raise ImportError('rewritten after freeze')\n")
    capsys.readouterr()
    assert main(["study", "run", str(twin), "--output", str(output)]) == 0
    # The run says that it ran the frozen copy, not the file as it is now.
    ran = capsys.readouterr().out
    for arm in USER_ARMS:
        assert f"note: arm {arm}: source {tmp_path / 'twin' / 'my_arms.py'} changed since freeze" in ran, ran
    for arm in USER_ARMS:
        for seed in (0, 1):
            cell = f"{arm}-s{seed}"
            ours = read_receipt(output / CELLS_DIR / cell / CELL_RECEIPT, StudyCellReceipt).record()
            theirs = read_receipt(
                tmp_path / "reference" / "study" / CELLS_DIR / cell / CELL_RECEIPT, StudyCellReceipt
            ).record()
            assert ours["body"]["final_state_sha256"] == theirs["body"]["final_state_sha256"]
            attempt = output / CELLS_DIR / cell / ours["body"]["attempt"]
            fit = read_receipt(attempt / "fit.receipt.json", FitReceipt).body_record()
            assert (
                fit["scorer"]["builder"]
                == {
                    "control_maxpool_sets": "my_arms.py:build_maxpool_sets",
                    "variant_struck_mlp": "my_arms.py:build_mlp",
                }[arm]
            )
            assert fit["scorer"]["members_path"] == "one scorer"
            assert len(fit["scorer"]["source_sha256"]) == 64
    capsys.readouterr()
    assert main(["study", "status", str(output)]) == 0
    assert "changed since freeze; the frozen copy is used" in capsys.readouterr().out
    assert main(["verify", str(output)]) == 0


PACKAGE = {
    "__init__.py": "",
    "layers.py": "from torch import nn\n\n\ndef head(d_in, h):\n    return nn.Sequential(nn.Linear(d_in, 16), nn.GELU(), nn.Linear(16, h))\n",  # noqa: E501 - one literal, kept whole
    "arms.py": (
        "import torch\nfrom torch import nn\n\nfrom .layers import head\n\n\n"
        "class CandidateOnly(nn.Module):\n"
        "    def __init__(self, dims):\n        super().__init__()\n"
        "        self.head = head(dims.candidate_features + dims.goal_features, dims.horizon)\n\n"
        "    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):\n"
        "        g = goal.unsqueeze(1).expand(-1, candidates.shape[1], -1)\n"
        "        return self.head(torch.cat([candidates, g], -1)).masked_fill(~candidate_mask.unsqueeze(-1), 0.0)\n\n\n"
        "def build(arch, dims):\n    return CandidateOnly(dims)\n"
    ),
}


@pytest.mark.parametrize("builder", ["armpkg.arms:build", "armpkg/arms.py:build"])
def test_a_local_package_is_frozen_whole_and_sealed(tmp_path, byo, capsys, builder) -> None:
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': f'builder = "{builder}"'})
    (tmp_path / "armpkg").mkdir()
    for name, text in PACKAGE.items():
        (tmp_path / "armpkg" / name).write_text(text)
    (tmp_path / "armpkg" / "__pycache__").mkdir()
    (tmp_path / "armpkg" / "__pycache__" / "arms.cpython-311.pyc").write_bytes(b"not source")
    output = tmp_path / "study"
    code, text = _freeze(config, output, capsys)
    assert code == 0, text
    copy = output / FAMILY_DIR / "variant_struck_mlp" / "armpkg"
    assert sorted(p.name for p in copy.iterdir()) == sorted(PACKAGE)  # no bytecode copied, none written
    body = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt).body_record()
    source = next(a for a in body["arms"] if a["arm"] == "variant_struck_mlp")["source"]
    assert source["kind"] == "package" and source["module"] == "armpkg.arms"
    assert sorted(source["files"]) == sorted(f"armpkg/{name}" for name in PACKAGE)
    assert main(["verify", str(output)]) == 0
    # A module added to the sealed copy: verify, every step's authentication and the import refuse it.
    from qhlab.execution.user_code import resolve_entry
    from qhlab.study.family import provide_family

    (copy / "extra.py").write_text("print('not frozen')\n")
    capsys.readouterr()
    assert main(["verify", str(output)]) == 2
    assert "armpkg/extra.py" in capsys.readouterr().err
    with pytest.raises(EvidenceError, match="armpkg/extra.py"):
        authenticate_freeze(config, output, "run_fit")
    shas = provide_family(read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt, verify_files=False).body, output)
    with pytest.raises(EvidenceError, match="armpkg/extra.py"):
        resolve_entry("arm 'variant_struck_mlp'", builder, shas["variant_struck_mlp"]).entry_function()


def test_a_shipped_copy_is_checked_before_it_is_imported(tmp_path, frozen_byo) -> None:
    """What a Ray task receives: the copy's bytes, written into its own directory and provided."""
    from qhlab.execution.user_code import resolve_entry
    from qhlab.study.family import family_bytes, provide_shipped

    body = read_receipt(frozen_byo["output"] / FREEZE_RECEIPT, StudyFreezeReceipt).body
    assert family_bytes(body, frozen_byo["output"], "baseline") is None
    shipped = family_bytes(body, frozen_byo["output"], "variant_struck_mlp")
    assert shipped["files"] == {"my_arms.py": MY_ARMS.read_bytes()}
    sha = shipped["record"]["sha256"]
    provide_shipped(shipped, tmp_path / "worker")
    source = resolve_entry("arm 'variant_struck_mlp'", "my_arms.py:build_mlp", sha)
    assert source.root == tmp_path / "worker" and callable(source.entry_function())
    forged = {**shipped, "files": {"my_arms.py": MY_ARMS.read_bytes() + b"\n# forged in transit\n"}}
    provide_shipped(forged, tmp_path / "forged")
    with pytest.raises(EvidenceError, match="differs from the bound digests in my_arms.py"):
        resolve_entry("arm 'variant_struck_mlp'", "my_arms.py:build_mlp", sha).entry_function()


def test_a_user_baseline_sizes_the_family_and_binds_its_source(tmp_path, byo, capsys) -> None:
    config = byo(
        tmp_path,
        **{
            'architecture = { arm = "baseline", encoder = { depth = 1, width = 16, heads = 2 } }': 'architecture = { arm = "my_baseline", builder = "my_arms.py:build_maxpool_sets", encoder = { width = 24 } }',  # noqa: E501 - one literal, kept whole
            '[[experiment.arms]]\narm = "control_global_readout"\nrole = "control"\n': "",
            'control = "control_global_readout"      # its regret': 'control = "control_maxpool_sets" #',
            'matched = "baseline"  ': 'matched = "my_baseline"  ',
        },
    )
    output = tmp_path / "study"
    code, text = _freeze(config, output, capsys)
    assert code == 0, text
    body = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt).body_record()
    arms = {a["arm"]: a for a in body["arms"]}
    assert list(arms) == ["my_baseline", "control_maxpool_sets", "variant_struck_mlp"]
    assert arms["my_baseline"]["role"] == "baseline" and arms["my_baseline"]["source"]["module"] == "my_arms"
    # The user baseline's width is the family's width: its arms follow the baseline's sizes.
    assert {a["architecture"]["encoder"]["width"] for a in arms.values()} == {24}
    assert body["cells"] == [f"{arm}-s{seed}" for arm in arms for seed in (0, 1)]
    assert (output / FAMILY_DIR / "my_baseline" / "my_arms.py").is_file()
    frozen = authenticate_freeze(config, output, "admit_canaries")
    recipe = frozen.recipe("my_baseline", 0, frozen.config.canary_updates)
    assert recipe.architecture.source_sha256 == arms["my_baseline"]["source"]["sha256"]


HELPER = "from torch import nn\n\n\ndef head(dims):\n    return nn.Linear(dims.candidate_features, dims.horizon)\n"


def test_an_arm_that_imports_unfrozen_code_of_its_own_is_refused(tmp_path, byo, capsys, monkeypatch) -> None:
    """A sibling module found on sys.path, or a package importing itself absolutely, would run
    the user's files rather than the copy: the freeze refuses both, naming the module."""
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_with_sibling"'})
    (tmp_path / "helper_beside.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    assert "imported module 'helper_beside'" in text and "not in its frozen source" in text
    assert not (tmp_path / "study").exists()

    config = byo(
        tmp_path / "forward",
        **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_importing_at_forward"'},
    )
    (tmp_path / "helper_at_forward.py").write_text(HELPER)
    code, text = _freeze(config, tmp_path / "forward" / "study", capsys)
    assert code == 2, text
    assert "imported module 'helper_at_forward'" in text

    package = tmp_path / "selfpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text(HELPER)
    (package / "arms.py").write_text(
        "from selfpkg.layers import head\n\n\ndef build(arch, dims):\n    return head(dims)\n"
    )
    config = byo(tmp_path / "pkg", **{'builder = "my_arms.py:build_mlp"': f'builder = "{package}/arms.py:build"'})
    code, text = _freeze(config, tmp_path / "pkg" / "study", capsys)
    assert code == 2, text
    assert "imported module 'selfpkg" in text


def test_planted_bytecode_or_a_planted_receipt_in_the_copy_is_refused(tmp_path, frozen_byo, capsys) -> None:
    """The import compiles the checked bytes themselves (never a .pyc), and the sealed copy may
    hold nothing else: not bytecode, and not a receipt that binds a planted file."""
    import py_compile

    from qhlab.evidence import write_receipt
    from qhlab.execution.user_code import resolve_entry
    from qhlab.study.family import provide_family

    output = tmp_path / "study"
    shutil.copytree(frozen_byo["output"], output)
    copy = output / FAMILY_DIR / "variant_struck_mlp"
    evil = tmp_path / "evil.py"
    evil.write_text("def build_mlp(arch, dims):\n    return 'EVIL'\n")
    (copy / "__pycache__").mkdir()
    pyc = copy / "__pycache__" / f"my_arms.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(evil), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    # Every step authenticates the freeze receipt, which seals family/: the planted file is refused
    # there, before any import; the import itself refuses it too.
    with pytest.raises(EvidenceError, match="__pycache__"):
        authenticate_freeze(frozen_byo["config"], output, "run_fit")
    body = read_receipt(output / FREEZE_RECEIPT, StudyFreezeReceipt, verify_files=False).body
    shas = provide_family(body, output)
    with pytest.raises(EvidenceError, match="__pycache__"):
        resolve_entry("arm 'variant_struck_mlp'", "my_arms.py:build_mlp", shas["variant_struck_mlp"]).entry_function()
    capsys.readouterr()
    assert main(["verify", str(output)]) == 2
    assert "__pycache__" in capsys.readouterr().err
    # study status agrees with verify on the copy: its freeze does not authenticate.
    assert main(["study", "status", str(output), "--json"]) == 0
    rows = {row["row"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["freeze"]["state"] == "crashed" and "__pycache__" in rows["freeze"]["note"], rows["freeze"]
    planted = {"seed": 0, "source_package_digest": "x", "state_sha256": "0" * 64, "tensor_count": 1}
    write_receipt(copy / "planted.receipt.json", ColdInitializationReceipt, body=planted, outputs={"pyc": pyc})
    assert main(["verify", str(output)]) == 2
    err = capsys.readouterr().err
    assert "seals, but it does not bind them" in err and "planted.receipt.json" in err


def test_an_error_in_the_users_forward_names_the_users_file_and_line(tmp_path, byo, capsys) -> None:
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_mismatch"'})
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    (error,) = [line for line in text.splitlines() if line.startswith("error:")]
    line = 1 + BAD_ARMS.splitlines().index(
        "            return self.linear(goal)  # the goal's width is not the candidates'"
    )
    assert "its forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied" in error, error
    # The frame shown is the user's own (the study's frozen copy of it), with the line's text.
    assert f"bad_arms.py, line {line}: return self.linear(goal)" in error, error
    assert text.count("HINT:") == 1 and "QhError" not in text and "Traceback" not in text, text
    assert not (tmp_path / "study").exists()


def test_a_syntax_error_in_the_users_module_is_an_import_failure_with_its_line(tmp_path, byo, capsys) -> None:
    config = byo(
        tmp_path,
        arms="import torch\n\n\ndef build(arch, dims)\n    return None\n",
        **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build"'},
    )
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    (error,) = [line for line in text.splitlines() if line.startswith("error:")]
    assert "importing bad_arms.py failed: SyntaxError" in error, error
    assert f"{tmp_path / 'bad_arms.py'}, line 4: def build(arch, dims)" in error, error
    assert text.count("HINT:") == 1 and "building it raised" not in text, text
    assert not (tmp_path / "study").exists()


def test_builder_errors_print_their_hint_once_without_internal_names(tmp_path, byo, capsys) -> None:
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_dict"'})
    code, text = _freeze(config, tmp_path / "study", capsys)
    assert code == 2, text
    assert text.count("HINT:") == 1, text
    assert "QhError" not in text and "QhInputError" not in text and "build_scorer:" not in text, text


def test_verbose_shows_the_whole_traceback_of_the_users_error(tmp_path, byo, capsys) -> None:
    config = byo(tmp_path, **{'builder = "my_arms.py:build_mlp"': 'builder = "bad_arms.py:build_mismatch"'})
    capsys.readouterr()
    assert main(["study", "freeze", str(config), "--output", str(tmp_path / "study"), "--verbose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):"), err
    assert "bad_arms.py" in err and "return self.linear(goal)" in err and "RuntimeError: mat1 and mat2" in err
    assert err.rstrip().splitlines()[-1].startswith("error: ") and err.count("error:") == 1
    assert not (tmp_path / "study").exists()
