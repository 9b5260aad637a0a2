"""The portal's control plane: a home's workers, their channels, their replies and their losses.

One object owns everything the portal knows about the processes of a home
pipeline (Eco-FL §3's portal node): the listener the devices join on, the
workers it started itself (:class:`~.launch.LocalDevices`), each device's
authenticated, sealed control channel (:mod:`.admission`), the heartbeat
monitor (fault tolerance, Asteroid §3.4) and the typed control messages
(:mod:`.control_messages`). Its three services, each defined once:

- :meth:`ControlPlane.gather` waits for one reply of a type from every
  worker, watching for lost devices while it waits, and files the pieces
  of a global copy that arrive meanwhile (:mod:`.global_copy`);
- :meth:`ControlPlane.lost` names the devices known to be lost and why: a
  failed heartbeat (frozen or cut off), a local worker process that exited,
  a remote device whose daemon left its home (``departed``); a control
  channel that closes is the fourth sign, seen by the reader;
- :meth:`ControlPlane.failure` attributes a failure: recoverable with fault
  tolerance (:class:`~.errors.DevicesLost`), else its root cause
  (:mod:`.failures`).

The training and inference drivers (:mod:`.portal`) and the recovery
(:mod:`.recovery`) both sit on it. A worker whose request was interrupted by
a lost peer answers ``Interrupted`` and is waited past (the loss that caused
it is about to be found); a worker whose trap fires says ``Trapped`` first
(:mod:`.traps`), and the time is noted.
"""

from __future__ import annotations

import socket
import time
from typing import Callable, Sequence, TypeVar

import numpy as np

from ecofl.net.heartbeat import HeartbeatMonitor
from ecofl.net.liveness import LivenessSettings
from ecofl.net.netns import HomeNetwork
from ecofl.net.schema import encode
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import send_message
from ecofl.pipeline.runtime.admission import Arrivals, admit_devices
from ecofl.pipeline.runtime.control_messages import (
    Abort,
    Config,
    CopyPiece,
    Error,
    Interrupted,
    Ready,
    Reply,
    Request,
    Stop,
    Trapped,
)
from ecofl.pipeline.runtime.errors import DeviceOutOfMemory, DevicesLost, WorkerFailed, WorkerTimeout
from ecofl.pipeline.runtime.failures import root_cause
from ecofl.pipeline.runtime.global_copy import CopyAssembly
from ecofl.pipeline.runtime.confinement import Confinement
from ecofl.pipeline.runtime.launch import LocalDevices
from ecofl.pipeline.runtime.reply_wait import ChannelSelector, next_reply

R = TypeVar("R")
Arrays = dict[str, np.ndarray]


