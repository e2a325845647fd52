"""The study's declared family: user arms' sources frozen into the study, and every arm's contract.

Owns: at freeze, copying each user arm's source into ``family/<arm>/`` and checking every
arm's builder contract on the canonical first TRAIN chain (``freeze_family``: output shape
[B, K, H], finite values, gradients reaching parameters, the same parameters from two builds
under one seed); after freeze, making the frozen copies importable in this process
(``provide_family``, called for every authenticated study, on every executor) and shipping
their bytes to a Ray worker (``family_bytes``, ``provide_shipped``). Does not own: the user's
files as they are now (``qhlab.design.user_sources``), parsing builders, digesting and importing a
copy (``qhlab.execution.user_code``), building scorers (``qhlab.finite_horizon.scorer``) or binding
files into the freeze receipt (``freeze``).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from qhlab.design.study_records import StudyFreezeBody
from qhlab.design.user_sources import arm_refusal, family_sources, user_sources
from qhlab.evidence import QhInputError, publish_bytes
from qhlab.evidence.layout import FAMILY_DIR
from qhlab.execution.user_code import (
    UNFROZEN_HINT,
    FrozenSource,
    UnfrozenImportError,
    file_digests,
    missing_sibling,
    provide,
    source_digest,
    unbound_modules,
    user_frames,
    user_location,
)

__all__ = [
    "copy_sources",
    "family_bytes",
    "freeze_family",
    "provide_family",
    "provide_shipped",
    "shipped_sources",
]

_CALL = "freeze_study"
_INPUTS = ("objects", "object_mask", "goal", "candidates", "candidate_object", "candidate_mask")


_VERBOSE = "; --verbose shows the whole traceback"
_BUILDER_HINT = (
    "the builder is build(arch, dims) -> nn.Module, whose forward takes the scorer's six inputs "
    "and returns Q [B, K, H] (docs/how-to/add-an-arm.md)"
)


def copy_sources(config: Any, config_dir: Path, output: Path) -> dict[str, dict]:
    """Copy each user arm's source to ``output/family/<arm>/``; returns ``{arm: source record}``.

    Raises:
        QhInputError: a builder whose source is missing (nothing is kept).
    """
    records = {}
    family = output / FAMILY_DIR
    sources = list(user_sources(config, config_dir))  # every source read before anything is written
    # Under the freeze lock and before any freeze receipt: a family a killed freeze left is redone.
    shutil.rmtree(family, ignore_errors=True)
    for arm, builder, located, files in sources:
        for rel, data in files.items():
            target = family / arm / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            publish_bytes(target, data)
        digests = file_digests(files)
        records[arm] = {
            "builder": builder,
            "kind": located.kind,
            "original": str(located.path),
            "module": located.module,
            "function": located.function,
            "files": digests,
            "sha256": source_digest(digests),
        }
    return records


def _arm_source(arm: str, record: dict, root: Path, files: dict[str, bytes] | None = None) -> FrozenSource:
    return FrozenSource(
        owner=f"arm {arm!r}",
        entry=record["builder"],
        root=root,
        module=record["module"],
        function=record["function"],
        files=dict(record["files"]),
        preloaded=files,
    )


def shipped_sources(records: dict[str, dict], output: Path) -> dict[str, dict]:
    """``{arm: shipped copy}`` of copied sources (``copy_sources``), for workers (``provide_shipped``)."""
    return {
        arm: {
            "arm": arm,
            "record": record,
            "files": {rel: (output / FAMILY_DIR / arm / rel).read_bytes() for rel in record["files"]},
        }
        for arm, record in records.items()
    }


def freeze_family(
    config: Any, config_dir: Path, population: Any, output: Path
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Freeze the family: copy user sources, then check every arm's contract from the copies.

    Args:
        config: the ``QhArchitectureStudyConfig``.
        config_dir: the config file's directory (relative builder paths start there).
        population: the TRAIN ``Population`` (its canonical first chain is the check's batch).
        output: the study directory (``family/`` is written there; removed again on refusal).

    Returns:
        (``{arm: source record}`` of the user arms, ``{arm: contract record}`` of every arm:
        ``parameters``, ``output_shape``, ``parameters_receiving_gradients``,
        ``parameters_without_gradients``).

    Raises:
        QhInputError: one line naming the arm, its builder and what failed (nothing is kept).
    """
    sources = copy_sources(config, config_dir, output)
    try:
        for arm, record in sources.items():
            provide(_arm_source(arm, record, output / FAMILY_DIR / arm))
        shas = {arm: record["sha256"] for arm, record in sources.items()}
        batch = _chain_batch(population)
        contracts = {}
        for arm in config.arms:
            recipe = config.cell_recipe(arm, config.seeds[0], config.broad_updates, sources=shas)
            before = set(sys.modules)
            built = (
                None
                if arm not in sources
                # check_contract calls it within this iteration.
                else (lambda arm=arm: _refuse_unbound_imports(arm, sources[arm], set(sys.modules) - before))  # noqa: B023
            )
            directory = Path(sources[arm]["original"]).parent if arm in sources else None
            contracts[arm] = check_contract(
                arm, config.builder(arm), recipe, batch, population, built=built, directory=directory
            )
        return sources, contracts
    except BaseException:
        shutil.rmtree(output / FAMILY_DIR, ignore_errors=True)
        raise


