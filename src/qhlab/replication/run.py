"""``qhlab study replicate STUDY --train-seed A --validation-seed B --output DIR``: a conclusion, tested again.

Owns: ``replicate`` (authenticate the finished original; refuse a population pair that any of its
records drew; write the replica's design, that is the original's config with only the two
population seeds changed and the original's frozen arm sources beside it; check that it is the
original's design; run it as a study with every step of ``qhlab study run``; then publish
``replication.json``, ``replication.md`` and, last, their receipt, which binds both studies'
records). A killed replication resumes: the replica is a study and
its finished steps are kept. Does not own: the study steps (``qhlab.study``), the agreement
(``agreement``) or the check ``qhlab verify`` runs (``records``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from qhlab.design.study_config import STUDY_PATH_FIELDS, STUDY_PRESET_FIELDS, read_study_config
from qhlab.design.user_sources import environment_source_change, user_source_digests
from qhlab.evidence import (
    POPULATION_SEED_LIMIT,
    EvidenceError,
    QhError,
    input_error,
    locate_population,
    publish_bytes,
    publish_json,
    require_seed,
    write_receipt,
)
from qhlab.evidence.layout import (
    FAMILY_DIR,
    FREEZE_RECEIPT,
    REPLICATION_CONFIG,
    REPLICATION_DESIGN_DIR,
    REPLICATION_JSON,
    REPLICATION_MARKDOWN,
    REPLICATION_RECEIPT,
    REPLICATION_STUDY_DIR,
    STUDY_CONFIG_COPY,
)
from qhlab.execution import ExecutorChoice, JobRunner
from qhlab.replication.agreement import (
    design_differences,
    refused_seeds,
    refused_training_seeds,
    replication_document,
    replication_markdown,
    reused_populations,
    study_design,
    used_populations,
)
from qhlab.replication.records import ReplicationReceipt
from qhlab.report.finished import finished_study, open_study
from qhlab.scenes.audit import audit_population
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.population import scene_content_digests
from qhlab.training.terminal import console as study_console

__all__ = ["CALL", "replicate"]

CALL = "qhlab study replicate"


def replicate(
    study: str | os.PathLike,
    output: str | os.PathLike,
    *,
    train_seed: int,
    validation_seed: int,
    training_seeds: Sequence[int] | None = None,
    populations: Sequence[str | os.PathLike] = (),
    workers: int | None = None,
    executor: ExecutorChoice | None = None,
    console: Any = None,
) -> int:
    """Run a finished study's frozen design on a fresh population pair and test the agreement.

    Args:
        study: the finished original study directory.
        output: the replication's directory (new or empty, or a replication of the same study and
            seeds to resume).
        train_seed, validation_seed: the fresh population pair's seeds (drawn from the original's
            presets); refused if the original, its tuning, pilot or E0 check drew either.
        populations: directories the original's populations were copied to (``--populations``).
        workers: fits at once (None: the config's).
        executor: where labelling and fits run (None: the config's).
        console: where progress goes (None: the study's console).

    Returns:
        0 when the replication record is published (or was already), 1 when the replica's E0
        gate failed (its receipt stays; no record is written).

    Raises:
        QhInputError: a bad seed, a reused population, an original whose populations are named
            by path, a changed environment source or an occupied ``output`` (nothing written).
        EvidenceError: the original does not authenticate as a finished study.
    """
    console = console or study_console()
    _check_seeds(train_seed, validation_seed)
    output = Path(output)
    original = _finished(Path(study), populations)
    if output.resolve().is_relative_to(Path(study).resolve()):
        raise input_error(
            CALL,
            "--output",
            str(output),
            f"a directory outside the original study {str(study)!r}",
            "a finished study is sealed evidence; write the replication beside it",
        )
    body = original["freeze"]
    _steps_the_original_again(body)
    used = used_populations(body, original["development"])
    _refuse_reused_seeds(used, train_seed, validation_seed)
    _refuse_reused_training_seeds(body, training_seeds)
    files = _design_files(Path(study), body, original["sources"], train_seed, validation_seed, training_seeds)
    replication = output / REPLICATION_RECEIPT
    written = _claim_checked(output, files, body, original["sources"], fresh=training_seeds is not None)
    if replication.is_file():
        document = json.loads((output / REPLICATION_JSON).read_text(encoding="utf-8"))
        console.print(f"[green]replication {output} is complete[/]: {document['summary']}", highlight=False)
        return 0
    replica = open_study(
        output / REPLICATION_DESIGN_DIR / REPLICATION_CONFIG,
        output / REPLICATION_STUDY_DIR,
        populations=populations,
        executor=executor,
    )
    _freeze_replica(replica, executor, console)
    # Checked at every run, so a resumed replication never trains on a TRAIN that is not fresh.
    _refuse_stale_train(original, replica, used, written, output, train_seed)
    code = replica.run(workers=workers, console=console)
    if code != 0:
        console.print(
            f"[red]replication stopped[/]: the replica's E0 gate failed on TRAIN seed {train_seed}, so no broad "
            "fit ran and no agreement can be tested. The original passed its gate; this one did not, which "
            "is itself a finding about the gate. HINT: the replica's E0 receipt says why "
            f"({replica.output}/canaries/); replicate with another --train-seed into a new --output.",
            highlight=False,
        )
        return code
    copy = _finished(output / REPLICATION_STUDY_DIR, populations)
    document = _checked_document(study, output, original, copy)
    _publish_record(output, files, original, copy, document)
    console.print(f"[green]replication {output} finished[/]: {document['summary']}", highlight=False)
    console.print(f"Replication report: {output / REPLICATION_MARKDOWN}", highlight=False)
    return 0


def _check_seeds(train_seed: int, validation_seed: int) -> None:
    """Refuse a population seed outside ``POPULATION_SEED_LIMIT``."""
    for field, seed in (("--train-seed", train_seed), ("--validation-seed", validation_seed)):
        require_seed(CALL, field, seed, limit=POPULATION_SEED_LIMIT, hint="a population seed")


def _refuse_reused_seeds(used: list[dict[str, Any]], train_seed: int, validation_seed: int) -> None:
    """Refuse a seed pair that one of the original's records drew, or that uses one seed twice."""
    reused = reused_populations(used, {"train": {"seed": train_seed}, "validation": {"seed": validation_seed}})
    if reused:
        raise input_error(
            CALL,
            "--train-seed/--validation-seed",
            [train_seed, validation_seed],
            f"two different seeds that none of the original's records drew (refused: {refused_seeds(used)})",
            f"{'; '.join(reused)}. A replication tests a conclusion on populations it has never seen, "
            "so it cannot reuse the study's, its tuning's, its pilot's or its E0 check's",
        )


def _refuse_reused_training_seeds(body: dict, training_seeds: Sequence[int] | None) -> None:
    """Refuse fresh training seeds that are not two distinct seeds none of ``refused_training_seeds``."""
    if training_seeds is None:
        return
    for seed in training_seeds:
        require_seed(CALL, "--seeds", seed, hint="a training seed")
    refused = refused_training_seeds(body)
    if len(set(training_seeds)) != 2 or set(training_seeds) & set(refused):
        raise input_error(
            CALL,
            "--seeds",
            list(training_seeds),
            f"two different training seeds that neither the original, its pilot nor its tuning fitted (refused: "
            f"{refused})",
            "a replica on fresh training seeds shares no fit seed with the original, or its intervals would "
            "count a shared seed effect as independent",
        )


def _claim_checked(
    output: Path, files: dict[str, bytes], body: dict, sources: dict[str, dict], *, fresh: bool
) -> Path | None:
    """``_claim`` the design, then ``_check_design`` it; a refused design removes what this call wrote.

    Returns:
        ``_claim``'s answer: what a later refusal must remove (None: the design was already there).
    """
    written = _claim(output, files)
    try:
        _check_design(output / REPLICATION_DESIGN_DIR, body, sources, fresh=fresh)
    except QhError:
        if written is not None:
            shutil.rmtree(written, ignore_errors=True)
        raise
    return written


def _freeze_replica(replica: Any, executor: ExecutorChoice | None, console: Any) -> None:
    """Freeze the replica unless a previous run already did."""
    if not (replica.output / FREEZE_RECEIPT).exists():
        console.rule("[bold]replica: freeze")
        with contextlib.ExitStack() as stack:
            if executor is not None and executor.kind == "ray":  # labelling shares one connection
                stack.enter_context(JobRunner(executor, 1, call=CALL)).ray()
            replica.freeze()


def _refuse_stale_train(
    original: dict[str, Any], replica: Any, used: list[dict], written: Path | None, output: Path, train_seed: int
) -> None:
    """Refuse a frozen replica TRAIN that is no fresh draw of the original's design (``_drawn_anew``).

    Raises:
        QhInputError: naming every problem; what this call wrote (``written``) is removed first.
    """
    problems = _drawn_anew(
        original["freeze"],
        json.loads((replica.output / FREEZE_RECEIPT).read_text(encoding="utf-8"))["body"],
        used,
        original["development"]["validation"],
    )
    if problems:
        if written is not None:
            shutil.rmtree(written, ignore_errors=True)
        raise input_error(
            CALL,
            "--train-seed",
            train_seed,
            "a fresh TRAIN drawn by the original's generator and preset",
            f"{'; '.join(problems)}; "
            + ("nothing was kept" if written is not None else f"remove {output} and replicate with another seed"),
        )


def _checked_document(
    study: str | os.PathLike, output: Path, original: dict[str, Any], copy: dict[str, Any]
) -> dict[str, Any]:
    """The replication document, once the finished replica is shown to replicate the original.

    Raises:
        EvidenceError: the replica's validation shares scenes with the original's populations, reuses
            one of their populations or is not the original's design.
    """
    validation = {
        "path": copy["development"]["validation"]["path"],
        "manifest_sha256": copy["development"]["validation"]["manifest_sha256"],
    }
    shared = _shared_scenes(
        {"train": original["freeze"]["train"], "validation": original["development"]["validation"]},
        {"validation": validation},
        "validation",
    )
    if shared:
        raise EvidenceError(
            f"{CALL}: the replica at {output / REPLICATION_STUDY_DIR} is no replication of {study}: "
            f"{'; '.join(shared)}. HINT: its validation preset draws the same scenes whatever its seed; a "
            "replication needs fresh scenes."
        )
    document = replication_document(original, copy)
    if document["reused"] or not document["design"]["identical"]:
        raise EvidenceError(
            f"{CALL}: the replica at {output / REPLICATION_STUDY_DIR} is no replication of {study}: "
            f"{'; '.join(document['reused'] + document['design']['differences'])}. HINT: remove {output} and "
            "replicate again."
        )
    return document


def _publish_record(
    output: Path, files: dict[str, bytes], original: dict[str, Any], copy: dict[str, Any], document: dict[str, Any]
) -> None:
    """Publish ``replication.json`` and ``replication.md``, then their receipt binding both studies' records."""
    inputs = {
        f"{side}/{name}": path
        for side, d in (("original", original), ("replica", copy))
        for name, path in d["paths"].items()
    }
    inputs.update({f"design/{rel}": output / REPLICATION_DESIGN_DIR / rel for rel in files})
    outputs = {name: output / name for name in (REPLICATION_JSON, REPLICATION_MARKDOWN)}
    # The receipt is published last: a replication killed before it leaves these two unbound files,
    # which the next run replaces.
    for path in outputs.values():
        path.unlink(missing_ok=True)
    publish_json(outputs[REPLICATION_JSON], document)
    publish_bytes(outputs[REPLICATION_MARKDOWN], replication_markdown(document).encode("utf-8"))
    write_receipt(
        output / REPLICATION_RECEIPT,
        ReplicationReceipt,
        body={
            "study": document["study"],
            "original": document["original"],
            "replica": document["replica"],
            "agreement": document["agreement"],
            "sign_flips": document["sign_flips"],
            "changed_conclusions": document["changed_conclusions"],
        },
        inputs=inputs,
        outputs=outputs,
    )


def _finished(directory: Path, populations: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """A finished study, authenticated: its freeze and development bodies, report and their paths."""
    finished = finished_study(directory, CALL, populations=populations, development=True)
    return {
        "freeze": finished.frozen.receipt.body_record(),
        "sources": finished.sources,
        "development": finished.development,
        "report": finished.report,
        "paths": finished.paths,
    }


def _design_files(
    original: Path,
    body: dict,
    sources: dict[str, dict],
    train_seed: int,
    validation_seed: int,
    training_seeds: Sequence[int] | None = None,
) -> dict[str, bytes]:
    """The replica's design: ``{path below design/: bytes}``, its config and the original's frozen arm sources.

    The config is the original's copy with its paths made absolute as the freeze resolved them
    and the two population seeds replaced. Each user arm's frozen copy is written where the
    config's builder names it, relative to the config, so the replica freezes the very bytes the
    original did.

    Raises:
        QhInputError: a population named by path, a user environment changed since the original's
            freeze, or an arm source outside the original config's directory.
    """
    raw = tomllib.loads((original / STUDY_CONFIG_COPY).read_text(encoding="utf-8"))
    resolved = body["config"]["resolved"]
    for role in ("train", "validation"):
        if resolved[role].get("path") is not None:
            raise input_error(
                CALL,
                f"{role}.path",
                resolved[role]["path"],
                "a study whose populations are drawn from a preset and a seed",
                "a population named by its directory cannot be drawn again with another seed",
            )
    change = environment_source_change(body["train"].get("environment_source"))
    if change is not None:
        raise input_error(
            CALL,
            "environment",
            change,
            "the environment source the original's TRAIN was drawn with",
            "a replication draws its populations with the original's environment; restore its source",
        )
    for fields in (*STUDY_PATH_FIELDS, *STUDY_PRESET_FIELDS):
        section = raw
        for key in fields[:-1]:
            section = section.get(key) if isinstance(section, dict) else None
        if isinstance(section, dict) and isinstance(section.get(fields[-1]), str):
            value = resolved
            for key in fields:
                value = value[key]
            if fields == ("experiment", "recipe"):  # read from a file: the file, as the freeze read it
                value = resolved["experiment"]["recipe_file"]
            section[fields[-1]] = value
    raw["train"]["seed"], raw["validation"]["seed"] = train_seed, validation_seed
    changed = "train.seed and validation.seed"
    if training_seeds is not None:
        raw["seeds"] = list(training_seeds)
        # The E0 check ran the gate on the original's first seed: it is no check of this one's.
        (raw.get("preparation") or {}).pop("e0", None)
        changed = "train.seed, validation.seed and seeds changed, and preparation.e0 dropped"
    else:
        changed += " changed"
    header = (
        f"# The frozen design of study {body['study']!r} ({original.resolve()}) on a fresh population pair,\n"
        f"# written by `{CALL}`: the original's config with only {changed}.\n"
    )
    files = {REPLICATION_CONFIG: (header + tomli_w.dumps(raw)).encode("utf-8")}
    base = Path(body["config"]["source_path"]).parent
    for arm, record in sources.items():
        if record["kind"] == "installed":
            continue  # imported from the installed package, whose digest the design check compares
        source = Path(record["original"])
        if Path(record["builder"].split(":")[0]).is_absolute() or source == base:
            raise input_error(
                CALL,
                f"arm {arm} builder",
                record["builder"],
                "a builder that names its file or package relative to the config, in a directory below it",
                "a replication writes the original's frozen copy where a relative builder names it; an absolute "
                "path, or a config inside the arm's own package, would import the user's live files instead",
            )
        if not source.is_relative_to(base):
            raise input_error(
                CALL,
                f"arm {arm} builder",
                record["builder"],
                f"a source beside or below the original's config directory {base}",
                "a replication writes the original's frozen copy where the builder names it, relative to the config",
            )
        for rel in record["files"]:
            files[(source.relative_to(base).parent / rel).as_posix()] = (original / FAMILY_DIR / arm / rel).read_bytes()
    return files


def _claim(output: Path, files: dict[str, bytes]) -> Path | None:
    """Write the design below a new or empty ``output``, or accept the same design there (a resumed
    replication: the same config, whatever its header comment says of the original's path, and the
    same arm sources).

    Returns:
        What a refusal must remove: ``output`` when this call created it, ``output/design`` when
        it wrote the design into an empty ``output``, None when the design was already there.

    Raises:
        QhInputError: ``output`` holds anything else (another replication's design included).
    """
    design = output / REPLICATION_DESIGN_DIR
    if design.is_dir():
        differing = [rel for rel, data in files.items() if not _same_file(design / rel, data)]
        if differing:
            raise input_error(
                CALL,
                "--output",
                str(output),
                "a new or empty directory, or a replication of the same study and seeds to resume",
                f"{output} holds the design of another replication ({', '.join(differing)} differ); "
                "choose a new --output",
            )
        return None
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise input_error(
            CALL, "--output", str(output), "a new or empty directory", "a replication is written into its own directory"
        )
    written = design if output.exists() else output
    for rel, data in files.items():
        (design / rel).parent.mkdir(parents=True, exist_ok=True)
        publish_bytes(design / rel, data)
    return written


def _steps_the_original_again(body: dict) -> None:
    """Step a sample of the original TRAIN's chain states again in this process, through the frozen
    environment: an environment that reads its surroundings (an environment variable, a file) and so
    steps differently here than where the original ran would give the replica other physics.

    Raises:
        EvidenceError: a stepped state, feature, reward or label is not the original's.
    """
    path = locate_population(body["train"]["path"], body["train"]["manifest_sha256"])
    try:
        audit_population(path, call=CALL)
    except EvidenceError as exc:
        raise EvidenceError(
            f"{CALL}: the original TRAIN {path} does not step the same in this process ({exc}). HINT: the "
            "environment depends on something outside its frozen source (an environment variable, a file, the "
            "working directory); a replica run here would not run the original's physics. Set it as the "
            "original had it, or freeze the dependence into the environment's options."
        ) from None


def _scene_contents(path: Path) -> set[str]:
    return set(scene_content_digests(path).values())


def _shared_scenes(original: dict, replica: dict, role: str) -> list[str]:
    """The original's populations whose scenes (by physical content) the replica's ``role``
    population holds: a fixed level that ignores its seed gives a replica the original's scenes."""
    ours = locate_population(replica[role]["path"], replica[role]["manifest_sha256"])
    theirs = {
        "TRAIN": locate_population(original["train"]["path"], original["train"]["manifest_sha256"]),
    }
    if "validation" in original and original["validation"].get("path"):
        theirs["validation"] = locate_population(
            original["validation"]["path"], original["validation"]["manifest_sha256"]
        )
    mine = _scene_contents(ours)
    found = []
    for name, path in theirs.items():
        shared = mine & _scene_contents(path)
        if shared:
            scenes = f"{len(shared)} scene{'s' if len(shared) != 1 else ''}"
            found.append(f"the replica's {role} shares {scenes} with the original's {name} (by content)")
    return found


def _drawn_anew(original: dict, replica: dict, used: list[dict], validation: dict) -> list[str]:
    """Why the replica's frozen TRAIN is no fresh draw of the original's design (empty: it is): a
    manifest some original record drew, or a generator (environment, preset, actor) that is not the
    original TRAIN's, seed aside (an edited preset file would draw from another distribution)."""
    drawn = {"manifest_sha256": replica["train"]["manifest_sha256"], "seed": replica["train"]["declared"].get("seed")}
    problems = reused_populations(used, {"train": drawn})
    generators = []
    for body in (original, replica):
        path = locate_population(body["train"]["path"], body["train"]["manifest_sha256"])
        generators.append({k: v for k, v in read_manifest(path)["generator"].items() if k != "seed"})
    problems += [f"TRAIN generator {d}" for d in design_differences(generators[0], generators[1])]
    return problems + _shared_scenes({"train": original["train"], "validation": validation}, replica, "train")


def _same_file(path: Path, data: bytes) -> bool:
    """``path`` holds ``data``; the config compares as TOML (its header names the original's path)."""
    if not path.is_file():
        return False
    if path.name != REPLICATION_CONFIG:
        return path.read_bytes() == data
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")) == tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def _check_design(design: Path, body: dict, sources: dict[str, dict], *, fresh: bool) -> None:
    """Refuse a replica config or arm source that is not the original's design (before anything runs).

    Raises:
        QhInputError: naming every differing field, or the arm whose source differs.
    """
    config, _, _ = read_study_config(design / REPLICATION_CONFIG)
    ours = study_design(
        {**body, "config": {**body["config"], "resolved": config.model_dump(mode="json")}}, training_seeds=not fresh
    )
    differences = design_differences(study_design(body, training_seeds=not fresh)["config"], ours["config"])
    now = user_source_digests(config, design)
    differences += [
        f"arm {arm} source (original: {record['sha256']}, replica: {now.get(arm)})"
        for arm, record in sources.items()
        if now.get(arm) != record["sha256"]
    ]
    if differences:
        raise input_error(
            CALL,
            "design",
            "; ".join(differences),
            "the original's frozen design, with only train.seed and validation.seed changed",
            "the original's recipe, preparation records or installed arm packages changed since it was frozen; "
            "restore them to replicate it",
        )
