"""When a group round completes: on the virtual clock and on the wall clock (Eco-FL §5.1).

One rule for both (:func:`closing_time`): a synchronous round closes when
every sampled home has replied, or at its deadline, whichever comes first.
A round with a late home therefore closes at its deadline, never at its last
on-time reply: a server cannot know that the missing home will not come
before the deadline.

**Virtual clock** (:class:`VirtualRounds`): a home's latency is computed by
the home from the task's virtual time, so every reply is known when
``Transport.train`` returns and the rule gives the completion at once (a
round without a deadline with a home that never answered closes at its
group's latency centre, or at its last reply if that is later). Rounds are
applied in exact virtual-time order, however the transport schedules the
real training.

**Wall clock** (:class:`WallRounds`): rounds are ``submit``-ted and replies
``collect``-ed as they arrive; the rule closes a round the moment its last
home answers or its deadline passes, while the other groups keep training.
The training time a home measured is remembered for re-grouping, also when
it answers too late for its round.

Both order completed rounds by (completion, group id), so ties do not
depend on the order a transport returns replies in.

**Busy homes.** A home is busy from the moment its task is sent until its
reply or its failure, also when its round closed without it: a straggler
is still training. :meth:`RoundCompletion.busy_homes` is what the loop may
not sample. On the virtual clock a home is busy until its reply's latency
has elapsed (a home that never answered is free when its round closes); on
the wall clock until its reply (or the transport's timeout error) is
collected. When every home the loop could sample is busy and no round is in
flight, :meth:`RoundCompletion.wait_for_a_home` waits until one is free.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, MutableMapping, Protocol, Sequence

import numpy as np

from ecofl.fl.clock import Clock
from ecofl.fl.group_round import GroupRound
from ecofl.fl.transport import TrainReply, TrainTask, Transport

log = logging.getLogger(__name__)

InFlight = MutableMapping[int, GroupRound]  # group id -> its round in flight
Latencies = MutableMapping[int, float]  # home -> latest response latency (seconds)
Busy = MutableMapping[int, float]  # home -> clock time its task ends (inf: a wall-clock task not yet answered)


class RoundCompletion(Protocol):
    """How the loop sends rounds and learns which completed first."""

    virtual: bool

    def send(self, rounds: Sequence[GroupRound], tasks: Sequence[TrainTask], in_flight: InFlight) -> None:
        """Send ``tasks`` (the homes of ``rounds``) and put the rounds in flight."""
        ...

    def next_completed(self, in_flight: InFlight, latencies: Latencies) -> GroupRound:
        """The in-flight round that completed first (waiting for one on the wall clock)."""
        ...

    def applied(self, r: GroupRound, latencies: Latencies) -> None:
        """Round ``r`` was applied: remember the latencies its homes reported where that is the rule."""
        ...

    def busy_homes(self, in_flight: InFlight) -> set[int]:
        """The homes training now: those of the rounds in flight and those still on a closed round's task."""
        ...

    def wait_for_a_home(self, in_flight: InFlight, latencies: Latencies) -> float:
        """No round is in flight and homes are busy: wait until one of them is free; returns the clock time."""
        ...


class BusyHomes:
    """The shared half of both rules: which homes are busy, by the clock."""

    def __init__(self, clock: Clock, busy: Busy):
        self.clock = clock
        self.busy = busy

    def busy_homes(self, in_flight: InFlight) -> set[int]:
        now = self.clock.now()
        for home in [h for h, until in self.busy.items() if until <= now]:
            del self.busy[home]
        return {h for r in in_flight.values() for h in r.homes} | set(self.busy)


def earliest(rounds) -> GroupRound:
    """The round that completes first; ties: the lower group id."""
    return min(rounds, key=lambda r: (r.completion, r.group))


def closing_time(r: GroupRound, now: float | None = None) -> float | None:
    """When round ``r`` closes: when every sampled home has replied within the deadline (at the latest of
    those replies), else at its deadline; None while it may still wait.

    ``now``: the wall clock's present (a deadline not yet reached keeps the round open); None on the
    virtual clock, where every reply that will ever come is known. A reply's ``latency_s`` is its
    arrival after ``r.start``.
    """
    on_time = {x.home: x.latency_s for x in r.arrived()}
    if set(r.homes) <= on_time.keys():
        return r.start + max(on_time.values(), default=0.0)
    if r.deadline is not None and (now is None or now >= r.start + r.deadline):
        return r.start + r.deadline
    return None


