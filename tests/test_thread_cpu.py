"""A round's CPU time by what each thread does (ecofl.pipeline.runtime.thread_cpu)."""

from __future__ import annotations

import threading
import time

import pytest

from ecofl.pipeline.runtime.thread_cpu import ENDED, ThreadClock, job_of


def burn(cpu_s: float) -> float:
    """Spin until this thread has used ``cpu_s`` CPU seconds more; the CPU seconds it used."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(range(1000))
    return time.thread_time() - start


@pytest.mark.parametrize(("name", "job"), [("send-to-2", "send-to"), ("recv-from-12", "recv-from"),
                                           ("Thread-7 (serve)", "Thread"), ("MainThread", "MainThread"),
                                           ("heartbeat", "heartbeat"), ("replica-receiver", "replica-receiver")])
def test_a_threads_job_is_its_name_without_its_peer(name, job):
    assert job_of(name) == job


def test_cpu_time_is_summed_by_job_and_what_ended_is_told_apart():
    clock = ThreadClock()
    release = threading.Event()
    used: dict[str, float] = {}

    def spin(key: str, stay: bool) -> None:
        used[key] = burn(0.2)
        if stay:
            release.wait(60)

    live = [threading.Thread(target=spin, args=(f"live-{i}", True), name=f"spinner-{i}") for i in range(2)]
    ended = threading.Thread(target=spin, args=("ended", False), name="burst-1")
    for thread in (*live, ended):
        thread.start()
    ended.join(60)
    while len(used) < 3:
        time.sleep(0.01)
    try:
        jobs = clock.by_job()
        told = clock.by_job(finished={"burst": used["ended"]})
    finally:
        release.set()
        for thread in live:
            thread.join(60)
    assert jobs["spinner"] >= used["live-0"] + used["live-1"] - 0.01  # both spinners, under one job
    assert jobs[ENDED] >= used["ended"] - 0.01  # the thread that ended is in the process's rest
    assert "burst" not in jobs
    assert told["burst"] == pytest.approx(used["ended"], abs=1e-3)
    assert told[ENDED] < jobs[ENDED] - 0.15  # named, it left the rest
