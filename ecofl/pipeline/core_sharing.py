"""Devices that are processes of one machine share its cores: processor sharing, as the kernel's time slices do.

When a home runs at host speed on one machine (``ecofl home train
--no-emulate``), its devices' operations compete for the machine's cores.
:func:`share_cores` runs the cost model's ready operations that way: an
operation starts as soon as it is ready, and while n run, each progresses at
min(1, C / n) of a core. :func:`take_core` gives the flush's optimizer steps
a free core each. The cost model (:func:`ecofl.pipeline.cost.simulate` with
``cores=C``) calls both.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable

from ecofl.pipeline.schedule import Schedule
from ecofl.pipeline.timeline import TimelineEvent

if TYPE_CHECKING:
    from ecofl.pipeline.cost import _Worker


def take_core(core_free: list[float] | None, ready_at: float, seconds: float) -> float:
    """Start of an operation ready at ``ready_at`` that lasts ``seconds``: at once, or when a shared core frees."""
    if core_free is None:
        return ready_at
    start = max(ready_at, heapq.heappop(core_free))
    heapq.heappush(core_free, start + seconds)
    return start


def share_cores(cores: int, workers: list[list[_Worker]], schedule: Schedule,
                 heap: list[tuple[float, int, int, int]], timeline: list[TimelineEvent],
                 completed: Callable[[int, int, str, int, float, float], None],
                 moved_on: Callable[..., None]) -> None:
    """Run the ready operations on ``cores`` shared cores the way the kernel shares them (processor sharing).

    An operation starts as soon as it is ready; while n operations run, each
    progresses at min(1, cores / n) of a core, so one lasts longer than its
    work when more devices compute than there are cores. ``heap`` holds
    ``(ready time, stage, index, position)`` offers (an offer of a device that
    is computing, or of an earlier position, is stale).
    """
    running: dict[tuple[int, int], list] = {}  # (stage, index) -> [kind, m, start, work left]
    now = 0.0
    while heap or running:
        while heap and (heap[0][3] != workers[heap[0][1]][heap[0][2]].position or heap[0][1:3] in running):
            heapq.heappop(heap)
        rate = min(1.0, cores / len(running)) if running else 1.0
        key = min(running, key=lambda k: running[k][3]) if running else None
        finish_at = now + max(0.0, running[key][3]) / rate if key is not None else float("inf")
        if heap and heap[0][0] <= finish_at:
            at, s, i, _ = heapq.heappop(heap)
            at = max(at, now)
        else:
            at, (s, i) = finish_at, key
        for entry in running.values():
            entry[3] -= (at - now) * rate
        now = at
        w = workers[s][i]
        if (s, i) not in running:  # an offer taken: the device starts its next action
            _, kind, m = schedule[s][w.position]
            running[(s, i)] = [kind, m, now, w.forward_s if kind == "F" else w.backward_s]
            continue
        kind, m, start, _ = running.pop((s, i))
        if kind == "step":
            timeline.append(TimelineEvent(w.device, s, "step", m, start, now))
            w.free = now
            moved_on(s, i, "B")
            continue
        completed(s, i, kind, m, start, now)
        if kind == "B" and w.step_s:  # asynchronous 1F1B: its own update, after its send
            running[(s, i)] = ["step", m, now, w.step_s]
            moved_on(s, i, kind, done=False)  # the gradient it sent is on its way already
            continue
        moved_on(s, i, kind)
