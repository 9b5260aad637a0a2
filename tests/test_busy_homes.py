"""A home is busy from the moment its task is sent until its reply (issue 39), on both clocks.

A synchronous round that closes at its deadline leaves its late homes
training; they must not be sent new work before they answer, and when every
home a round could sample is still busy the loop waits for one instead of
stopping. The same scripted homes run on the virtual clock (every reply
known at once) and on the wall clock (replies collected as a test clock
reaches them), and must be sent the same tasks at the same times.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ecofl.fl.latency import FixedLatency
from ecofl.fl.loop import EventLoop
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.transport import HomeReport, TrainReply

WEIGHTS = [np.zeros(1, dtype=np.float32)]
#: 22/13 x the group's latency centre (13/3 s for latencies 1, 2, 10): 7.33 s, the same rule on both clocks
DEADLINE_7_33 = {"round_deadline": "factor", "round_deadline_factor": 22 / 13}


class ScriptedHomes:
    """Homes with fixed latencies, each task's send time recorded; replies all at once (virtual clock) or as
    the test clock reaches them (wall clock: ``collect`` moves the clock to the next arrival)."""

    def __init__(self, latencies: dict[int, float], clock: "ScriptedClock | None" = None):
        self.latencies, self.clock = latencies, clock
        self.sent: dict[int, list[float]] = {h: [] for h in latencies}
        self.pending: list[tuple[float, object]] = []

    def query(self, homes, virtual_time):
        return [HomeReport(h, self.latencies[h], np.ones(2), 10) for h in homes]

    def _reply(self, home: int, latency: float) -> TrainReply:
        return TrainReply(home, [w + 1 for w in WEIGHTS], 10, 0.5, latency)

    def train(self, tasks):
        for task in tasks:
            self.sent[task.home].append(task.route.virtual_time)
        return [self._reply(t.home, self.latencies[t.home]) for t in tasks]

    def submit(self, tasks):
        for task in tasks:
            self.sent[task.home].append(self.clock.now())
            self.pending.append((self.clock.now() + self.latencies[task.home], task))

    def collect(self, wait_s):
        horizon = self.clock.now() + (math.inf if wait_s is None else wait_s)
        self.clock.t = min(min((at for at, _ in self.pending), default=math.inf), horizon)
        arrived = [(task, self._reply(task.home, 0.0)) for at, task in self.pending if at <= self.clock.t]
        self.pending = [(at, task) for at, task in self.pending if at > self.clock.t]
        return arrived


class ScriptedClock:
    """A wall clock the scripted homes move."""

    virtual = False

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance_to(self, t: float) -> None:
        """Time moves by itself (here: when the homes' replies arrive)."""

    def state(self) -> dict:
        return {"kind": "wall", "now": self.t}


def run(latencies: dict[int, float], clock_kind: str, **settings) -> tuple[ScriptedHomes, list[dict]]:
    config = LoopConfig(strategy="fedavg", homes_per_round=len(latencies), max_concurrent=len(latencies),
                        max_updates=100, **settings)
    clock = ScriptedClock() if clock_kind == "wall" else None
    homes = ScriptedHomes(latencies, clock)
    # "foreseen": the virtual clock with the homes' latency model on the server (ecofl/fl/foreseen_rounds.py)
    model = FixedLatency([latencies[h] for h in sorted(latencies)]) if clock_kind == "foreseen" else None
    loop = EventLoop(config, homes, sorted(latencies), WEIGHTS, lambda w: (0.0, 0.5), clock=clock, progress=False,
                     latency_model=model)
    return homes, loop.run()


def overlapping(homes: ScriptedHomes) -> list[tuple[int, float]]:
    """(home, send time) of every task sent while the home's previous task was still running."""
    return [(h, sent[i]) for h, sent in homes.sent.items() for i in range(1, len(sent))
            if sent[i] < sent[i - 1] + homes.latencies[h] - 1e-9]


@pytest.mark.parametrize("clock_kind", ["virtual", "foreseen", "wall"])
def test_a_straggler_is_not_sent_new_work_before_it_answers(clock_kind):
    """Latencies 1, 2 and 10 s, a deadline of 7.33 s: home 2 misses it and is busy to 10 s."""
    homes, rows = run({0: 1.0, 1: 2.0, 2: 10.0}, clock_kind, **DEADLINE_7_33, max_virtual_time_s=30.0)
    assert not overlapping(homes)
    # rounds 2 (at 7.33 s) and 3 (at 9.33 s) go on without home 2, round 4 (at 11.33 s) takes it again
    assert homes.sent[0][:4] == pytest.approx([0.0, 22 / 3, 22 / 3 + 2, 22 / 3 + 4])
    assert homes.sent[2][:2] == pytest.approx([0.0, 22 / 3 + 4])
    first = rows[0]
    assert first["round_closed_s"] == pytest.approx(22 / 3) and first["stragglers"] == 1
    assert (first["busy_homes"], first["idle_homes"]) == (1, 2)  # home 2, still training when round 1 closed


@pytest.mark.parametrize("virtual_kind", ["virtual", "foreseen"])
def test_both_clocks_send_the_same_tasks_at_the_same_times(virtual_kind):
    latencies = {0: 1.0, 1: 2.0, 2: 10.0}
    virtual, _ = run(latencies, virtual_kind, **DEADLINE_7_33, max_virtual_time_s=40.0)
    wall, _ = run(latencies, "wall", **DEADLINE_7_33, max_virtual_time_s=40.0)
    assert virtual.sent.keys() == wall.sent.keys()
    for home in latencies:
        assert virtual.sent[home] == pytest.approx(wall.sent[home])


@pytest.mark.parametrize("clock_kind", ["virtual", "foreseen", "wall"])
def test_with_every_home_busy_the_loop_waits_for_one_instead_of_stopping(clock_kind):
    """One home of 10 s, rounds that close after 5 s: each round is empty, and the next goes out at 10, 20, ..."""
    homes, rows = run({0: 10.0}, clock_kind, round_deadline="factor", round_deadline_factor=0.5,
                      max_virtual_time_s=36.0)
    assert homes.sent[0] == pytest.approx([0.0, 10.0, 20.0, 30.0])
    assert rows == []  # every round closed before its home answered
