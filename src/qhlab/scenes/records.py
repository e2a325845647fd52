"""The receipt kinds of a population: its identity (``population``) and how it was labelled (``population_generation``).

Owns: the body models of the two receipts a population directory holds, each registered by its
kind when defined. Does not own: the population format (``manifest``) or authentication
(``qhlab.evidence``).
"""

from __future__ import annotations

from qhlab.evidence.envelope import Closed, Json, Receipt

__all__ = [
    "PopulationBody",
    "PopulationGenerationBody",
    "PopulationGenerationReceipt",
    "PopulationReceipt",
]


class PopulationBody(Closed):
    """A published population.

    Attributes:
        name: the population's name. split: train or validation. counts: scenes, rows and
        chains. generator: the preset, seed and generator settings. sealed_directories: the
        directories that hold exactly the files the receipt binds (a user environment's frozen
        source); absent for a built-in environment.
    """

    name: str
    split: str
    counts: Json
    generator: Json
    sealed_directories: list[str] | None = None


class PopulationReceipt(Receipt, kind="population", version=1):
    """``population.receipt.json``."""

    body: PopulationBody


class PopulationGenerationBody(Closed):
    """How a population was labelled (facts of the run, not of the population).

    Attributes:
        executor: local or ray. ray_address: the cluster, when Ray. driver: the driver host.
        label_seconds: labelling time. processes: local worker processes. cluster_cpus,
        nodes: the Ray cluster's CPUs and nodes.
    """

    executor: str
    ray_address: str | None
    driver: Json
    label_seconds: float
    processes: int | None = None
    cluster_cpus: int | None = None
    nodes: Json | None = None


class PopulationGenerationReceipt(Receipt, kind="population_generation", version=1):
    """``generation.receipt.json``."""

    body: PopulationGenerationBody