def _refuse_unbound_imports(arm: str, record: dict, new: set[str]) -> None:
    """Refuse an arm whose import or run loaded code that is neither its frozen copy nor installed
    (``qhlab.execution.user_code.unbound_modules``)."""
    unbound = unbound_modules(record["module"], new)
    if unbound:
        name, file = unbound[0]
        raise arm_refusal(
            arm,
            record["builder"],
            f"importing it loaded module {name!r} from {file!r}, which is not in its frozen source",
            f"{UNFROZEN_HINT}; installed packages are imported as usual",
        )


def _chain_batch(population: Any) -> dict:
    # torch-heavy modules are imported where used: status and verify import this module without torch.
    import torch

    # Lazy: keeps importing this module free of Lightning.
    from qhlab.finite_horizon.batches import QhPopulationDataModule
    from qhlab.finite_horizon.benchmark import canonical_first_chain

    rows = torch.tensor(canonical_first_chain(population)["rows"], dtype=torch.int64)
    return QhPopulationDataModule(population, batch_size=len(rows), seed=0, rows=rows).gather(rows)


def check_contract(
    arm: str,
    builder: str | None,
    recipe: Any,
    batch: dict,
    population: Any,
    *,
    built: Callable[[], None] | None = None,
    directory: Path | None = None,
) -> dict:
    """Check one arm's builder contract on a batch; returns its contract record.

    One member of the cell's recipe is built twice under the recipe's seed (torch's RNG is
    forked, so nothing else changes): the parameters must be identical. Its forward on the
    batch must give finite Q of shape [B, K, H], and one native H1 Huber backward must reach at
    least one parameter with finite gradients.

    Args:
        arm, builder: named in refusals.
        recipe: the cell recipe whose architecture, seed, head init and Huber delta are used.
        batch: the canonical first TRAIN chain's batch (``BATCH_KEYS``).
        population: the TRAIN population (its dims).
        built: called right after the two builds and again after the forward and backward (the
            freeze checks there what importing and running the arm loaded).
        directory: the user's directory the arm's source was read from (a module beside it that
            the source imports is named, with how to freeze it); None for a built-in arm.

    Raises:
        QhInputError: one line naming the arm, its builder and what failed.
    """
    import torch

    # Lazy: keeps importing this module free of torch.
    from qhlab.finite_horizon.batches import population_dims
    from qhlab.finite_horizon.q_learning import native_huber_loss
    from qhlab.finite_horizon.scorer import ArmContractError, build_scorer, scorer_structure

    dims = population_dims(population)

    def build() -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.seed)
            return build_scorer(recipe.architecture, dims, q_head_init=recipe.q_head_init)

    try:
        first, second = build(), build()
    except QhInputError:
        raise
    except ArmContractError as exc:
        raise arm_refusal(arm, builder, exc.cause, exc.hint) from None
    except UnfrozenImportError as exc:
        cause, _, _ = str(exc).partition(" HINT: ")
        raise arm_refusal(arm, builder, cause.rstrip("."), UNFROZEN_HINT) from None
    # A user's builder may raise anything, or exit: refused by name, never a silent exit 0.
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001
        _refuse_failed_build(arm, builder, exc, directory)
    if built is not None:
        built()
    _refuse_lazy_tensors(arm, builder, first)
    _refuse_nondeterministic(arm, builder, recipe.seed, first.state_dict(), second.state_dict())
    parameters = dict(first.named_parameters())
    if not parameters:
        raise arm_refusal(arm, builder, "the module has no parameters", "an arm is trained; give it parameters")
    q, expected = _checked_forward(arm, builder, first, batch, dims.horizon, directory)
    loss = native_huber_loss(
        q[..., :1].float(), batch["reward"].unsqueeze(-1).float(), batch["candidate_mask"], recipe.huber_delta
    )
    if loss.requires_grad:
        loss.backward()
    if built is not None:  # again: a forward may import too
        built()
    receiving = _receiving_gradients(arm, builder, parameters)
    return {
        "parameters": int(sum(p.numel() for p in parameters.values())),
        # What every fit of the arm must build again (a fit refuses another structure).
        "structure": scorer_structure(first),
        "output_shape": expected,
        "parameters_receiving_gradients": len(receiving),
        "parameters_without_gradients": sorted(set(parameters) - set(receiving)),
        "deterministic_initialisation": True,
    }


