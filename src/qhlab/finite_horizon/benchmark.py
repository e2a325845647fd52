"""Time a verified scorer on the canonical first TRAIN chain, without training it.

Owns: ``benchmark_scorer`` (synchronized forward timings, which parameter tensors a native H1
Huber backward reaches, hooked encoder/readout timings, memory evidence) for any finished
fit, the canonical first TRAIN chain it runs on (``canonical_first_chain``, also recorded by
the architecture study's freeze), and loading a fit's final state into a module strictly
(``load_final_module``). Does not own: fitting (``qhlab.finite_horizon.fit``), the lane's
policy (``qhlab.training.execution_profile``), or publishing a benchmark receipt (the study
does that for its cells). Torch is imported inside the functions so that importing this
module stays cheap.
"""

from __future__ import annotations

import os
import statistics as pystats
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qhlab.evidence import EvidenceError, QhError, input_error, read_receipt, sha256_file
from qhlab.evidence.layout import FINAL_STATE, FIT_RECEIPT
from qhlab.finite_horizon.recipe import validate_recipe
from qhlab.training.records import FitReceipt

if TYPE_CHECKING:
    from qhlab.finite_horizon.data import Population
    from qhlab.finite_horizon.fit import FitResult
    from qhlab.finite_horizon.q_learning import QhTDModule
    from qhlab.finite_horizon.recipe import QhRecipe

__all__ = ["TIMED_FORWARDS", "WARMUP_FORWARDS", "benchmark_scorer", "canonical_first_chain", "load_final_module"]

WARMUP_FORWARDS = 10
TIMED_FORWARDS = 20


def canonical_chains(population: Any) -> list[dict[str, Any]]:
    """Every chain in canonical order: by (scene_id, chain_id), each chain's rows in step order.

    Args:
        population: a ``Population`` (``is_chain``, ``scene_id``, ``chain_id``, ``step``: [S]).

    Returns:
        ``[{"scene_id": int, "chain_id": int, "rows": [int, ...]}, ...]`` (rows index S).
    """
    rows = np.flatnonzero(population.is_chain.numpy().astype(bool))
    scene = population.scene_id.numpy()[rows]
    chain = population.chain_id.numpy()[rows]
    step = population.step.numpy()[rows]
    order = np.lexsort((step, chain, scene))
    chains: dict[tuple[int, int], list[int]] = {}
    for i in order:
        chains.setdefault((int(scene[i]), int(chain[i])), []).append(int(rows[i]))
    return [{"scene_id": s, "chain_id": c, "rows": r} for (s, c), r in chains.items()]


def canonical_first_chain(population: Any) -> dict[str, Any]:
    """The rows of the chain with the smallest (scene_id, chain_id), in step order.

    Args:
        population: a ``Population`` (``is_chain``, ``scene_id``, ``chain_id``, ``step``: [S]).

    Returns:
        ``{"scene_id": int, "chain_id": int, "rows": [int, ...]}`` (rows index S).
    """
    return canonical_chains(population)[0]


def load_final_module(
    recipe: QhRecipe, population: Any, final_state: Path, expected_sha256: str | None = None
) -> QhTDModule:
    """The module (online + target, + average if kept) of a fit's final state, loaded strictly, on the CPU.

    Args:
        recipe: the recipe the fit ran (its architecture builds the scorers).
        population: a ``Population`` giving the scorer's dims.
        final_state: the fit's ``final_state.safetensors``.
        expected_sha256: refuse the file unless its bytes have this digest.
    """
    # Lazy: keeps importing this module free of torch.
    from qhlab.finite_horizon.batches import population_dims
    from qhlab.finite_horizon.q_learning import QhTDModule
    from qhlab.training.tensor_state import load_tensor_state

    module = QhTDModule(recipe, population_dims(population))
    tensors, _ = load_tensor_state(final_state, expected_sha256=expected_sha256)
    scorers = [("online.", module.online), ("target.", module.target)]
    if module.average is not None:
        scorers.append(("average.", module.average))
    # A state holding a scorer the recipe does not build (average.* without averaging) is not this fit's.
    foreign = sorted({k.split(".")[0] for k in tensors} - {p.rstrip(".") for p, _ in scorers} - {"optim"})
    if foreign:
        raise EvidenceError(
            f"load_final_module: {final_state} holds tensors {', '.join(p + '.*' for p in foreign)} that the recipe "
            f"{recipe.name!r} does not build. HINT: load a final state with the recipe its fit ran."
        )
    for prefix, target in scorers:
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        target.load_state_dict(state, strict=True)
    return module


def _sync(device_type: str) -> None:
    import torch

    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


