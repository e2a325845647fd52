"""Module and optimizer state of one fit: observed update counts, capture and restore.

Owns: counting optimizer updates from the optimizer's own per-parameter state
(:func:`observed_optimizer_updates`), capturing detached CPU copies of the module state and
the AdamW moments with their structure (:func:`capture_training_state`), and the inverse:
the module part of a captured state (:func:`module_state_tensors`) and loading saved
moments into a live optimizer (:func:`restore_optimizer_state`).

Does not own: writing or reading tensor files (``qhlab.training.tensor_state``), when a
state is captured (``qhlab.training.callbacks``, ``qhlab.training.launcher``), or any
learning rule (``qhlab.finite_horizon``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from qhlab.evidence import EvidenceError, QhError, to_jsonable

__all__ = [
    "capture_training_state",
    "module_state_tensors",
    "observed_optimizer_updates",
    "restore_optimizer_state",
]

_MOMENT_KEYS = ("exp_avg", "exp_avg_sq", "step")


def _unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    # Lightning hands callbacks a LightningOptimizer wrapper; the state lives on the inner one.
    return getattr(optimizer, "optimizer", optimizer) if not isinstance(optimizer, torch.optim.Optimizer) else optimizer


def observed_optimizer_updates(optimizer: Any) -> int:
    """Count successful optimizer updates from the optimizer's own per-parameter state.

    Reads AdamW's ``state[p]["step"]`` for every parameter of every param group. A skipped
    AMP step (GradScaler found inf/NaN) does not advance it, unlike ``trainer.global_step``.
    A parameter that received no gradient in some update has a smaller count, so the
    maximum is the number of updates the optimizer performed.

    Args:
        optimizer: a ``torch.optim.Optimizer`` (or Lightning's ``LightningOptimizer`` wrapper).

    Returns:
        The number of completed updates; 0 when no parameter has state yet.

    Raises:
        QhError: a parameter's state has no integral ``step`` (not an Adam-family optimizer).
    """
    inner = _unwrap_optimizer(optimizer)
    counts = []
    for group in inner.param_groups:
        for param in group["params"]:
            state = inner.state.get(param)
            if not state:
                continue
            step = state.get("step")
            if step is None:
                raise QhError(
                    f"observed_optimizer_updates: optimizer={type(inner).__name__} keeps no 'step' in its "
                    "parameter state; allowed: an Adam-family optimizer (AdamW). HINT: the update count "
                    "must come from the optimizer, never from batch counts."
                )
            value = float(step.item()) if isinstance(step, torch.Tensor) else float(step)
            if value != int(value) or value < 0:
                raise QhError(f"observed_optimizer_updates: step={value!r} is not a non-negative integer.")
            counts.append(int(value))
    return max(counts, default=0)


def _parameter_names(module: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}


def capture_training_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor], dict]:
    """Detached CPU copies of the module state and the optimizer moments, plus their structure.

    Tensor keys: ``module.state_dict()`` keys as they are (``online.*``, ``target.*`` for the
    QH module), and ``optim.<i>.exp_avg`` / ``optim.<i>.exp_avg_sq`` / ``optim.<i>.step``
    with ``i`` the index of the parameter in optimizer order. Live tensors are not changed.

    Returns:
        ``(tensors, structure)``; ``structure`` holds ``param_groups`` (hyper-parameters and
        parameter indices), ``param_names`` (optimizer order), ``steps`` per parameter index
        and ``observed_updates``.
    """
    tensors = {name: t.detach().to("cpu", copy=True) for name, t in module.state_dict().items()}
    structure: dict[str, Any] = {"module_keys": sorted(tensors), "param_groups": [], "param_names": [], "steps": {}}
    if optimizer is None:
        structure["observed_updates"] = 0
        return tensors, structure
    inner = _unwrap_optimizer(optimizer)
    names = _parameter_names(module)
    index = 0
    for group in inner.param_groups:
        hyper = {k: to_jsonable(v) for k, v in group.items() if k != "params"}
        indices = []
        for param in group["params"]:
            structure["param_names"].append(names.get(id(param), f"<unnamed:{index}>"))
            indices.append(index)
            state = inner.state.get(param) or {}
            for key in _MOMENT_KEYS:
                if key in state:
                    value = state[key]
                    value = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                    tensors[f"optim.{index}.{key}"] = value.detach().to("cpu", copy=True)
            if "step" in state:
                step = state["step"]
                structure["steps"][str(index)] = int(step.item() if isinstance(step, torch.Tensor) else step)
            index += 1
        structure["param_groups"].append({"hyper_parameters": hyper, "params": indices})
    structure["observed_updates"] = observed_optimizer_updates(inner)
    return tensors, structure


def module_state_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The module part of a captured training state (every key but ``optim.*``)."""
    return {k: v for k, v in tensors.items() if not k.startswith("optim.")}


def restore_optimizer_state(optimizer: Any, tensors: Mapping[str, torch.Tensor], structure: Mapping) -> None:
    """Load saved AdamW moments into a live optimizer whose hyper-parameters must match.

    Args:
        optimizer: the live optimizer (or Lightning's wrapper), after ``configure_optimizers``.
        tensors: a captured state with ``optim.<i>.{exp_avg,exp_avg_sq,step}`` keys.
        structure: its structure (``param_groups`` with hyper-parameters and indices).

    Raises:
        EvidenceError: the saved param groups differ from the live optimizer's.
    """
    inner = _unwrap_optimizer(optimizer)
    saved_groups = structure["param_groups"]
    if len(saved_groups) != len(inner.param_groups):
        raise EvidenceError(
            f"resume: the saved state has {len(saved_groups)} param groups but the optimizer has "
            f"{len(inner.param_groups)}. HINT: resume only with the recipe that wrote the state."
        )
    live_state = inner.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for saved, live in zip(saved_groups, live_state["param_groups"], strict=True):
        live_hyper = {k: to_jsonable(v) for k, v in live.items() if k != "params"}
        if saved["hyper_parameters"] != live_hyper or saved["params"] != list(live["params"]):
            raise EvidenceError(
                f"resume: saved param group {saved['hyper_parameters']} differs from the live optimizer's "
                f"{live_hyper}. HINT: resume only with the recipe that wrote the state."
            )
        for i in saved["params"]:
            moments = {k: tensors[f"optim.{i}.{k}"] for k in _MOMENT_KEYS if f"optim.{i}.{k}" in tensors}
            if moments:
                state[i] = {k: v.clone() for k, v in moments.items()}
    inner.load_state_dict({"state": state, "param_groups": live_state["param_groups"]})
