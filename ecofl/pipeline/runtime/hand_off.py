"""Hand-offs first: a device of less than one core sends its results before it computes on.

A stage posts its output (an activation, a gradient, a stream's result) to
a link's sender thread (:class:`ecofl.net.links.PeerLink`), which seals and
writes it. A device with a core to spare computes its next pass meanwhile.
A device of less than one core (a confined one, :mod:`.cpu_pace`) has no
core to spare: the sender thread shares the quota with that pass, and each
of its wakes in a throttled cgroup may wait out a CFS period, so the
hand-off trickles out beside the pass and its receiver waits. That device
waits until its hand-offs have left (sealed and written; on an emulated
link the receiver holds them for the link's time) before its next pass:
the CPU they take comes from the same quota either way, now first.
Measured by ``benchmarks/handoff_send.py`` (docs/pipeline.md, "Hand-offs first").
"""

from __future__ import annotations

from collections.abc import Iterable

from ecofl.net.links import AbortCheck, Ticket
from ecofl.pipeline.runtime.cpu_pace import CpuPace


def hand_off_first(pace: CpuPace, tickets: Iterable[Ticket], timeout_s: float, abort: AbortCheck) -> None:
    """On a device of less than one core (``pace``), wait until each of ``tickets`` has left; else return at once."""
    if pace.cores is None or pace.cores >= 1:
        return
    for ticket in tickets:
        ticket.wait(timeout_s, abort, "a hand-off to the next or previous stage")
