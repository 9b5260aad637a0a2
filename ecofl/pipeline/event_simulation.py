"""The cost model's event simulation: devices run their stages' action lists under a dispatch rule.

:func:`run` plays a schedule (:mod:`ecofl.pipeline.schedule`) on
:class:`Worker` s, each one device's part of one stage with the seconds of
its passes and what it sends to whom; the training cost model
(:func:`ecofl.pipeline.cost.simulate`) and the inference stream's
(:func:`ecofl.pipeline.stream.simulate_stream`) build them. The portal
(device 0) holds the data: it sends each micro-batch's input samples to
stage 0's other devices (``Worker.input_s``) and, in a stream, takes the
last stage's results (a receiver ``None``). A device takes its stage's next
action as soon as the action's inputs have all arrived and the device is
done with its last one; a finished pass sends its output over FIFO
channels, one per ordered device pair (full duplex; sending is asynchronous,
so communication overlaps computation). In an asynchronous 1F1B plan
(``Worker.step_s``) every backward is followed by that micro-batch's
optimizer step, after its gradient has gone out (FTPipeHD §III-C).

Back-pressure (a stream, PipeEdge): a device with ``Worker.hold`` = K holds
at most K micro-batches, each from the start of its transfer in (the start
of its forward, for the portal's own input) until its output has been sent
on; a forward transfer into a full device waits until micro-batch m - K has
left it. Training sets no hold: its resident forwards are bounded by the
schedule's action lists instead.

How the actions that are ready get a processor is the dispatch rule:

- :class:`Fifo`: every device is its own machine and runs its actions in
  order, one at a time, at full speed; an action's end is known, and so
  settled, the moment it starts.
- :class:`ProcessorSharing`: the devices are processes of one machine with
  C cores: an action starts as soon as it is ready and, while n run, each
  progresses at min(1, C/n) of a core (how the kernel's time slices share
  cores among runnable processes); an action's end is settled only when it
  comes, as later starts slow it down.

The loop takes whichever comes first: the next ready action (ties: lower
stage first) or the next end the rule settles (a ready action on a tie).
Each rule also says when a flush's optimizer step starts: at once on a
device of its own, on a free core when the cores are shared.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Protocol

from ecofl.pipeline.schedule import Action, ActionKind, Schedule, ScheduleError
from ecofl.pipeline.timeline import TimelineEvent

Key = tuple[int, int]  # a worker's (stage, index in its stage)


class Worker:
    """One device's part of one stage: its passes' seconds, its sends and its progress through the actions."""

    __slots__ = ("device", "stage", "index", "lo", "hi", "forward_s", "backward_s", "step_s", "input_s", "hold",
                 "free", "busy", "position", "pending_f", "pending_b", "arrive_f", "arrive_b", "send_f", "send_b",
                 "unsent", "release", "waiting")

    def __init__(self, device: int, stage: int, index: int, lo: int, hi: int, forward_s: float, backward_s: float,
                 num_micro_batches: int):
        self.device, self.stage, self.index, self.lo, self.hi = device, stage, index, lo, hi
        self.forward_s, self.backward_s = forward_s, backward_s
        self.step_s = 0.0  # asynchronous 1F1B: the optimizer step after each backward
        self.input_s: float | None = None  # stage 0: seconds of a micro-batch's inputs from the portal
        self.hold: int | None = None  # a stream's K: micro-batches held at most (None: no back-pressure)
        self.free = 0.0  # when the device is done with its last action
        self.busy = 0.0  # seconds of forward and backward passes
        self.position = 0  # index of its next action in its stage's list
        self.pending_f = [0] * num_micro_batches  # inputs of each micro-batch's forward not yet sent to it
        self.pending_b = [0] * num_micro_batches  # and of its backward
        self.arrive_f = [0.0] * num_micro_batches  # when the last of them arrives
        self.arrive_b = [0.0] * num_micro_batches
        self.send_f: list[tuple[Worker | None, float]] = []  # (receiver, seconds) of each forward's output;
        # receiver None: the portal takes the result (a stream's last stage)
        self.send_b: list[tuple[Worker, float]] = []  # and of each backward's
        self.unsent = [0] * num_micro_batches  # each forward's outputs not yet on their way
        self.release: list[float | None] = [None] * num_micro_batches  # when micro-batch m left (while
        # unsent[m]: the latest of its forward and the transfers out booked so far; None: not computed yet)
        self.waiting: list[tuple[Worker | None, int, float, float]] = []  # transfers in, waiting for room:
        # (sender, None: the portal's input; micro-batch, ready at, seconds)

    def room(self, m: int) -> float | None:
        """When this device may take micro-batch ``m`` (None: not known yet, m - K has not left)."""
        if self.hold is None or m < self.hold:
            return 0.0
        held = m - self.hold
        return None if self.unsent[held] else self.release[held]


class DispatchRule(Protocol):
    """How the ready actions get a processor: when each ends, and when that end is settled."""

    now: float  # the time the simulation has reached

    @property
    def running(self) -> Mapping[Key, object]:
        """The workers whose action has started and is not settled."""

    def start(self, key: Key, kind: ActionKind, micro_batch: int, begin: float, work: float) -> None:
        """Worker ``key`` begins ``work`` seconds (at full speed) of ``kind`` on the micro-batch at ``begin``."""

    def next_settled(self) -> tuple[float, Key | None]:
        """When the next running action's end is settled, and whose (inf, None: nothing runs)."""

    def advance(self, to: float) -> None:
        """Time passes to ``to`` (no action is settled or started before it)."""

    def settle(self, key: Key) -> tuple[ActionKind, int, float, float]:
        """Worker ``key``'s action is over: its kind, micro-batch, begin and end."""

    def flush_start(self, ready_at: float, seconds: float) -> float:
        """When a flush's optimizer step of ``seconds``, ready at ``ready_at``, starts."""


