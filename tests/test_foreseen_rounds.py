"""The virtual clock that foresees each round's completion from the homes' latency model (ecofl/fl/foreseen_rounds.py).

With the completions known when a round is sent, a transport that trains in
the background gets every round in flight at once (FedAsync once trained one
home at a time on a simulation's many actors), and the loop applies exactly
what it applies when each dispatch blocks until its replies are in, whatever
order the replies come back in.
"""

from __future__ import annotations

import numpy as np
import pytest

from ecofl.fl.foreseen_rounds import ForeseenRounds
from ecofl.fl.group_round import GroupRound, screen_replies
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.latency import FixedLatency
from ecofl.fl.loop import EventLoop
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.transport import HomeReport, TrainReply

HOMES = 6
LATENCIES = [1.0, 1.5, 2.5, 3.0, 4.5, 7.0]
WEIGHTS = [np.zeros(3, dtype=np.float64)]


def trained(task) -> TrainReply:
    """A reply whose weights depend on what was sent, the home and the task's seed (so order shows)."""
    step = np.array([task.home + 1.0, task.train["seed"] % 7, 1.0])
    return TrainReply(task.home, [task.weights[0] * 0.9 + step], 10 + task.home, 0.5, LATENCIES[task.home])


class Homes:
    """Scripted homes; ``background``: submitted tasks come back a few per ``collect``, in a seeded shuffle."""

    def __init__(self, background: bool, seed: int = 0):
        self.trains_in_background = background
        self.pending: list = []
        self.rng = np.random.default_rng(seed)
        self.outstanding_at_submit: list[int] = []  # earlier tasks not yet collected, at each submit
        self.queries = 0

    def query(self, homes, virtual_time):
        self.queries += 1
        return [HomeReport(h, LATENCIES[h], np.eye(2)[h % 2] * 10, 10) for h in homes]

    def train(self, tasks):
        assert not self.trains_in_background, "a background transport is never asked to block"
        return [trained(t) for t in reversed(tasks)]

    def submit(self, tasks, batched=False):
        self.outstanding_at_submit.append(len(self.pending))
        self.pending += list(tasks)

    def collect(self, wait_s):
        self.rng.shuffle(self.pending)
        count = int(self.rng.integers(1, 3))
        out, self.pending = self.pending[:count], self.pending[count:]
        return [(t, trained(t)) for t in out]


def run(strategy: str, homes: Homes, foreseen: bool = True) -> list[dict]:
    config = LoopConfig(strategy=strategy, num_groups=2, homes_per_round=2, max_concurrent=HOMES,
                        max_virtual_time_s=30.0, max_updates=1000, target_accuracy=None, requery_every=3)
    loop = EventLoop(config, homes, range(HOMES), WEIGHTS, lambda w: (0.0, float(w[0].sum())), progress=False,
                     latency_model=FixedLatency(LATENCIES) if foreseen else None)
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in loop.run()]


@pytest.mark.parametrize("strategy", ["fedasync", "ecofl", "fedavg"])
def test_rounds_trained_in_the_background_apply_exactly_what_blocking_dispatches_apply(strategy):
    blocking = run(strategy, Homes(background=False))
    for seed in range(3):
        homes = Homes(background=True, seed=seed)
        assert run(strategy, homes) == blocking
    assert len(blocking) >= 4
    if strategy == "fedasync":  # one home a dispatch: the earlier ones were still training when it went out
        assert max(homes.outstanding_at_submit) >= HOMES - 2


def test_re_queries_are_answered_from_the_latency_model_as_the_homes_would():
    """Eco-FL re-queries every 3 updates here: with the model the loop answers them itself (no query waits
    in the engine behind the training in flight), and applies what it applies when it asks the homes."""
    asked, told = Homes(background=False), Homes(background=True)
    assert run("ecofl", told) == run("ecofl", asked, foreseen=False)
    assert asked.queries > 3 and told.queries == 1  # the profiling query at the start


def a_round(homes: tuple[int, ...], deadline: float | None, start: float = 10.0) -> GroupRound:
    return GroupRound(group=0, round=0, dispatch=0, start=start, version=0, homes=homes, deadline=deadline,
                      weights=WEIGHTS)


class Replies:
    """A background transport returning the scripted (task, reply) pairs once, then nothing."""

    trains_in_background = True

    def __init__(self, reply_of):
        self.reply_of, self.submitted = reply_of, []

    def submit(self, tasks, batched=False):
        self.submitted += list(tasks)

    def collect(self, wait_s):
        out, self.submitted = [(t, self.reply_of(t)) for t in self.submitted], []
        return out


