"""What a replication finds: the design two studies share, the seeds it may not reuse, and their agreement.

Owns: pure functions over the records of an original study and its replica (freeze and
development receipt bodies, ``report.json``): ``used_populations`` (every population the original,
its tuning, pilot and E0 check drew), ``refused_seeds``, ``reused_populations``, ``study_design``
(what a replica must share with its original), ``design_differences``, ``replication_document``
(every number of ``replication.json``: per comparison the two seed-pooled estimates and z, the
t-calibrated chi-square agreement test, sign flips and changed decisions) and
``replication_markdown`` (``replication.md``, from that document). ``qhlab study replicate``
computes both with these functions and ``qhlab verify`` recomputes them with the same ones. Does
not own: the statistics (``qhlab.statistics.replication.agreement_test``), running the replica
(``run``) or the receipt kind (``records``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from qhlab.design.study_config import EXECUTION_FIELDS
from qhlab.evidence.layout import DOCUMENT_SCHEMA_VERSION
from qhlab.report.render import fmt, table
from qhlab.statistics.agreement import agreement_distribution, agreement_test

# The two studies a replication compares, as its records name them.
SIDES = ("original", "replica")

__all__ = [
    "SIDES",
    "design_differences",
    "refused_seeds",
    "refused_training_seeds",
    "replication_document",
    "replication_markdown",
    "reused_populations",
    "study_design",
    "used_populations",
]

# Where a study ran and cached its populations, not what it decided; and the pair a replication draws anew.
_NOT_DESIGN = (*EXECUTION_FIELDS, "population_cache")
_DRAWN_ANEW = (("train", "seed"), ("validation", "seed"))


def used_populations(freeze: dict, development: dict) -> list[dict[str, Any]]:
    """Every population the original study, its tuning, pilot and E0 check drew.

    Args:
        freeze: the original's freeze receipt body.
        development: the original's development receipt body (its sealed validation).

    Returns:
        ``[{"use", "preset", "seed", "manifest_sha256"}]`` (the manifest is None where the record
        names only the seed: an E0 check's draws).
    """
    used = [
        {
            "use": "study TRAIN",
            "preset": freeze["train"]["declared"].get("preset"),
            "seed": freeze["train"]["declared"].get("seed"),
            "manifest_sha256": freeze["train"]["manifest_sha256"],
        },
        {
            "use": "study validation",
            "preset": freeze["validation"]["declared"].get("preset"),
            "seed": freeze["validation"]["declared"].get("seed"),
            "manifest_sha256": development["validation"]["manifest_sha256"],
        },
    ]
    preparation = freeze.get("preparation") or {}
    for kind in ("tuning", "pilot"):
        for role, population in ((preparation.get(kind) or {}).get("populations") or {}).items():
            used.append(
                {"use": f"{kind} {role}", **{k: population.get(k) for k in ("preset", "seed", "manifest_sha256")}}
            )
    e0 = preparation.get("e0") or {}
    for seed in e0.get("train_seeds") or []:
        used.append(
            {
                "use": "E0 check draw",
                "preset": freeze["train"]["declared"].get("preset"),
                "seed": seed,
                "manifest_sha256": None,
            }
        )
    return used


def refused_seeds(used: list[dict[str, Any]]) -> list[int]:
    """The population seeds a replication may not draw: every seed in ``used``, sorted."""
    return sorted({int(p["seed"]) for p in used if p.get("seed") is not None})


def refused_training_seeds(freeze: dict) -> list[int]:
    """The training seeds a replica on fresh training seeds may not fit: the original's, its pilot's
    and its tuning's.

    Args:
        freeze: the original's freeze receipt body.

    Returns:
        Sorted seeds: the study's own and every seed its bound pilot fitted (a replica that shared
        them would share what its intervals count as independent), and the seeds its bound tuning
        chose the recipe on (a recipe chosen on some seeds reads quieter on them than it is).
    """
    preparation = freeze.get("preparation") or {}
    fitted = {int(s) for entry in (preparation.get("pilot") or {}).get("layout") or [] for s in entry["seeds"]}
    fitted |= {int(s) for s in ((preparation.get("tuning") or {}).get("objective") or {}).get("seeds") or []}
    return sorted(fitted | {int(s) for s in freeze["seeds"]})


def reused_populations(used: list[dict[str, Any]], drawn: dict[str, dict[str, Any]]) -> list[str]:
    """What a replica's population pair reuses of ``used``, in words (empty: both are fresh).

    Args:
        used: ``used_populations`` of the original.
        drawn: ``{"train" | "validation": {"seed", "manifest_sha256" (None: not drawn yet)}}``.

    Returns:
        One line per reuse: a seed the original's records drew, or a manifest equal to one of
        theirs (a generator that ignored the seed would give the same population twice).
    """
    seeds = {int(p["seed"]): p["use"] for p in reversed(used) if p.get("seed") is not None}
    manifests = {p["manifest_sha256"]: p["use"] for p in used if p.get("manifest_sha256")}
    found = []
    for role, population in drawn.items():
        if population.get("seed") in seeds:
            found.append(f"{role} seed {population['seed']} is the seed of the {seeds[population['seed']]}")
        if population.get("manifest_sha256") in manifests:
            found.append(f"{role} population is the {manifests[population['manifest_sha256']]} (same manifest)")
    if drawn.get("train", {}).get("seed") is not None and drawn["train"].get("seed") == drawn.get("validation", {}).get(
        "seed"
    ):
        found.append(f"train and validation share seed {drawn['train']['seed']}")
    return found


def study_design(freeze: dict, *, training_seeds: bool = True) -> dict[str, Any]:
    """What a replica shares with its original: everything frozen but where it ran and its population pair.

    Args:
        freeze: a freeze receipt body.
        training_seeds: keep what the training seeds fix (the seeds, each cell's recipe digest and
            the E0 check, whose gate is fitted on the study's first seed); False for a replica on
            fresh training seeds, which shares the rest.

    Returns:
        The config as frozen (without the execution fields, the population cache and the two
        population seeds), each cell's recipe digest, the arms (role, control, architecture,
        builder, source digest), the seeds, budgets and thresholds, the qhlab source and package
        versions, the preparation records' digests, the user environment's source digest and the
        validation preset.
    """
    config = json.loads(json.dumps(freeze["config"]["resolved"]))
    for field in _NOT_DESIGN:
        config.pop(field, None)
    for section, key in _DRAWN_ANEW:
        config[section].pop(key, None)
    environment = freeze["train"].get("environment_source") or {}
    preparation = {k: v["record_sha256"] for k, v in (freeze.get("preparation") or {}).items() if v}
    if not training_seeds:
        config.pop("seeds", None)
        (config.get("preparation") or {}).pop("e0", None)
        preparation.pop("e0", None)
    design = {
        "config": config,
        "profile": freeze["profile"],
        "recipes": freeze["recipes"],
        "arms": [
            {
                **{k: a.get(k) for k in ("arm", "role", "control", "matched", "architecture", "builder")},
                "source_sha256": (a.get("source") or {}).get("sha256"),
            }
            for a in freeze["arms"]
        ],
        "seeds": freeze["seeds"],
        "budgets": freeze["budgets"],
        "thresholds": freeze["thresholds"],
        "source_package": freeze["source_package"]["sha256"],
        "versions": freeze["versions"],
        "preparation": preparation,
        "environment_source": environment.get("sha256"),
        "validation_preset": freeze["validation"].get("preset"),
    }
    if not training_seeds:
        del design["recipes"], design["seeds"]
    return design


def design_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Every dotted field where two ``study_design`` values differ, with both values, sorted."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            found += design_differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return found
    if a != b:
        return [f"{prefix.rstrip('.')} (original: {json.dumps(a)}, replica: {json.dumps(b)})"]
    return []


def _side(freeze: dict, development: dict, report: dict) -> dict[str, Any]:
    return {
        "study_id": freeze["study_id"],
        "directory": freeze["output"],
        "train": {**freeze["train"]["declared"], "manifest_sha256": freeze["train"]["manifest_sha256"]},
        "validation": {
            **freeze["validation"]["declared"],
            "manifest_sha256": development["validation"]["manifest_sha256"],
        },
        "n_scenes": report["n_scenes"],
    }


def _estimate(entry: dict) -> dict[str, Any]:
    pooled = entry["pooled"]
    return {
        "estimate": pooled["estimate"],
        "se": pooled["se"],
        # The se's degrees of freedom, as its interval's Student's t reads them.
        "dof": float(pooled["dof"]),
        "sources": list(pooled["sources"]),
        "low": pooled["low"],
        "high": pooled["high"],
        "label": entry["label"],
    }


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def replication_document(original: dict[str, dict], replica: dict[str, dict]) -> dict[str, Any]:
    """Every number of ``replication.json`` from the two studies' records.

    Args:
        original, replica: ``{"freeze": freeze receipt body, "development": development receipt
            body, "report": report.json}`` of each study.

    Returns:
        The document: both studies' populations, the refused seeds, the design check, per
        comparison (arm, against, metric at H) both seed-pooled estimates with their standard
        errors and labels, z = (a - b) / sqrt(se_a^2 + se_b^2), whether the sign flipped and
        whether the label changed; the chi-square agreement test over every comparison; each
        variant's decision ("retained", "not retained", "undecided") in both studies, whether it
        changed and whether it flipped (retained in one, not retained in the other); and one summary
        sentence.

    Raises:
        ValueError: the two reports do not hold the same comparisons or variants.
    """
    used = used_populations(original["freeze"], original["development"])
    fresh = list(replica["freeze"]["seeds"]) != list(original["freeze"]["seeds"])
    differences = design_differences(
        study_design(original["freeze"], training_seeds=not fresh),
        study_design(replica["freeze"], training_seeds=not fresh),
    )
    if fresh:
        reused_seeds = sorted(set(replica["freeze"]["seeds"]) & set(refused_training_seeds(original["freeze"])))
        if reused_seeds:
            differences.append(f"training seeds {reused_seeds} are the original's, its pilot's or its tuning's")
    replica_side = _side(replica["freeze"], replica["development"], replica["report"])
    reused = reused_populations(used, {role: replica_side[role] for role in ("train", "validation")})
    rows = _paired_comparisons(original, replica)
    test = _score_comparisons(rows)
    placed = _placed(test, rows, original["report"], replica["report"])
    conclusions = _conclusions(original, replica)
    flips = [f"{r['arm']} vs {r['against']} ({r['metric']})" for r in rows if r["sign_flipped"]]
    caveats = _caveats(rows)
    changed = [c["variant"] for c in conclusions if c["changed"]]
    moved = ", ".join(f"{c['variant']} ({c['original']} -> {c['replica']})" for c in conclusions if c["changed"])
    where = (
        ""
        if placed is None
        else f", at the {placed['percentile']:.0%} point of its distribution under the studies' correlation "
        f"({'inside' if placed['inside_central_90'] else 'outside'} the central 90%)"
    )
    summary = (
        f"{len(rows)} comparisons: t-calibrated sum of z^2 {test['statistic']:.2f} on {test['dof']} dof, "
        f"p {test['p_value']:.3g}{where}; {len(flips)} of {len(rows)} estimates changed sign; changed decisions: "
        f"{moved or 'none'}."
    )
    return {
        "schema_version": DOCUMENT_SCHEMA_VERSION,
        "study": original["report"]["study"],
        "primary_horizon": original["report"]["primary_horizon"],
        "unit": original["report"]["unit"],
        "original": _side(original["freeze"], original["development"], original["report"]),
        "replica": replica_side,
        "fresh": ["TRAIN", "validation", *(["training seeds"] if fresh else [])],
        "training_seeds": {"original": list(original["freeze"]["seeds"]), "replica": list(replica["freeze"]["seeds"])},
        "used_populations": used,
        "refused_seeds": refused_seeds(used),
        "reused": reused,
        "design": {"identical": not differences, "differences": differences},
        "comparisons": rows,
        "agreement": {
            **{k: test[k] for k in ("statistic", "dof", "p_value")},
            "test": "each z referred to Student's t with the Welch-Satterthwaite dof of its two standard errors "
            "and mapped to the normal score of the same tail; the sum of the squared scores against "
            "chi-square(K). The comparisons of one study share cells, so they are not independent and the "
            "p value is approximate; ``correlated`` places the sum in its distribution under both studies' "
            "scene correlation of the comparisons",
            "correlated": placed,
        },
        "caveats": caveats,
        "sign_flips": flips,
        "conclusions": conclusions,
        "changed_conclusions": changed,
        "summary": summary,
    }


def _paired_comparisons(original: dict[str, dict], replica: dict[str, dict]) -> list[dict[str, Any]]:
    """Per comparison of the original's report, in its order: both studies' seed-pooled estimates.

    Args:
        original, replica: each study's records, as ``replication_document`` takes them.

    Raises:
        ValueError: the two reports do not hold the same comparisons.
    """
    key = ("arm", "against", "metric")
    theirs = {tuple(e[k] for k in key): e for e in replica["report"]["replication"]}
    ours = [tuple(e[k] for k in key) for e in original["report"]["replication"]]
    if sorted(ours) != sorted(theirs):
        raise ValueError(f"the reports compare other things: original {sorted(ours)}, replica {sorted(theirs)}")
    rows = []
    for entry in original["report"]["replication"]:
        other = theirs[tuple(entry[k] for k in key)]
        rows.append(
            {
                **{k: entry[k] for k in (*key, "relation")},
                "original": _estimate(entry),
                "replica": _estimate(other),
            }
        )
    return rows


def _score_comparisons(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the agreement test over ``rows`` and add each row's z, its dof, normal score, sign flip and label change.

    Returns:
        ``agreement_test``'s result.
    """
    dof = {side: [r[side]["dof"] if r[side]["dof"] is not None else math.inf for r in rows] for side in SIDES}
    test = agreement_test(
        [r["original"]["estimate"] for r in rows],
        [r["original"]["se"] for r in rows],
        [r["replica"]["estimate"] for r in rows],
        [r["replica"]["se"] for r in rows],
        dof_a=dof["original"],
        dof_b=dof["replica"],
    )
    for row, z, welch, score in zip(rows, test["z"], test["dof_k"], test["normal_scores"]):
        a, b = row["original"]["estimate"], row["replica"]["estimate"]
        row["z"], row["z_dof"], row["normal_score"] = z, welch, score
        row["sign_flipped"] = _sign(a) * _sign(b) < 0
        row["label_changed"] = row["original"]["label"] != row["replica"]["label"]
    return test


