"""Where evidence lives: every file and directory name that qhlab publishes, spelled once.

Owns: the names of a population directory, of a fit's attempt directory, of a study directory
(and the name of a cell and the paths derived from it), of the preparation records (a tuning,
a pilot, an E0 check), of a lane comparison and of a replication. Every module that writes or reads one of these
files takes its name from here, so a name is spelled in one place and a reader never imports
the (torch-heavy) writer to learn it. Does not own: what the files hold (their writers and
their record models) or reading and writing them (``receipts``, ``publish``).
"""

from __future__ import annotations

from pathlib import Path

from qhlab.evidence.publish import safe_component

__all__ = [
    "BENCHMARK_DIR",
    "CANARY_DIR",
    "CANARY_ROLES",
    "CELLS_DIR",
    "CELL_RECEIPT",
    "COLD_INIT_RECEIPT",
    "COLD_INIT_STATE",
    "COLD_INIT_STRUCTURE",
    "COMMISSION_RECEIPT",
    "CONTINUATION_FILE",
    "DEVELOPMENT_RECEIPT",
    "DOCUMENT_SCHEMA_VERSION",
    "E0_CHECK_RECEIPT",
    "E0_CHECK_RECORD",
    "E0_CHECK_STUDIES_DIR",
    "E0_RECEIPT",
    "EVALUATION_RECEIPT",
    "FAMILY_DIR",
    "FINAL_STATE",
    "FIT_LOG",
    "FIT_RECEIPT",
    "FREEZE_LOCK",
    "FREEZE_RECEIPT",
    "GENERATION_RECEIPT",
    "LANES_FIGURE",
    "LANES_JSON",
    "LANES_MARKDOWN",
    "LANES_RECEIPT",
    "MANIFEST",
    "MPS_MEMORY_RECEIPT",
    "PILOT_RECEIPT",
    "PILOT_RECORD",
    "PLAN_MARKDOWN",
    "PLAN_RECEIPT",
    "PLAN_RECORD",
    "POPULATION_ENVIRONMENT_DIR",
    "POPULATION_FILES",
    "POPULATION_RECEIPT",
    "PREPARATION_DIR",
    "PREPARATION_FITS_DIR",
    "RECEIPT_SUFFIX",
    "RECORD_CONFIG_COPY",
    "REPLICATION_CONFIG",
    "REPLICATION_DESIGN_DIR",
    "REPLICATION_JSON",
    "REPLICATION_MARKDOWN",
    "REPLICATION_RECEIPT",
    "REPLICATION_STUDY_DIR",
    "REPORT_DIR",
    "REPORT_JSON",
    "REPORT_LOCK",
    "REPORT_MARKDOWN",
    "REPORT_RECEIPT",
    "REPORT_SCHEMA_VERSION",
    "RUN_LOCK",
    "SELECTION_FILE",
    "SIGNATURE_FILE",
    "STUDY_CALL",
    "STUDY_CONFIG_COPY",
    "TUNING_RECEIPT",
    "TUNING_RECIPE",
    "TUNING_RECORD",
    "TUNING_TRIALS_DB",
    "WANDB_RECEIPT",
    "WANDB_REPORT_DIR",
    "benchmark_receipt_path",
    "cell_lock_path",
    "cell_name",
    "cell_receipt_path",
]

RECEIPT_SUFFIX = ".receipt.json"

# A population directory (``qhlab.scenes``): the manifest, its receipt, the three tables and the
# generation record (which executor labelled it; not part of its identity).
MANIFEST = "manifest.json"
POPULATION_RECEIPT = "population.receipt.json"
POPULATION_FILES = ("scenes.parquet", "states.parquet", "candidates.parquet")
GENERATION_RECEIPT = "generation.receipt.json"
# A user environment's frozen source inside its population: environment/<file or package>.
POPULATION_ENVIRONMENT_DIR = "environment"

# A fit's attempt directory (``qhlab.training``, ``qhlab.finite_horizon.fit``).
COLD_INIT_STATE = "cold_init.safetensors"
COLD_INIT_STRUCTURE = "cold_init.json"
COLD_INIT_RECEIPT = "cold_init.receipt.json"
FINAL_STATE = "final_state.safetensors"
FIT_RECEIPT = "fit.receipt.json"
WANDB_RECEIPT = "wandb_attempt.receipt.json"
CONTINUATION_FILE = "continuation.json"
EVALUATION_RECEIPT = "evaluation.receipt.json"
FIT_LOG = "fit.log"
# ``qhlab commission``'s run receipt and the MPS memory guard's observation.
COMMISSION_RECEIPT = "commission.receipt.json"
MPS_MEMORY_RECEIPT = "mps_memory_observation.receipt.json"