def _read_fit(fit: str | os.PathLike | FitResult) -> tuple[Path, FitReceipt, QhRecipe]:
    """The fit's receipt path, its authenticated receipt document and the recipe it ran (validated)."""
    directory = Path(getattr(fit, "output_directory", fit))
    receipt_path = directory if directory.name == FIT_RECEIPT else directory / FIT_RECEIPT
    document = read_receipt(receipt_path, FitReceipt)
    body = document.body
    recipe = validate_recipe(body.recipe, source=f"fit receipt {receipt_path}")
    return receipt_path, document, recipe


def _require_train_population(population: Any, recipe: QhRecipe) -> None:
    """Refuse a population that is not TRAIN, or whose horizon is not the fitted recipe's."""
    if getattr(population, "split", None) != "train":
        raise input_error(
            "benchmark_scorer",
            "train.split",
            getattr(population, "split", None),
            "'train'",
            "the benchmark runs on the canonical first TRAIN chain",
        )
    if population.horizon != recipe.horizon:
        raise input_error(
            "benchmark_scorer",
            "train.horizon",
            population.horizon,
            f"{recipe.horizon} (the fitted recipe's horizon)",
            "pass the fit's own TRAIN population",
        )


def _bound_final_state(document: FitReceipt, receipt_path: Path) -> tuple[Path, str]:
    """The fit's final state file and its SHA-256, refused unless the receipt binds those bytes."""
    final_state = receipt_path.parent / FINAL_STATE
    digest = sha256_file(final_state)
    bound = {e.sha256 for e in document.outputs.values()}
    if digest not in bound:
        raise EvidenceError(f"benchmark_scorer: {final_state} is not a final state bound by {receipt_path}.")
    return final_state, digest


def _timed_forwards(online: Any, inputs: list, profile: Any) -> list[float]:
    """Wall seconds of each of the ``TIMED_FORWARDS`` synchronized forwards, after the warm-up ones."""
    import torch

    times = []
    with torch.no_grad():
        for _ in range(WARMUP_FORWARDS):
            with profile.autocast_context():
                online(*inputs)
        _sync(profile.device_type)
        for _ in range(TIMED_FORWARDS):
            start = time.perf_counter()
            with profile.autocast_context():
                online(*inputs)
            _sync(profile.device_type)
            times.append(time.perf_counter() - start)
    return times


def _h1_backward(
    online: Any, inputs: list, batch: dict, recipe: QhRecipe, profile: Any, huber_loss: Any
) -> tuple[Any, list[str], list[str]]:
    """One H1 Huber backward: (the loss, parameter names it reaches, names it does not); grads cleared.

    ``huber_loss`` is ``native_huber_loss``, passed in so that the torch-loading imports stay in one lazy block.
    """
    # One H1 backward: y_1 = r, native Huber; lists which tensors the loss reaches.
    online.zero_grad(set_to_none=True)
    with profile.autocast_context():
        q = online(*inputs)
    loss = huber_loss(
        q[..., :1].float(), batch["reward"].unsqueeze(-1).float(), batch["candidate_mask"], recipe.huber_delta
    )
    loss.backward()
    receiving = sorted(n for n, p in online.named_parameters() if p.grad is not None)
    without = sorted(n for n, p in online.named_parameters() if p.grad is None)
    online.zero_grad(set_to_none=True)
    return loss, receiving, without


