"""The image a command's ``--timeline`` or ``--gantt`` option asks for: a pipeline's timeline drawn as a Gantt chart."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from ecofl.cli.options import image_path
from ecofl.devices import HomePool
from ecofl.pipeline.gantt import plot_gantt
from ecofl.pipeline.timeline import TimelineEvent


def write_timeline(option: str, timeline: Iterable[TimelineEvent], title: str, pool: HomePool,
                   label: str = "timeline") -> None:
    """Draw ``timeline`` (a row for each of ``pool``'s devices, by name) into the file ``option`` names
    (:func:`~ecofl.cli.options.image_path`), and say on stderr where it went."""
    image = image_path(option)
    plot_gantt(timeline, image, title=title, device_names={d: spec.name for d, spec in enumerate(pool.devices)})
    print(f"{label} written to {image}", file=sys.stderr)
