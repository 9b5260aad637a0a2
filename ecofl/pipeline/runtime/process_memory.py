"""Real memory of a worker process (Linux ``/proc``), measured beside the memory model's accounting.

The emulation's :class:`~ecofl.pipeline.runtime.emulation.MemoryLedger`
*accounts* for weights, gradients, optimizer state and saved activations
(Asteroid eq. 3); this module *measures* the process: its resident set now
(``VmRSS``) and its peak (``VmHWM``), which :func:`reset_peak` sets back to
the current resident set (``/proc/self/clear_refs``, value 5, Linux 4.0+),
so that a sync-round's own peak can be read. Where ``/proc`` is missing,
the figures are None. :func:`mapped_since` is the memory the process mapped
anew since then (its peak's growth, whatever the page size): a stage's
first sync-round maps its stash (docs/pipeline.md, "A new stage's first
round"), at the CPU per byte :func:`first_touch_cpu_s_per_byte` measures.
"""

from __future__ import annotations

import mmap
import statistics
import time
from pathlib import Path

_STATUS = Path("/proc/self/status")
FIRST_TOUCH_SAMPLE_BYTES = 32 << 20  # thousands of pages; the probe holds twice this while it runs
FIRST_TOUCH_SAMPLES = 5


def _status_bytes(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """The process's resident set now."""
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int | None:
    """The process's peak resident set since it started or since :func:`reset_peak`."""
    return _status_bytes("VmHWM")


def reset_peak() -> bool:
    """Start a new peak at the current resident set; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def resident_from_now() -> int | None:
    """Start a new peak and return the resident set it starts from (None: the kernel cannot reset the peak)."""
    return rss_bytes() if reset_peak() else None


def mapped_since(resident: int | None) -> int | None:
    """Bytes the process has mapped anew since :func:`resident_from_now` returned ``resident``: its peak resident
    set's growth (None where that is unknown)."""
    peak = peak_rss_bytes()
    return None if peak is None or resident is None else max(0, peak - resident)


def first_touch_cpu_s_per_byte(sample_bytes: int = FIRST_TOUCH_SAMPLE_BYTES,
                               samples: int = FIRST_TOUCH_SAMPLES) -> float:
    """CPU seconds this process spends on each byte it maps for the first time: writing a fresh anonymous mapping
    of ``sample_bytes`` (each page a minor fault the kernel zero-fills) beyond writing it again, per byte, on the
    calling thread's clock (torch's idle threads may spin meanwhile); the median of ``samples`` mappings
    (docs/pipeline.md, "A new stage's first round").

    A mapping of its own, not a step of the stage: the process keeps the memory it freed (:mod:`ecofl.allocator`),
    so a step after other work (a calibrating device computes its stage's input first) maps little or nothing
    anew, and its first call's extra CPU over so few bytes read 0.94 ms of CPU a MiB in one calibration of the
    Nanos and 14.8 in the next (2026-12-03 22:21 and 2026-12-04 02:17, ecofl-3stage); the replayed round after a kill
    then took 1.2 s longer than the rounds after it, predicted 22.5 s longer. The median, because a process's
    first mapping now and then costs far more than its next ones: on the 2-core test host (2026-12-04) the first
    read 1.5-16 ms of CPU a MiB in 11 of 45 processes, the others' first and every later one 0.7-1.3."""
    data = b"\x01" * sample_bytes  # made before the clock starts: its own pages are not the sample's
    per_byte = []
    for _ in range(samples):
        with mmap.mmap(-1, sample_bytes) as mapping:
            started = time.thread_time()
            mapping.write(data)
            cold = time.thread_time() - started
            mapping.seek(0)
            started = time.thread_time()
            mapping.write(data)
            warm = time.thread_time() - started
        per_byte.append(max(cold - warm, 0.0) / sample_bytes)
    return statistics.median(per_byte)
