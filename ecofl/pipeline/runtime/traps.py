"""Phase-targeted failures: a device kills or freezes itself at an exact moment of its work.

Random kills land where they happen to land; recovery must be exact for a
failure at *any* moment (Asteroid §3.4's replay, FTPipeHD §III-F), so tests
and the chaos benchmark also aim. The portal arms a worker's :class:`Trap`
with ``(signal, phase, count)``; the worker calls :meth:`Traps.reached` at
each phase point of its work, and at the ``count``-th it tells the portal
when (one ``trapped`` control message, so detection and recovery are timed
from the real moment) and sends itself ``SIGKILL`` or ``SIGSTOP``. The kill
is a real ``kill -9``: nothing of the process survives it.

Phase points (where the worker calls ``reached``):

================  ==============================================================
``forward``       a micro-batch's forward is about to run
``backward``      a micro-batch's backward is about to run
``send``          an activation or gradient send was just posted (bytes in flight)
``allreduce``     a replicated stage enters its gradient all-reduce
``step``          the optimizer step of the flush has just been applied
``replicate``     the stage's copies to its backups were just posted
``global-copy``   the stage's state for the global copy is on its way (in a sync-round)
``migrate``       a re-plan's layer moves were just posted
``recover``       a recovery's re-configuration is about to start
================  ==============================================================
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from ecofl import names
from ecofl.pipeline.runtime.control_messages import Trapped

ROUND_PHASES, PHASES = names.ROUND_PHASES, names.PHASES
SIGNALS = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP}


@dataclass
class Trap:
    """A worker's armed failure: ``signal`` (kill | freeze) at the ``count``-th ``phase`` from now on."""

    signal: str
    phase: str
    count: int

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS or self.phase not in PHASES or self.count < 1:
            raise ValueError(f"bad trap {self}: signal kill|freeze, phase one of {', '.join(PHASES)}, count >= 1")


class Traps:
    """The traps armed in one worker; ``notify(message)`` tells the portal just before one fires."""

    def __init__(self, notify: Callable[[Trapped], None]):
        self.notify = notify
        self.armed: list[Trap] = []

    def arm(self, trap: Trap) -> None:
        self.armed.append(trap)

    def reached(self, phase: str) -> None:
        """Count one ``phase``; fire the trap whose count it completes."""
        for trap in [t for t in self.armed if t.phase == phase]:
            trap.count -= 1
            if trap.count == 0:
                self.armed.remove(trap)
                self.notify(Trapped(trap.signal, phase, time.time()))
                os.kill(os.getpid(), SIGNALS[trap.signal])
