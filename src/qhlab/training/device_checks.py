"""Checks that live tensors obey an execution lane, and MPS CPU-fallback observation.

Owns: ``assert_device_tensors`` (every parameter, buffer and gradient FP32 on the lane's device),
``device_check_record`` (the same over optimizer state, as a JSON-able record) and
``captured_fallback_operations`` (the MPS operators that fell back to the CPU inside a
context). Every check only reads tensors. Does not own: the lanes and their admission
(``qhlab.training.profiles``) or the fit callback that runs these checks
(``qhlab.training.lane_evidence``). The public API ``qhlab.training.execution_profile``
re-exports its public names.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from qhlab.evidence import QhError, input_error, require_instance
from qhlab.training.profiles import ACCELERATORS

__all__ = ["assert_device_tensors", "captured_fallback_operations", "device_check_record"]

_FALLBACK_MESSAGE = re.compile(
    r"The operator '(?P<op>[^']+)' is not currently supported on the MPS backend and will fall "
    r"back to run on the CPU"
)
_FALLBACK_FILTER = r"The operator '[^']+' is not currently supported on the MPS backend"


def assert_device_tensors(module: torch.nn.Module, device_type: str, *, gradients: bool) -> None:
    """Reject CPU execution or non-FP32 state when an accelerator was requested.

    Every parameter and buffer must live on ``device_type``; every floating-point one must
    be float32 (integer/bool buffers such as BatchNorm's ``num_batches_tracked`` are counters,
    not precision state, and only their device is checked). With ``gradients=True`` every
    parameter that requires grad must have a float32 gradient on ``device_type``.

    Raises:
        QhInputError: bad ``module``/``device_type``/``gradients``.
        QhError: one error listing every offender by qualified name with dtype and device.
    """
    call = "assert_device_tensors"
    require_instance(
        call, "module", module, torch.nn.Module, allowed="torch.nn.Module", hint="pass the LightningModule."
    )
    if device_type not in ACCELERATORS:
        raise input_error(call, "device_type", device_type, ", ".join(ACCELERATORS), "pass profile.device_type.")
    if not isinstance(gradients, bool):
        raise input_error(call, "gradients", gradients, "True or False", "True after a backward pass.")
    parameters = list(module.named_parameters())
    buffers = list(module.named_buffers())
    if not parameters and not buffers:
        raise input_error(
            call, "module", type(module).__name__, "a module with parameters or buffers", "nothing to verify."
        )
    offenders = _offenders("parameter", parameters, device_type) + _offenders("buffer", buffers, device_type)
    if gradients:
        for name, param in parameters:
            if not param.requires_grad:
                continue
            if param.grad is None:
                offenders.append(f"gradient {name}: missing")
            else:
                offenders += _offenders("gradient", [(name, param.grad)], device_type)
    _raise_offenders(call, offenders, device_type)


def _offenders(kind: str, named: list[tuple[str, torch.Tensor]], device_type: str) -> list[str]:
    """``"<kind> <name>: dtype=... device=..."`` for each tensor off the device or not FP32."""
    found = []
    for name, tensor in named:
        wrong_device = tensor.device.type != device_type
        wrong_dtype = tensor.dtype != torch.float32 and (tensor.is_floating_point() or tensor.is_complex())
        if wrong_device or wrong_dtype:
            found.append(f"{kind} {name}: dtype={_dtype(tensor.dtype)} device={tensor.device}")
    return found


def _raise_offenders(call: str, offenders: list[str], device_type: str) -> None:
    if offenders:
        raise QhError(
            f"{call}: {len(offenders)} tensor(s) are not float32 on {device_type!r}: "
            + "; ".join(offenders)
            + ". HINT: the profile requires every parameter, buffer and gradient on the device in FP32."
        )


def device_check_record(
    module: torch.nn.Module, device_type: str, *, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Run :func:`assert_device_tensors` (and the same check on optimizer state); return the record.

    Optimizer state tensors (AdamW ``exp_avg``/``exp_avg_sq``) must be FP32 on ``device_type``
    too. ``state["step"]`` is not checked: torch keeps that scalar counter on the CPU unless
    the optimizer is capturable or fused, on every lane.

    Returns:
        JSON-able ``{"device_type", "devices", "dtypes", "parameters", "buffers",
        "optimizer_state_tensors", "optimizer_step_counters", "passed": True}``.

    Raises:
        QhError: any tensor off the device or not FP32 (every offender listed).
    """
    assert_device_tensors(module, device_type, gradients=False)
    names = {id(p): n for n, p in module.named_parameters()}
    state: list[tuple[str, torch.Tensor]] = []
    if optimizer is not None:
        for param, entries in optimizer.state.items():
            state += [
                (f"{names.get(id(param), '<unnamed>')}.{key}", value)
                for key, value in entries.items()
                if isinstance(value, torch.Tensor) and key != "step"
            ]
    _raise_offenders("device_check_record", _offenders("optimizer state", state, device_type), device_type)
    tensors = [*module.parameters(), *module.buffers(), *(t for _, t in state)]
    return {
        "device_type": device_type,
        "devices": sorted({str(t.device) for t in tensors}),
        "dtypes": sorted({_dtype(t.dtype) for t in tensors}),
        "parameters": sum(1 for _ in module.parameters()),
        "buffers": sum(1 for _ in module.buffers()),
        "optimizer_state_tensors": len(state),
        "optimizer_step_counters": "not checked (torch keeps state['step'] on the CPU)",
        "passed": True,
    }


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def captured_fallback_operations() -> Iterator[list[str]]:
    """Observe fallback names without retaining unrelated long-fit warnings.

    Yields a list that receives, once each and in order of first sight, the operator names
    (e.g. ``"aten::foo"``) of MPS CPU-fallback warnings raised inside the context. Those
    warnings are consumed; every other warning is passed to the previous handler unchanged.
    ``torch.set_warn_always(True)`` is on inside (torch warns once per process otherwise)
    and restored after.
    """
    observed: list[str] = []
    previous_warn_always = torch.is_warn_always_enabled()
    with warnings.catch_warnings():
        previous_show = warnings.showwarning
        # Only the fallback message is forced to "always"; other warnings keep their filters.
        warnings.filterwarnings("always", message=_FALLBACK_FILTER)

        def _show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            match = _FALLBACK_MESSAGE.search(str(message))
            if match is None:
                previous_show(message, category, filename, lineno, file, line)
            elif match.group("op") not in observed:
                observed.append(match.group("op"))

        warnings.showwarning = _show
        torch.set_warn_always(True)
        try:
            yield observed
        finally:
            torch.set_warn_always(previous_warn_always)