# A study directory.
# The layout version of the study's own JSON documents (selection.json, lanes.json, replication.json);
# each receipt carries its kind's version.
DOCUMENT_SCHEMA_VERSION = 1
# report.json's layout version (``qhlab.report.document``): 2 since its decisions speak one
# vocabulary and its intervals carry each comparison's own pilot components.
REPORT_SCHEMA_VERSION = 2
# The call named in messages that belong to the study as a whole rather than to one step.
STUDY_CALL = "architecture_study"
CANARY_ROLES = ("e0",)
STUDY_CONFIG_COPY = "study-config.toml"
# The frozen copies of user arms' sources: family/<arm>/<file or package>.
FAMILY_DIR = "family"
FREEZE_RECEIPT = "freeze.receipt.json"
# Held while a step that publishes once per study runs: a second freeze or report exits 3.
FREEZE_LOCK = ".study-freeze.lock"
# Held by `qhlab study run` for its whole run: a second run of the same study is refused at its start.
RUN_LOCK = ".study-run.lock"
REPORT_LOCK = ".study-report.lock"
# The preparation records a study binds, copied in by its freeze: preparation/<kind>/...
PREPARATION_DIR = "preparation"
CANARY_DIR = "canaries"
SELECTION_FILE = "selection.json"
E0_RECEIPT = "e0.receipt.json"
DEVELOPMENT_RECEIPT = "development.receipt.json"
CELLS_DIR = "cells"
CELL_RECEIPT = "cell.receipt.json"
BENCHMARK_DIR = "benchmarks"
REPORT_DIR = "report"
REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"
REPORT_RECEIPT = "report.receipt.json"
# The study's W&B report run (``qhlab.report.wandb_run``): offline runs go under it, bound by no receipt.
WANDB_REPORT_DIR = "wandb-report"
# A signed directory's signature (``qhlab sign``): DIR/model.sig, never part of what it signs.
SIGNATURE_FILE = "model.sig"

# A preparation record's directory: the copy of the config it ran, its fits or sub-studies, its
# record and the receipt binding them.
RECORD_CONFIG_COPY = "config.toml"
PREPARATION_FITS_DIR = "fits"
TUNING_RECORD = "tuning.json"
TUNING_RECEIPT = "tuning.receipt.json"
TUNING_RECIPE = "recipe.toml"
TUNING_TRIALS_DB = "trials.db"
PILOT_RECORD = "pilot.json"
PILOT_RECEIPT = "pilot.receipt.json"
# A power plan's record and receipt (``qhlab plan``).
PLAN_RECORD = "plan.json"
PLAN_RECEIPT = "plan.receipt.json"
PLAN_MARKDOWN = "plan.md"
E0_CHECK_RECORD = "e0.json"
E0_CHECK_RECEIPT = "e0.receipt.json"
E0_CHECK_STUDIES_DIR = "studies"

# A lane comparison's write-once directory.
LANES_JSON = "lanes.json"
LANES_MARKDOWN = "lanes.md"
LANES_FIGURE = "lanes.png"
LANES_RECEIPT = "lanes.receipt.json"

# A replication's directory: the design it froze (the config and the original's frozen arm
# sources), the replica study, and the replication record beside them (the receipt last).
REPLICATION_DESIGN_DIR = "design"
REPLICATION_CONFIG = "replication-config.toml"
REPLICATION_STUDY_DIR = "study"
REPLICATION_JSON = "replication.json"
REPLICATION_MARKDOWN = "replication.md"
REPLICATION_RECEIPT = "replication.receipt.json"


def cell_name(arm: str, seed: int, canary_role: str | None = None) -> str:
    """The directory name of one cell: ``<arm>-s<seed>``, or ``<role>-<arm>-s<seed>`` for a canary.

    Raises:
        QhInputError: the name is not one safe path component.
    """
    name = f"{arm}-s{seed}" if canary_role is None else f"{canary_role}-{arm}-s{seed}"
    return safe_component(name, field="cell", call=STUDY_CALL)


def cell_receipt_path(output: Path, arm: str, seed: int) -> Path:
    """``OUTPUT/cells/<arm>-s<seed>/cell.receipt.json``: the final receipt of a broad cell."""
    return Path(output) / CELLS_DIR / cell_name(arm, seed) / CELL_RECEIPT


def cell_lock_path(parent: Path, cell: str) -> Path:
    """``<parent>/.<cell>.lock``: held around a whole cell."""
    return Path(parent) / f".{cell}.lock"


def benchmark_receipt_path(output: Path, arm: str, seed: int) -> Path:
    """``OUTPUT/benchmarks/<arm>-s<seed>.receipt.json``: the benchmark receipt of a broad cell."""
    return Path(output) / BENCHMARK_DIR / f"{cell_name(arm, seed)}{RECEIPT_SUFFIX}"
