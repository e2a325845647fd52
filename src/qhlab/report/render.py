"""The report's human-readable forms: ``report.md`` and the PNG figures, from ``report.json``'s content.

Owns: assembling ``report.md`` from the report's sections (the title, the lead section's
headline, every other section in order, the figures line), the cell formats every section's
markdown uses (``fmt``, ``ci``, ``table``), the figures (``arms.png``, ``paired_differences.png``,
``learning_curves.png``, and a tuned study's two from ``qhlab.report.tuning_figures``; matplotlib
Agg, no timestamp metadata) and writing all report files into a directory
(``write_report_files``). Computes nothing new: every number comes from the report dict.
Does not own: the sections and their markdown (``report.SECTIONS``), publishing the directory
or its receipt (``report.write_report``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from qhlab.evidence import QhError, canonical_json, publish_bytes, publish_file, publish_json
from qhlab.evidence.layout import REPORT_JSON, REPORT_MARKDOWN
from qhlab.report.document import StudyReportDocument
from qhlab.report.figures import label_categories, save_figure
from qhlab.report.tuning_figures import tuning_figures

if TYPE_CHECKING:
    from qhlab.report.sections import Section

__all__ = ["FIGURES", "bounds", "ci", "fmt", "per_horizon", "render_markdown", "table", "write_report_files"]

FIGURES = ("arms.png", "paired_differences.png", "learning_curves.png", "regret_profile.png")


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: floats with ``digits`` decimals, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ci(interval: dict) -> str:
    """An interval as "[low, high]"."""
    return f"[{fmt(interval['low'])}, {fmt(interval['high'])}]"


def bounds(interval: dict) -> list[Any]:
    """An interval's cells of a W&B table: [estimate, low, high]."""
    return [interval["estimate"], interval["low"], interval["high"]]


def per_horizon(metric: str, horizon: int) -> list[str]:
    """The W&B table columns of a metric at every horizon: ``metric_1`` .. ``metric_H``."""
    return [f"{metric}_{h}" for h in range(1, int(horizon) + 1)]


def table(columns: list[str], rows: Iterable[list[Any]]) -> list[str]:
    """A markdown table's lines: the header, its rule and one line per row (cells as ``str``)."""
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def render_markdown(report: dict, sections: Iterable[Section]) -> str:
    """The text of ``report.md``: the title, the lead sections (highest ``lead`` first), then the others."""
    lines = [f"# Architecture study `{report['study']}`", ""]
    for section in sorted(sections, key=lambda s: -int(s.lead)):
        lines += section.markdown(report)
    lines += [
        "",
        "Figures: `arms.png` (each arm's MAE and regret with intervals), "
        "`paired_differences.png` (paired differences against controls), `learning_curves.png` (each "
        "cell's validation MAE and regret at the observed updates its fit measured; display only, no "
        "checkpoint is ever selected), `regret_profile.png` (each variant's per-scene regret minus the "
        "baseline's, seeds averaged, sorted: where it wins and loses, and by how much).",
        "",
    ]
    return "\n".join(lines)


def _error_bar(iv: dict) -> list[list[float]]:
    """An interval as matplotlib's [[below], [above]] the estimate (an open side drawn as none)."""
    low = iv["low"] if iv["low"] is not None else iv["estimate"]
    high = iv["high"] if iv["high"] is not None else iv["estimate"]
    return [[iv["estimate"] - low], [high - iv["estimate"]]]


def _figures(report: dict) -> dict[str, Callable[[Path], None]]:
    """{figure name: writer(path)} for each of ``FIGURES`` (the writer saves a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = report["horizon"]
    writers = (_arms_figure, _paired_figure, _curves_figure, _profile_figure)
    figures = {name: partial(writer, plt, report, h) for name, writer in zip(FIGURES, writers)}
    return {**figures, **tuning_figures((report.get("preparation") or {}).get("tuning"))}


def _arms_figure(plt: Any, report: dict, h: int, path: Path) -> None:
    """Save ``arms.png``: each cell's MAE and regret at H with intervals, beside the reference lines."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("mae", "regret")):
        labels = []
        for i, c in enumerate(report["cells"]):
            iv = c[f"{metric}_intervals"][-1]
            ax.errorbar(
                [i],
                [iv["estimate"]],
                yerr=_error_bar(iv),
                fmt="o",
                capsize=3,
                color=f"C{report['seeds'].index(c['seed'])}",
            )
            labels.append(f"{c['arm']}\ns{c['seed']}")
        ax.axhline(report["constant"][metric][-1], color="grey", linestyle="--", label="TRAIN constant")
        if metric == "regret":
            # The heuristics are policies (no MAE); the oracle line is labelled as such.
            for ref, style in zip(report["references"].values(), (":", "-.", (0, (1, 3)))):
                ax.axhline(
                    ref["regret"][-1],
                    color="C3" if ref["oracle"] else "black",
                    linestyle=style,
                    linewidth=0.9,
                    label=f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"],
                )
        label_categories(
            ax,
            labels,
            rotation=60,
            ylabel=f"{metric} at H={h}{_axis_unit(report)}",
            title=f"{metric.upper() if metric == 'mae' else metric}_{h}, 95% scene-bootstrap CI",
        )
    save_figure(fig, path)


