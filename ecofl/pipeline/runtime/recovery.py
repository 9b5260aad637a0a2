"""Adapt and survive: the portal's loop of monitor -> decide -> re-plan -> migrate -> replay.

One mechanism with three triggers (Eco-FL §4.4; Asteroid §3.4; FTPipeHD
§III-D to III-F):

- **a device is gone** (:class:`~ecofl.pipeline.runtime.errors.DevicesLost`:
  a closed channel, or heartbeat silence and an unanswered probe), at any
  moment: in a sync-round, a replication, the global copy, a re-plan or a
  recovery. The portal aborts whatever the survivors are doing and each
  answers with the committed copies it holds (its own stage's, its stage
  peers' are the same, the replicas it backs up); it kills what is left of
  the lost workers, picks the newest version every layer has a surviving
  copy of (else the portal's global copy,
  :func:`~ecofl.pipeline.migration.restore_point`), re-plans on the
  survivors (lightweight, full or heavy), rolls every survivor back to that
  version, migrates only the layers that change owner and replays from it,
  so the result is that of a run without the failure. A device lost while
  this happens starts it again with the survivors left;
- **a device is slow**: its measured compute time per micro-batch stays
  ``slowdown_ratio`` above the plan's expectation for ``slowdown_rounds``
  sync-rounds; its speed is re-estimated (FTPipeHD eqs. 1-3) and the pipeline
  re-planned between sync-rounds, with no replay;
- **the plan was made on speeds the pipeline does not run at** (a
  :class:`~.tuning_settings.Tuning`, with or without fault tolerance): after
  its first sync-rounds, and then every few if asked, every device's speed is
  re-estimated from its own operations and the pipeline moves to a re-plan
  the cost model predicts faster (:mod:`.pipeline_tuning`), between
  sync-rounds, with no replay.

While sync-rounds compute, every single-device stage is replicated to its
backups, and every few the portal's global copy travels too (:mod:`.copies`). Its parts: the injected
faults (:mod:`.fault_injection`), the copies, the speed monitor
(:mod:`.slowdown_watch`) and the record of every event (:mod:`.fault_log`);
:class:`Recovery` restores, re-plans and migrates.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ecofl.errors import UserError
from ecofl.pipeline.migration import Holders, restore_point
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.replan import full_replans, lightweight_replans, shifted_replans, with_speeds
from ecofl.pipeline.runtime.control_messages import Config, Done, GlobalCopy, Replicate
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.copies import Copies
from ecofl.pipeline.runtime.errors import DevicesLost, HomePipelineError
from ecofl.pipeline.runtime.fault_injection import FaultInjector
from ecofl.pipeline.runtime.fault_log import FaultLog
from ecofl.pipeline.runtime.faults import FaultEvent, FaultTolerance, Injection, Reconfiguration
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.pipeline_tuning import TuningWindow, decide, measured_pass_s, pipeline_speeds
from ecofl.pipeline.runtime.prediction import fastest_plan, preferred_plan, quickest_to_finish, weighs_hybrid
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.pipeline.runtime.reconfiguration import reconfigure, restored_from
from ecofl.pipeline.runtime.slowdown_watch import SlowdownWatch
from ecofl.pipeline.runtime.stage import Optimization


class Recovery:
    """The fault tolerance and tuning of one ``HomePipeline.train`` call (inert without either).

    It sits on the home's :class:`~.control_plane.ControlPlane` (the workers)
    and :class:`~.layout.PipelineLayout` (the plan, which a re-plan replaces);
    ``config`` is what a joining worker is told, ``start`` the weights of
    version 0 (the portal's first global copy); ``tuning`` re-tunes the plan
    in a call of ``sync_rounds`` sync-rounds, predicted in ``emulation`` (the runtime's overheads as
    recorded in ``cache_dir``, the profiles' cache; None: the default one).
    """

    def __init__(self, control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance | None,
                 config: Callable[[int], Config],
                 start: dict[str, np.ndarray], reference: dict[str, np.ndarray], inject: Sequence[Injection],
                 optimization: Optimization, tuning: Tuning | None = None, emulation: Emulation = Emulation.NONE,
                 sync_rounds: int = 0, cache_dir: str | None = None):
        self.control, self.layout, self.ft, self.config = control, layout, ft, config
        self.tuning, self.emulation, self.sync_rounds, self.cache_dir = tuning, emulation, sync_rounds, cache_dir
        self.tuned: list[dict] = []  # each re-tune's decision (TuningDecision.to_dict), its seconds and bytes
        self.window = TuningWindow(tuning) if tuning is not None else None
        self.reference, self.optimization = reference, optimization
        self.log = FaultLog()
        self.injector = FaultInjector(control, self.log, inject)
        self.copies = Copies(control, layout, ft, optimization.momentum > 0, start) if ft is not None else None
        self.watch = SlowdownWatch(ft, emulation, cache_dir) if ft is not None else None
        self.speeds = {d: spec.speed for d, spec in enumerate(layout.pool.devices)}
        self.epoch = self.lost_rounds = self._token = 0
        self.referenced: dict[int, set[str]] = {}  # the FedProx reference keys each worker holds

    def stages_set_up(self) -> None:
        """Every stage has its starting weights and, under FedProx, its parameters' reference."""
        if self.reference:
            self.referenced = {role.device: set(self.layout.reference_keys(role.stage)) for role in self.layout.roles}

    @property
    def slowdowns(self) -> dict[int, float]:
        """How many times slower each injected-slow device is told to run."""
        return self.injector.slowdowns

    # -- between sync-rounds -------------------------------------------------------------

    def before_round(self, r: int) -> None:
        if self.ft is None:
            return
        for device in self.injector.before_round(r):
            self.join(device, r)
        self.copies.before_round(r)

    def replication(self, r: int) -> dict[int, Replicate]:
        """The replicas each device sends and keeps in sync-round ``r`` ({}: none), placed at the speeds known now."""
        return {} if self.copies is None else self.copies.replication(r, with_speeds(self.layout.pool, self.speeds))

    def uploads(self, r: int) -> dict[int, GlobalCopy]:
        """The devices that send their stage for the global copy while sync-round ``r`` computes ({}: none due)."""
        return {} if self.copies is None else self.copies.uploads(r)

    def kept_versions(self, r: int) -> list[int]:
        """The committed versions besides ``r`` that the workers keep copies of during sync-round ``r``."""
        return [] if self.copies is None else self.copies.kept_versions(r)

    def after_send(self, r: int) -> None:
        """Sync-round ``r`` has started: the events recovered from have resumed; injected failures not aimed
        at a phase strike now."""
        self.log.round_sent()
        self.injector.after_send(r)

    def after_round(self, r: int, replies: dict[int, Done], seconds: float) -> None:
        self.log.round_completed(seconds)
        if self.copies is not None:
            self.copies.round_completed(r)
        confined = self.control.devices.confinement is not None
        if self.ft is not None and self.ft.adapt and (self.layout.sleeps or confined):
            slow = self.watch.slow_devices(self.layout, self.speeds, replies, self.epoch)
            if slow:
                self._adapt(slow, replies, r)
                return
        self._tune(r, replies)

    def _tune(self, r: int, replies: dict[int, Done]) -> None:
        """Where a re-tune is due after sync-round ``r`` (:class:`.TuningWindow`) and rounds are left: re-estimate
        every device's speed from the rounds since the last and move to a re-plan predicted faster."""
        measured = self.window.due(self.epoch, replies) if self.window is not None else None
        if not measured or r + 1 >= self.sync_rounds:
            return
        layout = self.layout
        started = time.time()
        decision = decide(self.tuning, layout.plan, layout.profile, with_speeds(layout.pool, self.speeds),
                          self.emulation, measured, r, self.layout.holders(), set(self.control.connections),
                          self.sync_rounds - (r + 1), self.cache_dir, calibrated=layout.pool)
        self.speeds.update(decision.speeds)
        moved = self._reconfigure(decision.plan, r + 1, self.layout.holders()).moved if decision.switched else 0
        self.tuned.append({**decision.to_dict(), "seconds": time.time() - started, "bytes_moved": moved})

    def _adapt(self, slow: list[int], replies: dict[int, Done], r: int) -> None:
        """Eco-FL §4.4: re-plan between sync-rounds on speeds re-estimated from round ``r``, overheads counted once
        (:func:`.pipeline_speeds`). Each device found slow, or ``slowdown_ratio`` times slower, has its event."""
        layout = self.layout
        started = time.time()
        planned = with_speeds(layout.pool, self.speeds)
        self.speeds.update(pipeline_speeds(layout.plan, layout.profile, planned, self.emulation,
                                           measured_pass_s([replies], planned), self.cache_dir, layout.pool))
        slowed = set(slow) | {d for d, speed in self.speeds.items()
                              if speed * self.ft.slowdown_ratio < planned.devices[d].speed}
        kind = self.ft.adapt_replan
        events = [self.log.slow_down(device, r, started) for device in sorted(slowed)]
        planning = time.time()
        new = self._replan(kind, self.layout.holders(), r + 1)
        planning_s = time.time() - planning
        done = self._reconfigure(new, r + 1, self.layout.holders())
        for event in events:
            event.detected_after_s = started - event.struck_at
            event.rescheduled(kind, planning_s, time.time() - started, done)
            self.log.recovered(event)

    def join(self, device: int, r: int) -> None:
        """A device (new, or back) joins between sync-rounds: admit it, re-plan with it, migrate its layers."""
        control = self.control
        if device in control.connections or not 0 <= device < len(self.layout.pool):
            raise HomePipelineError(f"device {device} cannot join: it is already in the home or not in the pool")
        event = self.log.record(FaultEvent("join", device, r))
        self.referenced.pop(device, None)  # a new worker process
        control.join(device)
        control.configure([device], self.config)
        event.detected_after_s = time.time() - event.struck_at
        started = time.time()
        holders = self.layout.holders()
        new = self._replan("full", holders, r)
        planning_s = time.time() - started
        done = self._reconfigure(new, r, holders)
        event.rescheduled("full", planning_s, time.time() - started, done)
        self.log.recovered(event)

    # -- failures ------------------------------------------------------------------------

    def recover(self, lost: DevicesLost, r: int) -> int:
        """Recover from losing ``lost`` while at sync-round ``r`` (in it, or before it); the sync-round to
        continue from. A device lost during the recovery itself starts it again with the survivors left."""
        if self.ft is None:
            raise lost
        plan = self.layout.plan  # the plan the lost devices served in
        found = dict.fromkeys(lost.failures, time.time())  # device -> when its loss was detected
        causes = dict(lost.failures)  # device -> why it was declared lost
        stopping = 0.0
        while True:
            stopped = time.time()
            holdings = self._settle(found, causes)
            stopping += time.time() - stopped
            version, holders = restore_point(holdings, self.layout.stateful, r, self.copies.global_copy[0])
            kind = self.ft.replan
            rescheduling = time.time()
            try:
                new = self._replan(kind, holders, version)
                planning = time.time() - rescheduling
                done = self._reconfigure(new, version, holders, heavy=kind == "heavy", recovery=True)
            except DevicesLost as again:  # lost while recovering: once more, without it
                found.update(dict.fromkeys(set(again.failures) - set(found), time.time()))
                causes.update({**again.failures, **causes})
                continue
            break
        rescheduling, layout = time.time() - rescheduling, self.layout
        self.lost_rounds += r - version
        for device, detected in sorted(found.items()):
            event = self._event_of(device, r, detected)
            event.detected_after_s = detected - event.struck_at
            event.cause = causes[device]
            event.rescheduled(kind, planning, rescheduling, done)
            event.stopping_s, event.lost_rounds = stopping, r - version
            event.restored_from = restored_from(plan, device, holders, version, layout.stateful, layout.plan)
            self.log.recovered(event)
        return version

    def _event_of(self, device: int, r: int, detected: float) -> FaultEvent:
        """The injected event that took ``device`` (timed from when it struck), or a new one for a failure
        found without injection (timed from the device's last sign of life before ``detected``)."""
        control = self.control
        event = next((e for e in self.log.events if e.device == device and e.kind in ("kill", "freeze")
                      and e.detected_after_s is None), None)
        if event is not None and event.phase is not None:
            event.round = r
            event.struck_at = control.trapped.pop(device, detected)
        if event is None:
            event = FaultEvent("failure", device, r)
            self.log.events.append(event)
            found = control.monitor.failures().get(device) if control.monitor else None
            silent_for = found.detected_at - found.last_seen if found is not None else 0.0
            event.struck_at = detected - silent_for
        return event

    def _settle(self, found: dict[int, float], causes: dict[int, str]) -> dict[int, dict[int, list[int]]]:
        """Stop every survivor where it is, remove the lost devices (adding to ``found`` and ``causes`` whoever
        is lost too or cannot answer); what each survivor holds: ``{device: {version: layers}}``."""
        control = self.control
        while True:  # several devices may fail at once: whoever cannot be aborted is lost too
            lost = {d: cause for d, cause in control.lost().items() if d in control.connections}
            found.update(dict.fromkeys(set(lost) - set(found), time.time()))
            causes.update({**lost, **causes})
            survivors = sorted(set(control.connections) - set(found))
            if not survivors:
                raise HomePipelineError(f"every device of the home is lost ({', '.join(map(str, sorted(found)))})")
            self._token += 1
            replies, unreachable = control.interrupt(survivors, self._token)
            if not unreachable:
                break
            found.update(dict.fromkeys(unreachable, time.time()))
            causes.update({**dict.fromkeys(unreachable, "it did not answer the recovery's stop"), **causes})
        for device in set(found) & set(control.connections):
            control.remove(device)
            self.referenced.pop(device, None)
        return {d: {int(v): layers for v, layers in reply.holdings.items()} for d, reply in replies.items()}

    # -- re-planning and migration -------------------------------------------------------

    def _replan(self, kind: str, holders: Holders, version: int) -> Plan:
        """A plan for the devices connected now to run from sync-round ``version``, ``holders`` holding its
        layers: lightweight (:func:`lightweight_recovery_plan`) where its partition fits, else the planner's, of
        its micro-batch sizes the one predicted fastest as the pipeline runs, and where devices compute at their own
        speeds (:func:`.prediction.weighs_hybrid`), the hybrid plans (Asteroid's, plain data parallelism) weighed
        beside it as the CLI plans up front (:func:`.prediction.preferred_plan`)."""
        layout = self.layout
        alive = set(self.control.connections)
        if kind == "lightweight":
            try:
                return lightweight_recovery_plan(layout, self.speeds, alive, holders,
                                                 max(1, self.sync_rounds - version), self.emulation, self.cache_dir)
            except UserError:
                pass  # the shifted partition does not fit: plan afresh
        candidates = full_replans(self.ft.planner, layout.profile, layout.pool, alive, layout.plan.batch_size,
                                  speeds=self.speeds, hybrid=weighs_hybrid(layout.plan, self.emulation))
        return preferred_plan(candidates, self.ft.planner, layout.profile, with_speeds(layout.pool, self.speeds),
                              self.emulation, self.cache_dir)[0]

    def _reconfigure(self, new: Plan, version: int, holders: Holders, heavy: bool = False,
                     recovery: bool = False) -> Reconfiguration:
        """Enter a new epoch running ``new`` from ``version`` (:func:`.reconfiguration.reconfigure`). The new
        plan's backups are filled before the next sync-round."""
        self.epoch += 1
        global_copy = self.copies.global_copy if self.copies is not None else (-1, {})  # tuning: every layer held
        done = reconfigure(self.control, self.layout, new, version, holders, epoch=self.epoch,
                           global_copy=global_copy, reference=self.reference,
                           referenced=self.referenced, optimization=self.optimization, heavy=heavy,
                           recovery=recovery)
        if self.copies is not None:
            self.copies.plan_changed()
        return done

    # -- outcome -------------------------------------------------------------------------

    def finish(self) -> list[FaultEvent]:
        """The events, with the throughput of the sync-rounds before each and after its recovery."""
        return self.log.finish(self.layout.plan.batch_size)


def lightweight_recovery_plan(layout: PipelineLayout, speeds: dict[int, float], alive: set[int], holders: Holders,
                              rounds_left: int, emulation: Emulation, cache_dir: str | None = None) -> Plan:
    """The current plan's cut points moved in proportion to capacity (Asteroid §3.4) at the micro-batch size
    predicted fastest, or one of its neighbours (:func:`~ecofl.pipeline.replan.shifted_replans`): the one that
    finishes ``rounds_left`` sync-rounds first, what switching to it costs included: its layer moves from
    ``holders`` and the memory its first round maps (:func:`.prediction.quickest_to_finish`). A UserError where
    the proportional partition does not fit. Predicted with the runtime's overheads recorded in ``cache_dir``."""
    plan, profile = layout.plan, layout.profile
    pool = with_speeds(layout.pool, speeds)
    lost = {d for stage in plan.stages for d in stage.devices} - alive
    proportional = lightweight_replans(plan, profile, layout.pool, lost=lost, speeds=speeds)
    best = fastest_plan(proportional, profile, pool, emulation, cache_dir)[0]
    candidates = [best, *shifted_replans(best, profile, pool)]
    return quickest_to_finish(candidates, plan, holders, rounds_left, profile, pool, emulation, cache_dir)[0]