def _placed(test: dict, rows: list[dict], original: dict, replica: dict) -> dict[str, Any] | None:
    """``agreement_distribution`` of the test's statistic under both reports' ``replication_correlation``.

    Args:
        test: ``agreement_test``'s result over ``rows``.
        rows: the paired comparisons, in the original report's order.
        original, replica: the two ``report.json`` documents.

    Returns:
        The placement, or None where a report has no correlation (one made before reports held it).
    """
    key = ("arm", "against", "metric")
    matrices = []
    for report in (original, replica):
        correlation = report.get("replication_correlation")
        if not correlation:
            return None
        index = {tuple(e[k] for k in key): i for i, e in enumerate(report["replication"])}
        order = [index[tuple(r[k] for k in key)] for r in rows]
        matrices.append([[correlation[i][j] for j in order] for i in order])
    return agreement_distribution(
        test["statistic"],
        [r["original"]["se"] for r in rows],
        [r["replica"]["se"] for r in rows],
        matrices[0],
        matrices[1],
    )


def _conclusions(original: dict[str, dict], replica: dict[str, dict]) -> list[dict[str, Any]]:
    """Each variant's decision in both reports, whether it changed and whether it flipped.

    Raises:
        ValueError: the two reports answer for other variants.
    """
    answers = {q["variant"]: q for q in replica["report"]["question"]}
    if sorted(answers) != sorted(q["variant"] for q in original["report"]["question"]):
        raise ValueError("the reports answer for other variants")
    conclusions = []
    for q in original["report"]["question"]:
        ours, theirs = q["decision"], answers[q["variant"]]["decision"]
        conclusions.append(
            {
                "variant": q["variant"],
                "original": ours,
                "replica": theirs,
                "changed": ours != theirs,
                "flipped": {ours, theirs} == {"retained", "not retained"},
            }
        )
    return conclusions