def _paired_figure(plt: Any, report: dict, h: int, path: Path) -> None:
    """Save ``paired_differences.png``: each paired difference of regret and MAE at H with its interval."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * max(4, len(report["paired"]) // 2) + 1.5))
    for ax, metric in zip(axes, ("regret", "mae")):
        rows = [p for p in report["paired"] if p["metric"] == metric]
        for i, p in enumerate(rows):
            iv = p["interval"]
            ax.errorbar(
                [iv["estimate"]],
                [i],
                xerr=_error_bar(iv),
                fmt="o",
                capsize=3,
                color=f"C{report['seeds'].index(p['seed'])}",
            )
        ax.axvline(0.0, color="grey", linestyle="--")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{p['arm']} - {p['against']} (s{p['seed']})" for p in rows], fontsize=7)
        ax.set_xlabel(f"paired difference of {metric} at H={h}{_axis_unit(report)}")
    save_figure(fig, path)


def _curves_figure(plt: Any, report: dict, h: int, path: Path) -> None:
    """Save ``learning_curves.png``: each cell's validation MAE and regret at H over its observed updates."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = list(dict.fromkeys(c["arm"] for c in report["cells"]))
    for ax, metric in zip(axes, ("mae", "regret")):
        for c in report["cells"]:
            points = c.get("curve") or []
            if points:
                ax.plot(
                    [p["updates"] for p in points],
                    [p[metric][-1] for p in points],
                    marker="o",
                    markersize=3,
                    color=f"C{arms.index(c['arm']) % 10}",
                    linestyle=("-", "--", ":", "-.")[report["seeds"].index(c["seed"]) % 4],
                    label=f"{c['arm']} s{c['seed']}",
                )
        ax.axhline(report["constant"][metric][-1], color="grey", linestyle="--", linewidth=0.8, label="TRAIN constant")
        ax.set_xlabel("observed optimizer updates")
        ax.set_ylabel(f"validation {metric} at H={h}{_axis_unit(report)}")
        ax.set_title(f"learning curves: {metric.upper() if metric == 'mae' else metric}_{h}")
        ax.legend(fontsize=6, ncol=2)
    save_figure(fig, path)


def _profile_figure(plt: Any, report: dict, h: int, path: Path) -> None:
    """Save ``regret_profile.png``: each variant's sorted per-scene regret minus the baseline's."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, q in enumerate(report["question"]):
        values = q["regret_profile"]
        share = [(k + 0.5) / len(values) for k in range(len(values))]
        ax.plot(share, values, color=f"C{i % 10}", linewidth=1.2, label=f"{q['variant']} ({q['decision']})")
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("share of validation scenes (sorted by the difference)")
    ax.set_ylabel(f"regret at H={h}: variant minus baseline{_axis_unit(report)}")
    ax.set_title("per-scene regret profile against the baseline (seeds averaged; below 0: the variant wins)")
    ax.title.set_fontsize(9)
    if report["question"]:
        ax.legend(fontsize=7)
    save_figure(fig, path)


def write_report_files(report: dict, directory: Path, sections: Iterable[Section]) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and the figures into ``directory`` (write-once files).

    Args:
        report: the report (``report.build_report``).
        directory: an existing directory (the staging directory of ``report/``).
        sections: the report's sections (``report.SECTIONS``), whose markdown ``report.md`` joins.

    Returns:
        {file name: path} of every file written, for the report receipt's outputs.
    """
    try:
        # What a user's code may read is what the reference documents: checked before any byte.
        StudyReportDocument.model_validate(report)
    except ValidationError as exc:
        raise QhError(
            f"report_study: the report does not have report.json's documented layout: {exc}. HINT: a "
            "section wrote a field that qhlab.report.document does not describe; describe it there."
        ) from None
    outputs = {REPORT_JSON: directory / REPORT_JSON, REPORT_MARKDOWN: directory / REPORT_MARKDOWN}
    publish_json(outputs[REPORT_JSON], report)
    # Rendered from report.json as published (canonical key order), so that anyone can render it again.
    report = json.loads(canonical_json(report))
    publish_bytes(outputs[REPORT_MARKDOWN], render_markdown(report, sections).encode("utf-8"))
    for name, writer in _figures(report).items():
        publish_file(directory / name, writer)
        outputs[name] = directory / name
    return outputs


def _axis_unit(report: dict) -> str:
    """An axis label's unit: " (m)" in the puck world, nothing where the reward names no unit."""
    return f" ({report['unit']})" if report["unit"] else ""
