"""The study's W&B "report" run: the report's tables and figures where researchers look.

Owns: ``log_report_run(output, *, offline=True)``: after the report step, one W&B run (job
type ``report``, grouped with the study's canaries and cells under the study's name) logs
every table of the authenticated ``report.json`` as a ``wandb.Table`` and both figures as
``wandb.Image``s, puts the headline in the run summary, and, when online, logs the report
directory as an artifact whose metadata carries the report receipt's SHA-256 and the
digest of every file the receipt binds. Offline runs go under ``OUTPUT/wandb-report/`` and
stay syncable later with ``wandb sync``; like a fit attempt's, the run's directory is left
without symbolic links (``drop_wandb_links``), so the study directory can be signed. Does
not own: the report itself (``report``), or deciding anything: the run only mirrors
authenticated files.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from qhlab.evidence import canonical_json, read_receipt, sha256_file
from qhlab.finite_horizon.studies.architecture.layout import (
    REPORT_DIR,
    REPORT_RECEIPT,
    SCHEMA_VERSION,
)
from qhlab.finite_horizon.studies.architecture.seed_aware import seed_aware_tables
from qhlab.training.wandb_attempt import drop_wandb_links

__all__ = ["REPORT_RUN_DIR", "log_report_run", "report_tables"]

REPORT_RUN_DIR = "wandb-report"
"""Where the report run's offline W&B files go, beside report/ (never inside it: report/ is
published whole and bound by its receipt)."""


def report_tables(report: dict) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """The report's tables as (columns, rows), exactly the numbers of ``report.json``.

    Args:
        report: the parsed ``report.json``.

    Returns:
        {"cells", "references", "paired", "retention", "replication", "verdicts"}: columns and
        rows of each table.
    """
    h = int(report["horizon"])
    horizons = range(1, h + 1)
    cells = [[c["arm"], c["seed"], c["role"], *c["mae"], *c["regret"], c["observed_updates"]]
             for c in report["cells"]]
    references = [[name, r["label"], bool(r["oracle"]), *r["regret"],
                   *[p["interval"]["estimate"] for p in r["paired"]]]
                  for name, r in sorted(report["references"].items())]
    paired = [[p["arm"], p["against"], p["relation"], p["seed"], p["metric"], p["interval"]["estimate"],
               p["interval"]["low"], p["interval"]["high"]] for p in report["paired"]]
    retention = [[r["variant"], seed, d["retained"], d["label"]]
                 for r in report["retention"] for seed, d in sorted(r["per_seed"].items())]
    seeds = [p["seed"] for p in next(iter(report["references"].values()))["paired"]]
    return {
        "cells": (["arm", "seed", "role", *(f"mae_{i}" for i in horizons), *(f"regret_{i}" for i in horizons),
                   "observed_updates"], cells),
        "references": (["reference", "label", "oracle", *(f"regret_{i}" for i in horizons),
                        *(f"baseline_minus_reference_s{s}" for s in seeds)], references),
        "paired": (["arm", "against", "relation", "seed", "metric", "difference", "low", "high"], paired),
        "retention": (["variant", "seed", "retained", "label"], retention),
        **seed_aware_tables(report),
    }


def log_report_run(output: str | os.PathLike, *, offline: bool = True) -> Path:
    """Log one W&B run mirroring the study's authenticated report.

    Args:
        output: the study output directory (its report step has finished).
        offline: offline (default: no account, no network) or online.

    Returns:
        The directory holding the run's W&B files.

    Raises:
        EvidenceError: the report receipt or a file it binds does not authenticate.
    """
    import json

    import wandb

    from qhlab.evidence import authentication_roots
    from qhlab.finite_horizon.studies.architecture.authentication import recorded_output

    output = Path(output)
    report_dir = output / REPORT_DIR
    with authentication_roots(output, original=recorded_output(output)):  # the study's own bytes
        receipt = read_receipt(report_dir / REPORT_RECEIPT, kind="study_report", schema_version=SCHEMA_VERSION)
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    if canonical_json(report["summary"]) != canonical_json(receipt["body"]["summary"]):
        from qhlab.evidence import EvidenceError

        raise EvidenceError(f"log_report_run: {report_dir / 'report.json'} does not match its receipt's summary.")
    study = str(report["study"])
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run_dir = output / REPORT_RUN_DIR / f"{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True)
    # symlink=False: no latest-run/debug.log links (a signed study directory holds no link).
    settings = wandb.Settings(console="off", disable_git=True, save_code=False, x_disable_stats=True,
                              x_disable_meta=True, x_disable_machine_info=True, silent=True, symlink=False)
    run = wandb.init(
        project="qhlab", id=f"{study[:40]}-report-{run_dir.name}", name=f"{study} report", group=study,
        job_type="report", tags=["report"], dir=str(run_dir), mode="offline" if offline else "online",
        config={"study": study, "horizon": report["horizon"], "seeds": report["seeds"],
                "profile": report["profile"], "thresholds": report["thresholds"],
                "report_receipt_sha256": sha256_file(report_dir / REPORT_RECEIPT)},
        settings=settings,
    )
    try:
        for name, (columns, rows) in report_tables(report).items():
            run.log({f"report/{name}": wandb.Table(columns=columns, data=rows)})
        for figure in ("arms.png", "paired_differences.png"):
            if (report_dir / figure).is_file():
                run.log({f"report/{figure.removesuffix('.png')}": wandb.Image(str(report_dir / figure))})
        run.summary.update({"headline": report["headline"]["text"],
                            "beats_best_heuristic_every_seed": report["headline"]["beats_every_seed"],
                            "n_scenes": report["n_scenes"]})
        if not offline:
            artifact = wandb.Artifact(f"{study}-report", type="report", metadata={
                "report_receipt_sha256": sha256_file(report_dir / REPORT_RECEIPT),
                "outputs_sha256": {k: v["sha256"] for k, v in receipt["outputs"].items()},
            })
            artifact.add_dir(str(report_dir))
            run.log_artifact(artifact)
    finally:
        run.finish()
        # After finish: wandb-core's debug-core.log link (outside the study) is made at run start.
        drop_wandb_links(run_dir)
    return run_dir
