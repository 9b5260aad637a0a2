"""Keep this machine's cores awake while confined devices run: one idle-priority spinner per core.

A confined device (:mod:`ecofl.cgroups`) runs a short slice of its CPU
quota each period and then sleeps, so the core it ran on goes idle many
times a second. On a virtual machine an idle core halts and the hypervisor
takes it away, and each slice then starts on a cold core. Measured here
(``benchmarks/awake_cores.py``, docs/pipeline.md; KVM, 2 cores, MobileNetV2
training steps in a 0.1-core cgroup with a 1 ms quota per 10 ms period, two
alternating repeats of 8 x 4 s each): 0.63 and 0.74 steps/s with the cores
left to halt, 0.58-0.68 of the quota, a coefficient of variation of
8.7-13.1% between the 4 s chunks; 0.93 and 0.96 steps/s, 0.84-0.88 of the
quota and 3.2-4.1% with a spinner on each core. So without the spinners a
device computes a quarter slower than its quota and its speed drifts, and
neither is a property of the device being emulated.

A spinner runs under ``SCHED_IDLE`` (Linux): the kernel runs it only when
nothing else wants the core and preempts it the moment anything wakes, so
it takes no CPU from the devices, the portal or any other job; it only
keeps the core from halting (what the kernel's ``idle=poll`` would do for
the whole machine). Each spinner exits when the process that started it is
gone, even if that process is killed.
"""

from __future__ import annotations

import os
import subprocess
import sys

POLL_EVERY = 200_000  # empty loop iterations between checks that the starter is alive (a few ms)


class AwakeCores:
    """One ``SCHED_IDLE`` spinner per core of this machine while started (a context manager)."""

    def __init__(self, cores: int | None = None):
        self.cores = len(os.sched_getaffinity(0)) if cores is None else cores
        self.spinners: list[subprocess.Popen] = []

    @property
    def running(self) -> bool:
        return bool(self.spinners)

    def start(self) -> None:
        command = [sys.executable, "-m", "ecofl.awake_cores", str(os.getpid())]
        while len(self.spinners) < self.cores:  # each recorded as it starts: stop() after a Ctrl-C finds it
            self.spinners.append(subprocess.Popen(command, stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        spinners, self.spinners = self.spinners, []
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()

    def __enter__(self) -> "AwakeCores":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def spin(starter: int) -> None:
    """Busy-loop at idle priority until ``starter`` (a pid) is no longer this process's parent."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while os.getppid() == starter:
        for _ in range(POLL_EVERY):
            pass


if __name__ == "__main__":
    spin(int(sys.argv[1]))
