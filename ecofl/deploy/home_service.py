"""The home service: a long-lived process on the portal machine, beside the Flower SuperNode.

It keeps the registry of the devices joined right now (each a
:mod:`.device_daemon` on an authenticated connection, with the profile it
sent and a heartbeat), and trains for the home's ClientApp, which reaches it
over an authenticated local connection: each request plans the model on the
portal plus the devices present as the CLI does
(:func:`ecofl.pipeline.runtime.prediction.plan_as_run`: where the devices
compute for real, the micro-batch and the devices predicted fastest, a
device that would slow the home left idle, PipeEdge §III-B), asks the
devices the plan uses to join a pipeline session, runs
:func:`ecofl.pipeline.runtime.round_training.train_round` with fault
tolerance (a device lost mid-round is recovered from, Asteroid §3.4) and
answers with the trained weights and the measured against the predicted
sync-round time.

Everyone proves the home's secret first (the mutual HMAC challenge of
:mod:`ecofl.net.auth`, at the service's :class:`~ecofl.net.door.Door`),
for a :data:`DAEMON` or a :data:`CLIENT` channel, and the connection
continues sealed (:mod:`ecofl.net.sealed`) on a thread of its own; nothing
else is read from a peer that has not, and nothing is unpickled. The portal is device 0
of the pool (it holds the data and computes a stage like any device, in a
warm worker process of the service's own, :mod:`.warm_workers`); daemons are
1, 2, ... in joining order.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import asdict
from functools import lru_cache

import numpy as np
import torch

from ecofl.cgroups import DeviceCgroup, DeviceLimits, find_hierarchy
from ecofl.deploy.device_profile import device_spec, first_touch_seconds_per_byte, workload_seconds
from ecofl.deploy.registry import Member, Registry
from ecofl.deploy.service_messages import (
    CLIENT,
    DAEMON,
    FROM_CLIENT,
    FROM_DAEMON,
    Bye,
    DaemonBeat,
    HomeStatus,
    NameTaken,
    Register,
    Registered,
    ServiceError,
    Session,
    StatusRequest,
    Train,
    Trained,
)
from ecofl.deploy.warm_workers import WarmWorkers
from ecofl.devices import DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.net.auth import Admitted
from ecofl.net.door import Door
from ecofl.net.liveness import LivenessSettings
from ecofl.net.errors import ChannelClosed
from ecofl.net.sealed import SealedSocket
from ecofl.net.schema import MalformedMessage, encode
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners import make_plan
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model
from ecofl.pipeline.runtime.confinement import STARTUP_ALLOWANCE_BYTES
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.errors import DevicesLost, HomePipelineError
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.model_spec import ZooModel, spec_from_json
from ecofl.pipeline.runtime.portal import HomePipeline
from ecofl.pipeline.runtime.prediction import plan_as_run
from ecofl.pipeline.runtime.round_training import train_round
from ecofl.train import TrainConfig

log = logging.getLogger(__name__)

SETUP_ATTEMPTS = 3  # a round is planned again on the devices present when they changed while it started
CLOSE_GRACE_S = 5.0  # closing waits this long in all for the connection threads


@lru_cache(maxsize=8)
def _profile(model: str, shape: tuple[int, ...], classes: int, granularity: str) -> ModelProfile:
    return profile_zoo_model(model, shape, classes, granularity)


def plan_round(planner: str, profile: ModelProfile, pool: HomePool, size: int, emulation: Emulation,
               every_device: bool) -> Plan:
    """A round's plan on the portal plus the devices present: the planner's own on every device
    (``every_device``), else as the CLI plans (:func:`~ecofl.pipeline.runtime.prediction.plan_as_run`); the
    devices it leaves idle are logged."""
    plan = make_plan(planner, profile, pool, size) if every_device else plan_as_run(planner, profile, pool, size,
                                                                                    emulation)
    used = {d for stage in plan.stages for d in stage.devices}
    idle = [spec.name for d, spec in enumerate(pool.devices) if d not in used]
    if idle:
        log.info("planned on %s; idle (predicted faster without them): %s",
                 ", ".join(pool.devices[d].name for d in sorted(used)), ", ".join(idle))
    return plan


class HomeService:
    """The registry of a home's devices and its trainer; a context manager that owns its threads and sockets.

    ``emulate``: ``none`` (``ecofl home serve``'s default) for devices that are the home's own machines, planned
    and predicted at the speeds they measured (:attr:`Emulation.REAL`); ``sleep`` (the default here, for tests
    and demos) for daemons that claim presets and sleep to the cost model; ``cgroup`` for confined ones.
    ``every_device`` plans every round on every device present, none left idle."""

    def __init__(self, secret: bytes, name: str = "home", host: str = "127.0.0.1", port: int = 0,
                 portal: DeviceSpec | None = None, emulate: str = Emulation.SLEEP, planner: str = "ecofl",
                 timeout_s: float = 120.0, beat_timeout_s: float = 5.0, pace_links: bool = True,
                 heartbeat: LivenessSettings | None = None, every_device: bool = False):
        self.secret, self.name, self.host, self.port = secret, name, host, port
        # Unemulated, a home's devices are its own machines, predicted at their speeds (not this machine's)
        mode = Emulation.parse(emulate)
        self.emulate = Emulation.REAL if mode == Emulation.NONE else mode
        self.every_device = every_device  # plan on every device present (the planner's own plan), none left idle
        self.planner, self.timeout_s = planner, timeout_s
        self.pace_links = pace_links  # False: the devices' links are shaped by the kernel (namespaces + tc)
        self.heartbeat = heartbeat or LivenessSettings()  # how long a pipeline worker may stay silent
        self.registry = Registry(beat_timeout_s)  # who is joined; a daemon silent for beat_timeout_s is left out
        self.reference_workload_s = workload_seconds()  # this machine profiles the models
        self.portal = portal or DeviceSpec("portal", 1.0, 4 << 30, 100e6 / 8,  # this machine, as measured
                                           first_touch_s_per_byte=first_touch_seconds_per_byte())
        self.rounds = 0
        self._planned: list[str] = []  # the devices the last pipeline opened was planned on
        self.sessions = 0  # pipeline sessions the devices were asked to join
        self.sync_rounds = 0  # sync-rounds completed, over every round trained
        self.round_log: list[dict] = []  # per trained task: devices (joined, planned), measured and predicted
        self._lock = threading.Lock()
        self._train_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._channels: set[SealedSocket] = set()  # admitted connections (devices and clients), open now
        self.door: Door | None = None
        # The portal's own stage (device 0), warm between rounds; confined (cgroup mode) to the portal's cores and
        # its budget plus room for the runtimes of a busy and a spare worker. The daemons confine themselves.
        self.portal_cgroup: DeviceCgroup | None = None  # created on entering, removed on closing
        self.hierarchy = None
        if self.emulate == Emulation.CGROUP:
            self.hierarchy = find_hierarchy()
            if isinstance(self.hierarchy, str):
                raise UserError(f"cannot confine the portal device: {self.hierarchy}")
        self.portal_workers = WarmWorkers(secret)

    # -- lifetime ------------------------------------------------------------------

    def __enter__(self) -> "HomeService":
        if self.hierarchy is not None:
            self.portal_cgroup = self.hierarchy.create("portal", DeviceLimits(
                self.portal.speed, self.portal.memory_bytes + STARTUP_ALLOWANCE_BYTES))
            self.portal_workers.prefix = self.portal_cgroup.entry_command()
        try:
            self.portal_workers.warm()
            self.door = Door(self.host, self.port, self.secret, lambda purpose: purpose in (DAEMON, CLIENT),
                             lambda admitted: self._spawn(self._serve_connection, admitted), name="home service")
        except BaseException:
            self.portal_workers.stop()
            self._remove_portal_cgroup()
            raise
        self.port = self.door.address[1]
        log.info("home service %s on %s:%d", self.name, self.host, self.port)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self.door is not None:
            self.door.close()
        for member in self.registry.everyone():
            try:
                member.send(Bye())
            except OSError:
                pass
        with self._lock:
            channels = list(self._channels)
        for channel in channels:  # wakes every thread blocked on a device's beats or a client's next request
            try:
                channel.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_GRACE_S
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.portal_workers.stop()
        self._remove_portal_cgroup()

    def _remove_portal_cgroup(self) -> None:
        if self.portal_cgroup is not None:
            self.portal_cgroup.remove()
            self.portal_cgroup = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def refused(self) -> int:
        """Peers that did not prove the secret for one of the service's channels."""
        return self.door.refused if self.door is not None else 0

    def present(self) -> list[Member]:
        """The devices joined now, in joining order (silent ones past ``beat_timeout_s`` left out)."""
        return self.registry.present()

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    # -- connections -----------------------------------------------------------------

    def _serve_connection(self, admitted: Admitted) -> None:
        """Serve an admitted daemon or client on this thread of its own, until it leaves."""
        channel = admitted.channel
        with self._lock:
            self._channels.add(channel)
        try:
            if admitted.purpose == DAEMON:
                self._serve_device(channel)
            else:
                self._serve_client(channel)
        except (ChannelClosed, OSError):
            pass
        except ValueError as error:  # a malformed message, or a registration no device can have
            log.warning("closed the channel of an admitted %s: %s", admitted.purpose, error)
        finally:
            with self._lock:
                self._channels.discard(channel)
            channel.close()

    def _serve_device(self, sock: SealedSocket) -> None:
        header, _ = recv_message(sock)
        registration = FROM_DAEMON.decode(header)
        if not isinstance(registration, Register):
            raise MalformedMessage(f"a device daemon must register first, not send {registration.TYPE!r}")
        spec = device_spec(registration, self.reference_workload_s)
        member, other = self.registry.join(spec, registration, sock)
        if member is None:
            log.warning("refused a second device named %s: one is joined and beating (id %d)", spec.name, other.id)
            send_message(sock, encode(NameTaken(spec.name)))
            return
        if other is not None:
            log.warning("device %s (id %d) was silent; its name passes to the device joining now (id %d)",
                        spec.name, other.id, member.id)
        member.send(Registered(member.id, spec.speed))
        log.info("device %s joined (id %d, speed %.3g, %.1f GiB)", spec.name, member.id, spec.speed,
                 spec.memory_bytes / 2**30)
        sock.settimeout(None)
        try:
            while not self._stop.is_set():
                header, _ = recv_message(sock)  # beats: the daemon is alive
                if not isinstance(FROM_DAEMON.decode(header), DaemonBeat):
                    raise MalformedMessage(f"a registered device daemon sends beats, not {header.get('type')!r}")
                self.registry.heard(member)
        finally:
            self.registry.leave(member)
            log.info("device %s (id %d) left", spec.name, member.id)

    def _serve_client(self, sock: SealedSocket) -> None:
        sock.settimeout(None)
        while not self._stop.is_set():
            header, arrays = recv_message(sock)
            try:
                request = FROM_CLIENT.decode(header)
                if isinstance(request, StatusRequest):
                    reply, out = self.status(), None
                else:
                    reply, out = self.train(request, arrays)
            except Exception as error:  # noqa: BLE001 - the client gets the reason, the service keeps serving
                reply, out = ServiceError(f"{type(error).__name__}: {error}"), None
            send_message(sock, encode(reply), out)

    # -- training --------------------------------------------------------------------

    def status(self) -> HomeStatus:
        return HomeStatus(self.name, self.rounds, self.sessions, self.sync_rounds, self.refused,
                          [{"id": m.id, **asdict(m.spec)} for m in self.present()], list(self.round_log))

    def train(self, request: Train, arrays: dict[str, np.ndarray]) -> tuple[Trained, dict[str, np.ndarray]]:
        """One training task: plan on the devices present, run the round, return weights and timings."""
        model = spec_from_json(request.model)
        if not isinstance(model, ZooModel):
            raise ValueError("a home service trains zoo models (ecofl.models), which it can profile")
        config = request.train
        weights = [arrays[f"w{i}"] for i in range(request.num_weights)]
        x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]).long()
        with self._train_lock:
            for attempt in range(1, SETUP_ATTEMPTS + 1):
                members = self.present()
                try:
                    trained = self._train_on(members, model, weights, x, y, config)
                    break
                except HomePipelineError as error:
                    changed = {m.id for m in self.present()} != {m.id for m in members}
                    if attempt == SETUP_ATTEMPTS or not changed:
                        raise
                    log.warning("the home's devices changed (%s); re-planning on the devices present", error)
            self.rounds += 1
            self.round_log.append({"devices": [m.spec.name for m in members], "planned": self._planned,
                                   **trained.metrics()})
        reply = Trained(len(trained.weights), float(trained.loss), trained.num_samples, trained.metrics(),
                        [m.spec.name for m in members])
        return reply, {f"w{i}": np.asarray(w) for i, w in enumerate(trained.weights)}


    def _train_on(self, members: list[Member], model: ZooModel, weights, x, y, config: TrainConfig):
        """One round on the portal plus ``members``; a device leaving mid-round is recovered from."""
        pool = HomePool(self.name, (self.portal, *(m.spec for m in members)))
        profile = _profile(model.name, tuple(model.input_shape), model.num_classes, model.granularity)

        def open_pipeline(size: int) -> HomePipeline:
            plan = plan_round(self.planner, profile, pool, size, self.emulate, self.every_device)
            used = {d for stage in plan.stages for d in stage.devices}
            self._planned = [pool.devices[d].name for d in sorted(used)]

            def departed() -> set[int]:
                return {d for d in used - {0} if not self.registry.holds(members[d - 1].id)}

            def invite(address: tuple[str, int], devices: list[int]) -> None:
                """Ask the devices to join the pipeline listening at ``address`` (it listens already)."""
                if departed():  # before inviting anyone: an invitation to a dead round ties a worker up
                    raise DevicesLost({d: "its device left the home" for d in departed()})
                for device in devices:
                    if device == 0:
                        self.portal_workers.run(Session(address, 0))
                        continue
                    try:
                        members[device - 1].send(Session(address, device))
                    except OSError:
                        raise DevicesLost({device: "its device left the home"}) from None
                self.sessions += 1

            return HomePipeline(model, pool, plan, profile=profile, emulate=self.emulate, secret=self.secret,
                                host=self.host, local_devices=[], invite=invite,
                                timeout_s=self.timeout_s,
                                fault_tolerance=FaultTolerance(planner=self.planner, heartbeat=self.heartbeat),
                                departed=departed, pace_links=self.pace_links)

        def progress(_round: int, _seconds: float) -> None:
            self.sync_rounds += 1

        return train_round(open_pipeline, weights, x, y, config, pool.name, progress)

