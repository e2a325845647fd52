"""Numerics: a NaN or inf in a population label or in a training batch fails clearly, with no final receipt.

Owns: the checks that non-finite numbers never reach published evidence: a population whose
label (or reward, or feature) was made non-finite, with every digest recomputed so that it
authenticates, is refused by the loader; a training batch that yields a non-finite loss
stops the fit with a ``QhError`` before any final state or fit receipt is written. Does not
own: the loader, the learning rule or the launcher.
"""

from __future__ import annotations

import pytest
import torch
from _reliability_support import (
    assert_nothing_partial,
    forge_population,
    reliability_recipe,
    run_cli,
    set_list_value,
    set_scalar_value,
)
from safetensors.torch import load_file

from qhlab.design.config_files import load_recipe
from qhlab.scenes.records import PopulationReceipt

pytestmark = pytest.mark.reliability


def _chain_candidate_row(tables: dict) -> int:
    states = tables["states.parquet"].to_pydict()
    chain = {sid for sid, step in zip(states["state_id"], states["step"]) if step >= 0}
    ids = tables["candidates.parquet"].column("state_id").to_pylist()
    return next(i for i, sid in enumerate(ids) if sid in chain)


@pytest.mark.parametrize(
    ("column", "horizon_index", "value"),
    [
        ("q", 0, float("nan")),
        ("q", 1, float("inf")),
        ("q", 1, -float("inf")),
        ("q", 0, 1e39),
        ("reward", None, float("nan")),
        ("reward", None, -1e40),
    ],
    ids=["label-nan", "label-inf", "label-minus-inf", "label-beyond-float32", "reward-nan", "reward-beyond-float32"],
)
def test_non_finite_population_value_is_refused_by_the_loader(tmp_path, rel_populations, column, horizon_index, value):
    from qhlab.evidence import QhInputError, read_receipt
    from qhlab.finite_horizon.data import load_population

    def mutate(tables: dict) -> None:
        row = _chain_candidate_row(tables)
        if horizon_index is None:
            tables["candidates.parquet"] = set_scalar_value(tables["candidates.parquet"], column, row, value)
        else:
            tables["candidates.parquet"] = set_list_value(
                tables["candidates.parquet"], column, row, horizon_index, value
            )

    forged = forge_population(rel_populations["train"], tmp_path / "forged", mutate)
    # The forgery authenticates: only the content check can catch it.
    read_receipt(forged / "population.receipt.json", PopulationReceipt).record()
    with pytest.raises(QhInputError) as info:
        load_population(forged, split="train")
    message = str(info.value)
    assert "candidates.parquet" in message and repr(column) in message and "finite" in message, message

    # Through the CLI: exit 2, one error line, and no fit output at all.
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(reliability_recipe(updates=5, train=forged, validation=rel_populations["validation"]))
    result = run_cli(["fit", recipe, "--profile", "cpu-fp32", "--output", tmp_path / "out", "--no-progress"])
    assert result.code == 2, result.stderr[-2000:]
    assert len(result.error_lines) == 1 and "finite" in result.error_lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_nan_object_feature_is_refused_by_the_loader(tmp_path, rel_populations):
    import pyarrow as pa

    from qhlab.evidence import QhInputError
    from qhlab.finite_horizon.data import load_population

    def mutate(tables: dict) -> None:
        states = tables["states.parquet"]
        values = states.column("objects").to_pylist()
        values[1] = [list(v) for v in values[1]]
        values[1][-1][-1] = float("nan")
        field = states.schema.field("objects")
        tables["states.parquet"] = states.set_column(
            states.column_names.index("objects"), field, pa.array(values, type=field.type)
        )

    forged = forge_population(rel_populations["train"], tmp_path / "forged", mutate)
    with pytest.raises(QhInputError, match=r"states\.parquet column 'objects' holds nan"):
        load_population(forged, split="train")


class _PoisonBatch:
    """A Lightning callback that writes a non-finite value into one training batch."""

    def __new__(cls, *args, **kwargs):  # build the Callback subclass lazily (lightning import)
        from lightning.pytorch import Callback

        class Poison(Callback):
            def __init__(self, at_batch: int, key: str, value: float) -> None:
                self.at_batch, self.key, self.value, self.poisoned = at_batch, key, value, 0

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if batch_idx == self.at_batch:
                    if self.key == "target_values":
                        # A hard target's successor values come from its table, not from the
                        # batch's successor states: poison the value this batch's first row reads.
                        row = int(batch["successor"][0, 0])
                        pl_module.target_values[0, row, 0] = self.value
                    else:
                        flat = batch[self.key].view(-1)
                        flat[0] = self.value
                    self.poisoned += 1

        return Poison(*args, **kwargs)


@pytest.mark.parametrize(
    ("key", "value"),
    [("reward", float("nan")), ("objects", float("inf")), ("target_values", float("nan"))],
    ids=["reward-nan", "objects-inf", "successor-value-nan"],
)
def test_non_finite_training_loss_fails_the_fit_without_final_receipt(tmp_path, rel_recipe, key, value):
    from qhlab.evidence import QhError, QhInputError
    from qhlab.finite_horizon.fit import FitRequest, fit_recipe

    poison = _PoisonBatch(at_batch=3, key=key, value=value)
    output = tmp_path / "out"
    with pytest.raises(QhError) as info:
        fit_recipe(
            FitRequest(
                recipe=load_recipe(rel_recipe),
                profile="cpu-fp32",
                output=output,
                extra_callbacks=[poison],
                progress=False,
                segment_checkpoint_every=2,
            )
        )
    assert poison.poisoned == 1
    assert not isinstance(info.value, QhInputError)  # a runtime failure (exit 1), not bad usage
    message = str(info.value)
    assert "finite" in message and "loss" in message, message
    published = sorted(p.relative_to(output).as_posix() for p in output.rglob("*") if p.is_file())
    assert not [
        p for p in published if p.endswith(("fit.receipt.json", "final_state.safetensors", "evaluation.receipt.json"))
    ], published
    # Whatever was published before the failure (cold init, checkpoints before the poison) is
    # complete and finite: a checkpoint never holds the poisoned update.
    assert_nothing_partial(output, context="non-finite loss")
    for state in output.rglob("*.safetensors"):
        for name, tensor in load_file(str(state)).items():
            if tensor.is_floating_point():
                assert torch.isfinite(tensor).all(), (state.name, name)