def test_a_failed_home_spends_its_round_and_its_error_arrives_at_its_latency():
    """An error reply carries latency 0 from the Flower transport; the home is still busy for its round, and
    the round waits for it as for any reply (it was freed at once before, and sampled again at once)."""
    def reply_of(task):
        if task.home == 3:
            return TrainReply(3, None, 0, float("nan"), 0.0, error="ClientApp crashed", failure="crashed")
        return trained(task)

    busy: dict = {}
    rule = ForeseenRounds(Replies(reply_of), FixedLatency(LATENCIES), _Clock(10.0), busy, HomeFailures())
    r, in_flight = a_round((0, 3), deadline=None), {}
    rule.send([r], [r.task(h, {}, seed=0) for h in r.homes], in_flight)
    assert r.completion == pytest.approx(10.0 + LATENCIES[3])
    assert busy == pytest.approx({0: 10.0 + LATENCIES[0], 3: 10.0 + LATENCIES[3]})
    assert rule.next_completed(in_flight, {}) is r
    assert [x.latency_s for x in r.replies] == [LATENCIES[0], LATENCIES[3]]
    screened = screen_replies(r, WEIGHTS, HomeFailures())
    assert (screened.failed, len(screened.valid), screened.stragglers) == (1, 1, 0)


def test_a_failed_home_after_the_deadline_is_a_straggler_and_the_round_closes_at_its_deadline():
    rule = ForeseenRounds(Replies(lambda t: TrainReply(t.home, None, 0, float("nan"), 0.0, error="x")),
                          FixedLatency(LATENCIES), _Clock(10.0), {}, HomeFailures())
    r, in_flight = a_round((0, 5), deadline=3.0), {}
    rule.send([r], [r.task(h, {}, seed=0) for h in r.homes], in_flight)
    assert rule.next_completed(in_flight, {}).completion == pytest.approx(13.0)
    screened = screen_replies(r, WEIGHTS, HomeFailures())
    assert (screened.failed, screened.stragglers) == (1, 1)


def test_a_reply_that_never_comes_ends_the_wait_with_the_home_missing(caplog):
    rule = ForeseenRounds(Replies(trained), FixedLatency(LATENCIES), _Clock(10.0), {}, HomeFailures())
    r, in_flight = a_round((1, 2), deadline=None), {}
    tasks = [r.task(h, {}, seed=0) for h in r.homes]
    rule.send([r], tasks[:1], in_flight)  # home 2's task is lost on the way
    with caplog.at_level("WARNING"):
        assert rule.next_completed(in_flight, {}) is r
    assert "homes [2] of dispatch 0 never answered" in caplog.text
    assert screen_replies(r, WEIGHTS, HomeFailures()).stragglers == 1


def test_a_home_the_transport_gave_up_on_is_a_silent_straggler_as_when_the_dispatch_blocks():
    def reply_of(task):
        if task.home == 2:
            return TrainReply(2, None, 0, float("nan"), float("nan"), error="no reply within 600 s", failure="timeout")
        return trained(task)

    failures = HomeFailures()
    rule = ForeseenRounds(Replies(reply_of), FixedLatency(LATENCIES), _Clock(10.0), {}, failures)
    r, in_flight = a_round((1, 2), deadline=None), {}
    rule.send([r], [r.task(h, {}, seed=0) for h in r.homes], in_flight)
    assert rule.next_completed(in_flight, {}) is r
    assert [x.home for x in r.replies] == [1]
    assert screen_replies(r, WEIGHTS, HomeFailures()).stragglers == 1
    assert failures.counts() == {"train:silent": 1}


def test_a_reply_reporting_another_latency_is_filed_at_the_models_with_a_warning(caplog):
    rule = ForeseenRounds(Replies(lambda t: TrainReply(t.home, WEIGHTS, 1, 0.0, 99.0)), FixedLatency(LATENCIES),
                          _Clock(0.0), {}, HomeFailures())
    r, in_flight = a_round((4,), deadline=None, start=0.0), {}
    with caplog.at_level("WARNING"):
        rule.send([r], [r.task(4, {}, seed=0)], in_flight)
        rule.next_completed(in_flight, {})
    assert "reported a latency of 99.0 s where the server's latency model gives 4.5 s" in caplog.text
    assert r.replies[0].latency_s == LATENCIES[4] and r.completion == LATENCIES[4]


class _Clock:
    virtual = True

    def __init__(self, t: float):
        self.t = t

    def now(self) -> float:
        return self.t
