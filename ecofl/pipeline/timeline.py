"""One timed event of a sync-round or a stream: what a device did, for which stage and micro-batch, when.

The cost model predicts timelines (:mod:`ecofl.pipeline.cost`,
:mod:`ecofl.pipeline.stream`), the runtime measures them
(:mod:`ecofl.pipeline.runtime.statistics`, which parses the kinds its
workers report in their string form), and :mod:`ecofl.pipeline.gantt`
draws either.
"""

from __future__ import annotations

from typing import NamedTuple

from ecofl.pipeline.schedule import ActionKind


class TimelineEvent(NamedTuple):
    device: int
    stage: int  # the stage the device works for; -1 for the portal's input transfer
    kind: ActionKind
    micro_batch: int  # -1 for flush events
    start: float
    end: float
