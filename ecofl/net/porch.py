"""The porch of a door: connections that have not knocked yet, each a few bytes on the accepting thread.

A :class:`~ecofl.net.door.Door` puts every connection it accepts on its
porch until the connection's first :data:`~ecofl.net.knock.KNOCK_BYTES`
have arrived (:mod:`.knock`). A member sends its knock the moment it has
connected, so its knock is usually there when the door accepts, and it
leaves the porch at once. A stranger's connection waits on the porch with no
thread, no handshake place and no reply, and is closed:

- when it has not knocked within ``knock_deadline_s`` (silent, trickling);
- when what it sent is not a right knock (anything a stranger can send; a
  knock under another secret is answered ``rejected`` first);
- when the porch is full: the oldest waiting connection of the newcomer's
  address gives up its place if that address has ``waiting_per_source``
  waiting, else the oldest of all. A waiting connection has sent nothing
  (or not enough) since it was accepted, which a member never does, so
  strangers only push out strangers.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from ecofl.net.auth import Rejected
from ecofl.net.errors import AuthenticationFailed
from ecofl.net.knock import KNOCK_BYTES, KnockLedger, WrongSecret, check_knock
from ecofl.net.schema import encode
from ecofl.net.wire import send_message


@dataclass
class _Waiting:
    source: str
    deadline: float  # time.monotonic() by which its knock must be whole
    received: bytearray = field(default_factory=bytearray)


class Porch:
    """The connections a door has accepted and not heard a knock from (used on the door's thread only).

    ``on_knocked(sock, source, purpose)`` takes a connection whose knock is
    right (blocking again); ``on_closed(source, reason, refused)`` hears of
    every connection the porch closes: refused (a wrong knock, none in
    time, hung up) or pushed out (``refused`` False).
    """

    def __init__(self, selector: selectors.BaseSelector, secret: bytes, ledger: KnockLedger, deadline_s: float,
                 places: int, per_source: int, on_knocked: Callable[[socket.socket, str, str], None],
                 on_closed: Callable[[str, str, bool], None]):
        self.selector, self.secret, self.ledger = selector, secret, ledger
        self.deadline_s, self.places, self.per_source = deadline_s, places, per_source
        self.on_knocked, self.on_closed = on_knocked, on_closed
        self._waiting: OrderedDict[socket.socket, _Waiting] = OrderedDict()  # oldest first
        self._per_source: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, sock: object) -> bool:
        return sock in self._waiting

    def arrive(self, sock: socket.socket, source: str) -> None:
        """A connection just accepted: its knock read now if it is there, else it waits."""
        sock.setblocking(False)
        waiting = _Waiting(source, time.monotonic() + self.deadline_s)
        if (outcome := self._read(sock, waiting)) is not None:
            outcome()
            return
        if self._per_source.get(source, 0) >= self.per_source:
            self._push_out(next(s for s, w in self._waiting.items() if w.source == source))
        elif len(self._waiting) >= self.places:
            self._push_out(next(iter(self._waiting)))
        self._waiting[sock] = waiting
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self.selector.register(sock, selectors.EVENT_READ, self)

    def readable(self, sock: socket.socket) -> None:
        """More of a waiting connection's knock (or its end) has arrived."""
        if (outcome := self._read(sock, self._waiting[sock])) is not None:
            self._leave(sock)
            outcome()

    def expire(self, now: float) -> None:
        """Close every waiting connection whose knock is late."""
        while self._waiting:
            sock, waiting = next(iter(self._waiting.items()))
            if waiting.deadline > now:
                return  # the oldest is the first to expire: all have the same deadline_s
            self._leave(sock)
            self._close(sock, waiting.source, f"did not knock within {self.deadline_s:g} s", True)

    def next_deadline(self) -> float:
        """When the oldest waiting connection's knock is late (inf: nobody waits)."""
        return next(iter(self._waiting.values())).deadline if self._waiting else float("inf")

    def clear(self) -> None:
        """Close every waiting connection (the door closes)."""
        for sock in list(self._waiting):
            self._leave(sock)
            sock.close()

    # -- one connection ----------------------------------------------------------------

    def _read(self, sock: socket.socket, waiting: _Waiting) -> Callable[[], None] | None:
        """Read what there is of ``sock``'s knock: None while more is to come, else what to do with the
        connection once it has left the porch (hand it on, or close it)."""
        try:
            chunk = sock.recv(KNOCK_BYTES - len(waiting.received))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as error:
            why = f"broke off before knocking: {error}"
            return lambda: self._close(sock, waiting.source, why, True)
        if not chunk:
            return lambda: self._close(sock, waiting.source, "hung up before knocking", True)
        waiting.received += chunk
        if len(waiting.received) < KNOCK_BYTES:
            return None
        try:
            purpose = check_knock(bytes(waiting.received), self.secret, self.ledger)
        except AuthenticationFailed as error:
            if isinstance(error, WrongSecret):  # a member set up wrong is told (a few bytes, never waited for)
                try:
                    send_message(sock, encode(Rejected()))
                except OSError:
                    pass
            why = str(error)
            return lambda: self._close(sock, waiting.source, why, True)
        return lambda: self._hand_on(sock, waiting.source, purpose)

    def _hand_on(self, sock: socket.socket, source: str, purpose: str) -> None:
        sock.setblocking(True)
        self.on_knocked(sock, source, purpose)

    def _push_out(self, sock: socket.socket) -> None:
        waiting = self._waiting[sock]
        self._leave(sock)
        self._close(sock, waiting.source, "pushed off the porch by a newer connection", False)

    def _leave(self, sock: socket.socket) -> None:
        waiting = self._waiting.pop(sock)
        left = self._per_source[waiting.source] - 1
        if left:
            self._per_source[waiting.source] = left
        else:
            del self._per_source[waiting.source]
        self.selector.unregister(sock)

    def _close(self, sock: socket.socket, source: str, reason: str, refused: bool) -> None:
        sock.close()
        self.on_closed(source, reason, refused)
