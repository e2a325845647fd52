"""The documented, typed layout of a study's ``report.json``: what a user's own code may read.

Owns: ``StudyReportDocument`` (every top-level field, typed; the cells and the answer typed
through; the other sections' entries documented as JSON objects whose fields ``report.md``
names), the models it is made of, and ``REPORT_JSON_SCHEMA`` (its JSON Schema, published in the
docs' reference). ``write_report`` validates every report against it before anything is
published, so a report that qhlab wrote always has this shape. Does not own: computing the
report (``report``), writing it (``render``) or the tidy export (``export``).

Indices: a list of per-horizon values (``mae``, ``regret``, ``*_intervals``, a curve point's
``mae`` and ``regret``) holds horizon h at index h - 1, for h = 1..``horizon``; every distance
is in the reward's unit (`unit`: metres for the puck world).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["REPORT_JSON_SCHEMA", "StudyReportDocument"]


class _Open(BaseModel):
    """A JSON object whose listed fields are typed; a section may carry more, documented in report.md."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Interval(_Open):
    """A scene-bootstrap interval of a mean over validation scenes.

    Attributes:
        estimate: the mean (the reward's unit).
        low: its lower bound (the reward's unit, `unit`; None: that side is open).
        high: its upper bound (the reward's unit, `unit`; None: that side is open).
        confidence: e.g. 0.95.
        method: "BCa" or "percentile".
        alternative: "two-sided", "less" or "greater".
    """

    estimate: float
    low: float | None
    high: float | None
    confidence: float
    method: str
    alternative: str


class CurvePoint(_Closed):
    """One evaluation of a cell's learning curve (display only: no checkpoint is ever selected).

    Attributes:
        updates: the observed optimizer updates at which it was measured.
        mae: MAE_h per horizon (index h - 1), in the reward's unit.
        regret: regret_h per horizon (index h - 1), in the reward's unit.
    """

    updates: int
    mae: list[float]
    regret: list[float]


class Cell(_Open):
    """One charged final cell: an arm fitted with one seed, scored on the validation population.

    Attributes:
        cell: its name (``ARM-sSEED``).
        arm: the arm.
        role: "baseline", "control" or "variant".
        seed: the training seed.
        attempt: its fit's directory.
        final_state_sha256: the final state scored.
        observed_updates: its optimizer updates.
        wall_seconds: the fit's wall time (None: not recorded).
        mae: MAE_h per horizon (index h - 1), in the reward's unit.
        regret: regret_h per horizon (index h - 1), in the reward's unit.
        mae_intervals: MAE_h's scene-bootstrap interval, per horizon.
        regret_intervals: regret_h's scene-bootstrap interval, per horizon.
        curve: the learning curve (may be empty).
        benchmark: the scorer benchmark (None: not run).
        previous_attempts: attempts of this cell that did not finish.
    """

    cell: str
    arm: str
    role: Literal["baseline", "control", "variant"]
    seed: int
    attempt: str
    final_state_sha256: str
    observed_updates: int
    wall_seconds: float | None
    mae: list[float]
    regret: list[float]
    mae_intervals: list[Interval]
    regret_intervals: list[Interval]
    curve: list[CurvePoint]
    benchmark: dict[str, Any] | None = None
    previous_attempts: list[Any]


class Difference(_Closed):
    """A seed-pooled difference (variant minus baseline) at H, with its two-sided interval.

    Attributes:
        estimate: the difference (the reward's unit).
        low: the interval's lower bound (the reward's unit).
        high: the interval's upper bound (the reward's unit).
        confidence: e.g. 0.95.
    """

    estimate: float
    low: float | None
    high: float | None
    confidence: float


class Answer(_Closed):
    """A variant's answer, as the report's first section says it.

    Attributes:
        decision: "retained", "not retained" or "undecided".
        why: the reason, in words (and, where the study could not decide, what would).
        against_baseline: ``{"regret": Difference, "mae": Difference}`` at H (None: not compared).
        probability_of_improvement: ``{"regret": Interval, "mae": Interval}``: the share of
            validation scenes on which the variant's seed-averaged value at H is below the
            baseline's (a tie counts half), with its scene-bootstrap interval (0 to 1); paired by
            scene, not rliable's unpaired comparison of runs.
        text: the sentence report.md and the README print, and one more where the study's own
            seeds contradicted the pilot's seed component of one of its intervals.
    """

    decision: Literal["retained", "not retained", "undecided"]
    why: str
    against_baseline: dict[Literal["regret", "mae"], Difference | None]
    probability_of_improvement: dict[Literal["regret", "mae"], Interval]
    text: str


