"""A confined device computes at its quota's pace, in short operations too.

CFS hands a cgroup its quota every period and throttles it only once the
quota is spent, checked at the scheduler's tick: a device idle for a period
runs its next short operation faster than the device would. Measured
here (``benchmarks/cpu_pace.py``, 2026-12-01, Linux 6.18, cgroup v1): a 3 ms
(CPU) step after 50 ms idle took 0.69 and 0.52 of its CPU time over the
cores at 0.1 and 0.25 cores, and 1.01 back to back. A pipeline stage idles
between its micro-batches, so a slow confined device (the mixed home's
Raspberry Pi) ran its stage 5x faster in the pipeline than in its
calibration's back-to-back steps, and the plan was made for a device that
was not there. A real board computes at one pace, idle or not.

So a confined device's operation lasts at least its CPU time over the
device's cores (:class:`CpuPace`): the calling thread's CPU clock is read at
the start and end of the operation, and the thread sleeps the rest. The
kernel still enforces the quota on everything the device runs (its link
threads too); the pace only takes away the burst. A device of two cores or
more computes on as many torch threads, whose CPU time the calling thread's
clock does not hold: its pace is a lower bound the kernel's quota already
keeps. The cores are the cgroup's quota, read from the kernel
(:func:`ecofl.own_cgroup.own_device_cores`) at each sync-round: a load spike that cuts the quota slows every operation,
as it would on a real device, and the runtime learns of it only from the
times it measures. Outside a device cgroup (host speed, sleep emulation, a
real device) there is no pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ecofl.own_cgroup import own_device_cores
from ecofl.pipeline.runtime.emulation import dilate


class CpuPace:
    """Operations of this thread last at least their CPU time / ``cores`` (None: no pace)."""

    def __init__(self, cores: float | None):
        self.cores = cores

    @classmethod
    def of_this_process(cls) -> "CpuPace":
        """The pace of the device cgroup this process runs in (none outside one)."""
        return cls(own_device_cores())

    def refresh(self) -> None:
        """Read the cgroup's quota again (a load spike may have cut it); a process with no pace keeps none."""
        if self.cores is not None:
            self.cores = own_device_cores() or self.cores

    def begin(self) -> tuple[float, float]:
        """The wall clock (time.time()) and this thread's CPU clock at an operation's start."""
        return time.time(), time.thread_time()

    def end(self, started: tuple[float, float], abort: Callable[[], None] | None = None) -> float:
        """Sleep until the operation begun at ``started`` has lasted its CPU time / cores; return the end."""
        wall, cpu = started
        if self.cores is None:
            return time.time()
        return dilate(wall, (time.thread_time() - cpu) / self.cores, 1.0, abort)

    def call(self, step: Callable[[], object]) -> None:
        """Run ``step`` at the pace."""
        started = self.begin()
        step()
        self.end(started)
