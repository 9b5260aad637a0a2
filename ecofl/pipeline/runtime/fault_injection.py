"""Injected faults (``--inject``): the papers' experiments on a home, each fired once at its sync-round
(:class:`~.faults.Injection`; a replayed round fires none)."""

from __future__ import annotations

import signal
from typing import Sequence

from ecofl.pipeline.runtime.control_messages import Arm, Armed
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.errors import HomePipelineError
from ecofl.pipeline.runtime.fault_log import FaultLog
from ecofl.pipeline.runtime.faults import FaultEvent, Injection


class FaultInjector:
    """Kills, freezes, slow-downs and joins at the sync-rounds they name."""

    def __init__(self, control: ControlPlane, log: FaultLog, injections: Sequence[Injection]):
        self.control, self.log = control, log
        self.injections = list(injections)
        self.slowdowns: dict[int, float] = {}  # device -> how many times slower the worker is told to run

    def before_round(self, r: int) -> list[int]:
        """Arm the kills and freezes aimed at a phase of sync-round ``r``, start its slow-downs; the devices
        that join before it."""
        for event in self._due(r, ("kill", "freeze"), aimed=True):
            self._present(event, f"aim {event.kind} at")
            self.control.send(event.device, Arm(event.kind, event.phase, event.count))
            self.control.gather(Armed, [event.device])
            self.log.events.append(FaultEvent(event.kind, event.device, r, phase=event.phase))  # timed on strike
        confinement = self.control.devices.confinement
        for event in self._due(r, ("slow",)):
            self._present(event, "slow")
            if confinement is not None and event.device in confinement.limits:
                confinement.slow(event.device, event.factor)  # a real load: the worker is not told
            else:
                self.slowdowns[event.device] = event.factor  # the worker sleeps F times longer
            self.log.record(FaultEvent("slow", event.device, r))
        return [event.device for event in self._due(r, ("join",))]

    def after_send(self, r: int) -> None:
        """Sync-round ``r`` has started: the kills and freezes not aimed at a phase strike now."""
        for event in self._due(r, ("kill", "freeze")):
            self._present(event, event.kind)
            self.control.devices.signal(event.device, signal.SIGKILL if event.kind == "kill" else signal.SIGSTOP)
            self.log.record(FaultEvent(event.kind, event.device, r))

    def _present(self, event: Injection, verb: str) -> None:
        """``event``'s device is in the home now (it may have been lost, or left out of the plan and never joined;
        :func:`~.faults.check_targets` refuses the latter before the first round)."""
        if event.device not in self.control.connections:
            raise HomePipelineError(f"cannot {verb} device {event.device} at sync-round {event.round}: it is not in "
                                    "the home (lost, or never given a stage)")

    def _due(self, r: int, kinds: tuple[str, ...], aimed: bool = False) -> list[Injection]:
        """The injections of ``kinds`` (``aimed``: at a phase) at sync-round ``r``, each fired once."""
        due = [e for e in self.injections if e.round == r and e.kind in kinds and (e.phase is not None) == aimed]
        self.injections = [e for e in self.injections if e not in due]
        return due