class Fifo:
    """Every device is its own machine: one action at a time, at full speed, each settled when it starts."""

    def __init__(self) -> None:
        self.now = 0.0
        self.running: dict[Key, tuple[float, ActionKind, int, float, float]] = {}  # (started at, kind, m, begin, end)

    def start(self, key: Key, kind: ActionKind, micro_batch: int, begin: float, work: float) -> None:
        self.running[key] = (self.now, kind, micro_batch, begin, begin + work)

    def next_settled(self) -> tuple[float, Key | None]:
        if not self.running:
            return math.inf, None
        key = min(self.running, key=lambda k: (self.running[k][0], k))
        return self.running[key][0], key

    def advance(self, to: float) -> None:
        self.now = to

    def settle(self, key: Key) -> tuple[ActionKind, int, float, float]:
        _, kind, m, begin, end = self.running.pop(key)
        return kind, m, begin, end

    def flush_start(self, ready_at: float, seconds: float) -> float:
        """At once: the device is its own machine."""
        return ready_at


class ProcessorSharing:
    """The devices share ``cores`` cores: while n actions run, each progresses at min(1, cores / n) of a core."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.now = 0.0
        self.running: dict[Key, list] = {}  # [kind, m, begin, work left at self.now]
        self._core_free = [0.0] * cores  # the flush's optimizer steps: a min-heap of when each core is free

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self.running)) if self.running else 1.0

    def start(self, key: Key, kind: ActionKind, micro_batch: int, begin: float, work: float) -> None:
        self.running[key] = [kind, micro_batch, begin, work]

    def next_settled(self) -> tuple[float, Key | None]:
        """The action with the least work left ends first, if nothing starts before."""
        if not self.running:
            return math.inf, None
        key = min(self.running, key=lambda k: self.running[k][3])
        return self.now + max(0.0, self.running[key][3]) / self._rate(), key

    def advance(self, to: float) -> None:
        rate = self._rate()
        for entry in self.running.values():
            entry[3] -= (to - self.now) * rate
        self.now = to

    def settle(self, key: Key) -> tuple[ActionKind, int, float, float]:
        kind, m, begin, _ = self.running.pop(key)
        return kind, m, begin, self.now

    def flush_start(self, ready_at: float, seconds: float) -> float:
        """When a core is free: the flush's steps take a core each."""
        start = max(ready_at, heapq.heappop(self._core_free))
        heapq.heappush(self._core_free, start + seconds)
        return start


def run(workers: list[list[Worker]], schedule: Schedule, rule: DispatchRule, timeline: list[TimelineEvent]) -> None:
    """Play every stage's actions of ``schedule`` on its ``workers`` under ``rule``; what happens goes to ``timeline``.

    Raises :class:`ScheduleError` if the schedule deadlocks.
    """
    links = _Links(timeline)
    # (ready time, stage, index, position): once an action is ready its time is final (its inputs have all
    # arrived, its device is not free earlier), so an offer stays valid until the device moves on.
    offers: list[tuple[float, int, int, int]] = []

    def offer(w: Worker | None) -> None:
        if w is not None and (t := _ready(w, schedule[w.stage])) is not None:
            heapq.heappush(offers, (t, w.stage, w.index, w.position))

    for w in workers[0]:
        if w.input_s is not None:
            links.feed(w)
    for ws in workers:
        for w in ws:
            offer(w)
    while offers or rule.running:
        while offers and (offers[0][3] != workers[offers[0][1]][offers[0][2]].position
                          or offers[0][1:3] in rule.running):
            heapq.heappop(offers)  # stale: its device has moved on, or is busy with the action offered
        settled_at, key = rule.next_settled()
        if offers and offers[0][0] <= settled_at:
            at, s, i, _ = heapq.heappop(offers)
            rule.advance(max(at, rule.now))
            w = workers[s][i]
            _, kind, m = schedule[s][w.position]
            rule.start((s, i), kind, m, rule.now, w.forward_s if kind == ActionKind.FORWARD else w.backward_s)
            continue
        rule.advance(settled_at)
        kind, m, begin, end = rule.settle(key)
        w = workers[key[0]][key[1]]
        w.free = end
        timeline.append(TimelineEvent(w.device, w.stage, kind, m, begin, end))
        if kind != ActionKind.STEP:
            w.busy += end - begin
            forward = kind == ActionKind.FORWARD
            for receiver in links.sent(w, m, end, forward):
                offer(receiver)
            if kind == ActionKind.BACKWARD and w.step_s:  # asynchronous 1F1B: the micro-batch's update, after its send
                rule.start(key, ActionKind.STEP, m, end, w.step_s)
                continue
        w.position += 1
        offer(w)
    stuck = [(s, w.device) for s, ws in enumerate(workers) for w in ws if w.position < len(schedule[s])]
    if stuck:  # cannot happen for the schedules plan_schedule builds; guards the invariant
        raise ScheduleError(f"the schedule deadlocks: stage/device pairs {stuck} wait forever")


