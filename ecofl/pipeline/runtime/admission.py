"""Admitting devices into a home: every control channel proves the home's secret before anything else.

The control port is a :class:`~ecofl.net.door.Door` (:class:`Arrivals`):
each connection's handshake runs on a thread of its own with a deadline,
and only so many at once, so a peer that says nothing, trickles, sends
garbage or does not know the secret holds up nobody: it is refused (and
its reason noted) while the devices of the plan join. An admitted device's
control channel continues sealed (:mod:`ecofl.net.sealed`) and waits among
the arrivals until :func:`admit_devices` takes it.
"""

from __future__ import annotations

import queue
import time
from typing import Callable

from ecofl.net.auth import CONTROL, Admitted
from ecofl.net.door import Door
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.errors import DeviceUnreachable, HomePipelineError


REASONS_KEPT = 20  # why peers were refused: the first reasons are kept (a flood is not kept in memory)


class Arrivals:
    """The portal's control port: the admitted devices in order of arrival, and why peers were refused."""

    def __init__(self, host: str, port: int, secret: bytes):
        self.queue: queue.Queue[tuple[int, SealedSocket]] = queue.Queue()
        self.refused: list[str] = []  # the first REASONS_KEPT reasons; the door counts them all
        self.door = Door(host, port, secret, lambda purpose: purpose == CONTROL, self._admitted, name="control",
                         on_refused=self._refused)

    @property
    def address(self) -> tuple[str, int]:
        return self.door.address

    def _admitted(self, admitted: Admitted) -> None:
        self.queue.put((admitted.device, admitted.channel))

    def _refused(self, reason: str) -> None:
        if len(self.refused) < REASONS_KEPT:
            self.refused.append(reason)

    def refusals(self) -> str:
        """The refused peers, for an error message ("" if none)."""
        if not self.door.refused:
            return ""
        more = self.door.refused - len(self.refused)
        return f"; refused: {'; '.join(self.refused)}" + (f"; and {more} more" if more > 0 else "")

    def close(self) -> None:
        """Close the port, and the channels of devices that arrived but were never taken."""
        self.door.close()
        while not self.queue.empty():
            self.queue.get()[1].close()


def admit_devices(
    arrivals: Arrivals, expected: dict[int, str], timeout_s: float,
    check: Callable[[], None] = lambda: None, local: set[int] = frozenset(), then_s: float | None = None,
) -> dict[int, SealedSocket]:
    """Take every device of ``expected`` (index -> name) from ``arrivals``, or fail by the deadline.

    The deadline is ``timeout_s``; with ``then_s``, the devices not in
    ``local`` (started elsewhere, invited) have at most ``then_s`` more once
    every ``local`` device has joined (local workers may take long to start
    on a loaded machine; a remote device that is not there by then is not
    coming).

    ``check`` runs while waiting (e.g. raising when a local worker already
    exited). A peer that fails the handshake is refused by the door, and
    admission goes on; a device that does not join in time
    is :class:`DeviceUnreachable` (naming the refused peers, which may be it
    with the wrong secret); a peer with the secret claiming a device the plan
    does not expect, or one that joined already, is a :class:`HomePipelineError`.
    On any failure the channels admitted so far are closed.
    """
    connections: dict[int, SealedSocket] = {}
    deadline = time.monotonic() + timeout_s
    bound = f"within {timeout_s:.0f} s"
    try:
        while len(connections) < len(expected):
            check()
            try:
                outcome = arrivals.queue.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(expected) - set(connections))
                    raise DeviceUnreachable(
                        f"device(s) {', '.join(f'{d} ({expected[d]})' for d in missing)} did not join the home "
                        f"{bound}{arrivals.refusals()}"
                    )
                continue
            device, channel = outcome
            if device not in expected or device in connections:
                channel.close()
                raise HomePipelineError(f"device {device} joined but is not expected by the plan (or twice)")
            connections[device] = channel
            if then_s is not None and local <= set(connections) and time.monotonic() + then_s < deadline:
                deadline, bound = time.monotonic() + then_s, f"within {then_s:.0f} s of the devices started here"
    except BaseException:
        for channel in connections.values():
            channel.close()
        raise
    return connections
