"""Bad-input corpus: malformed recipes, study configs, populations and CLI arguments.

Owns: the corpus (``RECIPE_CASES``, ``STUDY_CASES``, ``POPULATION_CASES``, ``CLI_CASES``) and
the one rule every case must satisfy (SPEC §1.4): exit status 2, exactly one ``error:`` line
on stderr (argparse usage errors count for CLI arguments), the message names the field or
file, no traceback, and the output directory does not exist afterwards. Does not own: any
validation logic (recipe, study, population reader, CLI parsers).

Every case runs in this process through ``qhlab.cli.main`` (validation happens before any
work, so the whole corpus takes seconds).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from _reliability_support import (
    STUDY_TEMPLATE,
    forge_population,
    reliability_recipe,
    run_cli,
    set_list_value,
    set_scalar_value,
)

from qhlab.scenes.records import PopulationReceipt

pytestmark = pytest.mark.reliability


@dataclass(frozen=True)
class Case:
    """One malformed input.

    Attributes:
        id: pytest id.
        build: ``(workdir, env) -> argv`` where ``env`` holds the session paths; ``workdir`` is
            fresh; the output directory is always ``workdir / "out"``.
        names: substrings that must appear in stderr (the field, the value or the file).
    """

    id: str
    build: Callable[[Path, dict], list]
    names: tuple[str, ...]
    known_bug: str | None = None


def _line_edit(text: str, old: str, new: str | None) -> str:
    """Replace (or with None, drop) the first line that starts with ``old``."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.startswith(old)]
    assert hits, old
    if new is None:
        del lines[hits[0]]
    else:
        lines[hits[0]] = new
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- recipes


def _recipe_case(
    case_id: str,
    edits: list[tuple[str, str | None]] | None = None,
    *,
    append: str = "",
    raw: str | None = None,
    train: str = "train",
    names: tuple[str, ...],
    known_bug: str | None = None,
) -> Case:
    def build(work: Path, env: dict) -> list:
        text = reliability_recipe(updates=40, train=env[train], validation=env["validation"])
        for old, new in edits or []:
            text = _line_edit(text, old, new)
        text += append
        path = work / "recipe.toml"
        path.write_text(text if raw is None else raw, encoding="utf-8")
        return ["fit", path, "--profile", "cpu-fp32", "--output", work / "out", "--no-progress"]

    return Case(case_id, build, names, known_bug)