def _ready(w: Worker, actions: list[Action]) -> float | None:
    """When ``w``'s next action could start (None: it waits for an input not yet sent, or it is done)."""
    if w.position >= len(actions):
        return None
    _, kind, m = actions[w.position]
    forward = kind == ActionKind.FORWARD
    if (w.pending_f if forward else w.pending_b)[m]:
        return None
    return max(w.free, (w.arrive_f if forward else w.arrive_b)[m])


class _Links:
    """The FIFO channels between devices, one per ordered pair: transfers booked in the order they may start.

    A transfer starts once its data is ready, its channel is free and (forward, into a held device) its
    receiver has room; one waiting for room is booked when the receiver releases what blocks it, which may in
    turn release its sender's micro-batch and so unblock transfers further back.
    """

    def __init__(self, timeline: list[TimelineEvent]) -> None:
        self.timeline = timeline
        self.free: dict[tuple[int, int], float] = {}  # when each (sender, receiver) channel is free; (-1, d):
        # the portal's input feed to device d, apart from what the portal sends d as a stage
        self.unblocked: list[Worker] = []  # receivers whose inputs arrived in the last sent(): to offer

    def feed(self, w: Worker) -> None:
        """The portal's input of every micro-batch for stage-0 device ``w``, each once ``w`` has room."""
        w.pending_f = [p + 1 for p in w.pending_f]
        for m in range(len(w.pending_f)):
            self._transfer(None, w, m, 0.0, w.input_s, True)

    def sent(self, w: Worker, m: int, end: float, forward: bool) -> list[Worker]:
        """``w``'s pass of micro-batch ``m`` ended at ``end``: its outputs go out; the receivers to offer."""
        self.unblocked = []
        receivers = w.send_f if forward else w.send_b
        if forward:
            w.unsent[m] = len(receivers)
            w.release[m] = end
        for receiver, seconds in receivers:
            self._transfer(w, receiver, m, end, seconds, forward)
        if forward and not receivers:
            self._released(w)
        return self.unblocked

    def _transfer(self, sender: Worker | None, receiver: Worker | None, m: int, ready: float, seconds: float,
                  forward: bool) -> None:
        room = receiver.room(m) if forward and receiver is not None else 0.0
        if room is None or (forward and receiver is not None and any(w[0] is sender for w in receiver.waiting)):
            receiver.waiting.append((sender, m, ready, seconds))  # its channel is FIFO: behind its waiting ones
            return
        self._book(sender, receiver, m, max(ready, room), seconds, forward)

    def _book(self, sender: Worker | None, receiver: Worker | None, m: int, ready: float, seconds: float,
              forward: bool) -> None:
        from_device = 0 if sender is None else sender.device
        to_device = 0 if receiver is None else receiver.device
        if sender is None and receiver.device == 0:  # the portal's own input: local, taken when it has room
            start = end = ready
        else:
            channel = (-1 if sender is None else from_device, to_device)  # the portal's inputs: a channel apart
            start = max(self.free.get(channel, 0.0), ready)
            end = start + seconds
            self.free[channel] = end
            from_stage = -1 if sender is None else sender.stage
            to_stage = -1 if receiver is None else receiver.stage
            self.timeline.append(TimelineEvent(from_device, from_stage, ActionKind.SEND, m, start, end))
            self.timeline.append(TimelineEvent(to_device, to_stage, ActionKind.RECV, m, start, end))
        if receiver is not None:
            if forward:
                receiver.pending_f[m] -= 1
                receiver.arrive_f[m] = max(receiver.arrive_f[m], end)
            else:
                receiver.pending_b[m] -= 1
                receiver.arrive_b[m] = max(receiver.arrive_b[m], end)
            self.unblocked.append(receiver)
        if forward and sender is not None:
            sender.release[m] = max(sender.release[m], end)
            sender.unsent[m] -= 1
            if not sender.unsent[m]:
                self._released(sender)

    def _released(self, w: Worker) -> None:
        """A micro-batch has left ``w``: book the transfers into ``w`` that waited for that room, each channel's
        in order."""
        still: list[tuple[Worker | None, int, float, float]] = []
        for sender, waiting_m, ready, seconds in w.waiting:
            room = w.room(waiting_m)
            if room is None or any(entry[0] is sender for entry in still):
                still.append((sender, waiting_m, ready, seconds))
            else:
                self._book(sender, w, waiting_m, max(ready, room), seconds, True)
        w.waiting = still
