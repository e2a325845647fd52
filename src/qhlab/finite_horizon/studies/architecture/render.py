"""The report's human-readable forms: ``report.md`` and the PNG figures, from ``report.json``'s content.

Owns: the markdown (headline first, then the references, every cell, seed means, paired
differences, retention and benchmark tables), the two figures (``arms.png``,
``paired_differences.png``; matplotlib Agg, no timestamp metadata) and writing all report
files into a directory (``write_report_files``). Computes nothing new: every number comes
from the report dict (``report.build_report``). Does not own: publishing the directory or its
receipt (``report.report_study``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qhlab.evidence import publish_bytes, publish_file, publish_json
from qhlab.finite_horizon.studies.architecture.layout import REPORT_JSON, REPORT_MARKDOWN
from qhlab.finite_horizon.studies.architecture.seed_aware import seed_aware_markdown

__all__ = ["FIGURES", "write_report_files"]

FIGURES = ("arms.png", "paired_differences.png")


def _fmt(value: Any, digits: int = 4) -> str:
    """A table cell: floats with ``digits`` decimals, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci(interval: dict) -> str:
    """An interval as "[low, high]"."""
    return f"[{_fmt(interval['low'])}, {_fmt(interval['high'])}]"


def _reference_lines(report: dict) -> list[str]:
    """The headline sentence (the report's first paragraph) and the heuristic references table."""
    h, seeds = report["horizon"], report["seeds"]
    level = f"{report['bootstrap']['confidence']:.0%}"
    lines = [
        report["headline"]["text"],
        "",
        "## Heuristic references (validation chain rows, scenes weighted equally)",
        "",
        "The fixed index was chosen on TRAIN only; the straight strike is candidate 0 (the target "
        "struck at the goal centre); the myopic oracle acts on the exact Q*_1 labels, so it reads "
        "validation labels and is no deployable policy. Paired columns: per seed, (baseline - "
        f"reference) regret_{h} on the same scenes with its {level} scene-bootstrap interval; below 0 "
        "favours the baseline.",
        "",
        "| reference | " + " | ".join(f"regret_{i}" for i in range(1, h + 1)) + f" | regret_{h} {level} CI | "
        + " | ".join(f"baseline - reference, seed {s}" for s in seeds) + " |",
        "|" + "---|" * (1 + h + 1 + len(seeds)),
    ]
    for ref in report["references"].values():
        label = f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"]
        paired = {p["seed"]: p["interval"] for p in ref["paired"]}
        lines.append(
            f"| {label} | " + " | ".join(_fmt(v) for v in ref["regret"]) + f" | {_ci(ref['regret_interval'])} | "
            + " | ".join(f"{_fmt(paired[s]['estimate'])} {_ci(paired[s])}" for s in seeds) + " |"
        )
    return lines + [""]


