"""Confined devices held on host cores of their own (:mod:`ecofl.core_placement`): the placement as plain data,
and real processes held on it (every thread, those started later too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ecofl.cgroups import DeviceLimits
from ecofl.core_placement import PIN_ENV, hold_on_cores, place_on_cores
from ecofl.pipeline.runtime.confinement import Confinement
from helpers import needs_cgroups

# A process that starts a thread, then on each line of stdin starts another and prints every thread's cores.
THREADS = """
import json, os, sys, threading, time
def idle():
    time.sleep(60)
def cores():
    return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir('/proc/self/task')})
threading.Thread(target=idle, daemon=True).start()
print('ready', flush=True)
for _ in sys.stdin:
    threading.Thread(target=idle, daemon=True).start()
    print(json.dumps(cores()), flush=True)
"""


def test_the_mixed_home_puts_its_largest_device_alone_and_the_rest_together():
    quotas = {0: 0.08, 1: 0.025, 2: 0.1, 3: 0.282}  # phone, rpi4, nano-10w, tx2-maxn
    assert place_on_cores(quotas, [0, 1]) == {3: (0,), 2: (1,), 0: (1,), 1: (1,)}


def test_each_core_carries_at_most_one_device_more_than_the_least_loaded():
    quotas = {d: q for d, q in enumerate([0.3, 0.25, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05])}
    placed = place_on_cores(quotas, [0, 1, 2])
    load = {cpu: sum(quotas[d] for d, cpus in placed.items() if cpu in cpus) for cpu in (0, 1, 2)}
    assert all(len(cpus) == 1 for cpus in placed.values())
    assert max(load.values()) - min(load.values()) <= max(quotas.values()) + 1e-9
    assert sum(load.values()) == pytest.approx(sum(quotas.values()))


def test_a_device_of_more_than_one_core_gets_as_many_whole_cores_and_shares_them_evenly():
    placed = place_on_cores({0: 1.5, 1: 0.4, 2: 0.3}, [0, 1, 2, 3])
    assert placed[0] == (0, 1)  # 0.75 on each
    assert placed[1] == (2,) and placed[2] == (3,)
    assert place_on_cores({0: 3.0}, [4, 5]) == {0: (4, 5)}  # never more cores than there are


def test_no_cores_or_a_quota_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no host cores"):
        place_on_cores({0: 0.1}, [])
    with pytest.raises(ValueError, match="device 1"):
        place_on_cores({0: 0.1, 1: 0.0}, [0])


def _threads_process() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _cores_of_every_thread(child: subprocess.Popen) -> list[tuple[int, ...]]:
    child.stdin.write("\n")
    child.stdin.flush()
    return [tuple(cores) for cores in json.loads(child.stdout.readline())]


def test_every_thread_of_a_held_process_and_each_it_starts_later_runs_on_its_cores():
    core = sorted(os.sched_getaffinity(0))[-1]
    child = _threads_process()
    try:
        hold_on_cores([child.pid, 999_999_999], [core])  # a process that does not exist is skipped
        assert _cores_of_every_thread(child) == [(core,)]
    finally:
        child.kill()
        child.wait()


@needs_cgroups
@pytest.mark.parametrize("pinned", ["1", "0"])
def test_a_confined_worker_is_held_on_its_placement_once_ready_unless_turned_off(pinned, monkeypatch):
    monkeypatch.setenv(PIN_ENV, pinned)
    confinement = Confinement({0: DeviceLimits(0.2, 1 << 30), 1: DeviceLimits(0.1, 1 << 30)})
    everywhere = tuple(sorted(os.sched_getaffinity(0)))
    try:
        group, _ = confinement.enter(0)
        child = subprocess.Popen([*group.entry_command(), sys.executable, "-c", THREADS], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            assert _cores_of_every_thread(child) == [everywhere]  # free while it starts up
            confinement.throttle(0)
            expected = confinement.placement[0] if pinned == "1" else everywhere
            assert _cores_of_every_thread(child) == [expected]
            assert confinement.report(0)["host_cores"] == (list(expected) if pinned == "1" else None)
        finally:
            child.kill()
            child.wait()
    finally:
        confinement.close()