RECIPE_CASES = [
    _recipe_case("recipe-wrong-type-batch-size", [("batch_size", 'batch_size = "sixteen"')], names=("batch_size",)),
    # updates = 1: were the string ever coerced again, the fit that runs stays short.
    _recipe_case(
        "recipe-wrong-type-huber-string",
        [("huber_delta", 'huber_delta = "0.05"'), ("updates", "updates = 1")],
        names=("huber_delta",),
    ),
    _recipe_case("recipe-float-updates", [("updates", "updates = 10.5")], names=("updates",)),
    _recipe_case("recipe-float-seed", [("seed", "seed = 1.5")], names=("seed",)),
    _recipe_case("recipe-missing-name", [("name", None)], names=("name",)),
    _recipe_case("recipe-missing-lr", [("lr = ", None)], names=("lr",)),
    _recipe_case(
        "recipe-missing-architecture",
        [("[architecture]", None), ('arm = "baseline"', None), ("encoder = ", None)],
        names=("architecture",),
    ),
    _recipe_case("recipe-extra-top-level-field", append="learning_rate = 0.1\n", names=("learning_rate",)),
    _recipe_case(
        "recipe-extra-nested-field", [("weight_decay", "weight_decay = 0.0\nmomentum = 0.9")], names=("momentum",)
    ),
    _recipe_case("recipe-nan-huber", [("huber_delta", "huber_delta = nan")], names=("huber_delta",)),
    _recipe_case("recipe-inf-lr", [("lr = ", "lr = inf")], names=("lr",)),
    _recipe_case("recipe-negative-inf-tie-band", [("tie_band", "tie_band = -inf")], names=("tie_band",)),
    _recipe_case("recipe-negative-budget", [("updates", "updates = -5")], names=("updates",)),
    _recipe_case("recipe-zero-budget", [("updates", "updates = 0")], names=("updates",)),
    _recipe_case("recipe-zero-batch", [("batch_size", "batch_size = 0")], names=("batch_size",)),
    _recipe_case("recipe-negative-seed", [("seed", "seed = -1")], names=("seed",)),
    _recipe_case("recipe-name-traversal", [("name", 'name = "../x"')], names=("name", "../x")),
    _recipe_case("recipe-name-slash", [("name", 'name = "a/b"')], names=("name", "a/b")),
    _recipe_case("recipe-name-unicode", [("name", 'name = "r\u00e9cepte"')], names=("name",)),
    _recipe_case("recipe-empty-file", raw="", names=("recipe",)),
    _recipe_case("recipe-not-toml", raw="name = [[[\n", names=("TOML",)),
    _recipe_case("recipe-horizon-mismatch", [("horizon", "horizon = 3")], names=("horizon",)),
    _recipe_case("recipe-horizon-zero", [("horizon", "horizon = 0")], names=("horizon",)),
    _recipe_case(
        "recipe-unknown-arm", [('arm = "baseline"', 'arm = "transformer_xl"')], names=("arm", "transformer_xl")
    ),
    _recipe_case(
        "recipe-betas-out-of-range", [("weight_decay", "weight_decay = 0.0\nbetas = [0.9, 1.5]")], names=("betas",)
    ),
    _recipe_case(
        "recipe-three-betas", [("weight_decay", "weight_decay = 0.0\nbetas = [0.9, 0.99, 0.999]")], names=("betas",)
    ),
    _recipe_case("recipe-unknown-target-rule", [('kind = "hard"', 'kind = "soft"')], names=("target_update",)),
    _recipe_case(
        "recipe-polyak-tau-zero", [('kind = "hard"', 'kind = "polyak"'), ("interval", "tau = 0.0")], names=("tau",)
    ),
    _recipe_case("recipe-negative-tie-band", [("tie_band", "tie_band = -0.1")], names=("tie_band",)),
    _recipe_case("recipe-negative-weight-decay", [("weight_decay", "weight_decay = -1.0")], names=("weight_decay",)),
    _recipe_case("recipe-zero-eps", [("weight_decay", "weight_decay = 0.0\neps = 0.0")], names=("eps",)),
    _recipe_case("recipe-absurd-huber-delta", [("huber_delta", "huber_delta = 1e300")], names=("huber_delta",)),
    _recipe_case(
        "recipe-zero-depth", [("encoder", "encoder = { depth = 0, width = 16, heads = 2 }")], names=("depth",)
    ),
    _recipe_case(
        "recipe-missing-train-population",
        [("train = ", 'train = "/nonexistent/qhlab-population"')],
        names=("/nonexistent/qhlab-population",),
    ),
    _recipe_case("recipe-validation-as-train", train="validation", names=("split",)),
]


# ----------------------------------------------------------------------------- study configs


def _study_case(
    case_id: str,
    edits: list[tuple[str, str | None]] | None = None,
    *,
    append: str = "",
    raw: str | None = None,
    names: tuple[str, ...],
) -> Case:
    def build(work: Path, env: dict) -> list:
        text = STUDY_TEMPLATE.format(broad_updates=20, cache=env["cache"])
        for old, new in edits or []:
            text = _line_edit(text, old, new)
        text += append
        path = work / "study.toml"
        path.write_text(text if raw is None else raw, encoding="utf-8")
        return ["study", "freeze", path, "--output", work / "out"]

    return Case(case_id, build, names)


