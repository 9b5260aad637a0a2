"""The heartbeat channel: one authenticated connection per device, served on threads of their own.

A device's :class:`HeartbeatSender` connects to the portal's
:class:`HeartbeatMonitor`, proves the home's secret for a heartbeat channel
(the same mutual HMAC challenge-response as the control channel, :mod:`.auth`,
then sealed), then sends
:class:`Beat` every ``period_s`` and answers a :class:`Probe` with
:class:`Alive` (typed messages, :mod:`.schema`), whatever the device's main thread is computing.
The monitor's :class:`~.door.Door` admits the channels (a stranger at the
port costs the monitor nothing); the monitor's thread reads every admitted
channel, feeds :class:`.liveness.Liveness`
(a device is watched from the moment its channel is up: joining has its own
timeout),
probes silent devices and records failures (:class:`.liveness.Failure`), which
the portal polls while it waits for a sync-round. Only small JSON headers
travel here (no arrays, nothing unpickled).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable

from ecofl.net.auth import Admitted
from ecofl.net.dial import dial
from ecofl.net.door import Door
from ecofl.net.errors import ChannelClosed
from ecofl.net.liveness import Failure, Liveness, LivenessSettings
from ecofl.net.sealed import SealedSocket
from ecofl.net.schema import MessageSet, encode, message
from ecofl.net.wire import recv_message, send_message


@message("beat")
class Beat:
    """A device is alive (sent every period)."""


@message("probe")
class Probe:
    """The monitor asks a silent device whether it is alive."""


@message("alive")
class Alive:
    """A device's answer to a probe."""


FROM_DEVICE = MessageSet(Beat, Alive)
TO_DEVICE = MessageSet(Probe)


HEARTBEAT = "heartbeat"  # the purpose a heartbeat channel's handshake proves


class HeartbeatMonitor:
    """The portal's end: accepts the devices' heartbeat channels and watches them (a context manager).

    ``on_failure(device)`` is called (on the monitor's thread, once a failure) the moment a device is declared
    failed: a wait on that device elsewhere (a reply it was half-way through sending when it froze) can end
    then, not at its own deadline.
    """

    def __init__(self, secret: bytes, devices: list[int], settings: LivenessSettings, host: str = "127.0.0.1",
                 on_failure: Callable[[int], None] = lambda device: None):
        self.secret, self.settings, self.on_failure = secret, settings, on_failure
        self._announced: dict[int, Failure] = {}
        self.expected = set(devices)
        self.liveness = Liveness([], settings, time.monotonic())  # a device is watched once its channel is up
        self._selector = selectors.DefaultSelector()
        self._channels: dict[int, SealedSocket] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="heartbeat-monitor", daemon=True)
        self._door: Door | None = None
        self._host = host

    @property
    def address(self) -> tuple[str, int]:
        return self._door.address

    def __enter__(self) -> "HeartbeatMonitor":
        self._thread.start()
        self._door = Door(self._host, 0, self.secret, lambda purpose: purpose == HEARTBEAT, self._welcome,
                          name="heartbeat")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def watch(self, device: int) -> None:
        """Expect ``device`` too (a device that joins later); it is watched once its channel is up."""
        with self._lock:
            self.expected.add(device)

    def forget(self, device: int) -> None:
        """Stop watching ``device`` (it left the pipeline on purpose)."""
        with self._lock:
            self.expected.discard(device)
            self.liveness.last_seen.pop(device, None)
            self.liveness.probed_at.pop(device, None)
            sock = self._channels.pop(device, None)
        if sock is not None:
            self._drop(sock)

    def failures(self) -> dict[int, Failure]:
        with self._lock:
            return dict(self.liveness.failures)

    def connected(self) -> set[int]:
        with self._lock:
            return set(self._channels)

    def close(self) -> None:
        if self._door is not None:
            self._door.close()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        for sock in list(self._channels.values()):
            sock.close()
        self._channels.clear()
        self._selector.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                wait = max(0.0, min(self.liveness.next_deadline(now) - now, self.settings.period_s))
            for key, _ in self._selector.select(timeout=wait):
                self._read(key.fileobj, key.data)
            now = time.monotonic()
            with self._lock:
                for device in self.liveness.to_probe(now):
                    sock = self._channels.get(device)
                    if sock is not None:
                        try:
                            send_message(sock, encode(Probe()))
                        except OSError:
                            self.liveness.closed(device, now)
                self.liveness.check(now)
                new = {d: f for d, f in self.liveness.failures.items() if self._announced.get(d) is not f}
                self._announced.update(new)
            for device in new:
                self.on_failure(device)

    def _welcome(self, admitted: Admitted) -> None:
        """A device's channel is up (on the door's handshake thread): watch it from now on."""
        channel, device = admitted.channel, admitted.device
        with self._lock:
            if device not in self.expected or device in self._channels or self._stop.is_set():
                channel.close()
                return
            channel.settimeout(1.0)
            self._channels[device] = channel
            self.liveness.last_seen[device] = time.monotonic()
            self._selector.register(channel, selectors.EVENT_READ, device)  # the monitor's wait sees it at once

    def _read(self, sock: SealedSocket, device: int) -> None:
        try:
            header, _ = recv_message(sock)
            FROM_DEVICE.decode(header)  # a beat or an answer to a probe: the device is alive
        except (ChannelClosed, ValueError, OSError):
            with self._lock:
                self.liveness.closed(device, time.monotonic())
                self._channels.pop(device, None)
            self._drop(sock)
            return
        with self._lock:
            self.liveness.heard(device, time.monotonic())

    def _drop(self, sock: SealedSocket) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()


class HeartbeatSender:
    """A device's end: beats every ``period_s`` and answers probes, on a daemon thread."""

    def __init__(self, address: tuple[str, int], secret: bytes, device: int, period_s: float):
        self.device, self.period_s = device, period_s
        self._sock = dial(address, secret, device, HEARTBEAT)
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            next_beat = time.monotonic()
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_beat:
                        self._send(Beat())
                        next_beat += self.period_s
                    if selector.select(timeout=max(0.0, next_beat - time.monotonic())):
                        header, _ = recv_message(self._sock)
                        TO_DEVICE.decode(header)  # the monitor's only message: a probe
                        self._send(Alive())
                except (ChannelClosed, ValueError, OSError):
                    return  # the portal is gone; the control channel notices too

    def _send(self, beat: Beat | Alive) -> None:
        with self._send_lock:
            send_message(self._sock, encode(beat))

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread from its wait at once
        except OSError:
            pass
        self._thread.join(timeout=2 * self.period_s + 1.0)
        self._sock.close()
