"""Describe a population: authenticate and check it, recompute its difficulty card, and audit it on request.

Owns: ``describe_population`` (what ``qhlab scenes describe`` runs). Reading a stranger's population
runs none of its code: the labels are checked without its environment (Bellman; a built-in
environment's successors are stepped, qhlab's own code), and its environment runs only when an
audit is asked for. Does not own: the card's arithmetic (``difficulty``), the physics audit
(``audit``) or the format (``manifest``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from qhlab.evidence import EvidenceError, canonical_json
from qhlab.scenes.audit import audit_population, check_population_labels
from qhlab.scenes.bellman import read_labels
from qhlab.scenes.difficulty import difficulty_card, reference_name, suggested_settings
from qhlab.scenes.manifest import read_manifest
from qhlab.scenes.origin import user_environment

__all__ = ["describe_population"]


def describe_population(
    path: str | os.PathLike, *, tie_band: float | None = None, audit_states: int | None = None
) -> dict[str, Any]:
    """Authenticate and check a population, recompute its difficulty card from the files, and check it.

    Args:
        path: population directory.
        tie_band: None uses the band of the card in the manifest (and the recomputed card must
            equal it); another band recomputes the card for that band.
        audit_states: None: check counts and every label's Bellman rule without the population's
            environment (a built-in one also steps every successor again); N: audit N chain states
            first (``qhlab.scenes.audit.audit_population``), which runs the environment's code (a user
            environment's frozen copy inside the population).

    Returns:
        ``{"name", "split", "generator", "counts", "card", "suggested" (a study's reward-scale
        settings, ``difficulty.suggested_settings``), "audit" (None without one),
        "user_code" (whether the population's environment is a user's)}``.

    Raises:
        EvidenceError (or a subclass): the population fails authentication or the audit
            (counts, Bellman rule, physics), or its manifest lacks a card or records one that
            the files do not reproduce.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    manifest = read_manifest(path)
    recorded = manifest.get("difficulty")
    if not isinstance(recorded, dict) or "tie_band" not in recorded:
        raise EvidenceError(
            f"describe_population: {path / 'manifest.json'} has no difficulty card. HINT: it was made by an "
            "older generator; regenerate it with `qhlab scenes generate`."
        )
    # Counts, every label's Bellman rule (and physics, on request) first: a card of forged labels is no card.
    if audit_states is None:
        labels = check_population_labels(path, manifest, call="describe_population", simulate=False)
        audit = None
    else:
        audit = audit_population(path, states=audit_states, call="describe_population")
        labels = read_labels(path, manifest, call="describe_population")
    # Scenes are numbered in scenes.parquet order and states kept in file order, exactly as
    # at generation, so the recomputed card is equal to the bit, not just close.
    scene_order = {
        int(sid): i
        for i, sid in enumerate(
            pq.read_table(path / "scenes.parquet", columns=["scene_id"]).column("scene_id").to_numpy()
        )
    }
    chain = labels.step >= 0
    scene_index = np.array([scene_order[int(s)] for s in labels.scene_id[chain]])
    mask = labels.mask[chain]
    q = np.where(mask[:, :, None], labels.q[chain], 0.0)
    band = recorded["tie_band"] if tie_band is None else tie_band
    card = difficulty_card(q, scene_index, tie_band=band, candidate_mask=mask, reference=reference_name(recorded))
    if band == recorded["tie_band"] and canonical_json(card) != canonical_json(recorded):
        raise EvidenceError(
            f"describe_population: {path / 'manifest.json'} records a difficulty card that its files do not "
            "reproduce. HINT: the card and the labels were written by different code; regenerate the population."
        )
    return {
        "name": manifest["name"],
        "split": manifest["split"],
        "generator": manifest["generator"],
        "counts": manifest["counts"],
        "card": card,
        "suggested": suggested_settings(labels.q[chain], mask),
        "audit": audit,
        "user_code": user_environment(manifest),
    }
