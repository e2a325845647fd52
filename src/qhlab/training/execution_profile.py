"""Execution and W&B-attempt policy for the QH research launchers (seed 000).

Owns: the closed registry of execution profiles (``cuda-amp``, ``mps-fp32``, ``cpu-fp32``,
``cpu-fp32-darwin-arm64``), applying one profile's backend fields to a recipe, admitting the
real host/backend and returning immutable runtime evidence, the precision context, memory
accounting, device/dtype assertions, MPS CPU-fallback observation, the digest of this policy
module's bytes, W&B attempt identity (``WandbAttempt``), publishing/closing one attempt, and
authenticating a cold-initialization lineage.

Does not own: starting a Trainer or creating a W&B run (the launcher does), the recipe's
scientific fields (``qhlab.finite_horizon.recipe``), receipts, digests, write-once files and
locks (``qhlab.evidence``), or the tensor file format (``qhlab.training.tensor_state``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import math
import os
import platform
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from qhlab.evidence import (
    DigestMismatchError,
    EvidenceError,
    MissingEvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    SchemaMismatchError,
    exclusive_lock,
    read_receipt,
    safe_component,
    sha256_file,
    write_receipt,
)
from qhlab.training.tensor_state import (
    COLD_INIT_KIND,
    COLD_INIT_RECEIPT,
    COLD_INIT_SCHEMA_VERSION,
    COLD_INIT_STATE,
    load_tensor_state,
    normalize_seed,
    normalize_source_package_digest,
    structure_path,
)

__all__ = [
    "ColdInitializationLineage",
    "PROFILE_NAMES",
    "ProfileRefusedError",
    "QhExecutionProfile",
    "RuntimeEvidence",
    "WandbAttempt",
    "assert_device_tensors",
    "captured_fallback_operations",
    "execution_policy_source",
    "execution_profile",
    "publish_wandb_attempt",
    "verified_cold_initialization_lineage",
]

# The versioned owner path of this policy; execution_policy_source() hashes these bytes.
_POLICY_OWNER = "src/qhlab/training/execution_profile.py"
_POLICY_SCHEMA_VERSION = "1"
_WANDB_RECEIPT_KIND = "wandb_attempt"
_WANDB_RECEIPT_SCHEMA_VERSION = 1

_ACCELERATORS = ("cuda", "mps", "cpu")
_PRECISIONS = ("16-mixed", "32-true")
_BACKEND_FIELDS = ("accelerator", "devices", "precision")
_ENVIRONMENT_KEYS = ("PYTORCH_ENABLE_MPS_FALLBACK", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG")
_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FALLBACK_MESSAGE = re.compile(
    r"The operator '(?P<op>[^']+)' is not currently supported on the MPS backend and will fall "
    r"back to run on the CPU"
)
_FALLBACK_FILTER = r"The operator '[^']+' is not currently supported on the MPS backend"
_WANDB_RESERVED_KEYS = ("id", "version", "resume", "mode", "group", "offline")


class ProfileRefusedError(QhInputError):
    """This host cannot run the requested profile; ``needs`` and ``actual`` are short phrases."""

    def __init__(self, message: str, *, needs: str, actual: str) -> None:
        super().__init__(message)
        self.needs = needs
        self.actual = actual


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class RuntimeEvidence:
    """Immutable record of one admitted runtime (returned by ``admit_runtime``).

    Nested mappings are read-only ``MappingProxyType``; ``as_dict()`` returns plain JSON values.
    """

    profile: str
    accelerator: str
    device_type: str
    precision: str
    allowed_cpu_fallback_operations: tuple[str, ...]
    versions: Mapping[str, str]
    host: Mapping[str, str]
    device: Mapping[str, Any]
    float32_matmul_precision: str
    environment: Mapping[str, str | None]
    execution_policy_source: Mapping[str, str]

    def as_dict(self) -> dict[str, Any]:
        """Return the evidence as plain, JSON-able dicts and lists."""
        return {f.name: _thaw(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class QhExecutionProfile:
    """One admitted single-device training backend and precision policy.

    Attributes:
        name: Stable profile identity persisted in protocol and attempt evidence.
        accelerator: Lightning accelerator selector.
        device_type: Torch device type required for model parameters, batches and gradients.
        precision: Lightning precision policy; the Mac lane is strictly FP32.
        expected_system: Operating system admitted for this profile (``platform.system()``).
        expected_machine: Host architecture admitted for this profile (``platform.machine()``).
        allowed_cpu_fallback_operations: Reviewed MPS operations (``aten::...``) allowed to
            execute on CPU. While it is empty, ``PYTORCH_ENABLE_MPS_FALLBACK=1`` is refused.
    """

    name: str
    accelerator: str
    device_type: str
    precision: str
    expected_system: str
    expected_machine: str
    allowed_cpu_fallback_operations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        call = "QhExecutionProfile"
        for field, value, allowed in (
            ("accelerator", self.accelerator, _ACCELERATORS),
            ("device_type", self.device_type, _ACCELERATORS),
            ("precision", self.precision, _PRECISIONS),
        ):
            if value not in allowed:
                raise QhInputError(
                    f"{call}: {field}={value!r} is not allowed; allowed: {', '.join(allowed)}. "
                    "HINT: profiles are a closed, reviewed registry (execution_profile(name))."
                )
        for field in ("name", "expected_system", "expected_machine"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise QhInputError(f"{call}: {field}={value!r} is not allowed; allowed: a non-empty string.")
        ops = self.allowed_cpu_fallback_operations
        if isinstance(ops, str) or not all(isinstance(o, str) and o.startswith("aten::") for o in ops):
            raise QhInputError(
                f"{call}: allowed_cpu_fallback_operations={ops!r} is not allowed; allowed: a tuple "
                "of reviewed operator names like 'aten::foo'. HINT: keep it empty unless reviewed."
            )
        object.__setattr__(self, "allowed_cpu_fallback_operations", tuple(ops))

    # -- recipe -----------------------------------------------------------------------------

    def apply(self, config):
        """Return the recipe with only backend and precision fields changed.

        Args:
            config: A frozen pydantic model with top-level fields ``accelerator``, ``devices``
                and ``precision`` (e.g. ``QhRecipe``).

        Returns:
            A new, re-validated instance of ``type(config)`` with ``accelerator``,
            ``devices=1`` and ``precision`` taken from this profile; every other field is
            the same object as before.

        Raises:
            QhInputError: ``config`` is not a pydantic model with the three backend fields,
                or the model refuses the profile's values.
        """
        call = f"execution_profile({self.name!r}).apply"
        model_fields = getattr(type(config), "model_fields", None)
        if not isinstance(model_fields, Mapping) or not hasattr(config, "model_dump"):
            raise QhInputError(
                f"{call}: config={type(config).__name__} is not allowed; allowed: a pydantic model "
                f"with fields {', '.join(_BACKEND_FIELDS)}. HINT: pass the loaded recipe (QhRecipe)."
            )
        missing = [f for f in _BACKEND_FIELDS if f not in model_fields]
        if missing:
            raise QhInputError(
                f"{call}: config={type(config).__name__} lacks backend field(s) {', '.join(missing)}; "
                f"allowed: a recipe with top-level fields {', '.join(_BACKEND_FIELDS)}. "
                "HINT: backend fields live at the recipe's top level."
            )
        update = {"accelerator": self.accelerator, "devices": 1, "precision": self.precision}
        # Field values (not a dump) keep nested models intact; validation runs the model's
        # own validators on the whole new recipe.
        data = {name: getattr(config, name) for name in model_fields}
        data.update(update)
        try:
            applied = type(config).model_validate(data, by_name=True)
        except ValueError as exc:
            raise QhInputError(
                f"{call}: the recipe refuses backend fields {update}: {exc}. HINT: the recipe's "
                "backend field types must admit this profile's values."
            ) from exc
        changed = [n for n in model_fields if n not in _BACKEND_FIELDS and getattr(applied, n) != getattr(config, n)]
        if changed:
            raise QhError(
                f"{call}: re-validation changed scientific field(s) {', '.join(changed)}; a profile "
                "may change only backend fields. HINT: a recipe validator depends on the backend."
            )
        return applied

    # -- admission --------------------------------------------------------------------------

    def _refuse(self, needs: str, actual: str, hint: str) -> ProfileRefusedError:
        return ProfileRefusedError(
            f"execution_profile({self.name!r}).admit_runtime: expected {needs}; actual: this host "
            f"{actual}. HINT: {hint}",
            needs=needs,
            actual=actual,
        )

    def _needs(self) -> str:
        host = f"{self.expected_system} {self.expected_machine}"
        if self.device_type == "cuda":
            return f"{host} with a CUDA device"
        if self.device_type == "mps":
            return f"{host} with an MPS device"
        return host

    def admit_runtime(self) -> RuntimeEvidence:
        """Validate the real host/backend and return immutable runtime evidence.

        Checks ``platform.system()``/``platform.machine()``, that the backend is available
        (CUDA: ``torch.cuda.is_available()`` and a device; MPS:
        ``torch.backends.mps.is_available()``), and the MPS fallback rule:
        ``PYTORCH_ENABLE_MPS_FALLBACK=1`` is refused while ``allowed_cpu_fallback_operations``
        is empty (an unsupported op would then silently run on the CPU instead of failing).

        Returns:
            RuntimeEvidence with profile, versions (python, torch, lightning), host (system,
            machine, SHA-256 of the node name), device (name, capability), precision,
            ``torch.get_float32_matmul_precision()``, the relevant environment and
            ``execution_policy_source()``.

        Raises:
            ProfileRefusedError: host, backend or environment differ; names expected and actual.
        """
        system, machine = platform.system(), platform.machine()
        needs = self._needs()
        if (system, machine) != (self.expected_system, self.expected_machine):
            raise self._refuse(needs, f"is {system} {machine}", "choose a profile for this host (`qhlab profiles`).")
        environment = {key: os.environ.get(key) for key in _ENVIRONMENT_KEYS}
        device: dict[str, Any]
        if self.device_type == "cuda":
            if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
                built = "a CPU-only torch build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build"
                raise self._refuse(
                    needs,
                    "has no CUDA device",
                    f"torch is {built}; install a CUDA torch 2.13 build on a CUDA host or use cpu-fp32.",
                )
            props = torch.cuda.get_device_properties(0)
            device = {
                "name": torch.cuda.get_device_name(0),
                "capability": list(torch.cuda.get_device_capability(0)),
                "total_memory_bytes": int(props.total_memory),
                "torch_cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
            }
        elif self.device_type == "mps":
            if not torch.backends.mps.is_available():
                built = "built with MPS" if torch.backends.mps.is_built() else "built without MPS"
                raise self._refuse(needs, "has no MPS device", f"torch is {built}; use an Apple-silicon Mac.")
            if environment["PYTORCH_ENABLE_MPS_FALLBACK"] == "1" and not self.allowed_cpu_fallback_operations:
                raise self._refuse(
                    f"{needs} and PYTORCH_ENABLE_MPS_FALLBACK unset or not '1'",
                    "sets PYTORCH_ENABLE_MPS_FALLBACK='1' with no reviewed fallback operations",
                    "unset PYTORCH_ENABLE_MPS_FALLBACK; the reviewed fallback list is empty.",
                )
            device = {
                "name": f"Apple MPS ({platform.processor() or machine})",
                "capability": None,
                "recommended_max_memory_bytes": int(torch.mps.recommended_max_memory()),
            }
        else:
            device = {"name": _cpu_name(), "capability": None, "torch_threads": torch.get_num_threads()}
        return RuntimeEvidence(
            profile=self.name,
            accelerator=self.accelerator,
            device_type=self.device_type,
            precision=self.precision,
            allowed_cpu_fallback_operations=self.allowed_cpu_fallback_operations,
            versions=_freeze(
                {
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "lightning": _distribution_version("lightning"),
                }
            ),
            host=_freeze(
                {
                    "system": system,
                    "machine": machine,
                    "node_sha256": hashlib.sha256(platform.node().encode()).hexdigest(),
                }
            ),
            device=_freeze(device),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            environment=_freeze(environment),
            execution_policy_source=_freeze(execution_policy_source()),
        )

    # -- precision and memory ---------------------------------------------------------------

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """Return the preflight precision context matching Lightning training.

        ``16-mixed`` -> ``torch.autocast(device_type, dtype=torch.float16)`` (what Lightning's
        MixedPrecision plugin enters); ``32-true`` -> ``contextlib.nullcontext()``.
        """
        if self.precision == "16-mixed":
            return torch.autocast(device_type=self.device_type, dtype=torch.float16)
        return contextlib.nullcontext()

    def prepare_memory_accounting(self, max_allocated_bytes: int | None) -> dict[str, Any]:
        """Apply the historical CUDA cap or reset available MPS counters.

        Args:
            max_allocated_bytes: The allocation cap in bytes (int > 0), or None for no cap.
                Enforced only on CUDA (``set_per_process_memory_fraction(max / total)``).

        Returns:
            JSON-able record of what was done: ``cap_enforced``, counters reset, and why not.
        """
        call = f"execution_profile({self.name!r}).prepare_memory_accounting"
        if max_allocated_bytes is not None and (
            isinstance(max_allocated_bytes, bool) or not isinstance(max_allocated_bytes, int) or max_allocated_bytes <= 0
        ):
            raise QhInputError(
                f"{call}: max_allocated_bytes={max_allocated_bytes!r} is not allowed; allowed: an int > 0 "
                "or None. HINT: the historical lane's cap is a byte count."
            )
        record: dict[str, Any] = {
            "profile": self.name,
            "backend": self.device_type,
            "requested_max_allocated_bytes": max_allocated_bytes,
        }
        if self.device_type == "cuda":
            self._require_backend(call)
            total = int(torch.cuda.get_device_properties(0).total_memory)
            if max_allocated_bytes is not None:
                if max_allocated_bytes > total:
                    raise QhInputError(
                        f"{call}: max_allocated_bytes={max_allocated_bytes} is not allowed; allowed: at most "
                        f"the device's {total} bytes. HINT: lower the cap."
                    )
                fraction = max_allocated_bytes / total
                torch.cuda.set_per_process_memory_fraction(fraction, 0)
                record.update(cap_enforced=True, memory_fraction=fraction)
            else:
                record.update(cap_enforced=False, reason="no cap requested")
            torch.cuda.reset_peak_memory_stats(0)
            record.update(total_memory_bytes=total, peak_stats_reset=True)
        elif self.device_type == "mps":
            self._require_backend(call)
            torch.mps.synchronize()
            # empty_cache returns cached blocks to the driver; it is not a counter reset.
            torch.mps.empty_cache()
            record.update(
                cap_enforced=False,
                peak_stats_reset=False,
                cache_emptied=True,
                reason="MPS exposes no peak counters; memory_evidence reports current values",
                baseline_current_allocated_bytes=int(torch.mps.current_allocated_memory()),
                baseline_driver_allocated_bytes=int(torch.mps.driver_allocated_memory()),
            )
        else:
            record.update(
                cap_enforced=False,
                peak_stats_reset=False,
                reason="no per-process allocation cap is enforced on CPU; ru_maxrss cannot be reset",
            )
        return record

    def memory_evidence(self) -> dict[str, int]:
        """Return backend-native allocation evidence without equating semantics.

        Returns:
            CUDA: ``peak_allocated_bytes``, ``peak_reserved_bytes`` (since the last reset);
            MPS: ``current_allocated_bytes``, ``driver_allocated_bytes`` (now);
            CPU: ``max_rss_bytes`` (process lifetime, ``resource.getrusage``).
        """
        call = f"execution_profile({self.name!r}).memory_evidence"
        if self.device_type == "cuda":
            self._require_backend(call)
            return {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(0)),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(0)),
            }
        if self.device_type == "mps":
            self._require_backend(call)
            return {
                "current_allocated_bytes": int(torch.mps.current_allocated_memory()),
                "driver_allocated_bytes": int(torch.mps.driver_allocated_memory()),
            }
        import resource

        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes.
        return {"max_rss_bytes": int(max_rss) if sys.platform == "darwin" else int(max_rss) * 1024}

    def _require_backend(self, call: str) -> None:
        available = torch.cuda.is_available() if self.device_type == "cuda" else torch.backends.mps.is_available()
        if not available:
            raise QhError(
                f"{call}: the {self.device_type} backend is not available on this host. "
                "HINT: call admit_runtime() first."
            )


_REGISTRY: Mapping[str, QhExecutionProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            QhExecutionProfile("cuda-amp", "cuda", "cuda", "16-mixed", "Linux", "x86_64"),
            # Reviewed and initially empty: no MPS operation may fall back to the CPU.
            QhExecutionProfile("mps-fp32", "mps", "mps", "32-true", "Darwin", "arm64", ()),
            QhExecutionProfile("cpu-fp32", "cpu", "cpu", "32-true", "Linux", "x86_64"),
            QhExecutionProfile("cpu-fp32-darwin-arm64", "cpu", "cpu", "32-true", "Darwin", "arm64"),
        )
    }
)
PROFILE_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def execution_profile(name: str) -> QhExecutionProfile:
    """Resolve one closed, reviewable training execution profile.

    Raises:
        QhInputError: ``name`` is not one of ``PROFILE_NAMES``; the message lists them.
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise QhInputError(
            f"execution_profile: name={name!r} is not allowed; allowed: {', '.join(PROFILE_NAMES)}. "
            "HINT: `qhlab profiles` shows which lanes this host admits."
        )
    return _REGISTRY[name]


