"""The file a command's ``--timeline`` or ``--gantt`` option asks for: a pipeline's timeline drawn as a Gantt
chart, or (``.json``) its events as data, one object per operation, for a reader to compute on."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from ecofl.cli.options import image_path
from ecofl.devices import HomePool
from ecofl.pipeline.gantt import plot_gantt
from ecofl.pipeline.timeline import TimelineEvent


def write_timeline(option: str, timeline: Iterable[TimelineEvent], title: str, pool: HomePool,
                   label: str = "timeline") -> None:
    """Draw ``timeline`` (a row for each of ``pool``'s devices, by name) into the file ``option`` names
    (:func:`~ecofl.cli.options.image_path`), or write its events there if it ends in ``.json``; say on stderr
    where it went."""
    path = image_path(option)
    names = {d: spec.name for d, spec in enumerate(pool.devices)}
    if path.suffix.lower() == ".json":
        events = [{"device": e.device, "device_name": names.get(e.device), "stage": e.stage, "kind": str(e.kind),
                   "micro_batch": e.micro_batch, "start": e.start, "end": e.end} for e in timeline]
        path.write_text(json.dumps({"title": title, "events": events}, indent=1))
    else:
        plot_gantt(timeline, path, title=title, device_names=names)
    print(f"{label} written to {path}", file=sys.stderr)