class ControlPlane:
    """The workers of one home pipeline and the portal's control channels to them.

    ``names`` maps every device of the pool to its name (for messages). ``heartbeat`` (fault tolerance) starts a
    heartbeat monitor; then a lost device is recoverable (:class:`DevicesLost`), else a failure is fatal and named
    by its root cause. ``network``: workers start in their device's namespace. ``departed()`` names remote devices
    known to have left. ``confinement``: the local workers run in cgroups of their own.
    """

    def __init__(self, names: Sequence[str], secret: bytes, timeout_s: float, *, host: str = "127.0.0.1",
                 port: int = 0, network: HomeNetwork | None = None, heartbeat: LivenessSettings | None = None,
                 departed: Callable[[], set[int]] | None = None, confinement: Confinement | None = None):
        self.names, self.secret, self.timeout_s = list(names), secret, timeout_s
        self.host, self.port, self.network, self.heartbeat, self.departed = host, port, network, heartbeat, departed
        self.devices = LocalDevices(confinement)
        self.connections: dict[int, SealedSocket] = {}
        self.data_ports: dict[int, tuple[str, int]] = {}  # device -> its worker's DataListener
        self.trapped: dict[int, float] = {}  # device -> when its phase-targeted trap fired (:mod:`.traps`)
        self.copy_pieces = CopyAssembly.refusing()  # where the pieces of the global copy under way go
        self.monitor: HeartbeatMonitor | None = None
        self.arrivals: Arrivals | None = None  # the control port
        self._members: set[int] = set()  # devices started or expected, not yet removed
        self._closed = False

    @property
    def recoverable(self) -> bool:
        """Whether a lost device is recoverable (fault tolerance on)."""
        return self.heartbeat is not None

    @property
    def refused(self) -> list[str]:
        """Why peers that failed the handshake at the control port were refused (the first few)."""
        return self.arrivals.refused if self.arrivals is not None else []

    @property
    def address(self) -> tuple[str, int]:
        """Where devices join: the control port's host and port."""
        return self.arrivals.address

    def name(self, device: int) -> str:
        return self.names[device]

    # -- lifetime ------------------------------------------------------------------------

    def open(self, watched: Sequence[int]) -> None:
        """Listen for devices; with heartbeats, watch ``watched``."""
        self.arrivals = Arrivals(self.host, self.port, self.secret)
        if self.heartbeat is not None:
            self.monitor = HeartbeatMonitor(self.secret, list(watched), self.heartbeat, self.host,
                                            on_failure=lambda device: hang_up(self.connections.get(device)))
            self.monitor.__enter__()

    def start_worker(self, device: int) -> None:
        """Start ``device``'s worker process here (in its namespace, with a network)."""
        namespace = self.network.namespace(device) if self.network is not None else None
        self._members.add(device)
        self.devices.start(device, self.address, self.secret, namespace)

    def admit(self, devices: Sequence[int], local: set[int] = frozenset(), then_s: float | None = None) -> None:
        """Accept and authenticate ``devices`` (:func:`.admission.admit_devices`), watching for lost ones."""
        self._members.update(devices)
        self.connections.update(admit_devices(
            self.arrivals, {d: self.name(d) for d in devices}, self.timeout_s,
            lambda: self.check_lost("joining the home"), local, then_s,
        ))

    def join(self, device: int) -> None:
        """A device joins a running pipeline: watched, started here, admitted."""
        if self.monitor is not None:
            self.monitor.watch(device)
        self.start_worker(device)
        self.admit([device])

    def configure(self, devices: Sequence[int], config_of: Callable[[int], Config]) -> None:
        """Send admitted ``devices`` their configuration; note the data port each reports when ready."""
        for device in devices:
            self.send(device, config_of(device))
        for device, ready in self.gather(Ready, devices).items():
            host, port = ready.data
            self.data_ports[device] = (host, port)
            confinement = self.devices.confinement
            if confinement is not None and device in confinement.groups:
                try:
                    confinement.throttle(device)
                except OSError as error:  # the kernel could not bring its usage under the limit
                    raise DeviceOutOfMemory(f"device {device} ({self.name(device)}) is out of memory already with "
                                            f"its model built: {error.strerror or error}") from None

    def remove(self, device: int) -> None:
        """A lost device leaves: its process killed (if started here), its channel closed, no longer watched."""
        self._members.discard(device)
        self.devices.kill(device)
        channel = self.connections.pop(device, None)
        if channel is not None:
            channel.close()
        if self.monitor is not None:
            self.monitor.forget(device)

    def close(self) -> None:
        """Stop every worker (politely, then by force) and release the sockets; a second Ctrl-C on the way
        cuts the politeness short, never the clean-up."""
        if self._closed:
            return
        self._closed = True
        try:
            for sock in self.connections.values():
                try:
                    sock.settimeout(1.0)
                    send_message(sock, encode(Stop()))
                except OSError:
                    pass
        finally:
            try:
                self.devices.stop(grace_s=5.0)
            finally:
                for sock in self.connections.values():
                    sock.close()
                self.connections.clear()
                if self.monitor is not None:
                    self.monitor.close()
                if self.arrivals is not None:
                    self.arrivals.close()

    @property
    def running(self) -> bool:
        return not self._closed and bool(self.connections)

    # -- messages --------------------------------------------------------------------------

    def send(self, device: int, request: Request, arrays: Arrays | None = None) -> None:
        """Send ``request`` (with ``arrays``) to ``device``; a channel that fails is that device's failure."""
        try:
            send_message(self.connections[device], encode(request), arrays)
        except OSError:
            raise self.failure(device, None, f"sending {request.TYPE!r}") from None

    def gather(self, expected: type[R], devices: Sequence[int] | None = None) -> dict[int, R]:
        """One reply of type ``expected`` from every worker (or from ``devices``)."""
        return {d: reply for d, (reply, _) in self.gather_with_arrays(expected, devices).items()}

    def gather_with_arrays(self, expected: type[R], devices: Sequence[int] | None = None
                           ) -> dict[int, tuple[R, Arrays]]:
        """:meth:`gather`, with the arrays each reply carried."""
        during = f"waiting for {expected.TYPE!r}"
        replies: dict[int, tuple[R, Arrays]] = {}
        interrupted: dict[int, str] = {}  # device -> why its request stopped (a peer was lost)
        deadline = time.monotonic() + self.timeout_s
        with ChannelSelector(self.connections, set(self.connections if devices is None else devices)) as channels:
            while channels.waiting or interrupted:  # an interrupted device waits for the lost one to be named
                self.check_lost(during)
                if time.monotonic() > deadline:
                    late = ", ".join(f"{d} ({self.name(d)})" for d in sorted(channels.waiting))
                    why = "".join(f"; device {d} stopped: {reason}" for d, reason in sorted(interrupted.items()))
                    raise WorkerTimeout(f"device(s) {late or 'none'} did not answer {expected.TYPE!r} within "
                                        f"{self.timeout_s:.0f} s{why}")
                for device in channels.ready():
                    reply, arrays = self._next_reply(device, deadline) or (None, {})
                    if isinstance(reply, (Trapped, CopyPiece)):
                        continue
                    if reply is None or isinstance(reply, Error):
                        raise self.failure(device, reply, during)
                    channels.done(device)
                    if isinstance(reply, Interrupted):
                        interrupted[device] = reply.reason
                    elif isinstance(reply, expected):
                        replies[device] = (reply, arrays)
                    else:
                        raise WorkerFailed(f"device {device} answered {reply.TYPE!r}, expected {expected.TYPE!r}")
        return replies

    def interrupt(self, devices: Sequence[int], token: int) -> tuple[dict[int, Interrupted], set[int]]:
        """Send :class:`Abort` (``token``) to ``devices`` and wait until each answers it: their
        :class:`Interrupted` replies (with their holdings), and the devices that cannot answer (a closed
        channel, a lost device, no answer within the timeout). Replies to requests from before the abort are
        passed over."""
        unreachable: set[int] = set()
        for device in devices:
            try:
                send_message(self.connections[device], encode(Abort(token)))
            except OSError:
                unreachable.add(device)
        replies: dict[int, Interrupted] = {}
        deadline = time.monotonic() + self.timeout_s
        with ChannelSelector(self.connections, set(devices) - unreachable) as channels:
            while channels.waiting:
                for device in (set(self.lost()) | (channels.waiting if time.monotonic() > deadline else set())
                               ) & channels.waiting:
                    channels.done(device)
                    unreachable.add(device)
                for device in channels.ready():
                    reply = (self._next_reply(device, deadline) or (None, {}))[0]
                    if reply is None or isinstance(reply, Error):
                        unreachable.add(device)
                    elif isinstance(reply, Interrupted) and reply.token == token:
                        replies[device] = reply
                    else:
                        continue  # a trap's notice, a copy's piece, an answer to a request from before the abort
                    channels.done(device)
        return replies, unreachable

    def _next_reply(self, device: int, deadline: float) -> tuple[Reply, Arrays] | None:
        """The next reply on ``device``'s channel, after noting a trap's notice and filing a copy's piece."""
        received = next_reply(self.connections[device], deadline, f"device {device} ({self.name(device)})")
        if received is not None and isinstance(received[0], Trapped):
            self.trapped[device] = received[0].time
        elif received is not None and isinstance(received[0], CopyPiece):  # unasked: the sender's failure
            self.copy_pieces.add(device, *received)
        return received

    # -- losses and failures -------------------------------------------------------------

    def lost(self) -> dict[int, str]:
        """The devices of the home known to be lost, and why: failed heartbeats (of an admitted device: one
        still joining may not beat yet), a local worker process that exited with an error, a remote device
        that left its home."""
        lost: dict[int, str] = {}
        if self.monitor is not None:
            lost.update({d: f.reason for d, f in self.monitor.failures().items() if d in self.connections})
        for device, code in self.devices.exited().items():
            if code != 0 and device in self._members:
                if self.devices.out_of_memory(device):  # told apart from a kill or a crash, whoever saw it first
                    lost[device] = "out of memory: the kernel killed its worker at its cgroup's limit"
                else:
                    lost.setdefault(device, f"its process exited with code {code}")
        for device in self.departed() if self.departed is not None else ():
            if device in self._members:
                lost.setdefault(device, "its device left the home")
        return lost

    def check_lost(self, during: str) -> None:
        """Raise if a device is known to be lost (:meth:`lost`): :class:`DevicesLost` with fault tolerance,
        or for a device that left its home; else the root cause of a worker that exited."""
        lost = self.lost()
        if not lost:
            return
        exited = sorted(d for d, code in self.devices.exited().items() if code != 0 and d in lost)
        if exited and not self.recoverable:
            raise self.failure(exited[0], None, during)
        raise DevicesLost(lost)

    def failure(self, device: int, report: Error | None, during: str) -> Exception:
        """What to raise for a failure first noticed at ``device`` (``report``: its error message, if any).

        A device gone without a word is recoverable with fault tolerance
        (:class:`DevicesLost`); otherwise, and for a worker that raised, the
        root cause (:func:`.failures.root_cause`).
        """
        if self.recoverable and report is None:  # the heartbeats' verdict, where they hung up on it first
            return DevicesLost({device: self.lost().get(device, "its control channel closed or its process ended")})
        return root_cause(device, report, during, self.connections, self.devices, self.name)


def hang_up(channel: SealedSocket | None) -> None:
    """Shut the control channel of a device the heartbeats declared failed (on the monitor's thread): a read of a
    reply it froze half-way through sending ends now, and the wait finds the device lost, not at its deadline."""
    if channel is not None:
        try:
            channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile
