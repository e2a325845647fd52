"""Saving a report figure as a PNG whose bytes repeat: the one place figures are written from.

Owns: ``save_figure`` (layout, fixed dpi, no ``Software`` metadata naming matplotlib's version,
close). Does not own: what any figure draws (``qhlab.report.render``, ``qhlab.report.tuning_figures``,
``qhlab.lanes.compare``) or publishing it (the caller writes to a temporary path first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["label_categories", "save_figure"]


def save_figure(fig: Any, path: Path) -> None:
    """Lay out ``fig``, write it to ``path`` as a PNG at 110 dpi without metadata, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)


def label_categories(ax: Any, labels: list[str], *, rotation: int, ylabel: str, title: str) -> None:
    """Name a panel whose x axis holds one category per tick (``labels``, rotated), its y axis and
    its title, and draw its legend."""
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=rotation, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
