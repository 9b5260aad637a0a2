"""One rule for when a synchronous round closes, on both clocks (Eco-FL §5.1; issue 27).

A round closes when every sampled home has replied, or at its deadline,
whichever comes first. The same scripted replies go through the virtual
clock (every reply known at once) and the wall clock (replies collected as
they arrive, on a clock the test moves), and give the same close times and
the same stragglers. The virtual clock once closed a round with a late home
at its last on-time reply, as if the server knew the late home would not
come before the deadline.
"""

from __future__ import annotations

import numpy as np
import pytest

from ecofl.fl.foreseen_rounds import ForeseenRounds
from ecofl.fl.group_round import GroupRound, screen_replies
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.latency import FixedLatency
from ecofl.fl.round_completion import VirtualRounds, WallRounds, closing_time
from ecofl.fl.transport import TrainReply, TrainTask

WEIGHTS = [np.zeros(1, dtype=np.float32)]

# (homes' latencies in seconds, deadline) -> the close time and the stragglers of a round started at 10 s
SCENARIOS = {
    "a late home: closes at the deadline": ({0: 2.0, 1: 3.0, 2: 9.0}, 5.0, 15.0, 1),
    "every home on time: at the last reply": ({0: 2.0, 1: 3.0, 2: 4.0}, 5.0, 14.0, 0),
    "no deadline: waits for every home": ({0: 2.0, 1: 7.0}, None, 17.0, 0),
    "a reply at the deadline itself is on time": ({0: 1.0, 1: 5.0}, 5.0, 15.0, 0),
    "every home late: at the deadline": ({0: 6.0, 1: 8.0}, 5.0, 15.0, 2),
}


def a_round(latencies: dict[int, float], deadline: float | None) -> GroupRound:
    return GroupRound(group=0, round=0, dispatch=0, start=10.0, version=0, homes=tuple(sorted(latencies)),
                      deadline=deadline, weights=WEIGHTS)


def reply(home: int, latency_s: float) -> TrainReply:
    return TrainReply(home=home, weights=WEIGHTS, num_samples=1, loss=0.0, latency_s=latency_s)


class ScriptedTransport:
    """Replies with the scripted latencies: all at once (virtual), or as a test clock reaches them (wall)."""

    def __init__(self, latencies: dict[int, float], clock: "ScriptedClock"):
        self.latencies, self.clock, self.pending = latencies, clock, []

    def train(self, tasks):
        return [reply(t.home, self.latencies[t.home]) for t in tasks]

    def submit(self, tasks):
        self.pending += [(t.route.virtual_time + self.latencies[t.home], t) for t in tasks]

    def collect(self, wait_s):
        """The replies due by the next arrival, or by ``now + wait_s`` when that comes first; the clock moves."""
        horizon = self.clock.now() + (wait_s if wait_s is not None else float("inf"))
        due = min((at for at, _ in self.pending), default=float("inf"))
        self.clock.t = min(due, horizon)
        arrived = [(t, reply(t.home, 0.0)) for at, t in self.pending if at <= self.clock.t]
        self.pending = [(at, t) for at, t in self.pending if at > self.clock.t]
        return arrived


class ScriptedClock:
    virtual = False

    def __init__(self, t: float):
        self.t = t

    def now(self) -> float:
        return self.t


def tasks_of(r: GroupRound) -> list[TrainTask]:
    return [r.task(home, {}, seed=0) for home in r.homes]


@pytest.mark.parametrize("latencies, deadline, closes_at, stragglers", SCENARIOS.values(), ids=SCENARIOS)
def test_both_clocks_close_a_round_at_the_same_time_with_the_same_stragglers(latencies, deadline, closes_at,
                                                                           stragglers):
    virtual_round = a_round(latencies, deadline)
    in_flight: dict = {}
    VirtualRounds(ScriptedTransport(latencies, ScriptedClock(10.0)), lambda g: 99.0, ScriptedClock(10.0), {}).send(
        [virtual_round], tasks_of(virtual_round), in_flight)

    wall_round, clock = a_round(latencies, deadline), ScriptedClock(10.0)
    wall = WallRounds(ScriptedTransport(latencies, clock), clock, {})
    wall_flight: dict = {}
    wall.send([wall_round], tasks_of(wall_round), wall_flight)
    closed = wall.next_completed(wall_flight, {})

    foreseen_round, foreseen_flight = a_round(latencies, deadline), {}
    model = FixedLatency([latencies.get(h, 0.0) for h in range(max(latencies) + 1)])
    foreseen = ForeseenRounds(ScriptedTransport(latencies, ScriptedClock(10.0)), model, ScriptedClock(10.0), {},
                              HomeFailures())
    foreseen.send([foreseen_round], tasks_of(foreseen_round), foreseen_flight)
    assert foreseen_round.completion == pytest.approx(closes_at)  # known when sent
    assert foreseen.next_completed(foreseen_flight, {}) is foreseen_round

    assert closed is wall_round
    assert virtual_round.completion == pytest.approx(closes_at)
    assert wall_round.completion == pytest.approx(closes_at)
    for r in (virtual_round, wall_round, foreseen_round):
        assert screen_replies(r, WEIGHTS, HomeFailures()).stragglers == stragglers


def test_a_wall_clock_round_stays_open_before_its_deadline_with_a_home_missing():
    r = a_round({0: 2.0, 1: 9.0}, 5.0)
    r.replies.append(reply(0, 2.0))
    assert closing_time(r, now=14.0) is None
    assert closing_time(r, now=15.0) == 15.0
    assert closing_time(r) == 15.0  # the virtual clock knows every reply: home 1 is not among them in time
