"""The server's event loop: synchronous group rounds, asynchronous global mixing (Eco-FL §5; docs/architecture.md).

1. Query every home for its latency L_n and label histogram (§5.2 "Profiling").
2. Group them by the strategy's policy (eq. 4 for Eco-FL).
3. Every group starts a round: it samples up to k of its idle homes and sends
   them the current global model. All the first rounds go out in one
   dispatch (one ``Transport.train`` or ``submit`` call), so the transport
   trains them concurrently.
4. A group round completes when every sampled home has replied, or at its
   deadline (``loop.round_deadline``; one rule for every strategy and both
   clocks; later replies are stragglers). The loop repeatedly takes the in-flight round
   with the earliest completion (ties: lower group id), averages its valid
   replies weighted by samples (the group model, §5.1), and makes the new
   global model as the policy says: FedAsync's mix with
   ``alpha_t = alpha * s(t - tau)`` (Xie et al.'s staleness, 1 for an update
   nobody overtook), or FedAT's average of every tier's latest model.
5. It evaluates, records a metrics row, re-groups (Algorithm 1) with the
   latencies the replies reported (and a fresh query every
   ``requery_every`` updates), and starts that group's next round, and any
   other idle group's, from the new global model.

**Clocks.** :mod:`ecofl.fl.round_completion` says when a round completes
on the virtual clock (known when ``Transport.train`` returns; exact
virtual-time order) and on the wall clock (replies collected as they
arrive); :mod:`ecofl.fl.foreseen_rounds` on the virtual clock when the loop
has the homes' latency model (known when the round is sent, so the rounds in
flight train side by side). On the wall clock grouping uses the training times the homes
measured (a probe before their first round), late replies included; they
leave out communication, so there RT only bounds the groups and a round
waits for all its homes unless ``round_deadline`` is ``factor`` (or the
transport's reply timeout passes).

**Modules.** The settings are :mod:`ecofl.fl.loop_config`, the state a
checkpoint saves :mod:`ecofl.fl.loop_state`, a round in flight and the
screening of its replies :mod:`ecofl.fl.group_round`, evaluation and
stopping :mod:`ecofl.fl.stop_rules`, the bar :mod:`ecofl.fl.progress`, the
strategies :mod:`ecofl.fl.strategies`. What remains here is dispatch and
apply.

**Determinism.** Replies are sorted by home id, sampling uses one seeded
generator, each task carries its own seed, and ties break by group id: the
metrics do not depend on the order a transport returns replies in.
Checkpoints store the global model, every in-flight round with the model it
was sent, the groups' latest models where the policy keeps them, the
grouping, clock, generator state and metrics; :func:`resume_loop`
sends the in-flight rounds again and continues exactly as if never stopped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ecofl.errors import UserError
from ecofl.fl.aggregation import staleness, weighted_mean
from ecofl.fl.checkpoint import LoopCheckpoint, load_loop, save_loop
from ecofl.fl.clock import Clock, VirtualClock, clock_from_state
from ecofl.fl.foreseen_rounds import completion_rule, query_homes
from ecofl.fl.group_round import GroupRound, screen_replies
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.grouping import derive_rt
from ecofl.fl.latency import LatencyModel
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.loop_state import LoopState
from ecofl.fl.loop_records import run_summary, update_row
from ecofl.fl.metrics import write_metrics
from ecofl.fl.progress import Progress
from ecofl.fl.stop_rules import (
    MAX_VIRTUAL_TIME,
    STOPPED,
    evaluation_due,
    past_time_limit,
    record_evaluation,
    stop_after_update,
    stop_before_next,
)
from ecofl.fl.strategies import make_policy
from ecofl.fl.transport import RunStopped, TrainTask, Transport
from ecofl.weights import Weights

log = logging.getLogger(__name__)


class EventLoop:
    """Eco-FL's hierarchical aggregation (and the baselines) over a :class:`Transport`.

    ``evaluate(weights) -> (loss, accuracy)`` scores the global model on the
    test set. ``run()`` returns the metric rows and, with ``out_dir``, writes
    metrics.csv, metrics.json, summary.json and ``checkpoints/``.
    ``placement() -> dict`` says where the homes trained (the transport's
    ``device`` and ``batch_homes``), for summary.json; ``failures`` counts
    the homes' failures by kind (shared with the transport, which sees the
    queries'; default: the loop's own, logged to ``home_failures.log``).
    ``latency_model``: the homes' own; on the virtual clock it foresees the
    completions, and rounds in flight train side by side (:mod:`ecofl.fl.foreseen_rounds`).
    """

    def __init__(
        self, config: LoopConfig, transport: Transport, homes: Sequence[int], initial_weights: Weights,
        evaluate: Callable[[Weights], tuple[float, float]], clock: Clock | None = None,
        out_dir: str | Path | None = None, progress: bool | Path = True, state: LoopState | None = None,
        placement: Callable[[], dict] | None = None, failures: HomeFailures | None = None,
        latency_model: LatencyModel | None = None,
    ):
        if not homes:
            raise UserError("the event loop needs at least one home")
        if config.checkpoint_every and out_dir is None:
            raise UserError("checkpoint_every needs an output directory")
        self.config = config
        self.policy = make_policy(config)
        self.transport = transport
        self.homes = sorted(int(h) for h in homes)
        self.global_weights = [np.array(w, copy=True) for w in initial_weights]
        self.evaluate = evaluate
        self.clock = clock or VirtualClock()
        self.state = state or LoopState(rng=np.random.default_rng(config.seed), rt=config.rt)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.failures = failures or HomeFailures(self.out_dir / "home_failures.log" if self.out_dir else None)
        self.failures.add(self.state.home_failures)  # a resumed run goes on counting
        self.latency_model = latency_model if self.clock.virtual else None
        self.completion = completion_rule(self.clock, transport, lambda g: self.state.grouping.centres[g],
                                          self.state.busy_until, self.latency_model, self.failures)
        self.progress = progress
        self.in_flight: dict[int, GroupRound] = {}
        self.group_models: dict[int, Weights] = {}  # each group's latest model, for policies that keep them
        self.stop_reason: str | None = None
        self.placement = placement or dict
        self._wall_origin = time.monotonic()

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def grouping(self):
        return self.state.grouping

    @property
    def rt(self) -> float | None:
        return self.state.rt

    # ------------------------------------------------------------------ running

    def run(self) -> list[dict]:
        """Run until a stop rule (:mod:`ecofl.fl.stop_rules`) ends it; on :class:`~ecofl.fl.transport.RunStopped`
        the updates applied so far are evaluated and written, and ``stop_reason`` says so."""
        # on a wall clock the run's wall time is the clock's time (which may have started earlier)
        spent = self.state.wall_offset if self.clock.virtual else self.clock.now()
        self._wall_origin = time.monotonic() - spent
        progress = Progress(self.config, self.state.version, self.clock.now(), enabled=self.progress is True,
                            file=self.progress if isinstance(self.progress, Path) else None)
        try:
            if self.state.grouping is None:
                self.profile()
                self.dispatch()
            while self.stop_reason is None:
                self._step(progress)
        except RunStopped:
            self.stop_reason = STOPPED
            log.warning("stopped while waiting for homes; writing the %d updates applied so far", self.version)
        finally:
            progress.close(reached_time_limit=self.stop_reason == MAX_VIRTUAL_TIME)
            self.failures.log_summary()
        rows = self.state.rows
        if rows and rows[-1]["accuracy"] is None:  # stopped between evaluations
            self._evaluate(rows[-1]["virtual_time"])
            rows[-1]["loss"], rows[-1]["accuracy"] = self.state.last_eval
        self.state.wall_offset = self._wall()
        if self.out_dir is not None:
            write_metrics(self.out_dir, rows, self.summary())
        log.info("stopped after %d updates: %s", self.version, self.stop_reason)
        return rows

    def _wall(self) -> float:
        """Wall seconds spent running, across resumes."""
        return time.monotonic() - self._wall_origin

    def _step(self, progress: Progress) -> None:
        state = self.state
        busy = self.completion.busy_homes(self.in_flight)
        self.stop_reason = stop_before_next(state, self.config, len(self.in_flight), len(busy))
        if self.stop_reason is not None:
            return
        if not self.in_flight:  # every home a round could sample is still busy with a closed round's task
            free_at = self.completion.wait_for_a_home(self.in_flight, state.latencies)
            if past_time_limit(self.config, free_at):
                self.stop_reason = MAX_VIRTUAL_TIME
                return
            self.clock.advance_to(free_at)
            self.dispatch()
            return
        current = self.completion.next_completed(self.in_flight, state.latencies)
        if past_time_limit(self.config, current.completion):
            self.stop_reason = MAX_VIRTUAL_TIME
            return
        self.clock.advance_to(current.completion)
        del self.in_flight[current.group]
        row = self._apply(current)
        self.completion.applied(current, state.latencies)
        if row is not None:
            state.rows.append(row)
            progress.show(state.version, self.clock.now(), state.last_eval[1], state.best_accuracy)
            if self.config.requery_every and self.policy.regroups and state.version % self.config.requery_every == 0:
                self._query(self.homes)
        state.grouping = self.policy.regroup(state.grouping, state.latencies, state.hists, state.rt)
        self.stop_reason = stop_after_update(state, self.config)
        if self.stop_reason is None:
            self.dispatch()
        every = self.config.checkpoint_every
        if row is not None and every and state.version % every == 0:
            self.checkpoint()

    def profile(self) -> None:
        """Query every home (§5.2 "Profiling"), derive RT if needed, and group."""
        state = self.state
        self._query(self.homes)
        answered = sorted(state.latencies)
        if not answered:
            raise UserError("no home answered the profiling query")
        missing = sorted(set(self.homes) - set(answered))
        if missing:
            log.warning("%d homes did not answer the query and are left out: %s", len(missing), missing[:20])
        if state.rt is None:
            derived = derive_rt([state.latencies[h] for h in answered], self.config.num_groups, self.config.seed)
            state.rt = self.config.rt_scale * derived
        state.start_grouping(self.policy.group(answered, state.latencies, state.hists, state.rt))
        log.info(
            "%s: %d homes in %d groups (sizes %s), %d waiting, RT=%.3gs",
            self.config.strategy, len(answered), len(state.grouping.groups),
            [len(g) for g in state.grouping.groups], len(state.grouping.waiting), state.rt,
        )

    def _query(self, homes: Sequence[int]) -> None:
        """Profile ``homes``: ask them, or answer as they would (:func:`~ecofl.fl.foreseen_rounds.query_homes`)."""
        self.state.record_reports(query_homes(self.transport, self.latency_model, homes, self.clock.now(), self.state))

    # ------------------------------------------------------------------ dispatch

    def dispatch(self) -> None:
        """Start a round in every idle group while at most ``max_concurrent`` homes train; a busy home (still on an
        earlier task) is never sampled."""
        state = self.state
        busy = self.completion.busy_homes(self.in_flight)
        budget = self.config.max_concurrent - len(busy)
        idle = [g for g, members in enumerate(state.grouping.groups) if g not in self.in_flight and set(members) - busy]
        started: list[GroupRound] = []
        synchronous = self.policy.synchronous_rounds  # a round with a deadline (loop.round_deadline), or none
        for group in state.rng.permutation(idle) if len(idle) > 1 else idle:
            group = int(group)
            available = sorted(set(state.grouping.groups[group]) - busy)
            k = min(self.policy.round_size(), len(available))
            if k > budget:
                continue
            chosen = tuple(sorted(int(h) for h in state.rng.choice(available, size=k, replace=False)))
            started.append(
                GroupRound(
                    group=group, round=state.group_rounds[group], dispatch=state.dispatched,
                    start=self.clock.now(), version=state.version, homes=chosen,
                    weights=self.global_weights, deadline=self.config.round_deadline_s(
                        state.grouping.centres[group], state.rt, self.clock.virtual) if synchronous else None,
                )
            )
            state.group_rounds[group] += 1
            state.dispatched += 1
            budget -= k
            busy.update(chosen)
        self.send(started)

    def task(self, r: GroupRound, home: int) -> TrainTask:
        """What home ``home`` of round ``r`` is sent."""
        return r.task(home, self.config.train, self.config.seed)

    def send(self, rounds: Sequence[GroupRound]) -> None:
        """Send the rounds' tasks to their homes (they are in flight from now)."""
        if rounds:
            self.completion.send(rounds, [self.task(r, h) for r in rounds for h in r.homes], self.in_flight)

    # ------------------------------------------------------------------ applying

    def _apply(self, r: GroupRound) -> dict | None:
        """Make the new global model from round ``r``'s group model as the policy says (FedAsync's mix,
        FedAT's tier average); the metrics row, or None if no reply was valid."""
        state = self.state
        screened = screen_replies(r, self.global_weights, self.failures)
        valid = screened.valid
        for name in ("failed", "rejected", "stragglers"):
            state.totals[name] += getattr(screened, name)
        if not valid:
            state.empty_rounds += 1
            log.warning("group %d round %d brought no valid update", r.group, r.round)
            return None
        state.empty_rounds = 0
        group_model = weighted_mean([x.weights for x in valid], [x.num_samples for x in valid])
        stale = staleness(state.version, r.version, self.config.fresh_staleness)
        busy = len(self.completion.busy_homes(self.in_flight))
        state.updates_per_group[r.group] += 1
        if self.policy.keeps_group_models:
            self.group_models[r.group] = group_model
        self.global_weights, alpha_t = self.policy.aggregate(
            self.global_weights, r.group, group_model, stale, state.updates_per_group, self.group_models)
        state.version += 1
        evaluation = (None, None)
        if evaluation_due(state, self.config, r.completion):
            self._evaluate(r.completion)
            evaluation = state.last_eval
        return update_row(state, r, screened, evaluation, stale, alpha_t, busy, self._wall(), self.failures,
                          self.policy.round_size())

    def _evaluate(self, at: float) -> None:
        loss, accuracy = self.evaluate(self.global_weights)
        record_evaluation(self.state, self.config, loss, accuracy, at)

    # ------------------------------------------------------------------ outputs

    def summary(self) -> dict:
        """summary.json (:func:`~ecofl.fl.loop_records.run_summary`)."""
        return run_summary(self.config, self.state, len(self.homes), self.clock.now(), self.stop_reason,
                           self.placement(), self.failures)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Path:
        """Save the loop to ``out_dir/checkpoints/update_<version>.{json,npz}`` (:func:`save_loop`)."""
        if self.out_dir is None:
            raise UserError("checkpoints need an output directory")
        self.state.wall_offset = self._wall()
        self.state.home_failures = self.failures.to_json()
        saved = LoopCheckpoint(asdict(self.config), self.homes, self.clock.state(), self.state.to_json(),
                               self.global_weights, list(self.in_flight.values()), self.group_models)
        path = save_loop(self.out_dir / "checkpoints" / f"update_{self.version:06d}", saved)
        write_metrics(self.out_dir, self.state.rows, self.summary())
        log.info("checkpoint %s", path)
        return path


def resume_loop(
    checkpoint: str | Path, transport: Transport, evaluate: Callable[[Weights], tuple[float, float]],
    out_dir: str | Path | None = None, **options,
) -> EventLoop:
    """A loop continuing from ``checkpoint``: its in-flight rounds are sent again, as they were; ``options``:
    the constructor's ``progress``, ``placement``, ``failures`` and ``latency_model``."""
    saved = load_loop(checkpoint)
    loop = EventLoop(
        LoopConfig(**saved.config), transport, saved.homes, saved.global_weights, evaluate,
        clock=clock_from_state(saved.clock), out_dir=out_dir or Path(checkpoint).parent.parent,
        state=LoopState.from_json(saved.state), **options,
    )
    if not loop.clock.virtual:  # sent again now, a wall-clock round starts now; older tasks are gone
        loop.state.busy_until.clear()
        for r in saved.in_flight:
            r.start = loop.clock.now()
    loop.group_models = dict(saved.group_models)
    loop.send(saved.in_flight)
    return loop