STUDY_CASES = [
    _study_case("study-three-seeds", [("seeds", "seeds = [0, 1, 2]")], names=("seeds",)),
    _study_case("study-one-seed", [("seeds", "seeds = [0]")], names=("seeds",)),
    _study_case("study-duplicate-seeds", [("seeds", "seeds = [3, 3]")], names=("seeds",)),
    _study_case("study-negative-seed", [("seeds", "seeds = [-1, 1]")], names=("seeds",)),
    _study_case("study-negative-broad-budget", [("broad_updates", "broad_updates = -30")], names=("broad_updates",)),
    _study_case("study-zero-canary-budget", [("canary_updates", "canary_updates = 0")], names=("canary_updates",)),
    _study_case(
        "study-string-canary-budget", [("canary_updates", 'canary_updates = "many"')], names=("canary_updates",)
    ),
    _study_case("study-nan-tie-band", [("tie_band", "tie_band = nan")], names=("tie_band",)),
    _study_case(
        "study-inf-regret-fraction", [("regret_fraction", "regret_fraction = inf")], names=("regret_fraction",)
    ),
    _study_case("study-zero-workers", [("workers", "workers = 0")], names=("workers",)),
    _study_case("study-boolean-seeds", [("seeds", "seeds = [false, true]")], names=("seeds.0", "False")),
    _study_case("study-float-seeds", [("seeds", "seeds = [0.0, 1.0]")], names=("seeds.0", "an integer")),
    _study_case(
        "study-boolean-canary-budget", [("canary_updates", "canary_updates = true")], names=("canary_updates", "True")
    ),
    _study_case("study-boolean-tie-band", [("tie_band", "tie_band = true")], names=("tie_band", "a TOML boolean")),
    _study_case("study-absurd-tie-band", [("tie_band", "tie_band = 1e300")], names=("tie_band", "<= 10.0")),
    _study_case(
        "study-absurd-regret-fraction",
        [("regret_fraction", "regret_fraction = 1e300")],
        names=("regret_fraction", "<= 100.0"),
    ),
    _study_case(
        "study-empty-population-cache",
        [("population_cache", 'population_cache = ""')],
        names=("population_cache", "a non-empty directory path"),
    ),
    _study_case(
        "study-nul-population-cache",
        [("population_cache", 'population_cache = "a\\u0000b"')],
        names=("population_cache", "NUL"),
    ),
    _study_case(
        "study-spaced-population-cache",
        [("population_cache", 'population_cache = "cache "')],
        names=("population_cache", "leading or trailing whitespace"),
    ),
    _study_case("study-number-recipe-name", [('name = "rel"', "name = 5")], names=("name=5", "a recipe name")),
    _study_case("study-name-traversal", [('name = "rel-study"', 'name = "../x"')], names=("name",)),
    _study_case("study-name-unicode", [('name = "rel-study"', 'name = "\u00e9tude"')], names=("name",)),
    _study_case("study-extra-field", append='test_split = "yes"\n', names=("test_split",)),
    _study_case(
        "study-missing-train", [("[train]", None), ('preset = "tiny"', None), ("seed = 7", None)], names=("train",)
    ),
    _study_case("study-unknown-profile", [("profile", 'profile = "warp-drive"')], names=("profile", "warp-drive")),
    _study_case("study-variant-without-control", [('control = "control_global_readout"', None)], names=("control",)),
    _study_case(
        "study-variant-control-is-variant",
        [('control = "control_global_readout"', 'control = "variant_deep"')],
        names=("control",),
    ),
    _study_case(
        "study-unknown-arm", [('arm = "variant_deep"', 'arm = "variant_wormhole"')], names=("variant_wormhole",)
    ),
    _study_case("study-train-preset-and-path", [("seed = 7", 'seed = 7\npath = "/tmp"')], names=("path",)),
    _study_case(
        "study-train-missing-path",
        [('preset = "tiny"', 'path = "/nonexistent/qhlab-train"'), ("seed = 7", None)],
        names=("/nonexistent/qhlab-train",),
    ),
    _study_case("study-unknown-preset", [('preset = "tiny"', 'preset = "galaxy"')], names=("galaxy",)),
    _study_case("study-recipe-carries-seed", [('name = "rel"', 'name = "rel"\nseed = 3')], names=("seed",)),
    _study_case("study-zero-bootstrap-resamples", [("resamples", "resamples = 0")], names=("resamples",)),
    _study_case("study-empty-file", raw="", names=("name",)),
    _study_case("study-not-toml", raw="seeds = [0, 1\n", names=("TOML",)),
]


