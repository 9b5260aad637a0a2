"""Real memory of a worker process (Linux ``/proc``), measured beside the memory model's accounting.

The emulation's :class:`~ecofl.pipeline.runtime.emulation.MemoryLedger`
*accounts* for weights, gradients, optimizer state and saved activations
(Asteroid eq. 3); this module *measures* the process: its resident set now
(``VmRSS``) and its peak (``VmHWM``), which :func:`reset_peak` sets back to
the current resident set (``/proc/self/clear_refs``, value 5, Linux 4.0+),
so that a sync-round's own peak can be read. Where ``/proc`` is missing,
the figures are None. :func:`first_touched_bytes` counts the memory the
kernel mapped on its first touch: a stage's first sync-round maps its stash
(docs/pipeline.md, "A new stage's first round").
"""

from __future__ import annotations

import resource
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


def first_touched_bytes() -> int:
    """Bytes of this process (every thread) the kernel has mapped on their first touch since it started: its
    minor faults, a page each."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * resource.getpagesize()
