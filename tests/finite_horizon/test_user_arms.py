"""User arms below the study: the architecture config, building from a provided copy, `qhlab fit`.

Validating a user arm never imports it; built-in arms' dumps (and so their recipe digests) keep
exactly their fields; a provided copy builds plain scorers, ensembles and zero Q heads; a
registered default size is applied in a study, not silently replaced by the baseline's; and a
recipe file's builder is found beside it, digested and recorded in the fit receipt.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from qhlab.cli import main
from qhlab.evidence import QhError, read_receipt
from qhlab.execution.user_code import FrozenSource, locate_source, parse_entry, provide, source_digest, source_files
from qhlab.finite_horizon.architecture import ARMS, ArchitectureConfig, ScorerDims, register_arm
from qhlab.finite_horizon.scorer import QhEnsemble, build_scorer
from qhlab.training.records import FitReceipt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DIMS = ScorerDims(object_features=5, goal_features=3, candidate_features=4, horizon=2)


def _provided(tmp_path: Path, arm: str = "struck_mlp", builder: str = "my_arms.py:build_mlp") -> ArchitectureConfig:
    shutil.copy(EXAMPLES / "my_arms.py", tmp_path / "my_arms.py")
    located = locate_source(parse_entry(builder), tmp_path)
    files = {rel: hashlib.sha256(data).hexdigest() for rel, data in source_files(located.path).items()}
    provide(
        FrozenSource(
            owner=f"arm {arm!r}",
            entry=builder,
            root=tmp_path,
            module=located.module,
            function=located.function,
            files=files,
        )
    )
    return ArchitectureConfig.model_validate(
        {
            "arm": arm,
            "builder": builder,
            "source_sha256": source_digest(files),
            "encoder": {"width": 16},
            "options": {"hidden": 12},
        }
    )


def _inputs(b: int = 3, n: int = 4, k: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(b, k, dtype=torch.bool)
    mask[0, -1] = False
    return [
        torch.randn(b, n, DIMS.object_features, generator=generator),
        torch.ones(b, n, dtype=torch.bool),
        torch.randn(b, DIMS.goal_features, generator=generator),
        torch.randn(b, k, DIMS.candidate_features, generator=generator),
        torch.randint(0, n, (b, k), generator=generator),
        mask,
    ]


def test_a_user_arm_validates_without_importing_anything() -> None:
    arch = ArchitectureConfig.model_validate(
        {
            "arm": "mine",
            "builder": "nowhere/at_all.py:build",
            "options": {"hidden": 8, "gate": True, "act": "relu", "p": 0.1},
        }
    )
    assert arch.is_user_arm and arch.encoder.kind is None
    dumped = arch.model_dump(mode="json")
    assert set(dumped) == {"arm", "builder", "encoder", "options"}
    assert dumped["encoder"] == {"depth": 1, "width": 64, "heads": 4}
    assert ArchitectureConfig.model_validate(dumped) == arch


def test_built_in_arms_dump_exactly_their_fields() -> None:
    dumped = ArchitectureConfig.model_validate({"arm": "variant_deep"}).model_dump(mode="json")
    assert dumped == {
        "arm": "variant_deep",
        "encoder": {"kind": "attention", "depth": 2, "width": 64, "heads": 4},
        "fusion": "concat",
        "readout": "local",
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"arm": "mine"}, "arm='mine' is not registered"),
        ({"arm": "baseline", "builder": "a.py:b"}, "not a built-in arm"),
        ({"arm": "mine", "builder": "a.py:b", "fusion": "concat"}, "fusion is not allowed for a user arm"),
        ({"arm": "mine", "builder": "a.py:b", "encoder": {"kind": "attention"}}, "encoder.kind is not allowed"),
        ({"arm": "mine", "builder": "a.py"}, "builder='a.py' is not allowed"),
        ({"arm": "mine", "builder": "a.py:b", "options": {"hidden": [1]}}, "options.hidden"),
        ({"arm": "baseline", "options": {"hidden": 1}}, "only with builder"),
    ],
)
def test_bad_architectures_are_refused_by_name(raw, message) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("[", r"\[")):
        ArchitectureConfig.model_validate(raw)


def test_a_provided_copy_builds_scorers_ensembles_and_zero_heads(tmp_path) -> None:
    arch = _provided(tmp_path)
    torch.manual_seed(3)
    one = build_scorer(arch, DIMS)
    torch.manual_seed(3)
    again = build_scorer(arch, DIMS)
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), again.state_dict().values()))
    assert one.mlp[0].out_features == 12  # options.hidden reached the builder
    q = one(*_inputs())
    assert q.shape == (3, 5, 2) and q[0, -1].abs().sum() == 0
    ensemble = build_scorer(arch, DIMS, members=2)
    assert isinstance(ensemble, QhEnsemble) and ensemble(*_inputs()).shape == (3, 5, 2)
    zero = build_scorer(arch, DIMS, q_head_init="zero")
    assert zero.mlp[-1].weight.abs().sum() == 0 and zero(*_inputs()).abs().sum() == 0


def test_an_arm_whose_source_was_not_provided_is_refused(tmp_path) -> None:
    arch = ArchitectureConfig.model_validate(
        {"arm": "never_provided", "builder": "x.py:build", "source_sha256": "0" * 64}
    )
    with pytest.raises(QhError, match="has no source provided in this process"):
        build_scorer(arch, DIMS)


def test_a_registered_default_size_is_applied_in_a_study(tmp_path) -> None:
    from qhlab.design.study_config import read_study_config

    register_arm("variant_wide_readout_test", encoder="attention", fusion="concat", readout="local", width=24)
    try:
        text = (
            (Path(__file__).parents[1] / "study" / "tiny-study.toml")
            .read_text()
            .replace('arm = "variant_deep"', 'arm = "variant_wide_readout_test"')
        )
        path = tmp_path / "study.toml"
        path.write_text(text)
        config, _, _ = read_study_config(path)
        wide = config.cell_recipe("variant_wide_readout_test", 0, 30).architecture.encoder
        baseline = config.cell_recipe("baseline", 0, 30).architecture.encoder
        assert (wide.width, wide.heads, wide.depth) == (24, 2, 1)  # declared width; the rest the baseline's
        assert baseline.width == 16
        path.write_text(
            text.replace(
                'control = "control_no_interaction"', 'control = "control_no_interaction"\nencoder = { width = 32 }'
            )
        )
        config, _, _ = read_study_config(path)
        assert config.cell_recipe("variant_wide_readout_test", 0, 30).architecture.encoder.width == 32
    finally:
        ARMS.pop("variant_wide_readout_test")


@pytest.fixture(scope="module")
def tiny_population(tmp_path_factory) -> dict[str, Path]:
    from qhlab.scenes import generate_population

    root = tmp_path_factory.mktemp("tiny-pops")
    return {
        "train": generate_population("tiny", "train", 0, root / "train", workers=1),
        "validation": generate_population("tiny", "validation", 1, root / "validation", workers=1),
    }


def test_qhlab_fit_finds_the_builder_beside_the_recipe_and_records_it(tmp_path, tiny_population) -> None:
    shutil.copy(EXAMPLES / "my_arms.py", tmp_path / "my_arms.py")
    recipe = (
        (EXAMPLES / "tiny-recipe.toml")
        .read_text()
        .replace(
            'arm = "baseline"\nencoder = { depth = 1, width = 32, heads = 2 }',
            'arm = "struck_mlp"\nbuilder = "my_arms.py:build_mlp"\noptions = { hidden = 8 }',
        )
        .replace("updates = 40", "updates = 5")
    )
    assert 'builder = "my_arms.py:build_mlp"' in recipe
    (tmp_path / "recipe.toml").write_text(recipe)
    out = tmp_path / "out"
    code = main(
        [
            "fit",
            str(tmp_path / "recipe.toml"),
            "--profile",
            "cpu-fp32",
            "--output",
            str(out),
            "--train",
            str(tiny_population["train"]),
            "--validation",
            str(tiny_population["validation"]),
            "--no-progress",
        ]
    )
    assert code == 0
    receipt = next(out.rglob("fit.receipt.json"))
    body = read_receipt(receipt, FitReceipt).body_record()
    files = {"my_arms.py": hashlib.sha256((EXAMPLES / "my_arms.py").read_bytes()).hexdigest()}
    structure = body["scorer"].pop("structure")
    assert body["scorer"] == {
        "arm": "struck_mlp",
        "builder": "my_arms.py:build_mlp",
        "source_sha256": source_digest(files),
        "members": 1,
        "members_path": "one scorer",
    }
    # The structure the fit built, as a freeze would record it for the arm.
    assert structure["parameters"] > 0 and len(structure["sha256"]) == 64
    assert body["recipe"]["architecture"]["source_sha256"] == source_digest(files)
