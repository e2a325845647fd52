"""The lane comparison shown: ``lanes.md`` and ``lanes.png``, from the comparison dict alone.

Owns: ``markdown`` (the text of ``lanes.md``: what was compared, the per-arm lane and seed effects
with their TOST verdicts, the per-cell paired differences, each seed's retention, the final-state
drift) and ``figure`` (per arm, the lane effect beside each lane's seed effect, in the reward's
unit). Does not own: the comparison itself or publishing it (``compare``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qhlab.evidence.layout import LANES_FIGURE
from qhlab.report.figures import label_categories, save_figure
from qhlab.report.render import ci, fmt, table

__all__ = ["figure", "markdown"]


def markdown(c: dict) -> str:
    """The text of ``lanes.md`` (from the comparison dict only)."""
    h, level = c["horizon"], "95%"
    lines = _markdown_head(c, h, level)
    lines += _arm_table(c, h)
    lines += ["", "## Per cell (paired B - A)", ""]
    lines += _cell_table(c, h, level)
    lines += ["", "## Retention: each seed's reading and the study's decision", ""]
    lines += table(
        ["variant", "seed", "retained A", "retained B", "reading A", "reading B", "decision A", "decision B"],
        [
            [v["variant"], s, d["A"], d["B"], d["reading_A"], d["reading_B"], v["decision"]["A"], v["decision"]["B"]]
            for v in c["retention"]["variants"]
            for s, d in v["per_seed"].items()
        ],
    )
    groups = sorted({g for d in c["drift"] for g in d["groups"]})
    lines += ["", "## Final-state drift (relative L2 norm ||B - A|| / ||A|| per tensor group)", ""]
    lines += table(
        ["cell", *groups],
        [[d["cell"], *(fmt(d["groups"].get(g, {}).get("relative_l2"), 6) for g in groups)] for d in c["drift"]],
    )
    lines += ["", f"Figure: `{LANES_FIGURE}` (per arm: lane effect beside each lane's seed effect).", ""]
    return "\n".join(lines)


def _markdown_head(c: dict, h: int, level: str) -> list[str]:
    """``lanes.md`` up to the per-arm table: title, what was compared, differing versions, the checks."""
    unit = f" {c['unit']}" if c["unit"] else ""
    return [
        f"# Lane replication of study `{c['study']}`",
        "",
        f"A = `{c['lanes']['A']['profile']}` ({c['lanes']['A']['directory']}); B = `{c['lanes']['B']['profile']}` "
        f"({c['lanes']['B']['directory']}). Differences are B - A at H={h} on {c['n_scenes']} validation scenes; "
        f"{level} paired scene-bootstrap intervals ({c['bootstrap']['resamples']} resamples, seed "
        f"{c['bootstrap']['seed']}) per cell. Equivalence margin {fmt(c['margin'])}{unit} on regret_{h} "
        f"({c['margin_source']}); the TOST intervals are seed-aware, as the report's ({c['tost_seed_variance']}).",
        "",
        "Package versions that differ between the lanes: "
        + (
            ", ".join(
                f"{k} {c['lanes']['A']['versions'].get(k)} / {c['lanes']['B']['versions'].get(k)}"
                for k in c["versions_differ"]
            )
            or "none"
        )
        + ".",
        "",
        "## Checks",
        "",
        *table(
            ["check", "passed", "detail"],
            [[k["check"], "yes" if k["passed"] else "**NO**", k["detail"]] for k in c["checks"]],
        ),
        "",
        "## Per arm: lane effect beside seed effect, and equivalence",
        "",
    ]


def _arm_table(c: dict, h: int) -> list[str]:
    """The per-arm table's lines: lane effect beside each lane's seed effect, and the regret TOST."""
    columns = [
        "arm",
        f"lane effect MAE_{h}",
        f"seed effect MAE_{h} A / B",
        f"lane effect regret_{h}",
        f"seed effect regret_{h} A / B",
        f"B - A regret_{h}",
        "90% CI",
        "95% CI",
        "TOST",
    ]
    return table(
        columns,
        [
            [
                r["arm"],
                fmt(r["mae"]["lane_effect"]),
                f"{fmt(r['mae']['seed_effect_A'])} / {fmt(r['mae']['seed_effect_B'])}",
                fmt(r["regret"]["lane_effect"]),
                f"{fmt(r['regret']['seed_effect_A'])} / {fmt(r['regret']['seed_effect_B'])}",
                fmt(r["tost_regret_h"]["estimate"]),
                ci(r["tost_regret_h"]["interval_90"]),
                ci(r["tost_regret_h"]["interval_95"]),
                r["tost_regret_h"]["verdict"],
            ]
            for r in c["arms"]
        ],
    )


def _cell_table(c: dict, h: int, level: str) -> list[str]:
    """The per-cell table's lines: both lanes' MAE_H and regret_H, B - A with its interval, update counts."""
    return table(
        [
            "cell",
            f"MAE_{h} A",
            f"MAE_{h} B",
            "B - A",
            f"{level} CI",
            f"regret_{h} A",
            f"regret_{h} B",
            "B - A",
            f"{level} CI",
            "updates A / B",
        ],
        [
            [
                x["cell"],
                *(
                    v
                    for m in ("mae_h", "regret_h")
                    for v in (
                        fmt(x[m]["A"]),
                        fmt(x[m]["B"]),
                        fmt(x[m]["difference"]["estimate"]),
                        ci(x[m]["difference"]),
                    )
                ),
                f"{x['observed_updates']['A']} / {x['observed_updates']['B']}",
            ]
            for x in c["cells"]
        ],
    )


def figure(c: dict, path: Path) -> None:
    """Per arm, bars of the lane effect beside lane A's and lane B's seed effect (MAE_H and regret_H)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, h = [r["arm"] for r in c["arms"]], c["horizon"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    x = np.arange(len(arms))
    for ax, metric in zip(axes, ("mae", "regret")):
        for i, field in enumerate(("lane_effect", "seed_effect_A", "seed_effect_B")):  # "seed effect A": on lane A
            ax.bar(x + (i - 1) * 0.27, [r[metric][field] for r in c["arms"]], width=0.27, label=field.replace("_", " "))
        title = f"{'MAE' if metric == 'mae' else 'regret'}_{h}: lane vs seed effect"
        unit = f" ({c['unit']})" if c["unit"] else ""
        label_categories(ax, arms, rotation=30, ylabel=f"|difference| of {metric} at H={h}{unit}", title=title)
    save_figure(fig, path)
