"""Failure detection that does not depend on compute (Asteroid §3.4, "Heartbeat-guided Failure Detection").

Every device sends a heartbeat every ``period_s`` on a thread of its own, so a
device busy computing a long stage still beats. The portal's
:class:`Liveness` keeps, per device, when it last heard from it:

- silent for ``suspect_after_s``: the device is *suspected* and gets one
  probe (the portal asks, the device's heartbeat thread answers);
- a suspected device that does not answer within ``probe_timeout_s`` is
  *failed* (a frozen process, ``SIGSTOP``, or a cut link);
- a heartbeat channel that closes is *failed* at once (a killed process,
  ``kill -9``, a crash).

So every failure is detected within ``suspect_after_s + probe_timeout_s`` of
the last sign of life, never by waiting out a round deadline, and the
failure names the device. Pure bookkeeping: the caller feeds it events and
times (``time.monotonic()``; tests drive it with a fake clock).

The home service keeps its device daemons in one too: they join and leave
while it runs, beat on their channel, and a daemon silent for
``suspect_after_s`` (:meth:`Liveness.suspected`) is left out of the next
plan until it beats again; its channel closing removes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Why a device was declared failed.
CLOSED = "channel closed"
SILENT = "no heartbeat and no answer to a probe"


@dataclass(frozen=True)
class Failure:
    """A device declared failed: why, when it was last heard of, and when it was declared."""

    device: int
    reason: str  # CLOSED or SILENT
    last_seen: float
    detected_at: float


@dataclass(frozen=True)
class LivenessSettings:
    """Heartbeat period, silence before a probe, and how long a probe may go unanswered (seconds).

    The detection bound is ``suspect_after_s + probe_timeout_s`` whatever the
    period; the default period gives two beats in a suspicion window. A beat
    is not free where it matters: at 0.2 s the heartbeat thread of a confined
    worker took 0.016-0.024 CPU-s a sync-round of 8.3-9.7 s (about 0.4 ms a
    beat; ``benchmarks/steady_runs.py``, its ``heartbeat`` job), and a device
    at a Nano's quota (0.14 of a core) pays each CPU-second with about 7 s of
    its round.
    """

    period_s: float = 0.5
    suspect_after_s: float = 1.0
    probe_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and self.suspect_after_s > self.period_s and self.probe_timeout_s > 0):
            raise ValueError(
                f"heartbeats need period > 0, suspect_after > period and probe_timeout > 0, got {self}"
            )

    @property
    def detection_bound_s(self) -> float:
        """At most this long from the last sign of life to a declared failure."""
        return self.suspect_after_s + self.probe_timeout_s


class Liveness:
    """Per-device last-seen times, probes and failures (see the module docstring)."""

    def __init__(self, devices: Iterable[int], settings: LivenessSettings, now: float):
        self.settings = settings
        self.last_seen = {d: now for d in devices}
        self.probed_at: dict[int, float] = {}
        self.failures: dict[int, Failure] = {}

    def heard(self, device: int, at: float) -> None:
        """A heartbeat or a probe answer from ``device`` at ``at``: it is alive."""
        if device in self.failures or device not in self.last_seen:
            return
        self.last_seen[device] = max(self.last_seen[device], at)
        self.probed_at.pop(device, None)

    def join(self, device: int, now: float) -> None:
        """``device`` joined after the start (or again): heard of now, with no failure on record."""
        self.last_seen[device] = now
        self.probed_at.pop(device, None)
        self.failures.pop(device, None)

    def leave(self, device: int) -> None:
        """``device`` left: forgotten."""
        self.last_seen.pop(device, None)
        self.probed_at.pop(device, None)
        self.failures.pop(device, None)

    def suspected(self, now: float) -> set[int]:
        """Devices not failed but silent for ``suspect_after_s`` (probed or not)."""
        return {d for d, seen in self.last_seen.items()
                if d not in self.failures and now - seen >= self.settings.suspect_after_s}

    def closed(self, device: int, at: float) -> None:
        """``device``'s heartbeat channel closed: it is failed now."""
        if device in self.last_seen and device not in self.failures:
            self.failures[device] = Failure(device, CLOSED, self.last_seen[device], at)

    def to_probe(self, now: float) -> list[int]:
        """Devices silent for ``suspect_after_s`` that have not been probed yet; marks them probed."""
        due = [
            d for d, seen in sorted(self.last_seen.items())
            if d not in self.failures and d not in self.probed_at and now - seen >= self.settings.suspect_after_s
        ]
        for d in due:
            self.probed_at[d] = now
        return due

    def check(self, now: float) -> list[Failure]:
        """Declare failed every probed device that has not answered within ``probe_timeout_s``; the new failures."""
        new = []
        for d, probed in sorted(self.probed_at.items()):
            if d not in self.failures and now - probed >= self.settings.probe_timeout_s:
                self.failures[d] = Failure(d, SILENT, self.last_seen[d], now)
                new.append(self.failures[d])
        for failure in new:
            self.probed_at.pop(failure.device, None)
        return new

    def alive(self) -> list[int]:
        return sorted(d for d in self.last_seen if d not in self.failures)

    def next_deadline(self, now: float) -> float:
        """The next time :meth:`to_probe` or :meth:`check` can change anything (for a waiting thread)."""
        times = [seen + self.settings.suspect_after_s for d, seen in self.last_seen.items()
                 if d not in self.failures and d not in self.probed_at]
        times += [probed + self.settings.probe_timeout_s for d, probed in self.probed_at.items()]
        return min(times, default=now + self.settings.period_s)
