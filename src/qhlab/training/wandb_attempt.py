"""Every W&B run qhlab makes, from its identity to its close: the one module that imports wandb.

Owns: ``WandbAttempt`` (run id, resume/offline mode, logical run, local segment id), the
fresh local output directory of an attempt, its host-local writer lock, a fit's run config
(``fit_run_config``), its ``WandbLogger`` (``wandb_logger``) and closing it
(``finish_wandb_run``), ``publish_wandb_attempt`` (online summary + artifact, or the closing
record of an offline segment) with its ``wandb_attempt`` receipt, ``drop_wandb_links``: a
finished run's W&B directory holds no symbolic link, so a published directory can be signed,
``quiet_wandb_settings``, the settings of every W&B run qhlab starts, ``teardown_wandb`` (a
process that hands its runs' files on stops wandb-core first) and ``log_mirror_run``, a run
that mirrors published files (the study report's).

Does not own: when a run starts or ends (``qhlab.training.launcher``, the report's
``qhlab.report.wandb_run``), execution lanes (``qhlab.training.profiles``), or receipts, locks
and safe path components (``qhlab.evidence``). The public API
``qhlab.training.execution_profile`` re-exports ``WandbAttempt`` and ``publish_wandb_attempt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from qhlab import __version__
from qhlab.evidence import (
    MissingEvidenceError,
    PublishConflictError,
    QhError,
    QhInputError,
    exclusive_lock,
    input_error,
    require_instance,
    require_number,
    safe_component,
    sha256_file,
    write_receipt,
)
from qhlab.training.records import WandbAttemptReceipt

__all__ = [
    "WandbAttempt",
    "drop_wandb_links",
    "finish_wandb_run",
    "fit_run_config",
    "log_mirror_run",
    "publish_wandb_attempt",
    "quiet_wandb_settings",
    "teardown_wandb",
    "wandb_logger",
    "writer_lock_path",
]

_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_WANDB_RESERVED_KEYS = ("id", "version", "resume", "mode", "group", "offline")


def _check_id(field: str, value: Any) -> None:
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise input_error(
            "WandbAttempt",
            field,
            value,
            "1 to 64 characters from [A-Za-z0-9_-]",
            "W&B run ids and local directory names share this charset.",
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
                raise input_error(
                    "WandbAttempt", field, getattr(self, field), "True or False", "pass a bool, not a string or number."
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
            raise input_error(
                "WandbAttempt",
                "local_attempt_id",
                None,
                "a new unique id when resume=True",
                "the resumed segment publishes into its own local directory.",
            )
        if self.resume and self.local_attempt_id == self.run_id:
            raise input_error(
                "WandbAttempt",
                "local_attempt_id",
                self.local_attempt_id,
                "an id different from run_id when resuming",
                "run_id names the original attempt's directory.",
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
            raise input_error(
                "WandbAttempt.apply",
                "config",
                type(config).__name__,
                "a mapping of WandbLogger keyword arguments",
                "pass e.g. {'project': 'qhlab'}.",
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
        lock_path = writer_lock_path(output_root, self.logical_run_id)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(lock_path):
            yield lock_path


def writer_lock_path(output_root: str | Path, logical_run_id: str) -> Path:
    """The host-local writer lock file of one logical run: ``output_root/.locks/<id>.lock``."""
    return Path(output_root) / ".locks" / f"{logical_run_id}.lock"


def _finite_metrics(metrics: Any) -> dict[str, float]:
    call = "publish_wandb_attempt"
    require_instance(call, "metrics", metrics, Mapping, allowed="a mapping name -> number", hint="pass a dict.")
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise input_error(call, "metric name", key, "a non-empty string", "name every metric.")
        clean[key] = require_number(
            call, f"metrics[{key!r}]", value, hint="a diverged fit is reported as a failure, not published."
        )
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
    require_instance(call, "attempt", attempt, WandbAttempt, hint="pass the fit's attempt.")
    result_path = _new_receipt_path(call, result_path)
    paths = _published_files(call, files)
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
        publication = _offline_publication(call, run, clean_metrics)
    else:
        publication = _online_publication(call, wandb, attempt, run, clean_metrics, digests, paths)
    body = {
        "attempt": attempt.evidence(),
        "files": digests,
        "metrics": clean_metrics,
        "links": {"logical_run_id": attempt.logical_run_id},
        "publication": publication,
    }
    write_receipt(
        result_path,
        WandbAttemptReceipt,
        body=body,
        inputs=paths,
        outputs=None,
    )
    return body


def _new_receipt_path(call: str, result_path: Path) -> Path:
    """``result_path`` as a Path, refused unless it is a new ``*.receipt.json`` (receipts are write-once)."""
    result_path = Path(result_path)
    if not result_path.name.endswith(".receipt.json"):
        raise input_error(
            call,
            "result_path",
            str(result_path),
            "a name ending in '.receipt.json'",
            "`qhlab verify` authenticates *.receipt.json files.",
        )
    if result_path.exists():
        raise input_error(
            call,
            "result_path",
            str(result_path),
            "a new path (write-once)",
            "it already exists.",
            error=PublishConflictError,
        )
    return result_path


def _published_files(call: str, files: Any) -> dict[str, Path]:
    """The files to publish as name -> Path, refused unless every name is a safe component and
    every path an existing file."""
    if not isinstance(files, Mapping) or not files:
        raise input_error(call, "files", files, "a non-empty mapping name -> file path", "bind the published files.")
    paths: dict[str, Path] = {}
    for name, path in files.items():
        safe_component(name, field="files key", call=call)
        if not Path(path).is_file():
            raise MissingEvidenceError(f"{call}: files[{name!r}]={str(path)!r} does not exist or is not a file.")
        paths[name] = Path(path)
    return paths


def _offline_publication(call: str, run: Any, clean_metrics: dict[str, float]) -> dict[str, Any]:
    """Close an offline segment: the active offline run (if any) gets the summary; nothing goes
    to the cloud. Returns the receipt's ``publication``."""
    local_run = None
    if run is not None:
        if not run.offline:
            raise QhInputError(f"{call}: the active wandb run {run.id!r} is online but attempt.offline=True.")
        run.summary.update(clean_metrics)
        local_run = {"id": run.id, "dir": str(run.dir)}
    return {
        "status": "closed offline segment",
        "cloud_publication": "not published (offline segment)",
        "local_wandb_run": local_run,
        "sync_note": "`wandb sync` may upload it later as a new run in group logical_run_id",
    }


