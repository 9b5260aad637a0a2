"""A picture of a partition: each client's samples as a bar stacked by class.

Clients are ordered by response-latency group when groups are given (the
RLG settings of Eco-FL §6.1), with the groups marked, so one can see at a
glance which classes each group holds. Uses matplotlib's Agg canvas
directly, without pyplot's global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_label_distribution(
    histograms: np.ndarray,
    path: str | Path,
    *,
    class_names: Sequence[str],
    title: str,
    groups: np.ndarray | None = None,
) -> None:
    """Write a PNG of ``histograms`` [clients, classes] as class-stacked bars per client."""
    num_clients, num_classes = histograms.shape
    order = np.argsort(groups, kind="stable") if groups is not None else np.arange(num_clients)
    ordered = histograms[order]
    figure = Figure(figsize=(min(4 + 0.18 * num_clients, 18), 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colours = matplotlib.colormaps["tab10" if num_classes <= 10 else "tab20"]
    positions = np.arange(num_clients)
    bottom = np.zeros(num_clients)
    for label in range(num_classes):
        axes.bar(positions, ordered[:, label], bottom=bottom, width=0.9 if num_clients < 100 else 1.0,
                 color=colours(label % colours.N), label=class_names[label], linewidth=0)
        bottom += ordered[:, label]
    if groups is not None:
        _mark_groups(axes, np.asarray(groups)[order], bottom.max())
    axes.set_xlim(-0.5, num_clients - 0.5)
    axes.set_xlabel("client" + (" (ordered by latency group)" if groups is not None else ""))
    axes.set_ylabel("samples")
    axes.set_title(title)
    if num_clients <= 40:
        axes.set_xticks(positions, [str(i) for i in order], fontsize=7)
    axes.legend(title="class", loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    figure.savefig(path, dpi=120)


def _mark_groups(axes, ordered_groups: np.ndarray, height: float) -> None:
    """Dashed lines between groups and the group id above each."""
    starts = np.flatnonzero(np.r_[True, ordered_groups[1:] != ordered_groups[:-1]])
    ends = np.r_[starts[1:], len(ordered_groups)]
    for start, end in zip(starts, ends):
        if start > 0:
            axes.axvline(start - 0.5, color="black", linestyle="--", linewidth=0.8)
        axes.text((start + end - 1) / 2, height * 1.02, f"G{ordered_groups[start]}",
                  ha="center", va="bottom", fontsize=8)
    axes.set_ylim(0, height * 1.1)
