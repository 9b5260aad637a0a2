"""What a worker measures of its own sync-round, from a start it chooses: CPU by thread, the peak resident set,
the memory mapped anew, the accelerator's peak.

A fault-tolerant worker commits a copy of its stage after it has replied
that its round is done (:meth:`~.worker_requests.Worker._round`): the copy
overlaps the gap before the next round (the portal gathering every reply,
the next request's travel, the pipeline filling) instead of lengthening the
round every device waits for. Its meter starts before that copy, so the
copy's CPU and memory count in the next sync-round's figures, not in none.
"""

from __future__ import annotations

from typing import Any

from ecofl.accelerator import peak_memory_bytes, reset_peak_memory
from ecofl.pipeline.runtime.process_memory import mapped_since, peak_rss_bytes, resident_from_now
from ecofl.pipeline.runtime.thread_cpu import ThreadClock


class RoundMeter:
    """Started now: a worker's CPU, resident set and accelerator memory from here on. Starting one resets the
    process's peak resident set, so a worker reads one meter before it starts the next."""

    def __init__(self, accelerator: Any):
        self.accelerator = accelerator
        self.resident = resident_from_now()  # and the peak resident set from it
        reset_peak_memory(accelerator)
        self.cpu = ThreadClock()

    def figures(self, ended_cpu_s: dict[str, float]) -> dict[str, Any]:
        """The figures a :class:`~.control_messages.Done` reports (``ended_cpu_s``: the CPU seconds of threads
        of the round that have ended, by job)."""
        return dict(
            peak_rss_bytes=peak_rss_bytes(),  # measured: the process's peak since the start
            peak_accelerator_bytes=peak_memory_bytes(self.accelerator),
            cpu_s=self.cpu.process_s(), cpu_s_by_job=self.cpu.by_job(ended_cpu_s),
            first_touched_bytes=mapped_since(self.resident),
        )