def _online_publication(
    call: str,
    wandb: Any,
    attempt: WandbAttempt,
    run: Any,
    clean_metrics: dict[str, float],
    digests: dict[str, str],
    paths: dict[str, Path],
) -> dict[str, Any]:
    """Publish to the active online run: its summary, then one artifact holding the files.

    ``wandb`` is the module the caller imported lazily. Returns the receipt's ``publication``.
    """
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
    return {
        "status": "published online",
        "cloud_publication": "summary updated and artifact logged to the online run",
        "artifact": {"name": artifact_name, "type": "qhlab-attempt"},
        "run": {"id": run.id, "project": run.project, "entity": run.entity, "url": run.url},
    }


def quiet_wandb_settings() -> Any:
    """The ``wandb.Settings`` of every run qhlab starts: no console capture, git, code, system
    statistics or machine metadata, and no symbolic links (a published or signed directory holds
    none; model signing refuses them)."""
    # Lazy: wandb costs a second to import; this module's other users never start a run.
    import wandb

    return wandb.Settings(
        console="off",
        disable_git=True,
        save_code=False,
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        silent=True,
        symlink=False,
    )


def drop_wandb_links(wandb_dir: str | os.PathLike) -> list[str]:
    """Remove every symbolic link below a run's W&B directory; return what was removed.

    Called once the run has started (so a killed fit leaves no link) and again after the run
    finished (``run.finish()``), before the directory is published.
    wandb 0.31 leaves, at run start, ``wandb/latest-run``, ``wandb/debug.log`` and
    ``wandb/debug-internal.log`` (links into the run's own directory; qhlab also turns them
    off with ``Settings(symlink=False)``) and, from wandb-core, ``<run>/logs/debug-core.log``,
    an absolute link to ``~/.cache/wandb/logs/core-debug-<time>.log``. OpenSSF model signing
    refuses links, and a link to a file outside the directory is not evidence of it.

    Every link is dropped, not replaced by a copy of its target: a link into the run only
    duplicates a real file that stays (the run's ``.wandb`` file, ``files/``, ``logs/debug*.log``
    are never touched), and ``debug-core.log`` is the wandb-core service's log, shared by every
    run of the process (all cells of a study), still appended after ``finish()`` returns: a
    copy would be a partial snapshot mixing other attempts' lines into this one's evidence. The
    service log itself stays at its path for debugging. Nothing a receipt binds is a link.

    Args:
        wandb_dir: the run's W&B directory (``<attempt>/wandb``, or a report run's directory);
            a missing directory (no run was started) removes nothing.

    Returns:
        The removed links as ``"<path relative to wandb_dir> -> <target>"``, sorted.
    """
    root = Path(wandb_dir)
    dropped: list[str] = []
    # os.walk does not follow links: a linked directory (latest-run) is listed, never entered.
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                target = os.readlink(path)
                path.unlink()
                dropped.append(f"{path.relative_to(root).as_posix()} -> {target}")
        dirnames[:] = [name for name in dirnames if (Path(dirpath) / name).is_dir()]
    return sorted(dropped)


# --------------------------------------------------------------------------------- runs, opened to closed


