"""Waiting on several workers' control channels at once (:mod:`.control_plane`): which have something to
read, and the next reply on one, parsed by the schema."""

from __future__ import annotations

import selectors
import time
from typing import Mapping

import numpy as np

from ecofl.net.errors import ChannelClosed
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import recv_message
from ecofl.pipeline.runtime.control_messages import REPLIES, Reply
from ecofl.pipeline.runtime.errors import WorkerFailed

Arrays = dict[str, np.ndarray]


class ChannelSelector:
    """The channels of the devices still to answer; a context manager (its selector is closed on exit)."""

    def __init__(self, connections: Mapping[int, SealedSocket], devices: set[int]):
        self.connections, self.waiting = connections, set(devices)
        self._selector = selectors.DefaultSelector()
        for device in self.waiting:
            self._selector.register(connections[device], selectors.EVENT_READ, device)

    def __enter__(self) -> ChannelSelector:
        return self

    def __exit__(self, *_) -> None:
        self._selector.close()

    def ready(self, timeout_s: float = 0.05) -> list[int]:
        """The waited-on devices with something to read, within ``timeout_s`` (which passes, if none is)."""
        if not self.waiting:
            time.sleep(timeout_s)
            return []
        return [key.data for key, _ in self._selector.select(timeout=timeout_s)]

    def done(self, device: int) -> None:
        """``device`` has answered (or cannot): no longer waited on."""
        if device in self.waiting:
            self._selector.unregister(self.connections[device])
            self.waiting.discard(device)


def next_reply(sock: SealedSocket, deadline: float, what: str) -> tuple[Reply, Arrays] | None:
    """The next reply on ``sock``, read before the monotonic ``deadline`` (at least a second; None: the channel
    closed). A malformed reply is the worker's failure (:class:`WorkerFailed`, naming ``what``)."""
    sock.settimeout(max(1.0, deadline - time.monotonic()))
    try:
        header, arrays = recv_message(sock)
    except (ChannelClosed, OSError):
        return None
    finally:
        sock.settimeout(None)
    try:
        return REPLIES.decode(header), arrays
    except ValueError as error:
        raise WorkerFailed(f"{what} sent a malformed reply: {error}") from None