class VirtualRounds(BusyHomes):
    """Train each batch of rounds in one blocking call; completion times follow from the replies."""

    virtual = True

    def __init__(self, transport: Transport, centre_of: Callable[[int], float], clock: Clock, busy: Busy):
        super().__init__(clock, busy)
        self.transport = transport
        self.centre_of = centre_of  # a group's latency centre: a round with no reply and no deadline takes it

    def send(self, rounds: Sequence[GroupRound], tasks: Sequence[TrainTask], in_flight: InFlight) -> None:
        replies = sorted(self.transport.train(tasks), key=lambda r: r.home)
        by_home = {h: r for r in rounds for h in r.homes}
        for reply in replies:
            if reply.home in by_home:
                by_home[reply.home].replies.append(reply)
        for r in rounds:
            closed = closing_time(r)
            if closed is None:  # no deadline and a home that never answers: no earlier than its other replies
                answered = [x.latency_s for x in r.replies if np.isfinite(x.latency_s)]
                closed = r.start + max([self.centre_of(r.group), *answered])
            r.completion = closed
            in_flight[r.group] = r
            answered = {x.home: x.latency_s for x in r.replies if np.isfinite(x.latency_s)}
            for home in r.homes:
                self.busy[home] = r.start + answered[home] if home in answered else r.completion

    def next_completed(self, in_flight: InFlight, latencies: Latencies) -> GroupRound:
        return earliest(in_flight.values())

    def wait_for_a_home(self, in_flight: InFlight, latencies: Latencies) -> float:
        """The clock time the first busy home is free (the loop moves its clock there)."""
        return min(self.busy.values())

    def applied(self, r: GroupRound, latencies: Latencies) -> None:
        """Algorithm 1 watches the latencies of every applied round's homes."""
        for reply in r.replies:
            if reply.latency_s is not None and np.isfinite(reply.latency_s):
                latencies[reply.home] = float(reply.latency_s)


class WallRounds(BusyHomes):
    """Submit rounds and collect replies as they arrive; a round completes when all answered or at its deadline."""

    virtual = False

    def __init__(self, transport: Transport, clock: Clock, busy: Busy):
        super().__init__(clock, busy)
        self.transport = transport

    def send(self, rounds: Sequence[GroupRound], tasks: Sequence[TrainTask], in_flight: InFlight) -> None:
        in_flight.update({r.group: r for r in rounds})
        self.busy.update((task.home, math.inf) for task in tasks)
        self.transport.submit(tasks)

    def next_completed(self, in_flight: InFlight, latencies: Latencies) -> GroupRound:
        while True:
            now = self.clock.now()
            for r in in_flight.values():
                if r.completion is None:
                    _close_if_complete(r, now)
            completed = [r for r in in_flight.values() if r.completion is not None]
            if completed:
                return earliest(completed)
            deadlines = [r.start + r.deadline for r in in_flight.values() if r.deadline is not None]
            self._collect(in_flight, latencies, max(0.0, min(deadlines) - now) if deadlines else None)

    def applied(self, r: GroupRound, latencies: Latencies) -> None:
        """Latencies were remembered as the replies arrived."""

    def wait_for_a_home(self, in_flight: InFlight, latencies: Latencies) -> float:
        """Collect replies until a busy home has answered (its reply, or the transport's timeout error)."""
        busy = set(self.busy)
        while busy <= set(self.busy):
            if not self._collect(in_flight, latencies, None):  # a whole reply timeout without a reply
                log.warning("homes %s never answered; they are free again", sorted(busy))
                for home in busy:
                    self.busy.pop(home, None)
        return self.clock.now()

    def _collect(self, in_flight: InFlight, latencies: Latencies, wait_s: float | None) -> int:
        """File the replies that arrived within ``wait_s`` seconds; how many there were."""
        replies = self.transport.collect(wait_s)
        for task, reply in replies:
            self.busy.pop(task.home, None)
            _receive(in_flight, latencies, task, reply, self.clock.now())
        return len(replies)


def _receive(in_flight: InFlight, latencies: Latencies, task: TrainTask, reply: TrainReply, arrival: float) -> None:
    """File a reply with its round, as arriving ``arrival - start`` after it was sent."""
    if np.isfinite(reply.latency_s):
        latencies[reply.home] = float(reply.latency_s)
    r = in_flight.get(task.route.group)
    if r is None or r.dispatch != task.route.dispatch or r.completion is not None:
        log.info("home %d answered after its round (dispatch %d) was closed", task.home, task.route.dispatch)
        return
    r.replies.append(replace(reply, latency_s=arrival - r.start))


def _close_if_complete(r: GroupRound, now: float) -> None:
    """Close a wall-clock round by :func:`closing_time` (its replies then in home order)."""
    r.completion = closing_time(r, now)
    if r.completion is not None:
        r.replies.sort(key=lambda x: x.home)


def round_completion(
    clock: Clock, transport: Transport, centre_of: Callable[[int], float], busy: Busy
) -> RoundCompletion:
    """The completion rule of ``clock``'s kind; ``busy`` (the loop's state) records which homes train until when."""
    if clock.virtual:
        return VirtualRounds(transport, centre_of, clock, busy)
    return WallRounds(transport, clock, busy)
