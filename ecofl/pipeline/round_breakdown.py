"""Where a sync-round's time goes, read from a timeline (measured or predicted): compute, and hand-off waits.

A device of a stage is either computing (a forward or a backward) or idle.
An operation whose input comes from a neighbour stage (a forward's
activations from stage s - 1, a backward's gradient from stage s + 1) and
which its device was free to start before that neighbour had finished
producing it, waited for a *hand-off*: from the end of the neighbour's
operation (the last of its devices, for a replicated stage) to the start of
this one. That span holds the transfer, the runtime's sending and
receiving, and, on a confined device, any wait for its next CPU period.

Set side by side, the breakdown of a measured round and of the cost model's
prediction (:func:`ecofl.pipeline.cost.simulate`) say whether a round ran
longer than predicted because its stages computed longer or because they
waited longer for each other (Eco-FL §4.2's synchronous static and
dependency bubbles, measured).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ecofl.pipeline.schedule import ActionKind
from ecofl.pipeline.timeline import TimelineEvent

COMPUTE = (ActionKind.FORWARD, ActionKind.BACKWARD)


@dataclass(frozen=True)
class DeviceBreakdown:
    """One device's share of a round: from its first operation's start to its last one's end."""

    device: int
    stage: int
    compute_s: float  # its forwards and backwards
    idle_s: float  # the rest of that span
    handoff_waits_s: tuple[float, ...]  # each waited-for hand-off: the producer's end to this operation's start


def round_breakdown(timeline: Iterable[TimelineEvent], rounds: int = 1, index: int = -1) -> dict[int, DeviceBreakdown]:
    """Each device's breakdown of sync-round ``index`` of ``timeline``, which holds ``rounds`` rounds of the
    same plan (each device runs the same operations every round)."""
    if rounds < 1:
        raise ValueError(f"rounds must be positive, got {rounds}")
    by_device: dict[int, list[TimelineEvent]] = defaultdict(list)
    for event in timeline:
        if event.kind in COMPUTE:
            by_device[event.device].append(event)
    chosen: dict[int, list[TimelineEvent]] = {}
    for device, events in by_device.items():
        if len(events) % rounds:
            raise ValueError(f"device {device} has {len(events)} operations, not {rounds} rounds' worth")
        per_round = len(events) // rounds
        events.sort(key=lambda e: e.start)
        chosen[device] = events[per_round * (index % rounds):][:per_round]
    produced: dict[tuple[int, ActionKind, int], float] = {}  # (stage, kind, micro-batch) -> its last end
    for events in chosen.values():
        for e in events:
            key = (e.stage, e.kind, e.micro_batch)
            produced[key] = max(produced.get(key, e.end), e.end)
    return {device: _breakdown(device, events, produced) for device, events in sorted(chosen.items())}


def _breakdown(device: int, events: list[TimelineEvent], produced: dict[tuple[int, ActionKind, int], float]
               ) -> DeviceBreakdown:
    compute = sum(e.end - e.start for e in events)
    waits = []
    free = float("-inf")  # the device was free before its first operation
    for e in events:
        neighbour = e.stage - 1 if e.kind == ActionKind.FORWARD else e.stage + 1
        ready = produced.get((neighbour, e.kind, e.micro_batch))
        if ready is not None and free < ready <= e.start:
            waits.append(e.start - ready)
        free = e.end
    span = events[-1].end - events[0].start
    return DeviceBreakdown(device, events[0].stage, compute, span - compute, tuple(waits))
