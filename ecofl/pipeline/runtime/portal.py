"""The portal's view of a home pipeline: start the devices, train, survive their failures, stop them.

:class:`HomePipeline` is what the Flower client calls (Eco-FL §3: the portal
node holds the home's data and drives the pipeline across the home's
devices). It admits one worker per device of the plan (started here, or
joining from real devices) on an authenticated, sealed control channel, tells every worker
the pipeline epoch's ranks and data ports (the workers link to each other
themselves, :mod:`ecofl.net.mesh`), validates the schedule, and for each sync-round
feeds the inputs to the first stage and the labels to the last; no other
device sees data.

Without fault tolerance a failure anywhere (a worker that dies or raises, a
device that never joins, a peer without the home's secret, an emulated
out-of-memory) becomes a :class:`~ecofl.pipeline.runtime.errors.HomePipelineError`
within ``timeout_s``, after every worker has been stopped
(:mod:`.failures` names the root cause). With a
:class:`~ecofl.pipeline.runtime.faults.FaultTolerance` the devices beat on
a heartbeat channel, stages are replicated to their backups, and a lost or
slow device makes the pipeline re-plan and continue (:mod:`.recovery`).
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ecofl.devices import HomePool
from ecofl.net.auth import new_secret
from ecofl.net.heartbeat import HeartbeatMonitor
from ecofl.net.netns import HomeNetwork
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import send_message
from ecofl.pipeline.cost import simulate
from ecofl.pipeline.plan import Plan, ScheduleKind, plan_schedule
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime.admission import admit_devices
from ecofl.pipeline.runtime.errors import DevicesLost, HomePipelineError
from ecofl.pipeline.runtime.failures import root_cause
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
from ecofl.pipeline.runtime.launch import LocalDevices
from ecofl.pipeline.runtime.model_spec import ModelSpec, layer_state_keys
from ecofl.pipeline.runtime.pipelined_inference import stream_inference
from ecofl.pipeline.runtime.round_protocol import gather
from ecofl.pipeline.runtime.statistics import InferenceResult, PipelineResult
from ecofl.pipeline.runtime.sync_training import train_async, train_sync_rounds
from ecofl.pipeline.runtime.topology import PER_CALL_PROGRAMS, worker_roles
from ecofl.pipeline.schedule import validate
from ecofl.pipeline.stream import simulate_stream
from ecofl.weights import Weights, get_weights


class HomePipeline:
    """A home's devices running ``plan`` for ``model``; a context manager that owns its workers.

    ``local_devices`` are the devices whose workers this portal starts itself
    (default: all of the plan's); the others must join from their own machine
    with ``python -m ecofl.pipeline.runtime.worker`` within ``timeout_s``.
    ``emulate`` dilates time, paces links and enforces memory budgets per
    device (:mod:`ecofl.pipeline.runtime.emulation`), with the cost model's
    times when a ``profile`` is given. With a ``network``
    (:class:`~ecofl.net.netns.HomeNetwork`, entered) each worker
    runs in its device's namespace and the kernel shapes the links instead.
    ``pace_links=False`` leaves the emulated devices' link rates to the
    kernel also without a ``network`` of this pipeline's own (devices in
    namespaces someone else shaped). ``invite(address, devices)`` is called
    once the control channel listens, to ask the remote devices to join (a
    home service's daemons). ``fault_tolerance`` (needs a ``profile``) turns
    on heartbeats, replication, re-planning and replay. ``departed()`` names remote devices
    known to have left (a home service's registry), so joining fails fast. ``join_timeout_s``:
    how long the remote devices may take to join once the local ones have (default: ``timeout_s``
    in all).
    """

    def __init__(
        self,
        model: ModelSpec,
        pool: HomePool,
        plan: Plan,
        *,
        profile: ModelProfile | None = None,
        emulate: bool = True,
        secret: bytes | None = None,
        timeout_s: float = 60.0,
        host: str = "127.0.0.1",
        port: int = 0,
        local_devices: list[int] | None = None,
        network: HomeNetwork | None = None,
        fault_tolerance: FaultTolerance | None = None,
        departed: Callable[[], set[int]] | None = None,
        pace_links: bool | None = None,
        invite: Callable[[tuple[str, int], list[int]], None] | None = None,
        aggregate_every: int = 1,
        join_timeout_s: float | None = None,
    ):
        if fault_tolerance is not None and profile is None:
            raise ValueError("fault tolerance re-plans from the model's profile: pass profile=")
        self.model, self.pool, self.profile, self.timeout_s = model, pool, profile, timeout_s
        self.emulate, self.network, self.fault_tolerance = emulate, network, fault_tolerance
        self.invite = invite
        self.join_timeout_s = join_timeout_s
        self.aggregate_every = aggregate_every  # asynchronous 1F1B's weight aggregation (FTPipeHD §III-C)
        self.pace_links = network is None if pace_links is None else pace_links
        self.departed = departed
        self.secret = secret if secret is not None else new_secret()
        self.port = port
        self.host = network.portal_address if network is not None else host  # namespaces: links shaped by the kernel
        full_model, self.layers = model.build()
        if len(self.layers) != plan.num_layers:
            raise ValueError(f"the plan covers {plan.num_layers} layers, the model has {len(self.layers)}")
        self.keys = list(full_model.state_dict().keys())
        self.layer_keys = layer_state_keys(full_model, self.layers)
        self.parameter_keys = {k for k, _ in full_model.named_parameters()}
        self.weights: Weights = get_weights(full_model)
        self.use_plan(plan)
        self.local_devices = [r.device for r in self.roles] if local_devices is None else list(local_devices)
        self.devices = LocalDevices()
        self.connections: dict[int, SealedSocket] = {}
        self.data_ports: dict[int, tuple[str, int]] = {}  # device -> its worker's DataListener
        self.refused: list[str] = []  # why each peer that failed the handshake was turned away
        self.trapped: dict[int, float] = {}  # device -> when its phase-targeted trap fired (:mod:`.traps`)
        self.monitor: HeartbeatMonitor | None = None
        self.listener: socket.socket | None = None
        self._closed = False

    def use_plan(self, plan: Plan) -> None:
        """Make ``plan`` the one the workers run (a training schedule is validated first: a bad one is refused;
        an inference plan's stream program follows from each call's length)."""
        schedule = None
        if plan.schedule not in PER_CALL_PROGRAMS:
            schedule = plan_schedule(plan)
            validate(schedule, plan.num_micro_batches, [s.in_flight for s in plan.stages]
                     if plan.schedule == ScheduleKind.ONE_F_ONE_B else None)
        self.plan = plan
        self.roles = worker_roles(plan, self.pool, self.profile, self.emulate, pace_links=self.pace_links,
                                  schedule=schedule, aggregate_every=self.aggregate_every)
        self.stage_keys = [self.keys_of(stage.layers) for stage in plan.stages]

    def predicted_sync_round_s(self) -> float | None:
        """The cost model's sync-round of the current plan (None without a profile)."""
        return None if self.profile is None else simulate(self.plan, self.profile, self.pool).sync_round_s

    def keys_of(self, layers: tuple[int, int]) -> list[str]:
        """The state keys of the layers ``layers[0]`` .. ``layers[1]``."""
        return self.keys_of_layers(range(layers[0], layers[1] + 1))

    def keys_of_layers(self, layers: Iterable[int]) -> list[str]:
        return [k for layer in sorted(layers) for k in self.layer_keys[layer]]

    # -- lifetime ------------------------------------------------------------------

    def __enter__(self) -> "HomePipeline":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def worker_pids(self) -> dict[int, int]:
        """Process ids of the workers this portal started, by device."""
        return self.devices.pids

    def _start(self) -> None:
        self.listener = socket.create_server((self.host, self.port))
        ft = self.fault_tolerance
        if ft is not None:
            self.monitor = HeartbeatMonitor(self.secret, [r.device for r in self.roles], ft.heartbeat, self.host)
            self.monitor.__enter__()
        for device in self.local_devices:
            self.start_worker(device)
        if self.invite is not None:
            self.invite(self.listener.getsockname()[:2], [r.device for r in self.roles
                                                          if r.device not in self.local_devices])
        self.connections.update(admit_devices(
            self.listener, self.secret, {r.device: r.device_name for r in self.roles}, self.timeout_s,
            lambda: self._check_processes("joining the home"), self.refused, set(self.local_devices),
            self.join_timeout_s,
        ))
        world = [role.device for role in self.roles]
        self.configure_joined(world)
        for device in world:
            send_message(self.connections[device], self.epoch_message(0, device, world))
        self.gather("entered")

    def start_worker(self, device: int) -> None:
        prefix = self.network.prefix(device) if self.network is not None else None
        self.devices.start(device, self.listener.getsockname()[:2], self.secret, prefix)

    def configure_joined(self, devices: list[int]) -> None:
        """Send admitted ``devices`` their configuration; note the data port each reports when ready."""
        ft = self.fault_tolerance
        heartbeat = None
        if ft is not None and self.monitor is not None:
            heartbeat = [*self.monitor.address, ft.heartbeat.period_s]
        config = {"type": "config", "model": self.model.to_json(), "timeout_s": self.timeout_s,
                  "snapshots": ft is not None, "heartbeat": heartbeat}
        for device in devices:
            send_message(self.connections[device], config)
        for device, reply in self.gather("ready", devices=devices).items():
            host, port = reply["data"]
            self.data_ports[device] = (str(host), int(port))

    def epoch_message(self, epoch: int, device: int, world: list[int]) -> dict[str, Any]:
        """What ``device`` needs to enter ``epoch``: its role (None: idle in this plan), its rank in ``world``
        (the ranks of the epoch, the plan's devices first), and every rank's data port."""
        role = next((r for r in self.roles if r.device == device), None)
        return {"type": "epoch", "epoch": epoch, "role": role.to_json() if role is not None else None,
                "rank": world.index(device), "addresses": [list(self.data_ports[d]) for d in world]}

    def close(self) -> None:
        """Stop every worker (politely, then by force) and release the portal's sockets."""
        if self._closed:
            return
        self._closed = True
        for sock in self.connections.values():
            try:
                sock.settimeout(1.0)
                send_message(sock, {"type": "stop"})
            except OSError:
                pass
        self.devices.stop(grace_s=5.0)
        for sock in self.connections.values():
            sock.close()
        self.connections.clear()
        if self.monitor is not None:
            self.monitor.close()
        if self.listener is not None:
            self.listener.close()

    # -- training ------------------------------------------------------------------

    def train(
        self,
        weights: Weights | None,
        x: torch.Tensor,
        y: torch.Tensor,
        sync_rounds: int,
        *,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        mu: float = 0.0,
        reference: Weights | None = None,
        progress: Callable[[int, float], None] | None = None,
        inject: Sequence[Injection] = (),
    ) -> PipelineResult:
        """Train ``sync_rounds`` mini-batches of ``plan.batch_size`` samples of (x, y), in order, cycling.

        Starts from ``weights`` (state_dict order; None: the pipeline's current
        weights) with a fresh SGD optimizer; with ``mu > 0`` adds FedProx's
        mu/2 ||w - reference||^2 (reference defaults to the starting weights).
        Sync-round r uses samples (r * B + i) mod len(x), i < B, split into
        M micro-batches of consecutive samples, as
        :func:`ecofl.train.accumulate_gradients` splits a mini-batch.
        ``progress(r, seconds)`` is called after each sync-round. ``inject``
        (fault tolerance on, local workers) kills, freezes, slows or adds
        devices at the given sync-rounds.

        An asynchronous 1F1B plan (``schedule="async-1f1b"``, FTPipeHD §III-C)
        streams the same ``sync_rounds`` x M micro-batches as one pass with no
        flush: every micro-batch is its own update (its loss scaled by 1 /
        micro-batch), on the weights its forward used (weight stashing), and
        each stage averages its last S - s weight versions every
        ``aggregate_every`` x (S - s) updates. Its result has one entry per
        pass, not per sync-round. It runs without fault tolerance.
        """
        self._check_running("train", training=True)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"need as many labels as inputs, got {len(x)} and {len(y)}")
        if sync_rounds < 1:
            raise ValueError(f"sync_rounds must be at least 1, got {sync_rounds}")
        if inject and self.fault_tolerance is None:
            raise ValueError("injected events need fault tolerance on")
        asynchronous = self.plan.schedule == ScheduleKind.ASYNC_ONE_F_ONE_B
        if asynchronous and self.fault_tolerance is not None:
            raise ValueError("asynchronous 1F1B has no sync-rounds to replay: run it without fault tolerance")
        start = dict(zip(self.keys, self._checked(self.weights if weights is None else weights)))
        ref = dict(zip(self.keys, self._checked(reference))) if reference is not None else start
        optimization = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "mu": mu}
        try:  # from here on a failure leaves the workers in an unknown state: stop them all
            if asynchronous:
                return train_async(self, start, ref, x, y, sync_rounds, optimization)
            return train_sync_rounds(self, start, ref, x, y, sync_rounds, optimization, progress, inject)
        except BaseException:
            self.close()
            raise

    # -- inference ---------------------------------------------------------------------

    def infer(self, weights: Weights | None, x: torch.Tensor) -> InferenceResult:
        """Pipelined inference (PipeEdge): the logits of every sample of ``x``, streamed through an inference plan.

        ``x`` is split into micro-batches of the plan's size (the last one
        padded by repeating its last sample; the padding's outputs are
        dropped); micro-batches stream through the stages with no flush,
        back-pressured (:mod:`.stream_stage`). The weights (state_dict order;
        None: the pipeline's current ones) are loaded in every stage first.
        """
        self._check_running("infer", training=False)
        if len(x) == 0:
            raise ValueError("nothing to infer: no samples")
        self.weights = self._checked(self.weights if weights is None else weights)
        try:
            return stream_inference(self, x)
        except BaseException:
            self.close()
            raise

    def predicted_stream(self, num_micro_batches: int | None = None):
        """The stream cost model's prediction for the current inference plan (None without a profile)."""
        return None if self.profile is None else simulate_stream(self.plan, self.profile, self.pool,
                                                                 num_micro_batches)

    def _check_running(self, what: str, training: bool) -> None:
        if self._closed or not self.connections:
            raise HomePipelineError("the home pipeline is not running (use it as a context manager)")
        if (self.plan.schedule == ScheduleKind.STREAM) == training:
            kind = "an inference" if training else "a training"
            raise ValueError(f"cannot {what} with {kind} plan ('{self.plan.schedule}'); plan with "
                             f"objective={'training' if training else 'inference'!r}")

    def _checked(self, weights: Weights) -> Weights:
        """``weights`` if they match the model's state (count and shapes), else ValueError."""
        if len(weights) != len(self.keys):
            raise ValueError(f"expected {len(self.keys)} weight arrays, got {len(weights)}")
        for key, current, given in zip(self.keys, self.weights, weights):
            if np.shape(given) != np.shape(current):
                raise ValueError(f"{key}: expected shape {np.shape(current)}, got {np.shape(given)}")
        return weights

    # -- replies -------------------------------------------------------------------

    def gather(self, expected: str, with_arrays: bool = False, devices: Sequence[int] | None = None,
               ) -> dict[int, dict[str, Any]]:
        """One reply of type ``expected`` from every worker (or ``devices``); see :func:`.round_protocol.gather`."""
        return gather(self, expected, with_arrays, devices)

    def _check_processes(self, during: str) -> None:
        """A local worker that exited with an error, or a remote device whose daemon left its home
        (``departed``), is a failure even before its socket says so."""
        for device, code in self.devices.exited().items():
            if code != 0:
                raise self.failure(device, None, during)
        gone = self.departed() if self.departed is not None else set()
        if gone:
            raise DevicesLost({d: "its device left the home" for d in sorted(gone)})

    def failure(self, device: int, report: dict[str, Any] | None, during: str) -> HomePipelineError:
        """What to raise for a failure first noticed at ``device`` (``report``: its error message, if any).

        A device gone without a word is recoverable with fault tolerance
        (:class:`DevicesLost`); otherwise, and for a worker that raised, the
        root cause (:func:`.failures.root_cause`).
        """
        if self.fault_tolerance is not None and report is None:
            return DevicesLost({device: "its control channel closed or its process ended"})
        return root_cause(device, report, during, self.connections, self.devices, self.name)

    def name(self, device: int) -> str:
        return self.pool.devices[device].name