def _refuse_failed_build(arm: str, builder: str | None, exc: BaseException, directory: Path | None) -> NoReturn:
    """Raise the refusal of a build that raised or exited with ``exc`` (called while handling it).

    A module beside the source that is not frozen with it is named with how to freeze it;
    otherwise the failure is placed in the module's import or in the builder.
    """
    sibling = None if directory is None else missing_sibling(directory, exc)
    if sibling is not None:
        raise arm_refusal(
            arm,
            builder,
            f"its source imports {sibling!r}, a module beside it that is not frozen with it",
            UNFROZEN_HINT,
        ) from None
    more = " (only the builder's own file or package is frozen)" if isinstance(exc, ModuleNotFoundError) else ""
    what = "exited" if isinstance(exc, SystemExit) else "raised"
    where = user_location(exc, shown_in=directory)
    if isinstance(exc, SyntaxError) or any(f.name == "<module>" for f in user_frames(exc)):
        # The module itself failed (its top level ran, or never compiled): no builder ran.
        module = builder.partition(":")[0] if builder else arm
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        cause = f"importing {module} failed: {type(exc).__name__}: {message}{more}{where}"
    else:
        cause = f"building it {what} {type(exc).__name__}: {exc}{more}{where}"
    # The user's exception stays the cause: `--verbose` prints its whole traceback.
    raise arm_refusal(arm, builder, cause.replace("\n", " "), _BUILDER_HINT + _VERBOSE) from exc


def _refuse_lazy_tensors(arm: str, builder: str | None, module: Any) -> None:
    """Refuse a built module holding uninitialised (lazy) parameters or buffers."""
    import torch

    lazy = sorted(
        n
        for n, t in [*module.named_parameters(), *module.named_buffers()]
        if isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
    )
    if lazy:
        raise arm_refusal(
            arm,
            builder,
            f"it has uninitialised (lazy) parameters or buffers: {', '.join(lazy[:5])}",
            "give every layer its input size when it is built (nn.Linear, not nn.LazyLinear), so "
            "that its initialisation is drawn, checked and frozen at build",
        )


