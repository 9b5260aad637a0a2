"""Gantt chart of a simulated sync-round (:func:`ecofl.pipeline.cost.simulate`'s timeline).

One row per device: forward and backward passes as full-height bars labelled
with their micro-batch, sends and receives as thin bars below them, the
flush (all-reduce, optimizer step) in its own colours.
"""

from __future__ import annotations

import os
from typing import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.patches import Patch  # noqa: E402

from ecofl.pipeline.schedule import PASSES, ActionKind  # noqa: E402
from ecofl.pipeline.timeline import TimelineEvent  # noqa: E402

COLOURS = {
    ActionKind.FORWARD: "#4c72b0",
    ActionKind.BACKWARD: "#dd8452",
    ActionKind.SEND: "#55a868",
    ActionKind.RECV: "#8172b3",
    ActionKind.ALLREDUCE: "#c44e52",
    ActionKind.STEP: "#937860",
}
LABELS = {
    ActionKind.FORWARD: "forward",
    ActionKind.BACKWARD: "backward",
    ActionKind.SEND: "send",
    ActionKind.RECV: "receive",
    ActionKind.ALLREDUCE: "all-reduce",
    ActionKind.STEP: "optimizer step",
}
# (bottom, height) within a device's row of height 1, by kind
LANES = {
    ActionKind.FORWARD: (0.35, 0.6),
    ActionKind.BACKWARD: (0.35, 0.6),
    ActionKind.ALLREDUCE: (0.35, 0.6),
    ActionKind.STEP: (0.35, 0.6),
    ActionKind.SEND: (0.2, 0.12),
    ActionKind.RECV: (0.05, 0.12),
}


def plot_gantt(
    timeline: Iterable[TimelineEvent],
    path: str | os.PathLike,
    title: str = "Simulated sync-round",
    device_names: dict[int, str] | None = None,
) -> None:
    """Write the timeline as a PNG: one row per device (top = lowest index)."""
    events = list(timeline)
    if not events:
        raise ValueError("nothing to plot: the timeline is empty")
    devices = sorted({e.device for e in events})
    row = {d: i for i, d in enumerate(reversed(devices))}
    end = max(e.end for e in events)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.7 * len(devices)))
    for kind, (bottom, height) in LANES.items():
        spans = [(e.start, e.end - e.start, row[e.device]) for e in events if e.kind == kind]
        for start, width, r in spans:
            ax.broken_barh([(start, width)], (r + bottom, height), facecolors=COLOURS[kind],
                           edgecolors="white", linewidth=0.3)
    for e in events:  # micro-batch labels where the bar is wide enough to read
        if e.kind in PASSES and e.end - e.start > end / 120:
            bottom, height = LANES[e.kind]
            ax.text((e.start + e.end) / 2, row[e.device] + bottom + height / 2, str(e.micro_batch),
                    ha="center", va="center", fontsize=6, color="white")
    names = device_names or {}
    ax.set_yticks([row[d] + 0.5 for d in devices])
    ax.set_yticklabels([f"device {d}" + (f" ({names[d]})" if d in names else "") for d in devices])
    ax.set_ylim(0, len(devices))
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    present = [k for k in COLOURS if any(e.kind == k for e in events)]
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in present],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
