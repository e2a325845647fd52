"""Execution lanes of the QH launchers: the closed profile registry and runtime admission.

Owns: the closed registry of execution profiles (``cuda-amp``, ``mps-fp32``, ``cpu-fp32``,
``cpu-bf16``, ``cpu-fp32-darwin-arm64``), applying one profile's backend fields to a recipe, admitting the
real host/backend and returning immutable runtime evidence, the precision context, memory
accounting, and the digest of this module's bytes (``execution_policy_source``): this file
alone is the lane policy it seals.

Does not own: checking that live tensors obey a lane and observing MPS CPU fallbacks
(``qhlab.training.device_checks``), starting a Trainer (``qhlab.training.launcher``), W&B
attempt identity and publication (``qhlab.training.wandb_attempt``), cold-initialization
lineage (``qhlab.training.lineage``), the recipe's scientific fields
(``qhlab.finite_horizon.recipe``), or receipts, digests and errors (``qhlab.evidence``).
The public API ``qhlab.training.execution_profile`` re-exports these names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

# torch is imported inside the methods that touch a device: the lane registry and its names
# (`PROFILE_NAMES`, `execution_profile(name).apply`) load without it, for configs and the CLI.
from qhlab.evidence import MissingEvidenceError, QhError, QhInputError, input_error, require_int, sha256_file

__all__ = [
    "PROFILE_NAMES",
    "ProfileRefusedError",
    "QhExecutionProfile",
    "RuntimeEvidence",
    "execution_policy_source",
    "execution_profile",
]

# The versioned owner path of the lane policy; execution_policy_source() hashes this file's
# bytes, so W&B and lineage code can change without changing the recorded policy digest.
_POLICY_OWNER = "src/qhlab/training/profiles.py"
_POLICY_SCHEMA_VERSION = "1"

ACCELERATORS = ("cuda", "mps", "cpu")
_PRECISIONS = ("16-mixed", "bf16-mixed", "32-true")
# bf16 keeps float32's exponent range, so Lightning's bf16-mixed uses no GradScaler: no update is
# skipped for an inf/NaN gradient, and the observed updates equal the optimizer steps.
_BF16_SCALER = "none: bf16 keeps float32's exponent range, so no loss scaling and no skipped update"
_BACKEND_FIELDS = ("accelerator", "devices", "precision")
_ENVIRONMENT_KEYS = ("PYTORCH_ENABLE_MPS_FALLBACK", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG")

if TYPE_CHECKING:
    from pydantic import BaseModel

_Config = TypeVar("_Config", bound="BaseModel")


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
            ("accelerator", self.accelerator, ACCELERATORS),
            ("device_type", self.device_type, ACCELERATORS),
            ("precision", self.precision, _PRECISIONS),
        ):
            if value not in allowed:
                raise input_error(
                    call,
                    field,
                    value,
                    ", ".join(allowed),
                    "profiles are a closed, reviewed registry (execution_profile(name)).",
                )
        for field in ("name", "expected_system", "expected_machine"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise input_error(call, field, value, "a non-empty string", "name the profile and its host.")
        ops = self.allowed_cpu_fallback_operations
        if isinstance(ops, str) or not all(isinstance(o, str) and o.startswith("aten::") for o in ops):
            raise input_error(
                call,
                "allowed_cpu_fallback_operations",
                ops,
                "a tuple of reviewed operator names like 'aten::foo'",
                "keep it empty unless reviewed.",
            )
        object.__setattr__(self, "allowed_cpu_fallback_operations", tuple(ops))
        # A lane's parts must agree: Lightning places tensors by accelerator while the checks
        # read device_type, and the MPS lane is commissioned in FP32 only.
        # (broken, field, allowed, hint): every rule a lane's parts must obey, checked in order.
        rules = (
            (
                self.device_type != self.accelerator,
                "device_type",
                f"{self.accelerator!r} (the accelerator)",
                "a single-device lane keeps its tensors on the accelerator it selects.",
            ),
            (
                self.precision == "bf16-mixed" and self.device_type != "cpu",
                "precision",
                f"'16-mixed' or '32-true' on a {self.device_type!r} lane",
                "bf16-mixed is the CPU bf16 lane's (cpu-bf16); CUDA mixed precision is 16-mixed.",
            ),
            (
                self.device_type == "mps" and self.precision != "32-true",
                "precision",
                "'32-true' on an mps lane",
                "the MPS lane is commissioned in FP32 only; mixed precision is the CUDA lane's.",
            ),
            (
                bool(self.allowed_cpu_fallback_operations) and self.device_type != "mps",
                "allowed_cpu_fallback_operations",
                f"() on a {self.device_type!r} lane",
                "only MPS operators fall back to the CPU.",
            ),
        )
        for broken, field, allowed, hint in rules:
            if broken:
                raise input_error(call, field, getattr(self, field), allowed, hint)

    # -- recipe -----------------------------------------------------------------------------

    def apply(self, config: _Config) -> _Config:
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
            raise input_error(
                call,
                "config",
                type(config).__name__,
                f"a pydantic model with fields {', '.join(_BACKEND_FIELDS)}",
                "pass the loaded recipe (QhRecipe).",
            )
        missing = [f for f in _BACKEND_FIELDS if f not in model_fields]
        if missing:
            raise input_error(
                call,
                "config",
                type(config).__name__,
                f"a recipe with top-level fields {', '.join(_BACKEND_FIELDS)}",
                f"it lacks backend field(s) {', '.join(missing)}; backend fields live at the recipe's top level.",
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
        if self.precision == "bf16-mixed":
            return f"{host} with native CPU bf16 (AVX512-BF16 or AMX)"
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
        import torch

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
            if self.precision == "bf16-mixed":
                native = {
                    "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
                    "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
                }
                capability = torch.backends.cpu.get_cpu_capability()
                if not any(native.values()):
                    # Without them torch still computes bf16, emulated and slowly: not a lane.
                    raise self._refuse(
                        needs,
                        f"has CPU capability {capability} without AVX512-BF16 or AMX",
                        "use cpu-fp32 here; cpu-bf16 needs e.g. an Intel Xeon of the Sapphire Rapids "
                        "generation or later, or an AMD Zen 4.",
                    )
                device.update(cpu_capability=capability, **native, autocast_dtype="bfloat16", grad_scaler=_BF16_SCALER)
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

        ``16-mixed`` -> ``torch.autocast(device_type, dtype=torch.float16)`` and ``bf16-mixed``
        -> ``torch.autocast("cpu", dtype=torch.bfloat16)`` (what Lightning's MixedPrecision
        plugin enters); ``32-true`` -> ``contextlib.nullcontext()``.
        """
        import torch

        if self.precision == "16-mixed":
            return torch.autocast(device_type=self.device_type, dtype=torch.float16)
        if self.precision == "bf16-mixed":
            return torch.autocast(device_type=self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def check_memory_ceiling(self, max_allocated_bytes: int | None) -> int | None:
        """Return ``max_allocated_bytes`` (bytes or None); refuse a ceiling this lane cannot enforce.

        Only CUDA enforces a per-process cap; on CPU and MPS a declared ceiling would be
        recorded yet never applied, so fits and studies call this before writing anything.
        (Commissioning's MPS live-tensor guard is a separate, sampled budget.)

        Raises:
            QhInputError: not None or an int >= 1, declared on a lane other than CUDA, or above
                the CUDA device's memory (checked where the lane was admitted).
        """
        if max_allocated_bytes is None:
            return None
        call = f"execution_profile({self.name!r})"
        _require_cap(call, max_allocated_bytes)
        if self.device_type != "cuda":
            raise input_error(
                call,
                "max_allocated_bytes",
                max_allocated_bytes,
                f"None on a {self.device_type!r} lane (only CUDA lanes enforce a ceiling)",
                "drop max_allocated_bytes, or run on a CUDA lane such as cuda-amp.",
            )
        import torch

        if torch.cuda.is_available():
            _require_within_device(call, max_allocated_bytes, int(torch.cuda.get_device_properties(0).total_memory))
        return max_allocated_bytes

    def prepare_memory_accounting(self, max_allocated_bytes: int | None) -> dict[str, Any]:
        """Apply the historical CUDA cap or reset available MPS counters.

        Args:
            max_allocated_bytes: The allocation cap in bytes (int > 0), or None for no cap.
                Enforced only on CUDA (``set_per_process_memory_fraction(max / total)``).

        Returns:
            JSON-able record of what was done: ``cap_enforced``, counters reset, and why not.
        """
        import torch

        call = f"execution_profile({self.name!r}).prepare_memory_accounting"
        if max_allocated_bytes is not None:
            _require_cap(call, max_allocated_bytes)
        record: dict[str, Any] = {
            "profile": self.name,
            "backend": self.device_type,
            "requested_max_allocated_bytes": max_allocated_bytes,
        }
        if self.device_type == "cuda":
            self._require_backend(call)
            total = int(torch.cuda.get_device_properties(0).total_memory)
            if max_allocated_bytes is not None:
                _require_within_device(call, max_allocated_bytes, total)
                fraction = max_allocated_bytes / total
                torch.cuda.set_per_process_memory_fraction(fraction, 0)
                record.update(cap_enforced=True, memory_fraction=fraction)
            else:
                # The fraction is process-wide: an earlier capped fit in this process must not cap this one.
                torch.cuda.set_per_process_memory_fraction(1.0, 0)
                record.update(cap_enforced=False, memory_fraction=1.0, reason="no cap requested")
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
        import torch

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
        import torch

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
            # bf16 autocast forward, float32 master weights, gradients and AdamW moments.
            QhExecutionProfile("cpu-bf16", "cpu", "cpu", "bf16-mixed", "Linux", "x86_64"),
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
        raise input_error(
            "execution_profile",
            "name",
            name,
            ", ".join(PROFILE_NAMES),
            "`qhlab profiles` shows which lanes this host admits.",
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
        ``{"owner": "src/qhlab/training/profiles.py", "sha256": <hex of the lane-policy
        module's bytes>, "schema_version": "1"}``. Only the lane policy is hashed: W&B
        attempts and cold-init lineage live in other modules and do not change this digest.
        Historical protocols retain their script-byte fields and are verified at their
        historical root.

    Raises:
        MissingEvidenceError: ``source_root`` has no file at the owner path.
    """
    if source_root is None:
        path = Path(__file__)
    else:
        path = Path(source_root) / _POLICY_OWNER
        if not path.is_file():
            raise input_error(
                "execution_policy_source",
                "source_root",
                str(source_root),
                f"a repository root holding {_POLICY_OWNER!r}",
                "pass the repository root of the producer checkout.",
                error=MissingEvidenceError,
            )
    return {"owner": _POLICY_OWNER, "sha256": sha256_file(path), "schema_version": _POLICY_SCHEMA_VERSION}


def _require_within_device(call: str, max_allocated_bytes: int, total: int) -> None:
    if max_allocated_bytes > total:
        raise input_error(
            call, "max_allocated_bytes", max_allocated_bytes, f"at most the device's {total} bytes", "lower the cap."
        )


def _require_cap(call: str, max_allocated_bytes: Any) -> int:
    """A memory cap: an int >= 1 (bytes)."""
    return require_int(
        call,
        "max_allocated_bytes",
        max_allocated_bytes,
        minimum=1,
        hint="the historical lane's cap is a byte count; pass None for no cap.",
    )
