"""The portal's view of a home pipeline: start the devices, train, survive their failures, stop them.

:class:`HomePipeline` is what the Flower client calls (Eco-FL §3: the portal
node holds the home's data and drives the pipeline across the home's
devices). It admits one worker per device of the plan (started here, or
joining from real devices) on an authenticated, sealed control channel, tells every worker
the pipeline epoch's ranks and data ports (the workers link to each other
themselves, :mod:`.mesh`), validates the schedule, and for each sync-round
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
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ecofl.devices import HomePool
from ecofl.pipeline.cost import plan_schedule, simulate
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime.admission import admit_devices
from ecofl.pipeline.runtime.auth import new_secret
from ecofl.pipeline.runtime.errors import DevicesLost, HomePipelineError
from ecofl.pipeline.runtime.failures import root_cause
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
from ecofl.pipeline.runtime.heartbeat import HeartbeatMonitor
from ecofl.pipeline.runtime.launch import LocalDevices
from ecofl.pipeline.runtime.model_spec import ModelSpec, layer_state_keys
from ecofl.pipeline.runtime.netns import HomeNetwork
from ecofl.pipeline.runtime.recovery import Recovery
from ecofl.pipeline.runtime.round_protocol import gather
from ecofl.pipeline.runtime.sealed import SealedSocket
from ecofl.pipeline.runtime.statistics import InferenceResult, PipelineResult, inference_result, pipeline_result
from ecofl.pipeline.runtime.topology import PER_CALL_PROGRAMS, worker_roles
from ecofl.pipeline.runtime.wire import send_message
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
    (:class:`~ecofl.pipeline.runtime.netns.HomeNetwork`, entered) each worker
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
                     if plan.schedule == "1f1b" else None)
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
        asynchronous = self.plan.schedule == "async-1f1b"
        if asynchronous and self.fault_tolerance is not None:
            raise ValueError("asynchronous 1F1B has no sync-rounds to replay: run it without fault tolerance")
        start = dict(zip(self.keys, self._checked(self.weights if weights is None else weights)))
        ref = dict(zip(self.keys, self._checked(reference))) if reference is not None else start
        optimization = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "mu": mu}
        try:  # from here on a failure leaves the workers in an unknown state: stop them all
            if asynchronous:
                return self._train_async(start, ref, x, y, sync_rounds, optimization)
            return self._train(start, ref, x, y, sync_rounds, optimization, progress, inject)
        except BaseException:
            self.close()
            raise

    def _set_up_stages(self, start_weights, ref, optimization) -> None:
        """Every stage gets its starting weights, its FedProx reference and a fresh optimizer."""
        for role in self.roles:
            keys = self.stage_keys[role.stage]
            arrays = {k: np.asarray(start_weights[k]) for k in keys}
            if optimization["mu"] > 0:
                arrays.update({f"reference/{k}": np.asarray(ref[k]) for k in keys if k in self.parameter_keys})
            header = {"type": "setup", "optimization": optimization}
            try:
                send_message(self.connections[role.device], header, arrays)
            except OSError:
                raise self.failure(role.device, None, "setting up the stages") from None
        self.gather("ok")

    def _collect_weights(self) -> Weights:
        """The trained model, stage by stage, in state_dict order."""
        for role in self.roles:
            send_message(self.connections[role.device], {"type": "collect"})
        collected: dict[str, np.ndarray] = {}
        for reply in self.gather("weights", with_arrays=True).values():
            collected.update(reply["arrays"])
        self.weights = [collected[k] for k in self.keys]
        return self.weights

    def _train_async(self, start_weights, ref, x, y, sync_rounds, optimization) -> PipelineResult:
        """Asynchronous 1F1B: the call's sync_rounds x M micro-batches as one pass (see :meth:`train`)."""
        self._set_up_stages(start_weights, ref, optimization)
        count = sync_rounds * self.plan.num_micro_batches
        origin = time.time()
        self._send_round(0, x.detach().cpu().numpy(), y.detach().cpu().numpy(), {}, count)
        replies = self.gather("done")
        elapsed = time.time() - origin
        stage_of = {role.device: role.stage for role in self.roles}
        rounds = [{d: {**reply, "stage": stage_of[d]} for d, reply in replies.items()}]
        return pipeline_result(self._collect_weights(), count * self.plan.micro_batch, len(self.plan.stages), rounds,
                               [elapsed], origin)

    def _train(self, start_weights, ref, x, y, sync_rounds, optimization, progress, inject) -> PipelineResult:
        """Sync-rounds 0 .. sync_rounds - 1, then the weights; a device lost at any moment of it (setting up, a
        round, replication, the global copy, a re-plan, collecting) is recovered from, and the rounds since the
        version restored are replayed."""
        mu = optimization["mu"]
        recovery = Recovery(self, ref if mu > 0 else {}, inject, optimization)
        recovery.global_copy = (0, {k: np.asarray(v) for k, v in start_weights.items()})  # the portal has version 0
        try:
            self._set_up_stages(start_weights, ref, optimization)
        except DevicesLost as lost:
            recovery.recover(lost, 0)
        x_np, y_np = x.detach().cpu().numpy(), y.detach().cpu().numpy()
        rounds: dict[int, dict[int, dict[str, Any]]] = {}
        round_s: dict[int, float] = {}
        epochs: dict[int, int] = {}  # sync-round -> the pipeline epoch it ran in
        origin = time.time()
        r = 0
        while True:
            try:
                if r == sync_rounds:
                    self._collect_weights()
                    break
                recovery.before_round(r)
                started = time.time()
                self._send_round(r, x_np, y_np, recovery.slowdowns, self.plan.num_micro_batches,
                                 recovery.kept_versions(r))
                recovery.after_send(r)
                replies = self.gather("done")
                stage_of = {role.device: role.stage for role in self.roles}
                rounds[r] = {d: {**reply, "stage": stage_of[d]} for d, reply in replies.items()}
                round_s[r] = time.time() - started
                epochs[r] = recovery.epoch
                r += 1
                recovery.after_round(r - 1, replies, round_s[r - 1])
                if progress is not None:
                    progress(r - 1, round_s[r - 1])
            except DevicesLost as lost:
                r = recovery.recover(lost, r)
        ordered = sorted(rounds)
        return pipeline_result(
            self.weights, self.plan.batch_size, len(self.plan.stages), [rounds[i] for i in ordered],
            [round_s[i] for i in ordered], origin, tuple(e.to_dict() for e in recovery.finish(round_s)),
            recovery.lost_rounds, tuple(epochs[i] for i in ordered),
        )

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
        state = dict(zip(self.keys, self.weights))
        try:
            for role in self.roles:
                arrays = {k: np.asarray(state[k]) for k in self.stage_keys[role.stage]}
                send_message(self.connections[role.device], {"type": "weights"}, arrays)
            self.gather("loaded")
            b = self.plan.micro_batch
            count = -(-len(x) // b)
            x_np = x.detach().cpu().numpy()
            index = np.minimum(np.arange(count * b), len(x_np) - 1)
            xb = x_np[index].reshape(count, b, *x_np.shape[1:])
            for role in self.roles:
                arrays = {"inputs": xb[:, role.lo : role.hi]} if role.stage == 0 else {}
                send_message(self.connections[role.device], {"type": "infer", "num_micro_batches": count}, arrays)
            replies = self.gather("inferred", with_arrays=True)
        except BaseException:
            self.close()
            raise
        last = len(self.plan.stages) - 1
        logits = None
        for role in self.roles:
            replies[role.device]["stage"] = role.stage
            if role.stage == last and role.samples:
                outputs = replies[role.device]["arrays"]["outputs"]  # [count, samples of mine, ...]
                if logits is None:
                    logits = np.empty((count, b, *outputs.shape[2:]), dtype=outputs.dtype)
                logits[:, role.lo : role.hi] = outputs
        logits = logits.reshape(count * b, *logits.shape[2:])[: len(x)]
        return inference_result(logits, b, count, len(self.plan.stages), replies)

    def predicted_stream(self, num_micro_batches: int | None = None):
        """The stream cost model's prediction for the current inference plan (None without a profile)."""
        return None if self.profile is None else simulate_stream(self.plan, self.profile, self.pool,
                                                                 num_micro_batches)

    def _check_running(self, what: str, training: bool) -> None:
        if self._closed or not self.connections:
            raise HomePipelineError("the home pipeline is not running (use it as a context manager)")
        if (self.plan.schedule == "stream") == training:
            kind = "an inference" if training else "a training"
            raise ValueError(f"cannot {what} with {kind} plan ({self.plan.schedule!r}); plan with "
                             f"objective={'training' if training else 'inference'!r}")

    def _send_round(self, r: int, x_np: np.ndarray, y_np: np.ndarray, slowdowns: dict[int, float],
                    m_count: int, keep: Sequence[int] = ()) -> None:
        """Sync-round r's ``m_count`` micro-batches: inputs to stage 0, labels to the last stage (an asynchronous
        pass: all of the call's micro-batches, each its own update). ``keep``: the committed versions besides r
        the workers keep copies of."""
        plan = self.plan
        micro = plan.micro_batch
        index = (r * plan.batch_size + np.arange(m_count * micro)) % len(x_np)
        xb = x_np[index].reshape(m_count, micro, *x_np.shape[1:])
        yb = y_np[index].reshape(m_count, micro)
        asynchronous = plan.schedule == "async-1f1b"
        last = len(plan.stages) - 1
        for role in self.roles:
            arrays = {}
            if role.stage == 0:
                arrays["inputs"] = xb[:, role.lo : role.hi]
            if role.stage == last:
                arrays["labels"] = yb[:, role.lo : role.hi]
            header = {"type": "round", "batch_size": micro if asynchronous else plan.batch_size, "version": r,
                      "slowdown": slowdowns.get(role.device, 1.0), "num_micro_batches": m_count, "keep": list(keep)}
            try:
                send_message(self.connections[role.device], header, arrays)
            except OSError:
                raise self.failure(role.device, None, f"sending sync-round {r}") from None

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