def _caveats(rows: list[dict[str, Any]]) -> list[str]:
    """Per study whose standard errors lack the TRAIN draw: why its z overstate the disagreement."""
    # A replication draws a new TRAIN: standard errors that do not carry the TRAIN draw (no pilot
    # measured it) understate the difference between the studies, and so overstate every z.
    return [
        f"the {side} study's standard errors do not carry the TRAIN draw (it names no pilot record), which a "
        "replication changes: its z are too large, and a small p is weaker evidence than it looks"
        for side in SIDES
        if any("TRAIN draw" not in r[side]["sources"] for r in rows)
    ]


def _placement_lines(document: dict) -> list[str]:
    """The paragraph placing the sum of squares under the studies' correlation, and what was drawn anew."""
    seeds = document["training_seeds"]
    lines = [
        f"Drawn anew: {', '.join(document['fresh'])} (training seeds: original {seeds['original']}, "
        f"replica {seeds['replica']}).",
        "",
    ]
    placed = document["agreement"]["correlated"]
    if placed is not None:
        low, high = placed["central_90"]
        lines += [
            f"Simulated under both studies' scene correlation of the comparisons ({placed['draws']} draws), the "
            f"sum of squared scores has mean {placed['mean']:.2f} and central 90% [{low:.2f}, {high:.2f}]; "
            f"{document['agreement']['statistic']:.2f} lies at its {placed['percentile']:.1%} point, "
            f"{'inside' if placed['inside_central_90'] else 'outside'} the central 90%. Below it, the studies "
            "agree more closely than their intervals say they may (the intervals are too wide, or the studies "
            "share what the intervals count as independent); above it, less.",
            "",
        ]
    return lines