def _cpu_name() -> str:
    # platform.processor() is just "x86_64" on Linux; /proc/cpuinfo names the model.
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def execution_policy_source(source_root: Path | None = None) -> dict[str, str]:
    """Bind current package policy bytes to their explicitly named source owner.

    Args:
        source_root: Repository root of a separately authenticated producer; omitted when
            sealing the imported package implementation.

    Returns:
        ``{"owner": "src/qhlab/training/execution_profile.py", "sha256": <hex of the
        module's bytes>, "schema_version": "1"}``.

    Raises:
        MissingEvidenceError: ``source_root`` has no file at the owner path.
    """
    if source_root is None:
        path = Path(__file__)
    else:
        path = Path(source_root) / _POLICY_OWNER
        if not path.is_file():
            raise MissingEvidenceError(
                f"execution_policy_source: source_root={str(source_root)!r} has no file {_POLICY_OWNER!r}. "
                "HINT: pass the repository root of the producer checkout."
            )
    return {"owner": _POLICY_OWNER, "sha256": sha256_file(path), "schema_version": _POLICY_SCHEMA_VERSION}


# -- device and fallback checks --------------------------------------------------------------


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
    if not isinstance(module, torch.nn.Module):
        raise QhInputError(f"{call}: module={type(module).__name__} is not allowed; allowed: torch.nn.Module.")
    if device_type not in _ACCELERATORS:
        raise QhInputError(f"{call}: device_type={device_type!r} is not allowed; allowed: {', '.join(_ACCELERATORS)}.")
    if not isinstance(gradients, bool):
        raise QhInputError(f"{call}: gradients={gradients!r} is not allowed; allowed: True or False.")
    offenders: list[str] = []

    def _check(kind: str, name: str, tensor: torch.Tensor) -> None:
        wrong_device = tensor.device.type != device_type
        wrong_dtype = tensor.dtype != torch.float32 and (tensor.is_floating_point() or tensor.is_complex())
        if wrong_device or wrong_dtype:
            offenders.append(f"{kind} {name}: dtype={_dtype(tensor.dtype)} device={tensor.device}")

    parameters = list(module.named_parameters())
    buffers = list(module.named_buffers())
    if not parameters and not buffers:
        raise QhInputError(f"{call}: module={type(module).__name__} has no parameters or buffers; nothing to verify.")
    for name, param in parameters:
        _check("parameter", name, param)
    for name, buffer in buffers:
        _check("buffer", name, buffer)
    if gradients:
        for name, param in parameters:
            if not param.requires_grad:
                continue
            if param.grad is None:
                offenders.append(f"gradient {name}: missing")
            else:
                _check("gradient", name, param.grad)
    if offenders:
        raise QhError(
            f"{call}: {len(offenders)} tensor(s) are not float32 on {device_type!r}: "
            + "; ".join(offenders)
            + ". HINT: the profile requires every parameter, buffer and gradient on the device in FP32."
        )


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

        def _show(message, category, filename, lineno, file=None, line=None):
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


