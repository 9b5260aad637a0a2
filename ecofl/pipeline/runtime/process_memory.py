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
round").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

_STATUS = Path("/proc/self/status")


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


def first_touch_cpu_s_per_byte(step: Callable[[], object]) -> float | None:
    """Run ``step`` for the first time and once more: the first one's CPU beyond the second's, per byte the first
    mapped anew (the stage's memory, kept for reuse after it; docs/pipeline.md, "A new stage's first round").
    None where it mapped nothing, or where the resident set cannot be read."""
    resident, cpu = resident_from_now(), time.process_time()
    step()
    cold, touched = time.process_time() - cpu, mapped_since(resident)
    cpu = time.process_time()
    step()
    warm = time.process_time() - cpu
    return max(cold - warm, 0.0) / touched if touched else None
