"""Adapt and survive: the portal's loop of monitor -> decide -> re-plan -> migrate -> replay.

One mechanism with two triggers (Eco-FL §4.4; Asteroid §3.4; FTPipeHD
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
  re-planned between sync-rounds, with no replay.

Between sync-rounds the portal also replicates every single-device stage to
its backup (every ``replicate_every`` rounds) and keeps a global copy (every
``global_copy_every`` rounds). Every event is recorded as a
:class:`~ecofl.pipeline.runtime.faults.FaultEvent`.
"""

from __future__ import annotations

import signal
import time
from typing import Sequence

import numpy as np

from ecofl.errors import UserError
from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.migration import Holders, restore_point
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.replan import full_replan, lightweight_replan, measured_speeds, with_speeds
from ecofl.pipeline.replication import backup_targets
from ecofl.pipeline.runtime.control_messages import Arm, Armed, Collect, Config, Done, Replicate, Replicated, Weights
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.errors import DevicesLost, HomePipelineError
from ecofl.pipeline.runtime.faults import FaultEvent, FaultTolerance, Injection
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.reconfiguration import reconfigure, restored_from
from ecofl.pipeline.runtime.stage import Optimization
from ecofl.pipeline.schedule import PASSES, ActionKind


class Recovery:
    """The fault-tolerance state of one ``HomePipeline.train`` call (inert without fault tolerance).

    It sits on the home's :class:`~.control_plane.ControlPlane` (the workers)
    and :class:`~.layout.PipelineLayout` (the plan, which a re-plan replaces);
    ``config`` is what a joining worker is told.
    """

    def __init__(self, control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance | None, config: Config,
                 reference: dict[str, np.ndarray], inject: Sequence[Injection], optimization: Optimization):
        self.control, self.layout, self.ft, self.config = control, layout, ft, config
        self.reference, self.optimization = reference, optimization
        self.momentum = optimization.momentum > 0
        self.injections = list(inject)
        self.slowdowns: dict[int, float] = {}
        self.speeds = {d: spec.speed for d, spec in enumerate(layout.pool.devices)}
        self.events: list[FaultEvent] = []
        self._waiting: list[FaultEvent] = []  # recovered, waiting for their first completed sync-round
        self.completed: list[tuple[float, float]] = []  # (end wall time, seconds) of every completed round
        self.epoch = 0
        self.replica_version: int | None = None  # the version every backup holds (None: replicate before a round)
        self.stateful = layout.stateful
        self.global_copy: tuple[int, dict[str, np.ndarray]] | None = None
        self.lost_rounds = 0
        self._slow: dict[int, int] = {}
        self._pace: dict[int, float] = {}  # each device's best seconds per micro-batch in the current plan
        self._pace_epoch = 0
        self._token = 0

    # -- between sync-rounds -------------------------------------------------------------

    def before_round(self, r: int) -> None:
        if self.ft is None:
            return
        for event in self._due(r, ("kill", "freeze"), aimed=True):
            if event.device not in self.control.connections:
                raise HomePipelineError(f"cannot aim {event.kind} at device {event.device}: it is not in the home")
            self.control.send(event.device, Arm(event.kind, event.phase, event.count))
            self.control.gather(Armed, [event.device])
            self.events.append(FaultEvent(event.kind, event.device, r, phase=event.phase))  # timed when it strikes
        confinement = self.control.devices.confinement
        for event in self._due(r, ("slow",)):
            if confinement is not None and event.device in confinement.limits:
                confinement.slow(event.device, event.factor)  # a real load: the worker is not told
            else:
                self.slowdowns[event.device] = event.factor  # the worker sleeps F times longer
            self._record(FaultEvent("slow", event.device, r))
        for event in self._due(r, ("join",)):
            self.join(event.device, r)
        every = self.ft.replicate_every
        if every and (self.replica_version is None or r - self.replica_version >= every):
            self.replicate(r)
        copy_every = self.ft.global_copy_every
        if copy_every and r % copy_every == 0 and (self.global_copy is None or self.global_copy[0] != r):
            self.global_copy = (r, self.collect())

    def kept_versions(self, r: int) -> list[int]:
        """The committed versions besides ``r`` that the workers keep copies of during sync-round ``r``."""
        return [] if self.replica_version is None or self.replica_version == r else [self.replica_version]

    def after_send(self, r: int) -> None:
        """Sync-round ``r`` has started: the events recovered from have resumed; injected failures not aimed
        at a phase strike now."""
        now = time.time()
        for event in self._waiting:
            if event.resumed_after_s is None:
                event.resumed_after_s = now - event.struck_at
        for event in self._due(r, ("kill", "freeze")):
            self.control.devices.signal(event.device, signal.SIGKILL if event.kind == "kill" else signal.SIGSTOP)
            self._record(FaultEvent(event.kind, event.device, r))

    def _due(self, r: int, kinds: tuple[str, ...], aimed: bool = False) -> list[Injection]:
        """The injections of ``kinds`` (``aimed``: at a phase) at sync-round ``r``, each fired once (a replayed
        round fires none)."""
        due = [e for e in self.injections if e.round == r and e.kind in kinds and (e.phase is not None) == aimed]
        self.injections = [e for e in self.injections if e not in due]
        return due

    def after_round(self, r: int, replies: dict[int, Done], seconds: float) -> None:
        now = time.time()
        self.completed.append((now, seconds))
        for event in self._waiting:
            event.recovered_after_s = now - event.struck_at
        self._waiting.clear()
        confined = self.control.devices.confinement is not None
        if self.ft is not None and self.ft.adapt and (self.layout.emulate or confined):
            self._watch_speeds(r, replies)

    def _watch_speeds(self, r: int, replies: dict[int, Done]) -> None:
        """Eco-FL §4.4: a sustained deviation of a device's compute time from the plan re-plans the pipeline.

        A device deviates when its seconds per micro-batch exceed ``slowdown_ratio`` times the larger of
        the cost model's and its own best pace in the current plan: the model alone would flag a device
        the model underestimates (the runtime's overhead on a stage of next to no compute, a confined
        device's measured speed a little off) as slow from its first round."""
        layout, profile = self.layout, self.layout.profile
        if self._pace_epoch != self.epoch:
            self._pace, self._pace_epoch = {}, self.epoch
        measured: dict[int, float] = {}
        slow = []
        for role in layout.roles:
            times = [end - start for kind, _, start, end in replies[role.device].events
                     if ActionKind.from_str(kind) in PASSES]
            if not times or role.samples == 0:
                continue
            per_micro_batch = 2 * float(np.mean(times))  # one forward and one backward
            expected = sum(stage_compute_s(profile, with_speeds(layout.pool, self.speeds).devices[role.device],
                                           role.layers, role.samples))
            measured[role.device] = per_micro_batch
            pace = self._pace[role.device] = min(self._pace.get(role.device, per_micro_batch), per_micro_batch)
            if per_micro_batch > self.ft.slowdown_ratio * max(expected, pace):
                self._slow[role.device] = self._slow.get(role.device, 0) + 1
                if self._slow[role.device] >= self.ft.slowdown_rounds:
                    slow.append(role.device)
            else:
                self._slow.pop(role.device, None)
        if not slow:
            return
        started = time.time()
        self.speeds.update(measured_speeds(layout.plan, profile, with_speeds(layout.pool, self.speeds), measured))
        kind = self.ft.adapt_replan
        new = self._replan(kind)
        event = next((e for e in reversed(self.events) if e.kind == "slow" and e.device in slow), None)
        if event is None:
            event = FaultEvent("slow", slow[0], r)
            event.struck_at = started
            self.events.append(event)
        event.detected_after_s = started - event.struck_at
        event.replan = kind
        event.bytes_moved = self._reconfigure(new, r + 1, self._plan_holders())
        event.rescheduling_s = time.time() - started
        self._slow.clear()
        self._waiting.append(event)

    def join(self, device: int, r: int) -> None:
        """A device (new, or back) joins between sync-rounds: admit it, re-plan with it, migrate its layers."""
        control = self.control
        if device in control.connections or not 0 <= device < len(self.layout.pool):
            raise HomePipelineError(f"device {device} cannot join: it is already in the home or not in the pool")
        event = FaultEvent("join", device, r)
        self._record(event)
        control.join(device)
        control.configure([device], self.config)
        event.detected_after_s = time.time() - event.struck_at
        event.replan = "full"
        started = time.time()
        event.bytes_moved = self._reconfigure(self._replan("full"), r, self._plan_holders())
        event.rescheduling_s = time.time() - started
        self._waiting.append(event)

    # -- replication -------------------------------------------------------------------

    def replicate(self, version: int) -> None:
        """Every single-device stage sends its state at ``version`` to its backup (Asteroid §3.4)."""
        layout = self.layout
        memory = {d: spec.memory_bytes for d, spec in enumerate(layout.pool.devices)}
        backups = backup_targets(layout.plan, memory)
        rank_of = {role.device: role.rank for role in layout.roles}
        stage_of = {d: stage for stage in layout.plan.stages for d in stage.devices}
        for role in layout.roles:
            sources = [(src, rank_of[src], *stage_of[src].layers) for src, dst in backups.items() if dst == role.device]
            to = rank_of[backups[role.device]] if role.device in backups else None
            self.control.send(role.device, Replicate(version, to, sources, layout.link_rate(role.device)))
        self.control.gather(Replicated)
        self.replica_version = version

    def collect(self) -> dict[str, np.ndarray]:
        """The whole model's state (weights and momentum) at the portal: FTPipeHD's global replication."""
        for role in self.layout.roles:
            self.control.send(role.device, Collect(self.momentum))
        state: dict[str, np.ndarray] = {}
        for _, arrays in self.control.gather_with_arrays(Weights).values():
            state.update({k: np.array(v) for k, v in arrays.items()})
        return state

    # -- failures ------------------------------------------------------------------------

    def recover(self, lost: DevicesLost, r: int) -> int:
        """Recover from losing ``lost`` while at sync-round ``r`` (in it, or before it); the sync-round to
        continue from. A device lost during the recovery itself starts it again with the survivors left."""
        if self.ft is None:
            raise lost
        plan = self.layout.plan  # the plan the lost devices served in
        found = dict.fromkeys(lost.failures, time.time())  # device -> when its loss was detected
        while True:
            holdings = self._settle(found)
            version, holders = restore_point(holdings, self.stateful, r, self.global_copy[0])
            kind = self.ft.replan
            rescheduling = time.time()
            try:
                moved = self._reconfigure(self._replan(kind), version, holders, heavy=kind == "heavy", recovery=True)
            except DevicesLost as again:  # lost while recovering: once more, without it
                found.update(dict.fromkeys(set(again.failures) - set(found), time.time()))
                continue
            break
        rescheduling = time.time() - rescheduling
        self.lost_rounds += r - version
        for device, detected in sorted(found.items()):
            event = self._event_of(device, r, detected)
            event.detected_after_s = detected - event.struck_at
            event.replan, event.bytes_moved, event.lost_rounds = kind, moved, r - version
            event.rescheduling_s = rescheduling
            event.restored_from = restored_from(plan, device, holders, version, self.stateful)
            self._waiting.append(event)
        return version

    def _event_of(self, device: int, r: int, detected: float) -> FaultEvent:
        """The injected event that took ``device`` (timed from when it struck), or a new one for a failure
        found without injection (timed from the device's last sign of life before ``detected``)."""
        control = self.control
        event = next((e for e in self.events if e.device == device and e.kind in ("kill", "freeze")
                      and e.detected_after_s is None), None)
        if event is not None and event.phase is not None:
            event.round = r
            event.struck_at = control.trapped.pop(device, detected)
        if event is None:
            event = FaultEvent("failure", device, r)
            self.events.append(event)
            found = control.monitor.failures().get(device) if control.monitor else None
            silent_for = found.detected_at - found.last_seen if found is not None else 0.0
            event.struck_at = detected - silent_for
        return event

    def _settle(self, found: dict[int, float]) -> dict[int, dict[int, list[int]]]:
        """Stop every survivor where it is, remove the lost devices (adding to ``found`` whoever cannot answer);
        what each survivor holds: ``{device: {version: layers}}``."""
        control = self.control
        while True:  # several devices may fail at once: whoever cannot be aborted is lost too
            failed = set(found) | (set(control.lost()) & set(control.connections))
            found.update(dict.fromkeys(failed - set(found), time.time()))
            survivors = sorted(set(control.connections) - failed)
            if not survivors:
                raise HomePipelineError(f"every device of the home is lost ({', '.join(map(str, sorted(found)))})")
            self._token += 1
            replies, unreachable = control.interrupt(survivors, self._token)
            if not unreachable:
                break
            found.update(dict.fromkeys(unreachable, time.time()))
        for device in set(found) & set(control.connections):
            control.remove(device)
        return {d: {int(v): layers for v, layers in reply.holdings.items()} for d, reply in replies.items()}

    # -- re-planning and migration -------------------------------------------------------

    def _replan(self, kind: str) -> Plan:
        """A plan for the devices connected now (lightweight: the current plan's cut points shifted)."""
        layout = self.layout
        alive = set(self.control.connections)
        lost = {d for stage in layout.plan.stages for d in stage.devices} - alive
        if kind == "lightweight":
            try:
                return lightweight_replan(layout.plan, layout.profile, layout.pool, lost=lost, speeds=self.speeds)
            except UserError:
                pass  # the shifted partition does not fit: plan afresh
        return full_replan(self.ft.planner, layout.profile, layout.pool, alive, layout.plan.batch_size,
                           speeds=self.speeds)

    def _plan_holders(self) -> Holders:
        """Between sync-rounds every device holds its stage at the current version."""
        return {layer: list(stage.devices) for stage in self.layout.plan.stages
                for layer in range(stage.layers[0], stage.layers[1] + 1) if layer in self.stateful}

    def _reconfigure(self, new: Plan, version: int, holders: Holders, heavy: bool = False,
                     recovery: bool = False) -> int:
        """Enter a new epoch running ``new`` from ``version`` (:func:`.reconfiguration.reconfigure`); the bytes
        that crossed a link. The new plan's backups are filled before the next sync-round."""
        self.epoch += 1
        moved = reconfigure(self.control, self.layout, new, version, holders, epoch=self.epoch,
                            global_copy=self.global_copy, reference=self.reference, optimization=self.optimization,
                            heavy=heavy, recovery=recovery)
        self.replica_version = None
        return moved

    # -- outcome -------------------------------------------------------------------------

    def _record(self, event: FaultEvent) -> None:
        event.struck_at = time.time()
        self.events.append(event)

    def finish(self, round_s: dict[int, float]) -> list[FaultEvent]:
        """The events, with the throughput of the sync-rounds before each and after its recovery."""
        batch = self.layout.plan.batch_size
        for event in self.events:
            at = event.struck_at
            if at is None:  # aimed at a phase the device never reached
                continue
            before = [s for end, s in self.completed if end <= at][-3:]
            after_start = at + (event.recovered_after_s or 0.0)
            after = [s for end, s in self.completed if end > after_start]
            event.throughput_before = batch / float(np.mean(before)) if before else None
            event.throughput_after = batch / float(np.mean(after)) if after else None
        return self.events