# ----------------------------------------------------------------------------- populations


def _population_case(case_id: str, forge: str, names: tuple[str, ...]) -> Case:
    def build(work: Path, env: dict) -> list:
        recipe = work / "recipe.toml"
        recipe.write_text(reliability_recipe(updates=40, train=env["train"], validation=env["validation"]))
        return [
            "fit",
            recipe,
            "--train",
            env["forged"][forge],
            "--profile",
            "cpu-fp32",
            "--output",
            work / "out",
            "--no-progress",
        ]

    return Case(case_id, build, names)


POPULATION_CASES = [
    _population_case("population-truncated-parquet", "truncated", ("candidates.parquet",)),
    _population_case("population-truncated-parquet-digests-recomputed", "truncated_forged", ("candidates.parquet",)),
    _population_case("population-empty-parquet-file", "empty_parquet", ("states.parquet",)),
    _population_case("population-missing-manifest", "no_manifest", ("manifest.json",)),
    _population_case("population-empty-manifest", "empty_manifest", ("manifest.json",)),
    _population_case("population-missing-receipt", "no_receipt", ("population.receipt.json",)),
    _population_case("population-missing-states", "no_states", ("states.parquet",)),
    _population_case("population-empty-directory", "empty_dir", ("population.receipt.json",)),
    _population_case("population-path-is-a-file", "a_file", ("population.receipt.json",)),
    _population_case("population-nan-label", "nan_label", ("candidates.parquet", "'q'", "nan")),
    _population_case("population-inf-reward", "inf_reward", ("candidates.parquet", "reward", "inf")),
    _population_case("population-nan-object-feature", "nan_object", ("states.parquet", "objects", "nan")),
    _population_case("population-reward-overflows-float32", "huge_reward", ("candidates.parquet", "reward")),
    _population_case("population-label-overflows-float32", "huge_label", ("candidates.parquet", "'q'")),
    _population_case("population-wrong-label-count", "short_labels", ("candidates.parquet", "q=")),
    _population_case("population-validation-split-as-train", "validation", ("split",)),
]


