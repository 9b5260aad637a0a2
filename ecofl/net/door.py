"""The door of every port a home listens on: one accept path, whatever strangers do at it.

The home service's port, the portal's control and heartbeat ports and every
worker's data port are each served by a :class:`Door`, so that anyone on
the home network who knows no secret can cost the home nothing but a few
refused connections, however many addresses it comes from:

- one thread accepts, and reads every new connection's knock (:mod:`.knock`)
  on its porch (:mod:`.porch`): a connection holds no thread and no place
  until its first bytes prove the secret, and one that does not prove it
  within a short deadline, or sends anything else, is closed. Members never
  queue behind strangers: only a knocked peer reaches the handshake;
- each knocked peer's handshake (:func:`.auth.admit_peer`, for the purpose
  it knocked for) runs on a thread of its own, with a deadline for the whole
  handshake, within a bound of handshakes in flight (:class:`DoorLimits`:
  overall, and from one source address; when all places are taken, a
  newcomer from a less busy address takes the place of the busiest
  address's oldest handshake). Only members fill those places;
- an admitted peer is handed to the owner's ``on_admitted``, which serves it
  elsewhere (the heartbeat monitor's thread, a thread of the home service,
  the data listener's links), so no one ever holds up the thread that
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
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ecofl.net.auth import HANDSHAKE_DEADLINE_S, Admitted, admit_peer
from ecofl.net.errors import AuthenticationFailed
from ecofl.net.knock import KNOCK_DEADLINE_S, PROCESS_LEDGER, KnockLedger
from ecofl.net.porch import Porch

log = logging.getLogger(__name__)

#: How soon the accepting thread notices its listening socket closed from under it. Nothing else needs a poll:
#: :meth:`Door.close` wakes it at once, and every wake-up costs a confined device CPU out of its quota.
POLL_S = 1.0
ACCEPTS_PER_WAKE = 64  # connections accepted before the porch is read again
BACKOFF_S = (0.01, 0.25)  # first and longest pause while out of descriptors, buffers or threads
LOGGED_SOURCES = 1024  # sources remembered as already logged (then forgotten, and logged again)

_WAKE = object()  # the selector's key of the door's own wake-up socket

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
    in_flight: int = 64  # handshakes at once (of knocked peers only)
    per_source: int = 16  # handshakes at once from one source address
    knock_deadline_s: float = KNOCK_DEADLINE_S  # from accepting a connection to its whole knock
    waiting: int = 256  # connections waiting to knock (at most a quarter of the open-file limit)
    waiting_per_source: int = 64  # of them from one source address


class Door:
    """Accepts on ``(host, port)``, admits peers that prove ``secret`` for a purpose it ``serves`` (a context manager).

    ``on_admitted`` gets every admitted peer (on a handshake thread: it must
    hand the peer on quickly); ``on_refused`` the reason of every refusal.
    A peer with the secret that asks for a purpose the door does not serve
    is refused too. ``ledger`` records the knocks accepted (the process's).
    """

    def __init__(self, host: str, port: int, secret: bytes, serves: Callable[[str], bool],
                 on_admitted: Callable[[Admitted], None], *, name: str,
                 on_refused: Callable[[str], None] = lambda reason: None, limits: DoorLimits = DoorLimits(),
                 ledger: KnockLedger = PROCESS_LEDGER):
        self.secret, self.serves, self.name, self.limits = secret, serves, name, limits
        self.on_admitted, self.on_refused = on_admitted, on_refused
        self.refused = 0  # peers that did not prove the secret: a wrong or missing knock, a failed handshake
        self.turned_away = 0  # connections closed at once, beyond the bounds
        self.stopped: str | None = None  # why accepting stopped, once it has
        self._listener = socket.create_server((host, port))
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake_up, self._waker = socket.socketpair()  # close() writes a byte: the accepting thread wakes
        self._waker.setblocking(False)
        self._selector.register(self._wake_up, selectors.EVENT_READ, _WAKE)
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        places = limits.waiting if open_files == resource.RLIM_INFINITY else min(limits.waiting,
                                                                                  max(8, open_files // 4))
        self._porch = Porch(self._selector, secret, ledger, limits.knock_deadline_s, places,
                            limits.waiting_per_source, self._let_in, self._closed_on_porch)
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
        try:
            self._waker.send(b"!")
        except OSError:  # its buffer is full of earlier wake-ups: the thread is awake anyway
            pass
        self._thread.join(timeout=10 * POLL_S)
        with self._lock:
            in_flight, threads = list(self._in_flight), list(self._handshakes)
        for sock in in_flight:
            _hang_up(sock)
        for thread in threads:
            thread.join(timeout=self.limits.deadline_s)
        self._listener.close(), self._wake_up.close(), self._waker.close()

    def __enter__(self) -> "Door":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- accepting, and the porch ----------------------------------------------------------

    def _accept_loop(self) -> None:
        try:
            self._serve()
        finally:
            self._porch.clear()
            self._selector.close()

    def _serve(self) -> None:
        paused_since: float | None = None  # accepting has failed for want of a resource since (None: it works)
        resume_at: float | None = None  # the listener is out of the selector until then
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            if self._listener.fileno() < 0:
                self._stop_accepting("accepting failed: the listening socket was closed")
                return
            now = time.monotonic()
            if resume_at is not None and now >= resume_at:
                self._selector.register(self._listener, selectors.EVENT_READ)
                resume_at = None
            wake = min(POLL_S, self._porch.next_deadline() - now, resume_at - now if resume_at else POLL_S)
            for key, _ in self._selector.select(max(0.0, wake)):
                if key.data is _WAKE:  # closing
                    continue
                if key.data is not None:  # a connection on the porch (unless pushed off it meanwhile)
                    if key.fileobj in self._porch:
                        self._porch.readable(key.fileobj)
                    continue
                accepted, error = self._accept_ready()
                if accepted and paused_since is not None:
                    log.warning("%s door accepts again, after %.1f s", self.name, time.monotonic() - paused_since)
                    paused_since, backoff = None, BACKOFF_S[0]
                if error is None:
                    continue
                if error.errno not in _EXHAUSTED:
                    self._stop_accepting(f"accepting failed: {error}")
                    return
                if paused_since is None:
                    paused_since = now
                    log.warning("%s door at %s:%d pauses accepting: %s; retrying every %.2f s at most",
                                self.name, *self.address, error.strerror, BACKOFF_S[1])
                self._selector.unregister(self._listener)
                resume_at, backoff = time.monotonic() + backoff, min(BACKOFF_S[1], backoff * 2)
            self._porch.expire(time.monotonic())
        self.stopped = "closed"

    def _accept_ready(self) -> tuple[int, OSError | None]:
        """Accept the connections waiting (up to :data:`ACCEPTS_PER_WAKE`), each onto the porch: how many, and
        the error that stopped it, if any but 'none left'."""
        accepted = 0
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                if error.errno in _PASSING:
                    continue
                return accepted, error
            accepted += 1
            self._porch.arrive(sock, str(address[0]))
        return accepted, None

    def _stop_accepting(self, why: str) -> None:
        self.stopped = why
        log.error("%s door at %s:%d stops accepting: %s", self.name, *self.address, why)

    def _closed_on_porch(self, source: str, reason: str, refused: bool) -> None:
        """The porch closed a connection from ``source``: counted, told and logged as a refusal, or turned away."""
        if refused:
            self.on_refused(f"a peer from {source} {reason}")
            self._log_once(source, f"refused: {reason}")
            with self._lock:
                self.refused += 1
        else:
            self.turned_away += 1
            self._log_once(source, f"turned away: {reason}")

    def _let_in(self, sock: socket.socket, source: str, purpose: str) -> None:
        """Start a knocked peer's handshake on a thread of its own, or close it at once beyond the bounds.

        When every place is taken, a peer from an address with fewer handshakes in flight than the busiest
        takes the place of its oldest: places held one to an address (replayed knocks) never shut a member out.
        """
        if not self.serves(purpose):
            sock.close()
            self._closed_on_porch(source, f"knocked for a {purpose!r} channel at the {self.name} door", True)
            return
        with self._lock:
            mine = self._per_source.get(source, 0)
            evicted = None
            if mine < self.limits.per_source and len(self._in_flight) >= self.limits.in_flight:
                busiest = max(self._per_source, key=self._per_source.__getitem__)
                if self._per_source[busiest] > mine:
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
        thread = threading.Thread(target=self._handshake, args=(sock, source, purpose),
                                  name=f"{self.name}-handshake", daemon=True)
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

    def _handshake(self, sock: socket.socket, source: str, purpose: str) -> None:
        try:
            self._admit(sock, source, purpose)
        finally:
            self._done(sock, threading.current_thread())

    def _admit(self, sock: socket.socket, source: str, purpose: str) -> None:
        """Admit the peer on ``sock``, which knocked for ``purpose``, and hand it over, or refuse it (told,
        logged once per source, counted)."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            admitted = admit_peer(sock, self.secret, time.monotonic() + self.limits.deadline_s)
            with self._lock:
                evicted = not self._release(sock)  # its place was taken at the last moment: it is being hung up
            if evicted or admitted.purpose != purpose:
                admitted.channel.close()
                raise AuthenticationFailed("its place was taken by a peer from a less busy address" if evicted
                                           else f"a peer knocked for {purpose!r} and asked for a "
                                                f"{admitted.purpose!r} channel")
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