def _markdown(report: dict) -> str:
    """The text of ``report.md``: the headline sentence first, then every table."""
    from qhlab.finite_horizon.studies.statistics import MIN_SCENES_FOR_ROBUST

    h = report["horizon"]
    lines = [
        f"# Architecture study `{report['study']}`",
        "",
        *_reference_lines(report),
        f"Lane `{report['profile']}`; {report['n_scenes']} validation scenes; horizon H={h} is primary; "
        f"seeds {report['seeds']}. Statistical unit: the scene. {report['states_used']}.",
        f"Thresholds: tie_band={report['thresholds']['tie_band']}, regret_fraction="
        f"{report['thresholds']['regret_fraction']}, mae_fraction={report['thresholds']['mae_fraction']}. "
        f"Intervals: {report['bootstrap']['confidence']:.0%} scene bootstrap (BCa unless noted), "
        f"{report['bootstrap']['resamples']} resamples, seed {report['bootstrap']['seed']}.",
        "",
    ]
    if report["n_scenes"] < MIN_SCENES_FOR_ROBUST:
        # Said once, up front, in plain words: a reader must not mistake a retention table on a
        # handful of scenes for evidence (statistics labels every such decision inconclusive).
        lines += [
            f"There are fewer than {MIN_SCENES_FOR_ROBUST} validation scenes ({report['n_scenes']}), "
            "so no retention decision is labelled robust: every decision below is inconclusive.",
            "",
        ]
    lines += [
        "## Every arm and seed (final states)",
        "",
        "| arm | role | seed | " + " | ".join(f"MAE_{i}" for i in range(1, h + 1)) + " | "
        + " | ".join(f"regret_{i}" for i in range(1, h + 1)) + f" | MAE_{h} 95% CI | regret_{h} 95% CI | updates |",
        "|" + "---|" * (3 + 2 * h + 3),
    ]
    for c in report["cells"]:
        lines.append(
            f"| {c['arm']} | {c['role']} | {c['seed']} | " + " | ".join(_fmt(v) for v in c["mae"]) + " | "
            + " | ".join(_fmt(v) for v in c["regret"]) + f" | {_ci(c['mae_intervals'][-1])} | "
            f"{_ci(c['regret_intervals'][-1])} | {c['observed_updates']} |"
        )
    k = report["constant"]
    lines.append(
        "| TRAIN constant | reference | - | " + " | ".join(_fmt(v) for v in k["mae"]) + " | "
        + " | ".join(_fmt(v) for v in k["regret"]) + f" | {_ci(k['mae_interval'])} | {_ci(k['regret_interval'])} | - |"
    )
    lines += ["", "## Seed-mean per arm (per-scene values averaged over both seeds)", "",
              f"| arm | role | MAE_{h} | 95% CI | regret_{h} | 95% CI |", "|---|---|---|---|---|---|"]
    for a in report["arms"]:
        lines.append(f"| {a['arm']} | {a['role']} | {_fmt(a['seed_mean_mae'][-1])} | {_ci(a['seed_mean_mae_interval'])} | "
                     f"{_fmt(a['seed_mean_regret'][-1])} | {_ci(a['seed_mean_regret_interval'])} |")
    lines += ["", f"## Paired differences at H={h} (same scenes, same seed)", "",
              "| arm | against | relation | seed | metric | difference | 95% CI | method |", "|---|---|---|---|---|---|---|---|"]
    for p in report["paired"]:
        i = p["interval"]
        lines.append(f"| {p['arm']} | {p['against']} | {p['relation']} | {p['seed']} | {p['metric']} | "
                     f"{_fmt(i['estimate'])} | {_ci(i)} | {i['method']} |")
    lines += ["", "## Retention rule", "",
              "D_reg = mean_s(r_v,s - regret_fraction * r_c,s) against the structural control; "
              "D_mae = mean_s(m_v,s - mae_fraction * m_m,s) against the matched control. Retained iff "
              f"both <= 0 (point estimates decide). With one-sided {report['bootstrap']['confidence']:.0%} "
              "scene-bootstrap bounds: a retention is robust iff both upper bounds are <= 0; a rejection "
              "is robust iff at least one failing margin (> 0) has its lower bound > 0, whatever the "
              f"passing margin's bound; nothing is robust on fewer than {MIN_SCENES_FOR_ROBUST} scenes; "
              "otherwise inconclusive.",
              "", "| variant | control | matched | seed | D_reg | upper | lower | D_mae | upper | lower "
              "| retained | label |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["retention"]:
        for seed, d in r["per_seed"].items():
            lines.append(f"| {r['variant']} | {r['structural_control']} | {r['matched_control']} | {seed} | "
                         f"{_fmt(d['d_reg']['estimate'])} | {_fmt(d['d_reg']['upper']['high'])} | "
                         f"{_fmt(d['d_reg']['lower']['low'])} | "
                         f"{_fmt(d['d_mae']['estimate'])} | {_fmt(d['d_mae']['upper']['high'])} | "
                         f"{_fmt(d['d_mae']['lower']['low'])} | "
                         f"{'yes' if d['retained'] else 'no'} | {d['label']} |")
        if r["seeds_disagree"]:
            lines.append(f"\n**Seeds disagree for `{r['variant']}`**: the decision is not replicated.\n")
    lines += seed_aware_markdown(report)
    if any("benchmark" in c for c in report["cells"]):
        lines += ["", "## Scorer benchmark (canonical first TRAIN chain, no updates)", "",
                  "| arm | seed | median forward (ms) | encoder (ms, hooked) | readout (ms, hooked) | tensors with grad |",
                  "|---|---|---|---|---|---|"]
        for c in report["cells"]:
            b = c.get("benchmark")
            if b:
                lines.append(f"| {c['arm']} | {c['seed']} | {b['median_forward_seconds'] * 1e3:.3f} | "
                             f"{b['encoder_seconds'] * 1e3:.3f} | {b['readout_seconds'] * 1e3:.3f} | "
                             f"{b['parameters_receiving_gradients']} |")
    lines += ["", "Figures: `arms.png` (each arm's MAE and regret with intervals), "
              "`paired_differences.png` (paired differences against controls).", ""]
    return "\n".join(lines)


def _figures(report: dict) -> dict[str, Callable[[Path], None]]:
    """{figure name: writer(path)} for each of ``FIGURES`` (the writer saves a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = report["horizon"]

    def arms_figure(path: Path) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, metric in zip(axes, ("mae", "regret")):
            labels = []
            for i, c in enumerate(report["cells"]):
                iv = c[f"{metric}_intervals"][-1]
                low = iv["low"] if iv["low"] is not None else iv["estimate"]
                high = iv["high"] if iv["high"] is not None else iv["estimate"]
                ax.errorbar([i], [iv["estimate"]], yerr=[[iv["estimate"] - low], [high - iv["estimate"]]],
                            fmt="o", capsize=3, color=f"C{report['seeds'].index(c['seed'])}")
                labels.append(f"{c['arm']}\ns{c['seed']}")
            ax.axhline(report["constant"][metric][-1], color="grey", linestyle="--", label="TRAIN constant")
            if metric == "regret":
                # The heuristics are policies (no MAE); the oracle line is labelled as such.
                for ref, style in zip(report["references"].values(), (":", "-.", (0, (1, 3)))):
                    ax.axhline(ref["regret"][-1], color="C3" if ref["oracle"] else "black",
                               linestyle=style, linewidth=0.9,
                               label=f"{ref['label']} {ref['note']}" if ref["oracle"] else ref["label"])
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(f"{metric} at H={h} (m)")
            ax.set_title(f"{metric.upper() if metric == 'mae' else metric}_{h}, 95% scene-bootstrap CI")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)

    def paired_figure(path: Path) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * max(4, len(report["paired"]) // 2) + 1.5))
        for ax, metric in zip(axes, ("regret", "mae")):
            rows = [p for p in report["paired"] if p["metric"] == metric]
            for i, p in enumerate(rows):
                iv = p["interval"]
                low = iv["low"] if iv["low"] is not None else iv["estimate"]
                high = iv["high"] if iv["high"] is not None else iv["estimate"]
                ax.errorbar([iv["estimate"]], [i], xerr=[[iv["estimate"] - low], [high - iv["estimate"]]],
                            fmt="o", capsize=3, color=f"C{report['seeds'].index(p['seed'])}")
            ax.axvline(0.0, color="grey", linestyle="--")
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels([f"{p['arm']} - {p['against']} (s{p['seed']})" for p in rows], fontsize=7)
            ax.set_xlabel(f"paired difference of {metric} at H={h} (m)")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)

    return dict(zip(FIGURES, (arms_figure, paired_figure)))


def write_report_files(report: dict, directory: Path) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and the figures into ``directory`` (write-once files).

    Args:
        report: the report (``report.build_report``).
        directory: an existing directory (the staging directory of ``report/``).

    Returns:
        {file name: path} of every file written, for the report receipt's outputs.
    """
    outputs = {REPORT_JSON: directory / REPORT_JSON, REPORT_MARKDOWN: directory / REPORT_MARKDOWN}
    publish_json(outputs[REPORT_JSON], report)
    publish_bytes(outputs[REPORT_MARKDOWN], _markdown(report).encode("utf-8"))
    for name, writer in _figures(report).items():
        publish_file(directory / name, writer)
        outputs[name] = directory / name
    return outputs