def _hooked_spans(online: Any, inputs: list, profile: Any, scorer_members: Any) -> tuple[list[str], dict[str, float]]:
    """The parts hooked (of "encoder", "readout") and their inclusive seconds in one hooked forward.

    ``scorer_members`` is ``qhlab.finite_horizon.scorer.scorer_members``, passed in for the same reason.
    """
    import torch

    # Hooked pass: inclusive wall time of encoder and readout (hooks add overhead).
    marks: dict[str, float] = {}
    spans: dict[str, float] = {}

    def _pre(name):
        def hook(_module, _inputs):
            _sync(profile.device_type)
            marks[name] = time.perf_counter()

        return hook

    def _post(name):
        def hook(_module, _inputs, _output):
            _sync(profile.device_type)
            spans[name] = spans.get(name, 0.0) + time.perf_counter() - marks[name]

        return hook

    # An ensemble's members run one after another: each part's time is the sum over members. A
    # user module times only the parts it exposes as submodules named encoder and readout.
    handles = []
    parts = [
        name
        for name in ("encoder", "readout")
        if all(isinstance(getattr(m, name, None), torch.nn.Module) for m in scorer_members(online))
    ]
    for member in scorer_members(online):
        for name in parts:
            sub = getattr(member, name)
            handles += [sub.register_forward_pre_hook(_pre(name)), sub.register_forward_hook(_post(name))]
    try:
        with torch.no_grad(), profile.autocast_context():
            online(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return parts, spans


def _module_timings(parts: list[str], spans: dict[str, float]) -> dict[str, Any]:
    """The report's ``module_timings``: hooked encoder/readout seconds, or why a part is unavailable."""
    return {
        "encoder_seconds": float(spans["encoder"]) if "encoder" in parts else None,
        "readout_seconds": float(spans["readout"]) if "readout" in parts else None,
        **{
            part: f"unavailable: the module has no submodule named {part!r}"
            for part in ("encoder", "readout")
            if part not in parts
        },
        "fusion_seconds": None,
        "fusion": "unavailable: fusion is not independently hookable in this measurement",
        "additive": False,
        "note": "hooked pass with synchronizing hooks; timings include hook overhead",
    }


def benchmark_scorer(fit: str | os.PathLike | FitResult, train: str | os.PathLike | Population) -> dict:
    """Measure a verified scorer on the canonical first TRAIN chain without updates.

    Ten warm-up and twenty synchronized, uninstrumented forwards under the lane's autocast;
    one native H1 Huber backward identifies the parameter tensors receiving gradients (no
    optimizer is built; no parameter changes, which is checked); a separate hooked pass times
    ``encoder`` and inclusive local ``readout`` (hook overhead; not additive). Fusion is not
    timed independently and is reported unavailable. Memory evidence describes this
    process's loaded module (online and target scorer).

    Args:
        fit: a fit attempt directory or its ``fit.receipt.json`` (authenticated here), or a
            ``FitResult``.
        train: the TRAIN population directory or a loaded ``Population`` (split "train").

    Returns:
        JSON-able dict: ``warmup_forwards``, ``timed_forwards``, ``median_forward_seconds``,
        ``forward_seconds`` [20], ``rows``, ``parameters_receiving_gradients``,
        ``parameters_without_gradients``, ``module_timings`` (``encoder_seconds``,
        ``readout_seconds``: None, with a ``encoder``/``readout`` key saying why, for a module
        without such a submodule; ``fusion_seconds`` None, ``fusion``, ``additive`` False),
        ``memory``, ``profile``, ``device_type``, ``final_state_sha256``, ``updates_applied`` 0.
    """
    import torch

    # Lazy: keeps importing this module free of torch.
    from qhlab.finite_horizon.batches import QhPopulationDataModule
    from qhlab.finite_horizon.data import load_population
    from qhlab.finite_horizon.q_learning import native_huber_loss
    from qhlab.finite_horizon.scorer import scorer_members
    from qhlab.training.execution_profile import execution_profile

    receipt_path, document, recipe = _read_fit(fit)
    profile = execution_profile(document.body.profile)
    profile.admit_runtime()
    if isinstance(train, (str, os.PathLike)):
        population = load_population(Path(train), split="train", horizon=recipe.horizon)
    else:
        population = train
    _require_train_population(population, recipe)
    final_state, digest = _bound_final_state(document, receipt_path)
    memory_setup = profile.prepare_memory_accounting(None)
    module = load_final_module(recipe, population, final_state, digest)
    device = torch.device(profile.device_type)
    module.to(device)
    chain = canonical_first_chain(population)
    rows = torch.tensor(chain["rows"], dtype=torch.int64)
    data = QhPopulationDataModule(population, batch_size=len(chain["rows"]), seed=0, rows=rows)
    batch = {k: v.to(device) for k, v in data.gather(rows).items()}
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    online = module.online
    online.eval()
    inputs = [batch[k] for k in ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")]
    times = _timed_forwards(online, inputs, profile)
    loss, receiving, without = _h1_backward(online, inputs, batch, recipe, profile, native_huber_loss)
    parts, spans = _hooked_spans(online, inputs, profile, scorer_members)
    after = module.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise QhError("benchmark_scorer: a parameter or buffer changed; the benchmark must not update.")
    return {
        "warmup_forwards": WARMUP_FORWARDS,
        "timed_forwards": TIMED_FORWARDS,
        "median_forward_seconds": float(pystats.median(times)),
        "forward_seconds": [float(t) for t in times],
        "rows": len(chain["rows"]),
        "canonical_first_chain": chain,
        "parameters_receiving_gradients": receiving,
        "parameters_without_gradients": without,
        "h1_huber_loss": float(loss.detach()),
        "module_timings": _module_timings(parts, spans),
        "memory": profile.memory_evidence(),
        "memory_accounting": memory_setup,
        "profile": profile.name,
        "device_type": profile.device_type,
        "precision": profile.precision,
        "final_state_sha256": digest,
        "torch_threads": torch.get_num_threads(),
        "updates_applied": 0,
    }