def _refuse_nondeterministic(arm: str, builder: str | None, seed: int, one: dict, two: dict) -> None:
    """Refuse two builds under ``seed`` whose state dicts ``one`` and ``two`` differ."""
    import torch

    def same(key: str) -> bool:
        a, b = one.get(key), two.get(key)
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return type(a) is type(b)  # extra state is not a drawn parameter; its presence must match
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)

    differing = sorted(k for k in set(one) | set(two) if not same(k))
    if differing:
        raise arm_refusal(
            arm,
            builder,
            f"its initialisation is not deterministic: two builds under seed {seed} "
            f"differ in {', '.join(differing[:5])}",
            "draw every initial value from torch's global RNG (no time, os.urandom or numpy seeds)",
        )


def _checked_forward(
    arm: str, builder: str | None, module: Any, batch: dict, horizon: int, directory: Path | None
) -> tuple[Any, list[int]]:
    """Run ``module``'s forward on ``batch``; returns (Q, its required shape [B, K, H]).

    Refuses a forward that raises or exits, a Q of another shape and a Q with non-finite values.
    """
    import torch

    b, k = batch["candidates"].shape[:2]
    expected = [int(b), int(k), horizon]
    try:
        q = module(*[batch[name] for name in _INPUTS])
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - refused by name, as above
        what = "exited" if isinstance(exc, SystemExit) else "raised"
        cause = f"its forward {what} {type(exc).__name__}: {exc}{user_location(exc, shown_in=directory)}"
        raise arm_refusal(arm, builder, cause.replace("\n", " "), _BUILDER_HINT + _VERBOSE) from exc
    shape = list(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
    if shape != expected:
        raise arm_refusal(
            arm, builder, f"output shape {shape} is not allowed; allowed: [B, K, H] = {expected}", _BUILDER_HINT
        )
    if not torch.isfinite(q).all():
        raise arm_refusal(
            arm,
            builder,
            "its output holds non-finite values on the canonical first TRAIN chain",
            "keep Q finite (masked candidates too)",
        )
    return q, expected


def _receiving_gradients(arm: str, builder: str | None, parameters: dict) -> list[str]:
    """The names of the parameters that received a gradient, sorted; refuses none, or a non-finite one."""
    import torch

    receiving = sorted(n for n, p in parameters.items() if p.grad is not None)
    if not receiving:
        raise arm_refusal(
            arm,
            builder,
            "no parameter receives a gradient from Q",
            "compute Q from the module's parameters (no detach, no torch.no_grad)",
        )
    bad = sorted(n for n in receiving if not torch.isfinite(parameters[n].grad).all())
    if bad:
        raise arm_refusal(arm, builder, f"non-finite gradients reach {', '.join(bad[:5])}", "keep Q finite")
    return receiving


def provide_family(body: StudyFreezeBody, output: Path) -> dict[str, str]:
    """Make a frozen study's user-arm copies importable here; returns ``{arm: source sha256}``.

    The copies' digests are checked against the freeze receipt right before their first import
    (``FrozenSource.check``), so a copy changed after the study was authenticated is refused.
    """
    sources = family_sources(body)
    for arm, record in sources.items():
        provide(_arm_source(arm, record, output / FAMILY_DIR / arm))
    return {arm: record["sha256"] for arm, record in sources.items()}


def family_bytes(body: StudyFreezeBody, output: Path, arm: str) -> dict | None:
    """The frozen copy of ``arm``'s source as bytes, for a worker without the study (None: built-in)."""
    record = family_sources(body).get(arm)
    if record is None:
        return None
    files = {rel: (output / FAMILY_DIR / arm / rel).read_bytes() for rel in record["files"]}
    return {"arm": arm, "record": record, "files": files}


def provide_shipped(shipped: dict | None, root: Path) -> None:
    """Provide a shipped copy from its bytes (checked against its digests at import; nothing is
    written, so a worker without the copy's directory runs it too). ``root`` is where the copy
    is kept, named in its tracebacks."""
    if shipped is None:
        return
    provide(_arm_source(shipped["arm"], shipped["record"], root, files=dict(shipped["files"])))
