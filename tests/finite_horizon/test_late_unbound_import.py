"""A user arm that imports unbound code only after its first forward is refused in one line.

The freeze runs an arm's build, one forward and one backward, and refuses what they import. An
arm that imports a module beside it only on a later forward passes them; the import guard refuses
that import when it runs, during the fit. The fit names the arm, its builder, the cell and the
module in one error line (exit 2), never a traceback through Lightning.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qhlab.cli import main
from qhlab.evidence.layout import FINAL_STATE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

LATE_ARM = """

class _ImportsLater(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.linear = nn.Linear(dims.candidate_features, dims.horizon)
        self.calls = 0

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        self.calls += 1
        if self.calls > 1:  # after the first forward, which the freeze checks
            import importlib

            importlib.import_module("late_helper")
        return self.linear(candidates)


def build_late(arch, dims):
    return _ImportsLater(dims)
"""


@pytest.fixture(scope="module")
def tiny_population(tmp_path_factory) -> dict[str, Path]:
    from qhlab.scenes import generate_population

    root = tmp_path_factory.mktemp("tiny-pops")
    return {
        "train": generate_population("tiny", "train", 0, root / "train", workers=1),
        "validation": generate_population("tiny", "validation", 1, root / "validation", workers=1),
    }


@pytest.mark.slow
def test_an_arm_importing_unbound_code_during_the_fit_is_one_refusal(
    tmp_path, tiny_population, capfd, monkeypatch
) -> None:
    (tmp_path / "my_arms.py").write_text((EXAMPLES / "my_arms.py").read_text() + LATE_ARM)
    # Beside the arm and on sys.path, as a sibling module is when the user runs from there.
    (tmp_path / "late_helper.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = (
        (EXAMPLES / "tiny-recipe.toml")
        .read_text()
        .replace(
            'arm = "baseline"\nencoder = { depth = 1, width = 32, heads = 2 }',
            'arm = "late_arm"\nbuilder = "my_arms.py:build_late"',
        )
        .replace("updates = 40", "updates = 5")
    )
    (tmp_path / "recipe.toml").write_text(recipe)
    populations = ["--train", str(tiny_population["train"]), "--validation", str(tiny_population["validation"])]
    argv = ["fit", str(tmp_path / "recipe.toml"), "--profile", "cpu-fp32", "--output", str(tmp_path / "out")]
    code = main([*argv, *populations, "--no-progress"])
    captured = capfd.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    assert "Traceback" not in text and text.count("error:") == 1, text
    (line,) = [line for line in text.splitlines() if line.startswith("error:")]
    assert "fit_recipe: arm 'late_arm' (builder 'my_arms.py:build_late') in cell 'tiny-baseline-s0'" in line, line
    assert f"during the fit its code imported module 'late_helper' from {str(tmp_path / 'late_helper.py')!r}" in line
    assert "which is not in its frozen source. HINT: only the named file" in line, line
    # The sibling never ran, and no final state was published for the refused fit.
    assert "late_helper" not in sys.modules
    assert not list((tmp_path / "out").rglob(FINAL_STATE))
