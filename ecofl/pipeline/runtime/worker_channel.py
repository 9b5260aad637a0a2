"""A worker's control channel to the portal: its replies, and the portal's abort, noticed while a request
waits (:mod:`.worker_requests`)."""

from __future__ import annotations

import selectors
import threading

import numpy as np

from ecofl.net.links import RoundAborted
from ecofl.net.schema import encode
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.runtime.control_messages import REQUESTS, Abort, Interrupted, Reply


class WorkerChannel:
    """The sealed control channel one worker serves the portal on."""

    def __init__(self, sock: SealedSocket):
        self.sock = sock
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._sending = threading.Lock()  # a message at a time: the global copy's pieces go from a thread

    def reply(self, reply: Reply, arrays: dict[str, np.ndarray] | None = None) -> None:
        with self._sending:
            send_message(self.sock, encode(reply), arrays)

    def interrupted(self, error: BaseException, holdings: dict[int, list[int]]) -> None:
        """Answer that the current request cannot finish: why, the abort's token, what I hold committed."""
        token = error.args[0] if isinstance(error, RoundAborted) and error.args else None
        self.reply(Interrupted(f"{type(error).__name__}: {error}", token,
                               {str(version): layers for version, layers in holdings.items()}))

    def abort_check(self) -> None:
        """Raise :class:`RoundAborted` if the portal sent :class:`Abort` (checked while a request waits)."""
        if self.sock.pending() or self._selector.select(timeout=0):
            header, _ = recv_message(self.sock)
            request = REQUESTS.decode(header)
            if not isinstance(request, Abort):
                raise ValueError(f"unexpected {request.TYPE!r} during a sync-round")
            raise RoundAborted(request.token)

    def close(self) -> None:
        self._selector.close()