def replication_markdown(document: dict) -> str:
    """``replication.md``: the agreement first, then every comparison and every conclusion."""
    o, r = document["original"], document["replica"]
    h = document["primary_horizon"]
    lines = [
        f"# Replication of {document['study']}",
        "",
        f"**{document['summary']}**",
        "",
        "The original study's frozen design (recipe, family, budgets, preparation records, gate) ran again "
        "on a fresh population pair. For every comparison, z = (original - replica) / sqrt(se_o^2 + se_r^2) "
        "with each study's seed-pooled standard error (scenes, training seed and, with a pilot, TRAIN draw). "
        "Each z is read on Student's t with the Welch-Satterthwaite degrees of freedom of its two standard "
        "errors (an se from two seeds has one) and turned into the normal score of the same tail; the sum of "
        f"the squared scores is tested against chi-square({document['agreement']['dof']}). The comparisons of "
        "one study share cells, so they are not independent and the p value is approximate.",
        "",
        *_placement_lines(document),
        *(f"- **Caveat**: {c}." for c in document["caveats"]),
        *([""] if document["caveats"] else []),
        "## Populations",
        "",
        *table(
            ["study", "TRAIN", "validation", "validation scenes"],
            [
                [
                    name,
                    *(
                        f"{side[role].get('preset')} seed {side[role].get('seed')} "
                        f"(`{side[role]['manifest_sha256'][:12]}`)"
                        for role in ("train", "validation")
                    ),
                    str(side["n_scenes"]),
                ]
                for name, side in (("original", o), ("replica", r))
            ],
        ),
        "",
        f"Seeds refused (drawn by the original, its tuning, pilot or E0 check): {document['refused_seeds']}.",
        "",
        f"## Comparisons at H={h}" + (f" ({document['unit']})" if document["unit"] else ""),
        "",
        *table(
            ["comparison", "metric", "original (se)", "replica (se)", "z (dof)", "sign", "label (original / replica)"],
            [
                [
                    f"{c['arm']} vs {c['against']}",
                    c["metric"],
                    f"{fmt(c['original']['estimate'])} ({fmt(c['original']['se'])})",
                    f"{fmt(c['replica']['estimate'])} ({fmt(c['replica']['se'])})",
                    f"{c['z']:.2f} ({'normal' if c['z_dof'] is None else format(c['z_dof'], '.3g')})",
                    "flipped" if c["sign_flipped"] else "same",
                    f"{c['original']['label']} / {c['replica']['label']}"
                    + (" (changed)" if c["label_changed"] else ""),
                ]
                for c in document["comparisons"]
            ],
        ),
        "",
        "## Conclusions",
        "",
        *table(
            ["variant", "original", "replica", "decision"],
            [
                [
                    c["variant"],
                    c["original"],
                    c["replica"],
                    "FLIPPED" if c["flipped"] else "changed" if c["changed"] else "same",
                ]
                for c in document["conclusions"]
            ],
        ),
        "",
        "The decision is the report's word on each variant (retained, not retained, undecided), the same word "
        "in the headline, the rule's table and each seed's reading. A sign flip of an estimate whose intervals "
        "include 0 is what noise does; a decision that moves between undecided and a decision is what a study "
        "near its MDE does; a flipped decision (retained in one study, not retained in the other) is a "
        "conclusion that did not replicate.",
        "",
    ]
    return "\n".join(lines)