def fit_run_config(
    recipe: Mapping[str, Any], cell: str, lane: str, runtime: Mapping[str, Any], populations: Mapping[str, Any]
) -> dict[str, Any]:
    """A fit's W&B run config: everything a researcher filters and compares runs by.

    Args:
        recipe: the applied recipe as JSON.
        cell: the cell name.
        lane: the execution profile's name.
        runtime: the admitted runtime evidence (``device_type``, ``precision``, ``device``,
            ``versions``, ``execution_policy_source``).
        populations: ``{"train"|"validation": {"name", "manifest_sha256"}}``.
    """
    return {
        "recipe": dict(recipe),
        "cell": cell,
        "lane": {
            "name": lane,
            "device_type": runtime.get("device_type"),
            "precision": runtime.get("precision"),
            "device": runtime.get("device"),
            "versions": runtime.get("versions"),
            "execution_policy_sha256": (runtime.get("execution_policy_source") or {}).get("sha256"),
        },
        "populations": dict(populations),
        "qhlab": {"version": __version__},  # the launcher adds the source digest it binds
    }


def wandb_logger(
    attempt: Any,
    directory: Path,
    *,
    project: str = "qhlab",
    config: Mapping | None = None,
    job_type: str | None = None,
    tags: Sequence[str] = (),
    group: str | None = None,
) -> Any:
    """A ``WandbLogger`` for one attempt, writing under ``directory/wandb``.

    Offline attempts never touch the network (``mode="offline"``, silent, no code, git,
    stats or machine-info capture: they also cost start-up time). W&B's convenience links
    (``latest-run``, ``debug.log``) are not made (``symlink=False``); the one wandb-core makes
    anyway is dropped as soon as the run starts (``drop_wandb_links``). Each offline segment is
    a new run ``attempt.run_id`` grouped by ``attempt.logical_run_id`` unless ``group``
    names another group (e.g. the study, so its cells group together in the W&B UI).
    """
    from lightning.pytorch.loggers import WandbLogger

    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")
    settings = quiet_wandb_settings()
    # mode comes from attempt.apply; WandbLogger(offline=True) would set WANDB_MODE process-wide.
    init = attempt.apply({"project": project})
    if group is not None:
        init["group"] = group
    logger = WandbLogger(
        save_dir=str(directory),
        settings=settings,
        config=dict(config or {}),
        name=attempt.resolved_local_attempt_id,
        log_model=False,
        job_type=job_type,
        tags=list(tags) or None,
        **init,
    )
    # Lightning passes anonymous=None explicitly; wandb 0.31 warns about any explicit value
    # ("The anonymous setting has no effect"), so leave the deprecated key out at the source.
    getattr(logger, "_wandb_init", {}).pop("anonymous", None)
    return logger


def finish_wandb_run(logger: Any, directory: Path, *, exit_code: int) -> None:
    """Close the attempt's W&B run, then drop the links it left in ``directory/wandb``.

    Every end of a segment comes here (published, refused, interrupted): each leaves a
    directory that may be verified, signed or resumed from, so each is left without links.
    The links are dropped only after ``finish()``: wandb-core makes ``debug-core.log`` when the
    run starts, and the run's own files (``.wandb``, ``files/``, ``logs/``) are not touched.
    """
    experiment = getattr(logger, "_experiment", None)
    if experiment is not None:
        with contextlib.suppress(Exception):
            experiment.finish(exit_code=exit_code)
    # WandbLogger(save_dir=directory) makes wandb write under directory/wandb.
    drop_wandb_links(Path(directory) / "wandb")


def teardown_wandb() -> None:
    """Stop this process's wandb-core service: it appends to offline run files after ``finish()``,
    so a process that hands its runs' files on (a Ray worker) stops it first, and the files are whole."""
    # Lazy: wandb costs a second to import.
    import wandb

    wandb.teardown()


def log_mirror_run(
    run_dir: Path,
    *,
    init: Mapping[str, Any],
    tables: Mapping[str, tuple[list, list]],
    images: Mapping[str, Path],
    summary: Mapping[str, Any],
    artifact: Mapping[str, Any] | None,
    offline: bool,
) -> None:
    """One W&B run that mirrors published files: its tables, images and summary, and when online an
    artifact; closed, then left without links (``drop_wandb_links``).

    Args:
        run_dir: the run's directory (made by the caller).
        init: ``wandb.init`` keywords besides ``dir``, ``mode`` and ``settings`` (``quiet_wandb_settings``).
        tables: ``{key: (columns, rows)}``, each logged as a ``wandb.Table``.
        images: ``{key: PNG path}``, each logged as a ``wandb.Image``.
        summary: the run summary's values.
        artifact: online only: ``{"name", "type", "metadata", "directory"}``, the directory logged whole.
        offline: offline (no account, no network) or online.
    """
    # Lazy: wandb costs a second to import.
    import wandb

    run = wandb.init(**init, dir=str(run_dir), mode="offline" if offline else "online", settings=quiet_wandb_settings())
    try:
        for key, (columns, rows) in tables.items():
            run.log({key: wandb.Table(columns=columns, data=rows)})
        for key, path in images.items():
            run.log({key: wandb.Image(str(path))})
        run.summary.update(dict(summary))
        if artifact is not None and not offline:
            logged = wandb.Artifact(artifact["name"], type=artifact["type"], metadata=artifact["metadata"])
            logged.add_dir(str(artifact["directory"]))
            run.log_artifact(logged)
    finally:
        run.finish()
        # After finish: wandb-core's debug-core.log link (outside the run's directory) is made at run start.
        drop_wandb_links(run_dir)
