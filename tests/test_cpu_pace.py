"""A confined device computes at its quota's pace, also in operations shorter than the kernel's enforcement
(:mod:`ecofl.pipeline.runtime.cpu_pace`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ecofl.pipeline.runtime import emulation
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from helpers import needs_cgroups

pytestmark = pytest.mark.timeout(120)


def spin(cpu_s: float) -> None:
    """Burn ``cpu_s`` of this thread's CPU time."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_an_operation_lasts_at_least_its_cpu_time_over_the_cores():
    pace = CpuPace(0.25)
    started = pace.begin()
    spin(0.02)
    cpu = time.thread_time() - started[1]
    end = pace.end(started)
    assert end - started[0] >= cpu / 0.25 - 1e-3


def test_without_cores_nothing_is_paced_and_a_refresh_keeps_it_so(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(emulation.time, "sleep", slept.append)
    pace = CpuPace(None)
    pace.refresh()  # outside a device cgroup: no quota to read, no pace
    assert pace.cores is None
    started = pace.begin()
    spin(0.01)
    pace.end(started)
    assert slept == []


@needs_cgroups
def test_a_confined_process_computes_short_steps_after_idling_at_its_quotas_pace():
    """In a 0.2-core cgroup (1 ms every 5 ms), 3 ms steps after 60 ms idle: each lasts its CPU / 0.2."""
    script = (
        "import time\n"
        "from ecofl.pipeline.runtime.cpu_pace import CpuPace\n"
        "def spin(cpu_s):\n"
        "    end = time.thread_time() + cpu_s\n"
        "    while time.thread_time() < end:\n"
        "        pass\n"
        "pace = CpuPace.of_this_process()\n"
        "assert pace.cores is not None and abs(pace.cores - 0.2) < 1e-6, pace.cores\n"
        "walls, cpus = [], []\n"
        "for _ in range(8):\n"
        "    time.sleep(0.06)\n"
        "    started = pace.begin()\n"
        "    spin(0.003)\n"
        "    cpus.append(time.thread_time() - started[1])\n"
        "    walls.append(pace.end(started) - started[0])\n"
        "print(sum(walls) / sum(cpus))\n"
    )
    done = subprocess.run([sys.executable, "-m", "ecofl.cgroups", "run", "--cores", "0.2", "--memory-bytes",
                           str(1 << 30), "--label", "pace", "--", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= 1 / 0.2 - 0.05  # wall / CPU: the device's pace, not the host's burst