class Question(_Closed):
    """One variant's entry of the answer section.

    Attributes:
        variant: the arm.
        decision: the study's decision, both seeds pooled ("retained", "not retained",
            "undecided"), the same as ``answer.decision``.
        per_seed: each seed's own reading of the rule, in the same words (seed as a string key).
        seeds_agree: whether every seed reads the same.
        answer: the answer.
        mde_d_reg: the smallest D_reg the study detects (80% power, two-sided), in the reward's unit.
        mde_d_mae: the smallest D_mae the study detects (80% power, two-sided), in the reward's unit.
        dominant: per margin, the part of its interval's variance with the largest share
            ("scene", "seed" or "draw": the pooled margin's ``variance_shares``).
        regret_profile: the variant's seed-averaged per-scene regret at H minus the baseline's,
            sorted ascending (one value per validation scene; below 0: the variant is better there).
    """

    variant: str
    decision: Literal["retained", "not retained", "undecided"]
    per_seed: dict[str, Literal["retained", "not retained", "undecided"]]
    seeds_agree: bool
    answer: Answer
    mde_d_reg: float
    mde_d_mae: float
    dominant: dict[Literal["D_reg", "D_mae"], Literal["scene", "seed", "draw"]]
    regret_profile: list[float]


class StudyReportDocument(_Closed):
    """``report/report.json``: every field a finished study's report holds.

    Attributes:
        schema_version: this layout's version.
        study: the study's name.
        profile: the lane.
        horizon: H.
        primary_horizon: the horizon the decisions read (H).
        unit: the unit of every reward-valued number ("m" in the puck world; "" where the
            environment names none).
        seeds: the training seeds.
        n_scenes: validation scenes.
        statistical_unit: what a statistic resamples, in words.
        states_used: which states it scores, in words.
        thresholds: ``tie_band``, ``regret_fraction`` and ``mae_fraction`` of the rule.
        bootstrap: ``confidence``, ``resamples`` and ``seed`` of every interval.
        question: the answer, one entry per variant (the report's first section).
        cells: every charged final cell.
        family: each arm's make-up, parameter count and cost.
        arms: each arm's values pooled over seeds.
        constant: the TRAIN-only constant reference.
        references: the heuristic references (each with its regret per horizon and paired
            differences).
        headline: does the baseline beat the best TRAIN-chosen heuristic on every seed.
        paired: every paired difference per seed and metric.
        retention: the rule's margins per variant and seed.
        replication: every comparison's seed-pooled difference with its MDE; with a pilot, each
            pooled record's ``floored`` (its interval at the scene-only variance) and
            ``seed_check`` (the study's own seeds against the pilot's seed component: statistic,
            degrees of freedom, p-value, verdict), as each retention margin's.
        replication_correlation: float [K, K], the correlation of the K ``replication`` rows'
            estimates as the scenes give it (``qhlab study replicate`` places its agreement
            statistic with it).
        preparation: the tuning, pilot and E0 records the freeze bound (None: none).
        summary: the values a W&B run summary holds (``seed_check``: the family's reading of the
            rows' seed checks, None without a pilot).
    """

    schema_version: int
    study: str
    profile: str
    horizon: int = Field(ge=1)
    primary_horizon: int = Field(ge=1)
    unit: str
    seeds: list[int]
    n_scenes: int = Field(ge=1)
    statistical_unit: str
    states_used: str
    thresholds: dict[Literal["tie_band", "regret_fraction", "mae_fraction"], float]
    bootstrap: dict[Literal["confidence", "resamples", "seed"], float | int]
    question: list[Question]
    cells: list[Cell]
    family: list[dict[str, Any]]
    arms: list[dict[str, Any]]
    constant: dict[str, Any]
    references: dict[str, dict[str, Any]]
    headline: dict[str, Any]
    paired: list[dict[str, Any]]
    retention: list[dict[str, Any]]
    replication: list[dict[str, Any]]
    replication_correlation: list[list[float]]
    preparation: dict[str, Any] | None
    summary: dict[str, Any]


REPORT_JSON_SCHEMA: dict[str, Any] = StudyReportDocument.model_json_schema()
"""The JSON Schema of ``report.json`` (docs/reference/report-json.md prints it)."""
