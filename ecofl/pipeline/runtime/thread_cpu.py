"""Where a worker's CPU goes in a sync-round: each thread's CPU time, summed by what the thread does.

A confined device computes, seals, sends, receives and opens out of one CPU
quota, so a round's CPU time (``cpu_s``) says how much it paid but not for
what. Each Python thread here has a name that says its job (``send-to-2``,
``recv-from-0``, ``heartbeat``, the worker's own ``MainThread`` that runs
the stage); :class:`ThreadClock` reads every live thread's CPU clock
(``pthread_getcpuclockid``) at a round's start and end and sums the
difference by that name without its peer (``send-to``). A thread that ends
within the round is not live at its end: its time is in ``ended``, the rest
of the process's CPU time, which also holds what no Python thread ran
(torch's own threads), unless the thread measured itself and the caller
names it (``finished``).
"""

from __future__ import annotations

import re
import threading
import time

#: The peer, index or number at a thread name's end ("send-to-2", "Thread-7"), dropped to name its job.
_NUMBERED = re.compile(r"-\d+(?: \(.*\))?$")
#: The part of the process's CPU time that no live thread accounts for.
ENDED = "ended"


def job_of(thread_name: str) -> str:
    """The job a thread's name says it does: the name without its peer or number."""
    return _NUMBERED.sub("", thread_name)


def _thread_cpu_s(thread: threading.Thread) -> float | None:
    """``thread``'s CPU seconds so far; None where the platform has no per-thread clock or the thread ended."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError):
        return None


class ThreadClock:
    """CPU seconds since it was made, by thread job (and :data:`ENDED`); empty where threads have no clocks."""

    def __init__(self) -> None:
        self._process = time.process_time()
        self._threads = self._read()

    @staticmethod
    def _read() -> dict[threading.Thread, float]:
        readings = ((thread, _thread_cpu_s(thread)) for thread in threading.enumerate())
        return {thread: cpu for thread, cpu in readings if cpu is not None}

    def process_s(self) -> float:
        """The process's CPU seconds (every thread, ended ones too) since this clock started."""
        return time.process_time() - self._process

    def by_job(self, finished: dict[str, float] | None = None) -> dict[str, float]:
        """CPU seconds each job's threads ran since this clock started, with ``finished`` (job: seconds of
        threads that ended and measured themselves); the rest of the process's in ``ended``."""
        now = self._read()
        if not now:
            return {}
        jobs = dict(finished or {})
        for thread, cpu in now.items():
            job = job_of(thread.name)
            jobs[job] = jobs.get(job, 0.0) + cpu - self._threads.get(thread, 0.0)
        jobs[ENDED] = max(0.0, self.process_s() - sum(jobs.values()))
        return {job: round(seconds, 4) for job, seconds in sorted(jobs.items())}
