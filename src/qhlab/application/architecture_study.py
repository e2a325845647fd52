"""Run a frozen, paired architecture development study: the study application's entry point.

Owns: the path-based step functions (``freeze_study``, ``admit_canaries``,
``prepare_development``, ``run_fit``, ``report_study``: each one call of a ``qhlab.study.Study``,
opened with its report step by ``qhlab.report.open_study``)
and ``main``, which runs ``qhlab study``'s own command rows (``qhlab.cli.study``): this module
is the seed API's face over the whole package, above the command line, and dispatches nothing of
its own. ``QhArchitectureStudyConfig`` (``qhlab.design.study_config``, below the pipeline so
that the preparation records read it) and ``benchmark_scorer`` (``qhlab.finite_horizon.benchmark``,
the measurement of one fit) are named here as this module's API too. ``python -m
qhlab.application.architecture_study SUBCOMMAND ...`` runs ``main``, and so does the seed API's
path, ``qhlab.finite_horizon.studies.architecture_study``, a thin alias of this module, whose
``__all__`` lists this module's public names.

The study's order: ``freeze_study`` -> ``admit_canaries`` (E0 gate) -> ``prepare_development``
-> ``run_fit`` for every declared cell -> ``benchmark_scorer`` -> ``report_study``.

Scientific guard rails, each enforced by the steps:
* the statistical unit is the scene (evaluation and bootstrap work on per-scene values);
* TRAIN is digested at freeze and re-authenticated once by each process that runs a later step;
  validation is not opened before ``prepare_development`` and only after a passed E0 gate; no
  test data exists;
* exactly the declared cells (arm x seed) run, each once to its final budget; only a crashed
  cell (no final receipt) is attempted again, as a new recorded attempt;
* the report uses final states only, never an intermediate checkpoint;
* the qhlab source package may not change after freeze (``source_package_digest``).

This owner composes existing diagnostic fits and evaluation receipts; it does not implement
another optimizer loop (``qhlab.finite_horizon.fit.fit_recipe`` is the only one).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from qhlab.cli import main as qhlab_main

# Named by this module's API too (re-exported as themselves).
from qhlab.design.study_config import QhArchitectureStudyConfig as QhArchitectureStudyConfig
from qhlab.finite_horizon.benchmark import benchmark_scorer as benchmark_scorer
from qhlab.report.finished import open_study


def freeze_study(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Bind TRAIN support, source and controls without constructing held-out data (``Study.freeze``).

    Returns:
        The freeze receipt body.
    """
    return open_study(config_path, output).freeze()


def admit_canaries(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Gate broad fits using the original labels of one prospectively selected TRAIN row
    (``Study.admit_canaries``).

    Returns:
        The E0 receipt body (``passed``, ``reason``, ``failures``).
    """
    return open_study(config_path, output).admit_canaries()


def prepare_development(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Seal exposed validation and TRAIN-only constant after the E0 gate passes
    (``Study.prepare_development``).

    Returns:
        The development receipt body.
    """
    return open_study(config_path, output).prepare_development()


def run_fit(
    config_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    variant: str,
    seed: int,
    canary_role: str | None = None,
) -> dict:
    """Fit one charged cell using canonical diagnostic admission and receipts (``Study.run_fit``).

    Returns:
        The cell receipt body.
    """
    return open_study(config_path, output).run_fit(variant, seed, canary_role=canary_role)


def report_study(config_path: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Compare all ten charged final cells; never select an intermediate checkpoint (``Study.report``).

    Returns:
        The report (the content of ``report.json``).
    """
    return open_study(config_path, output).report()


def main() -> NoReturn:
    """Execute one explicit, immutable study operation from the command line.

    Parses ``sys.argv[1:]`` (``SUBCOMMAND ...``, as after ``qhlab study``) and runs it through the
    same command rows as ``qhlab study`` (``qhlab.cli.study``): one ``error:`` line on a refusal or
    failure, and the subcommand's exit status.
    """
    sys.exit(qhlab_main(["study", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