def _forge_all(root: Path, train: Path, validation: Path) -> dict[str, Path]:
    """Every malformed population of the corpus, built once from the session TRAIN population."""
    import pyarrow as pa

    out: dict[str, Path] = {}

    def copy(name: str) -> Path:
        target = root / name
        shutil.copytree(train, target)
        return target

    truncated = copy("truncated")
    data = (truncated / "candidates.parquet").read_bytes()
    (truncated / "candidates.parquet").write_bytes(data[: len(data) // 2])
    out["truncated"] = truncated

    # Rewritten unchanged, then truncated with every digest recomputed: only parsing can refuse it.
    forged = forge_population(train, root / "truncated_forged", lambda tables: None)
    half = (forged / "candidates.parquet").read_bytes()
    half = half[: len(half) // 2]
    out["truncated_forged"] = _reseal(forged, {"candidates.parquet": half})
    out["empty_parquet"] = _reseal(
        forge_population(train, root / "empty_parquet", lambda t: None), {"states.parquet": b""}
    )

    no_manifest = copy("no_manifest")
    (no_manifest / "manifest.json").unlink()
    out["no_manifest"] = no_manifest
    empty_manifest = copy("empty_manifest")
    (empty_manifest / "manifest.json").write_bytes(b"")
    out["empty_manifest"] = empty_manifest
    no_receipt = copy("no_receipt")
    (no_receipt / "population.receipt.json").unlink()
    out["no_receipt"] = no_receipt
    no_states = copy("no_states")
    (no_states / "states.parquet").unlink()
    out["no_states"] = no_states
    (root / "empty_dir").mkdir()
    out["empty_dir"] = root / "empty_dir"
    (root / "a_file").write_text("not a population\n")
    out["a_file"] = root / "a_file"

    def chain_candidate_row(tables: dict) -> int:
        states = tables["states.parquet"].to_pydict()
        chain = {sid for sid, step in zip(states["state_id"], states["step"]) if step >= 0}
        return next(
            i for i, sid in enumerate(tables["candidates.parquet"].column("state_id").to_pylist()) if sid in chain
        )

    def nan_label(tables: dict) -> None:
        row = chain_candidate_row(tables)
        tables["candidates.parquet"] = set_list_value(tables["candidates.parquet"], "q", row, 1, float("nan"))

    def huge_label(tables: dict) -> None:
        row = chain_candidate_row(tables)
        tables["candidates.parquet"] = set_list_value(tables["candidates.parquet"], "q", row, 0, -1e300)

    def inf_reward(tables: dict) -> None:
        tables["candidates.parquet"] = set_scalar_value(tables["candidates.parquet"], "reward", 0, float("inf"))

    def huge_reward(tables: dict) -> None:
        # Finite as float64 (the stored type) but not representable as float32 (the tensors).
        tables["candidates.parquet"] = set_scalar_value(tables["candidates.parquet"], "reward", 0, 1e39)

    def nan_object(tables: dict) -> None:
        states = tables["states.parquet"]
        values = states.column("objects").to_pylist()
        values[0] = [list(v) for v in values[0]]
        values[0][0][0] = float("nan")
        position = states.column_names.index("objects")
        tables["states.parquet"] = states.set_column(
            position, states.schema.field("objects"), pa.array(values, type=states.schema.field("objects").type)
        )

    def short_labels(tables: dict) -> None:
        cands = tables["candidates.parquet"]
        values = cands.column("q").to_pylist()
        row = chain_candidate_row(tables)
        values[row] = values[row][:1]
        position = cands.column_names.index("q")
        tables["candidates.parquet"] = cands.set_column(
            position, cands.schema.field("q"), pa.array(values, type=cands.schema.field("q").type)
        )

    for name, mutate in (
        ("nan_label", nan_label),
        ("huge_label", huge_label),
        ("inf_reward", inf_reward),
        ("huge_reward", huge_reward),
        ("nan_object", nan_object),
        ("short_labels", short_labels),
    ):
        out[name] = forge_population(train, root / name, mutate)
    out["validation"] = validation
    return out


def _reseal(population: Path, replace: dict[str, bytes]) -> Path:
    """Replace file bytes in a (forged) population and recompute manifest + receipt digests."""
    from qhlab.evidence import canonical_json, read_receipt, sha256_file, write_receipt

    receipt = read_receipt(population / "population.receipt.json", PopulationReceipt).record()
    for name, data in replace.items():
        (population / name).write_bytes(data)
    manifest = json.loads((population / "manifest.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = sha256_file(population / name)
    (population / "manifest.json").write_bytes(canonical_json(manifest))
    (population / "population.receipt.json").unlink()
    write_receipt(
        population / "population.receipt.json",
        PopulationReceipt,
        body=receipt["body"],
        outputs={n: population / e["path"] for n, e in receipt["outputs"].items()},
    )
    return population


# ----------------------------------------------------------------------------- CLI arguments


def _fit_args(*extra: str) -> Callable[[Path, dict], list]:
    def build(work: Path, env: dict) -> list:
        recipe = work / "recipe.toml"
        recipe.write_text(reliability_recipe(updates=40, train=env["train"], validation=env["validation"]))
        return ["fit", recipe, "--profile", "cpu-fp32", "--output", work / "out", "--no-progress", *extra]

    return build


def _commission_args(milestones: str) -> Callable[[Path, dict], list]:
    def build(work: Path, env: dict) -> list:
        recipe = work / "recipe.toml"
        recipe.write_text(reliability_recipe(updates=40, train=env["train"], validation=env["validation"]))
        return [
            "commission",
            recipe,
            "--profile",
            "cpu-fp32",
            "--milestones",
            milestones,
            "--output",
            work / "out",
            "--no-progress",
        ]

    return build


def _argv(*args: str) -> Callable[[Path, dict], list]:
    def build(work: Path, env: dict) -> list:
        return [a.replace("{work}", str(work)).replace("{out}", str(work / "out")) for a in args]

    return build


def _study_args(step: str, *extra: str) -> Callable[[Path, dict], list]:
    def build(work: Path, env: dict) -> list:
        config = work / "study.toml"
        config.write_text(STUDY_TEMPLATE.format(broad_updates=20, cache=env["cache"]))
        return ["study", step, config, "--output", work / "out", *extra]

    return build


CLI_CASES = [
    Case("cli-no-command", _argv(), ("COMMAND",)),
    Case("cli-verify-empty-path", _argv("verify", ""), ("directory=''",)),
    Case(
        "cli-compare-lanes-zero-mde-multiple",
        lambda w, e: ["study", "compare-lanes", w / "a", w / "b", "--output", w / "out", "--margin-mde-multiple", "0"],
        ("margin_mde_multiple",),
    ),
    Case("cli-unknown-command", _argv("frobnicate"), ("frobnicate",)),
    Case("cli-fit-no-arguments", _argv("fit"), ("RECIPE",)),
    Case(
        "cli-fit-missing-profile",
        lambda w, e: [a for a in _fit_args()(w, e) if a not in ("--profile", "cpu-fp32")],
        ("--profile",),
    ),
    Case(
        "cli-fit-unknown-profile",
        lambda w, e: [("warp-drive" if a == "cpu-fp32" else a) for a in _fit_args()(w, e)],
        ("warp-drive",),
    ),
    Case("cli-fit-unknown-option", _fit_args("--frobnicate"), ("--frobnicate",)),
    Case("cli-fit-online-and-offline", _fit_args("--online", "--offline"), ("--offline",)),
    Case("cli-fit-checkpoint-every-zero", _fit_args("--checkpoint-every", "0"), ("--checkpoint-every",)),
    Case("cli-fit-checkpoint-every-negative", _fit_args("--checkpoint-every", "-3"), ("--checkpoint-every",)),
    Case("cli-fit-checkpoint-every-text", _fit_args("--checkpoint-every", "often"), ("--checkpoint-every",)),
    Case("cli-fit-cell-traversal", _fit_args("--cell", "../x"), ("cell", "../x")),
    Case("cli-fit-cell-absolute", _fit_args("--cell", "/tmp/x"), ("cell", "/tmp/x")),
    Case("cli-fit-cell-unicode", _fit_args("--cell", "c\u00e9ll"), ("cell",)),
    Case("cli-fit-resume-unknown-attempt", _fit_args("--resume", "no-such-attempt"), ("no-such-attempt",)),
    Case("cli-fit-resume-traversal", _fit_args("--resume", "../../etc"), ("../../etc",)),
    Case("cli-fit-train-missing", _fit_args("--train", "/nonexistent/qhlab-pop"), ("/nonexistent/qhlab-pop",)),
    Case(
        "cli-fit-recipe-missing",
        _argv("fit", "{work}/absent.toml", "--profile", "cpu-fp32", "--output", "{out}"),
        ("absent.toml",),
    ),
    Case(
        "cli-fit-recipe-is-directory", _argv("fit", "{work}", "--profile", "cpu-fp32", "--output", "{out}"), ("recipe",)
    ),
    Case(
        "cli-scenes-unknown-preset",
        _argv("scenes", "generate", "--preset", "galaxy", "--split", "train", "--seed", "1", "--out", "{out}"),
        ("galaxy",),
    ),
    Case(
        "cli-scenes-unknown-split",
        _argv("scenes", "generate", "--preset", "tiny", "--split", "holdout", "--seed", "1", "--out", "{out}"),
        ("holdout",),
    ),
    Case(
        "cli-scenes-negative-seed",
        _argv("scenes", "generate", "--preset", "tiny", "--split", "train", "--seed", "-3", "--out", "{out}"),
        ("seed",),
    ),
    Case(
        "cli-scenes-text-seed",
        _argv("scenes", "generate", "--preset", "tiny", "--split", "train", "--seed", "seven", "--out", "{out}"),
        ("--seed",),
    ),
    Case(
        "cli-scenes-zero-workers",
        _argv(
            "scenes",
            "generate",
            "--preset",
            "tiny",
            "--split",
            "train",
            "--seed",
            "1",
            "--out",
            "{out}",
            "--workers",
            "0",
        ),
        ("workers",),
    ),
    Case("cli-commission-decreasing-milestones", _commission_args("10,5,100"), ("milestones", "10, 5, 100")),
    Case("cli-commission-repeated-milestones", _commission_args("1,1,2"), ("milestones", "1, 1, 2")),
    Case("cli-commission-zero-milestone", _commission_args("0,10"), ("milestones", "0, 10")),
    Case("cli-commission-text-milestones", _commission_args("a,b"), ("--milestones", "a,b")),
    Case("cli-commission-empty-milestones", _commission_args(""), ("--milestones",)),
    Case("cli-commission-negative-milestone", _commission_args("-1,5"), ("--milestones",)),
    Case("cli-verify-missing-directory", _argv("verify", "{out}"), ("out",)),
    Case("cli-verify-directory-without-receipts", _argv("verify", "{work}"), ("receipt",)),
    Case("cli-study-unknown-step", _study_args("frobnicate"), ("frobnicate",)),
    Case("cli-study-run-fit-without-seed", _study_args("run-fit", "--variant", "baseline"), ("--seed",)),
    Case(
        "cli-study-run-fit-before-freeze", _study_args("run-fit", "--variant", "baseline", "--seed", "0"), ("freeze",)
    ),
    Case("cli-study-report-before-freeze", _study_args("report"), ("freeze",)),
    Case(
        "cli-study-unknown-canary-role",
        _study_args("run-fit", "--variant", "baseline", "--seed", "0", "--canary-role", "e9"),
        ("e9",),
    ),
    Case("cli-profiles-unknown-option", _argv("profiles", "--bogus"), ("--bogus",)),
]

ALL_CASES = RECIPE_CASES + STUDY_CASES + POPULATION_CASES + CLI_CASES
_PARAMS = [
    pytest.param(
        case, id=case.id, marks=[pytest.mark.xfail(reason=case.known_bug, strict=True)] if case.known_bug else []
    )
    for case in ALL_CASES
]


@pytest.fixture(scope="module")
def corpus_env(tmp_path_factory, rel_populations) -> dict:
    """Session paths plus the forged populations the corpus names."""
    root = tmp_path_factory.mktemp("forged-populations")
    return {
        **{k: str(v) for k, v in rel_populations.items()},
        "forged": {
            k: str(v) for k, v in _forge_all(root, rel_populations["train"], rel_populations["validation"]).items()
        },
    }


def test_corpus_is_large_and_ids_unique():
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids))
    assert len(ALL_CASES) >= 40
    assert len(RECIPE_CASES) >= 10 and len(STUDY_CASES) >= 10 and len(POPULATION_CASES) >= 10 and len(CLI_CASES) >= 10


@pytest.mark.parametrize("case", _PARAMS)
def test_bad_input_gives_one_clear_error_and_writes_nothing(case: Case, tmp_path: Path, corpus_env: dict):
    work = tmp_path / "work"
    work.mkdir()
    argv = case.build(work, corpus_env)
    result = run_cli(argv)
    assert result.code == 2, (argv, result.code, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.error_lines) == 1, result.stderr
    for name in case.names:
        assert name in result.stderr, (name, result.stderr)
    assert not (work / "out").exists(), sorted(p.name for p in (work / "out").rglob("*"))
    # qhlab's own errors (not argparse usage errors) follow the "field=value ... allowed" style
    # or name a file; either way they say what to do.
    line = result.error_lines[0]
    if line.startswith("error:"):
        assert re.search(
            r"allowed|HINT|does not exist|missing|sha256|not a readable|holds no|not valid", result.stderr
        ), line
