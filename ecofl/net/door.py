"""The door of every port a home listens on: one accept path, whatever strangers do at it.

The home service's port, the portal's control and heartbeat ports and every
worker's data port are each served by a :class:`Door`, so that anyone on
the home network who knows no secret can cost the home nothing but a few
refused connections:

- one thread accepts, and does nothing else. A connection beyond the bound
  of handshakes in flight (:class:`DoorLimits`: overall, and from one source
  address) is closed at once, so a flood holds a bounded number of threads
  and file descriptors; when all places are taken, a newcomer from a less
  busy address takes the place of the busiest address's oldest handshake;
- each handshake (:func:`.auth.admit_peer`) runs on a thread of its own,
  with a deadline for the whole handshake: a peer that is silent, or sends a
  byte every half second, is cut off when it passes;
- an admitted peer is handed to the owner's ``on_admitted``, which serves it
  elsewhere (the heartbeat monitor's thread, a thread of the home service,
  the data listener's links), so no stranger ever holds up the thread that
  serves the admitted peers;
- running out of file descriptors (EMFILE, ENFILE), buffers or threads
  pauses accepting, logged once, with short back-offs until it can go on;
  an error it cannot survive stops it with a logged error, never silently;
- a refused peer is logged once per source address (a flood is one line),
  and counted.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ecofl.net.auth import HANDSHAKE_DEADLINE_S, Admitted, admit_peer
from ecofl.net.errors import AuthenticationFailed

log = logging.getLogger(__name__)

POLL_S = 0.1  # how soon the accepting thread notices it is to stop
BACKOFF_S = (0.01, 0.25)  # first and longest pause while out of descriptors, buffers or threads
LOGGED_SOURCES = 1024  # sources remembered as already logged (then forgotten, and logged again)

# Out of a resource: accepting pauses and goes on once some is freed.
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# The connection being accepted failed (Linux reports its network errors on accept): the next one may not.
_PASSING = {getattr(errno, name) for name in ("ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN",
                                              "ENONET", "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "EPERM")
            if hasattr(errno, name)}


@dataclass(frozen=True)
class DoorLimits:
    """How much a door gives peers that have not proved the secret yet."""

    deadline_s: float = HANDSHAKE_DEADLINE_S  # for a whole handshake
    in_flight: int = 64  # handshakes at once
    per_source: int = 16  # handshakes at once from one source address


class Door:
    """Accepts on ``(host, port)``, admits peers that prove ``secret`` for a purpose it ``serves`` (a context manager).

    ``on_admitted`` gets every admitted peer (on a handshake thread: it must
    hand the peer on quickly); ``on_refused`` the reason of every refusal.
    A peer with the secret that asks for a purpose the door does not serve
    is refused too.
    """

    def __init__(self, host: str, port: int, secret: bytes, serves: Callable[[str], bool],
                 on_admitted: Callable[[Admitted], None], *, name: str,
                 on_refused: Callable[[str], None] = lambda reason: None, limits: DoorLimits = DoorLimits()):
        self.secret, self.serves, self.name, self.limits = secret, serves, name, limits
        self.on_admitted, self.on_refused = on_admitted, on_refused
        self.refused = 0  # handshakes that failed
        self.turned_away = 0  # connections closed at once, beyond the bounds
        self.stopped: str | None = None  # why accepting stopped, once it has
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(POLL_S)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._in_flight: dict[socket.socket, str] = {}  # handshake socket -> its source address
        self._per_source: dict[str, int] = {}
        self._handshakes: set[threading.Thread] = set()
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-door", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, cut off the handshakes in flight (waiting for their threads), close the port."""
        self._stop.set()
        self._thread.join(timeout=10 * POLL_S)
        with self._lock:
            in_flight, threads = list(self._in_flight), list(self._handshakes)
        for sock in in_flight:
            _hang_up(sock)
        for thread in threads:
            thread.join(timeout=self.limits.deadline_s)
        self._listener.close()

    def __enter__(self) -> "Door":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- accepting -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        paused_at: float | None = None
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                sock, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if self._stop.is_set():
                    break
                if error.errno in _PASSING:
                    continue
                if error.errno not in _EXHAUSTED:
                    self.stopped = f"accepting failed: {error}"
                    log.error("%s door at %s:%d stops accepting: %s", self.name, *self.address, error)
                    return
                if paused_at is None:
                    paused_at = time.monotonic()
                    log.warning("%s door at %s:%d pauses accepting: %s; retrying every %.2f s at most",
                                self.name, *self.address, error.strerror, BACKOFF_S[1])
                self._stop.wait(backoff)
                backoff = min(BACKOFF_S[1], backoff * 2)
                continue
            if paused_at is not None:
                log.warning("%s door accepts again, after %.1f s", self.name, time.monotonic() - paused_at)
                paused_at, backoff = None, BACKOFF_S[0]
            self._let_in(sock, str(address[0]))
        self.stopped = "closed"

    def _let_in(self, sock: socket.socket, source: str) -> None:
        """Start ``sock``'s handshake on a thread of its own, or close it at once beyond the bounds.

        When every place is taken, a peer from an address with fewer
        handshakes in flight than the busiest address takes the place of
        that address's oldest handshake: to keep a newcomer out, a flood
        needs as many addresses of its own as there are places.
        """
        with self._lock:
            mine = self._per_source.get(source, 0)
            evicted = None
            if mine < self.limits.per_source and len(self._in_flight) >= self.limits.in_flight:
                busiest = max(self._per_source, key=self._per_source.__getitem__)
                if self._per_source[busiest] > mine + 1:
                    evicted = next(s for s, where in self._in_flight.items() if where == busiest)
                    self._release(evicted)
            crowded = mine >= self.limits.per_source or len(self._in_flight) >= self.limits.in_flight
            if not crowded:
                self._in_flight[sock] = source
                self._per_source[source] = mine + 1
        if evicted is not None:
            _hang_up(evicted)  # its handshake ends at once, refused
        if crowded:
            self.turned_away += 1
            sock.close()
            self._log_once(source, f"turned away: {self.limits.in_flight} handshakes in flight, "
                                   f"or {self.limits.per_source} from this address")
            return
        thread = threading.Thread(target=self._handshake, args=(sock, source), name=f"{self.name}-handshake",
                                  daemon=True)
        with self._lock:
            self._handshakes.add(thread)
        try:
            thread.start()
        except RuntimeError as error:  # no thread to be had: like running out of descriptors
            self._done(sock, thread)
            self.turned_away += 1
            sock.close()
            self._log_once(source, f"turned away: {error}")

    # -- one handshake -----------------------------------------------------------------

    def _handshake(self, sock: socket.socket, source: str) -> None:
        try:
            self._admit(sock, source)
        finally:
            self._done(sock, threading.current_thread())

    def _admit(self, sock: socket.socket, source: str) -> None:
        """Admit the peer on ``sock`` and hand it over, or refuse it (told, logged once per source, counted)."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            admitted = admit_peer(sock, self.secret, time.monotonic() + self.limits.deadline_s)
            with self._lock:
                evicted = not self._release(sock)  # its place was taken at the last moment: it is being hung up
            if evicted or not self.serves(admitted.purpose):
                admitted.channel.close()
                raise AuthenticationFailed("its place was taken by a peer from a less busy address" if evicted
                                           else f"a peer asked for a {admitted.purpose!r} channel at the "
                                                f"{self.name} door")
        except (AuthenticationFailed, OSError) as error:  # OSError: TCP_NODELAY on a connection already reset
            sock.close()
            self.on_refused(str(error))
            self._log_once(source, f"refused: {error}")
            with self._lock:
                self.refused += 1  # last: whoever waits for the count finds the refusal told and logged
            return
        admitted.channel.settimeout(None)
        if self._stop.is_set():
            admitted.channel.close()
            return
        try:
            self.on_admitted(admitted)
        except Exception:  # noqa: BLE001 - the owner's failure to take the peer costs this peer, not the door
            log.exception("%s door could not hand over device %d", self.name, admitted.device)
            admitted.channel.close()

    def _done(self, sock: socket.socket, thread: threading.Thread) -> None:
        with self._lock:
            self._release(sock)
            self._handshakes.discard(thread)

    def _release(self, sock: socket.socket) -> bool:
        """Free ``sock``'s place among the handshakes in flight; False if it had none (freed already, or
        evicted)."""
        source = self._in_flight.pop(sock, None)
        if source is None:
            return False
        left = self._per_source[source] - 1
        if left:
            self._per_source[source] = left
        else:
            del self._per_source[source]
        return True

    def _log_once(self, source: str, what: str) -> None:
        """Log what happened to a peer from ``source``, the first time only (a flood is one line)."""
        with self._lock:
            if source in self._logged:
                return
            if len(self._logged) >= LOGGED_SOURCES:
                self._logged.clear()
            self._logged.add(source)
        log.warning("%s door: %s %s (further peers from this address are counted, not logged)",
                    self.name, source, what)


def _hang_up(sock: socket.socket) -> None:
    """End a handshake's wait on ``sock`` at once (its thread closes it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
