"""Idle-priority spinners that keep the cores awake while confined devices run (ecofl.awake_cores)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ecofl.awake_cores import AwakeCores
from ecofl.cgroups import DeviceLimits
from ecofl.pipeline.runtime.confinement import Confinement
from helpers import needs_cgroups

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_one_spinner_per_core_runs_at_idle_priority_until_stopped():
    with AwakeCores(cores=2) as awake:
        pids = [spinner.pid for spinner in awake.spinners]
        assert len(pids) == 2
        assert wait_until(lambda: all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in pids))
    assert not awake.running
    assert not any(alive(pid) for pid in pids)


def test_spinners_exit_when_the_process_that_started_them_is_killed():
    starter = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom ecofl.awake_cores import AwakeCores\na = AwakeCores(cores=2)\na.start()\n"
        "print(' '.join(str(s.pid) for s in a.spinners), flush=True)\ntime.sleep(600)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in starter.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    finally:
        starter.kill()
        starter.wait()
    assert wait_until(lambda: not any(alive(pid) for pid in pids)), "a spinner outlived its starter"


@needs_cgroups
def test_the_cores_are_kept_awake_exactly_while_a_device_is_confined():
    confinement = Confinement({0: DeviceLimits(0.1, 1 << 30), 1: DeviceLimits(0.1, 1 << 30)})
    try:
        assert not confinement.awake.running
        confinement.enter(0)
        confinement.enter(1)
        spinners = [spinner.pid for spinner in confinement.awake.spinners]
        assert len(spinners) == len(os.sched_getaffinity(0)) and all(map(alive, spinners))
        confinement.release(0)
        assert all(map(alive, spinners))
        confinement.release(1)
        assert not any(map(alive, spinners))
        confinement.enter(0)
        spinners = [spinner.pid for spinner in confinement.awake.spinners]
        assert spinners and all(map(alive, spinners))
    finally:
        confinement.close()
    assert not any(map(alive, spinners))


def test_a_ctrl_c_while_spinners_start_leaves_the_started_ones_for_stop(monkeypatch):
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):  # the second spinner is interrupted as it starts
        if started:
            raise KeyboardInterrupt
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    awake = AwakeCores(cores=2)
    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        awake.start()
    monkeypatch.undo()
    assert awake.spinners == started
    awake.stop()
    assert not alive(started[0].pid)
