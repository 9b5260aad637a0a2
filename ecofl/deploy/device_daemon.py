"""The device daemon: a long-lived process on each device of a home (``ecofl device serve``).

It connects to its home service, proves the home's secret (the mutual HMAC
challenge; the service proves it back, so a daemon never serves a stranger),
describes itself (:mod:`.device_profile`: measured at first join, or an
emulated preset), beats every ``beat_s`` seconds, and hands every session the
service asks for to a warm pipeline worker (:class:`WarmWorkers`: ``python
-m ecofl.pipeline.runtime.worker --sessions``, started ahead of time with the
secret in its environment, killed with the daemon) that joins the round's
pipeline. When the service goes away the daemon reconnects with exponential
backoff; SIGTERM or Ctrl-C stops it cleanly, its workers first.

A refusal ends a daemon (exit 2) only before it has ever joined, at the
:data:`REFUSALS_BEFORE_GIVING_UP`-th: a wrong secret. A refusal is
sent before the channel is sealed, so anyone who can put bytes on the LAN
can forge one; once the daemon has joined, it is retried with the same
backoff, and the forger can keep the device out only while it keeps forging.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading

from ecofl.deploy.device_profile import describe_device
from ecofl.deploy.service_messages import TO_DAEMON, Bye, DaemonBeat, NameTaken, Registered, Session
from ecofl.deploy.service_messages import DAEMON, DAEMON_BEAT_S
from ecofl.deploy.warm_workers import WarmWorkers
from ecofl.net.dial import dial
from ecofl.net.errors import AuthenticationFailed, ChannelClosed
from ecofl.net.sealed import SealedSocket
from ecofl.net.schema import encode
from ecofl.net.wire import recv_message, send_message

log = logging.getLogger(__name__)

#: Refusals after which a daemon that has never joined its home gives up (its secret is wrong).
REFUSALS_BEFORE_GIVING_UP = 3


class NameInUse(Exception):
    """The home refused this registration: a device of this name is joined and beating."""


class DeviceDaemon:
    """One device's membership of its home, across service restarts."""

    def __init__(self, home: tuple[str, int], secret: bytes, name: str, preset: str | None = None,
                 bandwidth_mbps: float = 100.0, beat_s: float = DAEMON_BEAT_S, max_backoff_s: float = 10.0,
                 accelerator: str = "auto"):
        self.home, self.secret, self.beat_s, self.max_backoff_s = home, secret, beat_s, max_backoff_s
        self.registration = describe_device(name, preset, bandwidth_mbps, accelerator)
        self.stop = threading.Event()
        self.sessions = 0
        self.joins = 0
        self.workers = WarmWorkers(secret)
        self._sock: SealedSocket | None = None
        self._send_lock = threading.Lock()

    def run(self) -> int:
        """Serve until stopped (0), or refused by the service before ever joining it (2)."""
        backoff, refusals = 0.5, 0
        while not self.stop.is_set():
            try:
                self._serve_once()
                backoff = 0.5  # served for a while: the next loss starts the backoff again
            except AuthenticationFailed as error:
                refusals += 1
                if self.joins == 0 and refusals >= REFUSALS_BEFORE_GIVING_UP:
                    log.error("the home service refused this device: %s", error)
                    return 2
                log.warning("the home service at %s:%d refused this device (%s)%s; trying again in %.1f s",
                            *self.home, error, "; its secret changed, or a stranger answered in its place"
                            if self.joins else "", backoff)
                self.stop.wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
            except NameInUse as error:
                log.warning("%s; trying again in %.1f s (names are identities in a home: give this device "
                            "another --name if it is another device)", error, backoff)
                self.stop.wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
            except (OSError, ChannelClosed) as error:
                if self.stop.is_set():
                    break
                log.info("home service at %s:%d unreachable (%s); retrying in %.1f s", *self.home, error, backoff)
                self.stop.wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
        self.workers.stop()
        return 0

    def shutdown(self, *_: object) -> None:
        """Stop serving (a signal handler): the workers are stopped, the connection closed."""
        self.stop.set()
        self.workers.stop()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _serve_once(self) -> None:
        sock = dial(self.home, self.secret, 0, DAEMON)
        self._sock = sock
        try:
            send_message(sock, encode(self.registration))
            header, _ = recv_message(sock)
            answer = TO_DAEMON.decode(header)
            if isinstance(answer, NameTaken):
                raise NameInUse(f"the home has a device named {answer.name} joined and beating")
            if not isinstance(answer, Registered):
                raise ChannelClosed(f"unexpected answer {answer.TYPE!r}")
            self.joins += 1
            log.info("joined home %s:%d as device id %d (speed %.3g)", *self.home, answer.id, answer.speed)
            self.workers.warm()
            sock.settimeout(None)
            beats = threading.Thread(target=self._beat, args=(sock,), daemon=True)
            beats.start()
            while not self.stop.is_set():
                header, _ = recv_message(sock)
                message = TO_DAEMON.decode(header)
                if isinstance(message, Session):
                    self.workers.run(message)
                    self.sessions += 1
                elif isinstance(message, Bye):
                    raise ChannelClosed("the home service is stopping")
        finally:
            self._sock = None
            sock.close()

    def _beat(self, sock: SealedSocket) -> None:
        while not self.stop.wait(self.beat_s):
            try:
                with self._send_lock:
                    send_message(sock, encode(DaemonBeat(self.sessions)))
            except OSError:
                return



def serve(home: tuple[str, int], secret: bytes, name: str, preset: str | None, bandwidth_mbps: float,
          accelerator: str = "auto") -> int:
    """``ecofl device serve``: run a daemon until SIGTERM / Ctrl-C."""
    daemon = DeviceDaemon(home, secret, name, preset, bandwidth_mbps, accelerator=accelerator)
    signal.signal(signal.SIGTERM, daemon.shutdown)
    signal.signal(signal.SIGINT, daemon.shutdown)
    return daemon.run()