# -- W&B attempts ----------------------------------------------------------------------------


def _check_id(field: str, value: Any) -> None:
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise QhInputError(
            f"WandbAttempt: {field}={value!r} is not allowed; allowed: 1 to 64 characters from "
            "[A-Za-z0-9_-]. HINT: W&B run ids and local directory names share this charset."
        )


@dataclasses.dataclass(frozen=True)
class WandbAttempt:
    """Explicit W&B identity for one immutable training attempt or segment.

    Attributes:
        run_id: Fresh online run, required online resume id, or unique offline segment id.
        resume: Require an existing online run with exactly run_id.
        offline: Write a locally recoverable segment without claiming cloud publication.
            wandb ignores ``resume`` offline, so every offline segment is a new run, linked
            to its siblings by ``logical_run_id`` (the W&B group).
        logical_run_id: Stable experiment identity linking multiple offline segments
            (defaults to ``run_id``).
        local_attempt_id: Unique immutable local segment; required when resuming an online
            run (and then different from ``run_id``, which names the original attempt).
    """

    run_id: str
    resume: bool = False
    offline: bool = False
    logical_run_id: str | None = None
    local_attempt_id: str | None = None

    def __post_init__(self) -> None:
        _check_id("run_id", self.run_id)
        for field in ("resume", "offline"):
            if not isinstance(getattr(self, field), bool):
                raise QhInputError(
                    f"WandbAttempt: {field}={getattr(self, field)!r} is not allowed; allowed: True or False."
                )
        if self.resume and self.offline:
            raise QhInputError(
                "WandbAttempt: resume=True with offline=True is not allowed; allowed: resume (online) or "
                "offline, not both. HINT: wandb ignores resume offline; start a new offline segment with "
                "its own run_id and the same logical_run_id."
            )
        if self.logical_run_id is not None:
            _check_id("logical_run_id", self.logical_run_id)
        else:
            object.__setattr__(self, "logical_run_id", self.run_id)
        if self.local_attempt_id is not None:
            _check_id("local_attempt_id", self.local_attempt_id)
        if self.resume and self.local_attempt_id is None:
            raise QhInputError(
                "WandbAttempt: local_attempt_id=None is not allowed when resume=True; allowed: a new "
                "unique id. HINT: the resumed segment publishes into its own local directory."
            )
        if self.resume and self.local_attempt_id == self.run_id:
            raise QhInputError(
                f"WandbAttempt: local_attempt_id={self.local_attempt_id!r} is not allowed when resuming; "
                "allowed: an id different from run_id, which names the original attempt's directory."
            )

    @property
    def resolved_local_attempt_id(self) -> str:
        """Return the immutable local segment id for filesystem publication."""
        return self.local_attempt_id or self.run_id

    @property
    def mode(self) -> str:
        """``"offline"`` or ``"online"``."""
        return "offline" if self.offline else "online"

    def apply(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Return a config with explicit new/resume/segment W&B identity.

        Args:
            config: ``WandbLogger``/``wandb.init`` keyword arguments (project, name, tags, ...).
                It may not set identity keys (id, version, resume, mode, group, offline).

        Returns:
            A new dict: ``config`` plus ``id=run_id``, ``resume="must"|"never"``,
            ``mode="online"|"offline"``, ``group=logical_run_id``.
        """
        if not isinstance(config, Mapping):
            raise QhInputError(
                f"WandbAttempt.apply: config={type(config).__name__} is not allowed; allowed: a mapping "
                "of WandbLogger keyword arguments."
            )
        reserved = [key for key in _WANDB_RESERVED_KEYS if key in config]
        if reserved:
            raise QhInputError(
                f"WandbAttempt.apply: config key(s) {reserved} are not allowed; allowed: keys other than "
                f"{', '.join(_WANDB_RESERVED_KEYS)}. HINT: the attempt alone sets W&B identity."
            )
        applied = dict(config)
        applied.update(
            id=self.run_id,
            resume="must" if self.resume else "never",
            mode=self.mode,
            group=self.logical_run_id,
        )
        return applied

    def evidence(self) -> dict[str, Any]:
        """Describe intended W&B behavior without creating a remote run."""
        if self.offline:
            role = "offline segment (a new local run; wandb ignores resume offline)"
            publication = "not published (offline segment)"
        elif self.resume:
            role = "online resume of an existing run (resume='must')"
            publication = "online run (publication recorded by publish_wandb_attempt)"
        else:
            role = "new online run (resume='never')"
            publication = "online run (publication recorded by publish_wandb_attempt)"
        return {
            "run_id": self.run_id,
            "logical_run_id": self.logical_run_id,
            "local_attempt_id": self.resolved_local_attempt_id,
            "mode": self.mode,
            "resume": "must" if self.resume else "never",
            "role": role,
            "cloud_publication": publication,
            "links": {"logical_run_id": self.logical_run_id, "wandb_group": self.logical_run_id},
        }

    def output_directory(self, output_root: Path, cell: str) -> Path:
        """Resolve a fresh local publication directory independent of W&B resume id.

        Returns ``output_root / cell / resolved_local_attempt_id`` without creating it.

        Raises:
            QhInputError: ``cell`` is not one safe path component (``safe_component``).
            PublishConflictError: the directory already exists.
        """
        safe_component(cell, field="cell", call="WandbAttempt.output_directory")
        directory = Path(output_root) / cell / self.resolved_local_attempt_id
        if directory.exists() or directory.is_symlink():
            raise PublishConflictError(
                f"WandbAttempt.output_directory: path={str(directory)!r} already exists; allowed: a fresh "
                f"directory per local attempt. HINT: use a new local_attempt_id (now "
                f"{self.resolved_local_attempt_id!r})."
            )
        return directory

    @contextlib.contextmanager
    def local_writer_lock(self, output_root: Path) -> Iterator[Path]:
        """Hold one nonblocking host-local writer lock for the logical run.

        The lock file is ``output_root/.locks/<logical_run_id>.lock`` (an ``fcntl.flock``
        through ``qhlab.evidence.exclusive_lock``). Yields the lock path.

        Raises:
            LockHeldError: another process holds it; the message names the lock file.
        """
        lock_path = Path(output_root) / ".locks" / f"{self.logical_run_id}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(lock_path):
            yield lock_path


def _finite_metrics(metrics: Any) -> dict[str, float]:
    call = "publish_wandb_attempt"
    if not isinstance(metrics, Mapping):
        raise QhInputError(f"{call}: metrics={type(metrics).__name__} is not allowed; allowed: a mapping name -> number.")
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise QhInputError(f"{call}: metric name {key!r} is not allowed; allowed: a non-empty string.")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise QhInputError(
                f"{call}: metrics[{key!r}]={value!r} is not allowed; allowed: a finite number. "
                "HINT: a diverged fit is reported as a failure, not published."
            )
        clean[key] = float(value)
    return clean


def publish_wandb_attempt(
    attempt: WandbAttempt,
    result_path: Path,
    files: Mapping[str, Path],
    metrics: Mapping[str, float],
) -> dict[str, Any]:
    """Publish online evidence or close one explicitly linked offline segment.

    Online: the active ``wandb.run`` (its id must be ``attempt.run_id`` and it must be
    online) gets ``metrics`` in its summary and one artifact holding ``files``. Offline: a
    closing segment record (files with digests, metrics, links) that states it was not
    published to the cloud; an active offline run with the same id also gets the summary.
    Both write a ``kind="wandb_attempt"`` receipt at ``result_path`` binding the files.

    Args:
        attempt: The attempt identity.
        result_path: New ``*.receipt.json`` path.
        files: Name -> existing file path.
        metrics: Name -> finite number.

    Returns:
        The receipt body.
    """
    call = "publish_wandb_attempt"
    if not isinstance(attempt, WandbAttempt):
        raise QhInputError(f"{call}: attempt={type(attempt).__name__} is not allowed; allowed: WandbAttempt.")
    result_path = Path(result_path)
    if not result_path.name.endswith(".receipt.json"):
        raise QhInputError(
            f"{call}: result_path={str(result_path)!r} is not allowed; allowed: a name ending in "
            "'.receipt.json'. HINT: `qhlab verify` authenticates *.receipt.json files."
        )
    if result_path.exists():
        raise PublishConflictError(
            f"{call}: result_path={str(result_path)!r} already exists; allowed: a new path (write-once)."
        )
    if not isinstance(files, Mapping) or not files:
        raise QhInputError(f"{call}: files={files!r} is not allowed; allowed: a non-empty mapping name -> file path.")
    paths: dict[str, Path] = {}
    for name, path in files.items():
        safe_component(name, field="files key", call=call)
        if not Path(path).is_file():
            raise MissingEvidenceError(f"{call}: files[{name!r}]={str(path)!r} does not exist or is not a file.")
        paths[name] = Path(path)
    clean_metrics = _finite_metrics(metrics)
    digests = {name: sha256_file(path) for name, path in paths.items()}

    import wandb

    run = wandb.run
    if run is not None and run.id != attempt.run_id:
        raise QhInputError(
            f"{call}: the active wandb run id={run.id!r} is not allowed; allowed: attempt.run_id="
            f"{attempt.run_id!r}. HINT: publish from the process that owns this attempt's run."
        )
    if attempt.offline:
        local_run = None
        if run is not None:
            if not run.offline:
                raise QhInputError(f"{call}: the active wandb run {run.id!r} is online but attempt.offline=True.")
            run.summary.update(clean_metrics)
            local_run = {"id": run.id, "dir": str(run.dir)}
        publication: dict[str, Any] = {
            "status": "closed offline segment",
            "cloud_publication": "not published (offline segment)",
            "local_wandb_run": local_run,
            "sync_note": "`wandb sync` may upload it later as a new run in group logical_run_id",
        }
    else:
        if run is None:
            raise QhError(
                f"{call}: no active wandb run for online attempt run_id={attempt.run_id!r}. HINT: start it "
                "with WandbLogger(**attempt.apply(...)) and publish before wandb.finish()."
            )
        if run.offline:
            raise QhInputError(
                f"{call}: the active wandb run {run.id!r} is offline but attempt.offline=False. HINT: unset "
                "WANDB_MODE=offline or construct an offline attempt."
            )
        run.summary.update(clean_metrics)
        artifact_name = f"{attempt.logical_run_id}-{attempt.resolved_local_attempt_id}"
        artifact = wandb.Artifact(
            name=artifact_name,
            type="qhlab-attempt",
            metadata={"files_sha256": digests, "attempt": attempt.evidence()},
        )
        for name, path in paths.items():
            artifact.add_file(str(path), name=name)
        run.log_artifact(artifact)
        publication = {
            "status": "published online",
            "cloud_publication": "summary updated and artifact logged to the online run",
            "artifact": {"name": artifact_name, "type": "qhlab-attempt"},
            "run": {"id": run.id, "project": run.project, "entity": run.entity, "url": run.url},
        }
    body = {
        "attempt": attempt.evidence(),
        "files": digests,
        "metrics": clean_metrics,
        "links": {"logical_run_id": attempt.logical_run_id},
        "publication": publication,
    }
    write_receipt(
        result_path,
        kind=_WANDB_RECEIPT_KIND,
        schema_version=_WANDB_RECEIPT_SCHEMA_VERSION,
        body=body,
        inputs=paths,
        outputs=None,
    )
    return body


# -- cold initialization ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ColdInitializationLineage:
    """The authenticated cold state a (possibly resumed) fit lineage started from."""

    path: Path
    sha256: str
    seed: int
    source_package_digest: str
    receipt_path: Path


def verified_cold_initialization_lineage(path: Path, *, source_package_digest, seed: int) -> ColdInitializationLineage:
    """Verify the original cold-state artifact used by a resumed fit lineage.

    Args:
        path: ``cold_init.safetensors`` (or the directory holding it), written by
            ``qhlab.training.tensor_state.write_cold_initialization``.
        source_package_digest: Expected hex digest (or ``source_package_digest()`` dict).
        seed: Expected seed.

    Returns:
        The frozen lineage record.

    Raises:
        MissingEvidenceError: the state, structure or receipt file is missing.
        DigestMismatchError: a byte of the state or structure file changed.
        EvidenceError: the receipt records another seed or source digest, or another file.
    """
    call = "verified_cold_initialization_lineage"
    seed = normalize_seed(call, seed)
    expected_source = normalize_source_package_digest(call, source_package_digest)
    path = Path(path)
    if path.is_dir():
        path = path / COLD_INIT_STATE
    if path.name != COLD_INIT_STATE:
        raise QhInputError(
            f"{call}: path={str(path)!r} is not allowed; allowed: a {COLD_INIT_STATE!r} file or its directory."
        )
    receipt_path = path.parent / COLD_INIT_RECEIPT
    for target in (path, receipt_path):
        if not target.is_file():
            raise MissingEvidenceError(
                f"{call}: file {str(target)!r} does not exist. HINT: a cold-initialization artifact is "
                f"{COLD_INIT_STATE}, cold_init.json and {COLD_INIT_RECEIPT} in one directory."
            )
    receipt = read_receipt(receipt_path, kind=COLD_INIT_KIND, schema_version=COLD_INIT_SCHEMA_VERSION)
    body = receipt.get("body", {})
    outputs = receipt.get("outputs", {})
    if body.get("seed") != seed:
        raise EvidenceError(
            f"{call}: file {str(receipt_path)!r} records seed={body.get('seed')!r} but the lineage expects "
            f"seed={seed}. HINT: a resumed fit must reuse its original seed."
        )
    if body.get("source_package_digest") != expected_source:
        raise EvidenceError(
            f"{call}: file {str(receipt_path)!r} records source_package_digest={body.get('source_package_digest')!r} "
            f"but the lineage expects {expected_source}. HINT: the cold state was built by other source."
        )
    state_entry = outputs.get("state", {})
    if state_entry.get("path") != COLD_INIT_STATE or outputs.get("structure", {}).get("path") != structure_path(path).name:
        raise SchemaMismatchError(f"{call}: file {str(receipt_path)!r} does not bind {COLD_INIT_STATE} and cold_init.json.")
    digest = state_entry.get("sha256")
    if digest != body.get("state_sha256") or sha256_file(path) != digest:
        raise DigestMismatchError(f"{call}: file {str(path)!r} does not match the digest its receipt binds.")
    # Parse the state (safetensors, no pickle) so dtype/shape agree with cold_init.json.
    load_tensor_state(path, expected_sha256=digest)
    return ColdInitializationLineage(
        path=path, sha256=digest, seed=seed, source_package_digest=expected_source, receipt_path=receipt_path
    )
