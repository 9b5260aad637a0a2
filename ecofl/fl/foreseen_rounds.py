"""The virtual clock with the homes' latency model on the server: completions known before training ends.

Every simulated home reports the latency its latency model gives at the
task's virtual time (:mod:`ecofl.fl.latency`), a pure function of the
configuration that the server can compute as well. :class:`ForeseenRounds`
does, so a round's completion is known the moment it is sent, by the one
closing rule of :func:`~ecofl.fl.round_completion.closing_time`: every reply
arrives at ``start + latency(home, start)``; a round closes at its last
arrival, or at its deadline when a home is due after it. A home is busy until
its arrival.

What that buys: the loop must know which round completes first before it
applies anything, and here it knows without waiting for any training. With a
transport that trains in the background (``trains_in_background``: the
Flower grid, unless ``server.train_in_background`` is false), a round's
tasks are submitted and the loop goes on; it waits only for the replies of
the round it applies next. The rounds sent meanwhile train side by side on
the simulation's actors. FedAsync sends one home at a time, so with a
blocking ``train`` one actor worked while the others idled. What is applied,
and in which order, is the same either way: the order never depends on when
a reply arrives.

Failures, the same either way: a home's error arrives at the home's latency
like any reply, so a failing home spends its round as a training one would
(it is not free at once), and the error counts as a failure if it arrives
within the deadline, as a straggler after it. A home that never answers
(the transport's reply timeout) is missing from its round, a straggler, and
counted as ``train:silent``. The latency a successful reply reports is the
model's (the home computed the same); a reply that reports another is logged
and filed at the model's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, Sequence

from ecofl.fl.clock import Clock
from ecofl.fl.group_round import GroupRound
from ecofl.fl.home_failures import TRAIN, HomeFailures
from ecofl.fl.latency import LatencyModel
from ecofl.fl.loop_state import LoopState
from ecofl.fl.round_completion import Busy, BusyHomes, InFlight, Latencies, RoundCompletion, earliest, round_completion
from ecofl.fl.transport import TIMEOUT, HomeReport, TrainReply, TrainTask, Transport

log = logging.getLogger(__name__)


def foreseen_completion(r: GroupRound, due: dict[int, float]) -> float:
    """When round ``r`` closes if each home's reply arrives ``due[home]`` seconds after ``r.start``:
    at the last arrival, or at the deadline when a home is due after it (``closing_time``'s rule)."""
    last = max(due.values(), default=0.0)
    if r.deadline is not None and last > r.deadline:
        return r.start + r.deadline
    return r.start + last


class ForeseenRounds(BusyHomes):
    """Completions from the latency model; replies trained in the background where the transport can."""

    virtual = True

    def __init__(self, transport: Transport, latency_model: LatencyModel, clock: Clock, busy: Busy,
                 failures: HomeFailures):
        super().__init__(clock, busy)
        self.transport = transport
        self.latency_model = latency_model
        self.failures = failures  # homes that never answered (train:silent)
        self.background = bool(getattr(transport, "trains_in_background", False))
        self.due: dict[int, dict[int, float]] = {}  # dispatch -> home -> its reply's arrival after the start
        self.waiting: dict[int, set[int]] = {}  # dispatch -> homes whose reply has not been filed
        self._warned = False  # a latency that differs from the model's: a warning the first time, then info

    def send(self, rounds: Sequence[GroupRound], tasks: Sequence[TrainTask], in_flight: InFlight) -> None:
        """Put ``rounds`` in flight with their foreseen completions and send their ``tasks``: submitted to train
        in the background, or trained here before returning."""
        for r in rounds:
            due = {home: float(self.latency_model.latency(home, r.start)) for home in r.homes}
            r.completion = foreseen_completion(r, due)
            in_flight[r.group] = r
            self.due[r.dispatch] = due
            self.waiting[r.dispatch] = set(r.homes)
            for home, latency in due.items():
                self.busy[home] = r.start + latency
        if self.background:
            self.transport.submit(tasks, batched=True)
            return
        round_of = {task.home: task.route for task in tasks}
        for reply in self.transport.train(tasks):
            if reply.home in round_of:
                self._file(in_flight, round_of[reply.home].group, round_of[reply.home].dispatch, reply)
        for r in rounds:  # a home the transport left out never answered
            self.waiting.pop(r.dispatch, None)

    def next_completed(self, in_flight: InFlight, latencies: Latencies) -> GroupRound:
        """The earliest round, once all its replies are in (the others go on training meanwhile)."""
        r = earliest(in_flight.values())
        while self.waiting.get(r.dispatch):
            replies = self.transport.collect(None)
            if not replies:  # nothing submitted is outstanding: no more replies will come
                log.warning("homes %s of dispatch %d never answered", sorted(self.waiting[r.dispatch]), r.dispatch)
                break
            for task, reply in replies:
                self._file(in_flight, task.route.group, task.route.dispatch, reply)
        self.waiting.pop(r.dispatch, None)
        self.due.pop(r.dispatch, None)
        r.replies.sort(key=lambda x: x.home)
        return r

    def wait_for_a_home(self, in_flight: InFlight, latencies: Latencies) -> float:
        """The clock time the first busy home is free (the loop moves its clock there)."""
        return min(self.busy.values())

    def applied(self, r: GroupRound, latencies: Latencies) -> None:
        """Algorithm 1 watches the latencies of every applied round's homes (the model's, as they reported)."""
        for reply in r.replies:
            latencies[reply.home] = float(reply.latency_s)

    def _file(self, in_flight: InFlight, group: int, dispatch: int, reply: TrainReply) -> None:
        """File a reply with its round, arriving at the latency the model gives its home (a home that never
        answered is left out of its round and counted as silent, as a blocking ``train`` does)."""
        r = in_flight.get(group)
        if r is None or r.dispatch != dispatch or reply.home not in self.waiting.get(dispatch, ()):
            log.info("home %d answered for dispatch %d, which expects no such reply", reply.home, dispatch)
            return
        self.waiting[dispatch].discard(reply.home)
        if reply.failure == TIMEOUT:
            self.failures.record(f"{TRAIN}silent", f"home {reply.home}", reply.error or "no reply")
            return
        due = self.due[dispatch][reply.home]
        if reply.error is None and not math.isclose(reply.latency_s, due, rel_tol=1e-9, abs_tol=1e-9):
            log.log(logging.INFO if self._warned else logging.WARNING, "home %d reported a latency of %s s where "
                    "the server's latency model gives %s s (is it configured alike?); the model's is used",
                    reply.home, reply.latency_s, due)
            self._warned = True
        r.replies.append(replace(reply, latency_s=due))


def completion_rule(
    clock: Clock, transport: Transport, centre_of: Callable[[int], float], busy: Busy,
    latency_model: LatencyModel | None, failures: HomeFailures,
) -> RoundCompletion:
    """The loop's completion rule: foreseen on the virtual clock with the homes' ``latency_model``, else
    :func:`~ecofl.fl.round_completion.round_completion`'s (from the replies, or the wall clock's)."""
    if clock.virtual and latency_model is not None:
        return ForeseenRounds(transport, latency_model, clock, busy, failures)
    return round_completion(clock, transport, centre_of, busy)


def query_homes(transport: Transport, latency_model: LatencyModel | None, homes: Sequence[int], now: float,
                known: LoopState) -> list[HomeReport]:
    """The answers of ``homes`` to a query at ``now`` (§5.2 "Profiling").

    The first query (nothing heard yet) and every query without the homes' ``latency_model`` asks them. A
    re-query with it is answered here as the homes would answer it: their model latency now, and the label
    histogram and sample count they reported (``known``; they do not change); homes never heard from are left
    out. No re-query then waits in the simulation engine behind the rounds training in flight.
    """
    if latency_model is None or not known.hists:
        return transport.query(homes, now)
    return [HomeReport(h, latency_model.latency(h, now), known.hists[h], known.num_samples[h])
            for h in homes if h in known.hists]
