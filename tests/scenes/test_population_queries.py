"""The DuckDB how-to's queries, run as written on a real tiny population, against qhlab's reader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from qhlab.finite_horizon.data import load_population
from qhlab.finite_horizon.evaluation import population_train_constant

duckdb = pytest.importorskip("duckdb", reason="the test extra installs duckdb for the how-to's queries")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "query-populations.md"


def _queries(population: Path) -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 4, "the page's four queries"
    return [block.replace("POP", population.as_posix()) for block in blocks]


def test_the_pages_queries_agree_with_the_population_reader(tiny_train) -> None:
    counts, constant, optimal, scenes = (duckdb.sql(q).fetchall() for q in _queries(tiny_train))
    manifest = json.loads((tiny_train / "manifest.json").read_text())
    assert counts == [(False, manifest["counts"]["successor_states"]), (True, manifest["counts"]["chain_states"])]

    population = load_population(tiny_train, split="train")
    assert population.horizon == 2
    np.testing.assert_allclose(constant[0], population_train_constant(population), rtol=1e-6)

    # The optimal index from the Parquet files themselves (float64, so ties are exact), read by pyarrow.
    states = pq.read_table(tiny_train / "states.parquet").to_pydict()
    candidates = pq.read_table(tiny_train / "candidates.parquet").to_pydict()
    chain_ids = {sid for sid, step in zip(states["state_id"], states["step"]) if step >= 0}
    by_state: dict[int, list[tuple[int, float]]] = {}
    for sid, k, q in zip(candidates["state_id"], candidates["candidate"], candidates["q"]):
        if sid in chain_ids:
            by_state.setdefault(sid, []).append((k, q[1]))
    tally: dict[int, int] = {}
    for pairs in by_state.values():
        top = max(v for _, v in pairs)
        for k, v in pairs:
            tally[k] = tally.get(k, 0) + (v == top)
    assert dict(optimal) == {k: n for k, n in tally.items() if n}

    chain = population.is_chain.numpy()
    first = chain & (population.step.numpy() == 0)
    assert len(scenes) == int(first.sum()) == manifest["counts"]["scenes"]
    np.testing.assert_allclose(sorted(r[3] for r in scenes), sorted(population.reward.numpy()[first][:, 0]), rtol=1e-6)
