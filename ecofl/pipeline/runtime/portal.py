"""The portal's view of a home pipeline: start the devices, train or infer, survive their failures, stop them.

:class:`HomePipeline` is what the Flower client calls (Eco-FL §3: the portal
node holds the home's data and drives the pipeline across the home's
devices). It admits one worker per device of the plan (started here, or
joining from real devices) on an authenticated, sealed control channel, tells every worker
the pipeline epoch's ranks and data ports (the workers link to each other
themselves, :mod:`.mesh`), validates the schedule, and for each sync-round
feeds the inputs to the first stage and the labels to the last; no other
device sees data. The processes and channels are the control plane's
(:mod:`.control_plane`), the plan and the roles the layout's
(:mod:`.layout`); this module drives them.

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

from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ecofl.accelerator import check_accelerators
from ecofl.cgroups import DeviceLimits
from ecofl.devices import HomePool
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners import check_planner
from ecofl.pipeline.profile import ModelProfile
from ecofl.net.auth import new_secret
from ecofl.pipeline.runtime.control_messages import Config, Entered
from ecofl.pipeline.runtime.confinement import Confinement
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.errors import HomePipelineError
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection, check_targets
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.model_spec import ModelSpec
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.net.netns import HomeNetwork
from ecofl.pipeline.runtime.pipelined_inference import stream_inference
from ecofl.pipeline.runtime.stage import Optimization
from ecofl.pipeline.runtime.statistics import InferenceResult, PipelineResult
from ecofl.weights import Weights, get_weights


class HomePipeline:
    """A home's devices running ``plan`` for ``model``; a context manager that owns its workers.

    ``local_devices`` are the devices whose workers this portal starts itself
    (default: all of the plan's); the others must join from their own machine
    with ``python -m ecofl.pipeline.runtime.worker`` within ``timeout_s``.
    ``emulate`` (:class:`~ecofl.pipeline.runtime.emulation.Emulation`; True
    is ``"sleep"``, False ``"none"``): ``"cgroup"`` confines each local
    worker to ``limits`` (default: its device's speed in cores and memory
    budget) and paces links; ``"sleep"`` dilates time, paces links and
    enforces memory budgets per device, with the cost model's times when a
    ``profile`` is given; ``"none"`` runs at host speed. With a ``network``
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
    in all). ``tuning`` (needs a ``profile``; synchronous schedules) re-plans on the speeds the devices
    show in the first sync-rounds of a ``train`` call, and every few after if asked (:mod:`.pipeline_tuning`).
    Re-plans predict with the runtime's overheads recorded in ``cache_dir`` (the profiles' cache; None: the
    default one).
    """

    def __init__(
        self,
        model: ModelSpec,
        pool: HomePool,
        plan: Plan,
        *,
        profile: ModelProfile | None = None,
        emulate: str = Emulation.SLEEP,
        limits: Mapping[int, DeviceLimits] | None = None,
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
        tuning: Tuning | None = None,
        cache_dir: str | None = None,
    ):
        if (fault_tolerance is not None or tuning is not None) and profile is None:
            raise ValueError("fault tolerance and tuning re-plan from the model's profile: pass profile=")
        if tuning is not None:
            check_planner(tuning.planner or plan.planner)  # a hand-made plan's re-tune needs a planner named
        self.model, self.timeout_s, self.fault_tolerance, self.tuning = model, timeout_s, fault_tolerance, tuning
        self.invite, self.join_timeout_s, self.cache_dir = invite, join_timeout_s, cache_dir
        self.emulation = Emulation.parse(emulate)
        full_model, layers = model.build()
        pace = self.emulation.paces_links and (network is None if pace_links is None else pace_links)
        self.layout = PipelineLayout(full_model, layers, pool, plan, profile,
                                     sleeps=self.emulation == Emulation.SLEEP, pace_links=pace,
                                     aggregate_every=aggregate_every)
        self.weights: Weights = get_weights(full_model)
        self.local_devices = self.layout.devices if local_devices is None else list(local_devices)
        # The devices whose workers run on this machine need its GPUs; a remote one (a daemon) has its own.
        check_accelerators([pool.devices[d] for d in self.local_devices], f"pool {pool.name}")
        confinement = None
        if self.emulation == Emulation.CGROUP:  # every device that may run here: the plan's and any that joins
            here = list(range(len(pool.devices))) if local_devices is None else self.local_devices
            confinement = (Confinement.of_pool(pool, here) if limits is None
                           else Confinement({d: limits[d] for d in here}))
        self.control = ControlPlane(
            [d.name for d in pool.devices], secret if secret is not None else new_secret(), timeout_s,
            host=network.portal_address if network is not None else host,  # namespaces: links shaped by the kernel
            port=port, network=network, heartbeat=fault_tolerance.heartbeat if fault_tolerance else None,
            departed=departed, confinement=confinement,
        )

    @property
    def plan(self) -> Plan:
        """The plan the workers run now (a re-plan replaces it)."""
        return self.layout.plan

    @property
    def profile(self) -> ModelProfile | None:
        return self.layout.profile

    @property
    def secret(self) -> bytes:
        return self.control.secret

    @property
    def refused(self) -> list[str]:
        """Why each peer that failed the handshake was turned away."""
        return self.control.refused

    @property
    def data_ports(self) -> dict[int, tuple[str, int]]:
        return self.control.data_ports

    def confinement_report(self) -> dict[int, dict]:
        """Each confined device's CPU quota, memory limit and cgroup peak (empty unless ``emulate="cgroup"``)."""
        confinement = self.control.devices.confinement
        return {} if confinement is None else {d: confinement.report(d) for d in sorted(confinement.groups)}

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
        return self.control.devices.pids

    def _start(self) -> None:
        control, world = self.control, self.layout.devices
        control.open(world)
        for device in self.local_devices:
            control.start_worker(device)
        if self.invite is not None:
            self.invite(control.address, [d for d in world if d not in self.local_devices])
        control.admit(world, set(self.local_devices), self.join_timeout_s)
        control.configure(world, self.worker_config)
        for device in world:
            control.send(device, self.layout.epoch(0, device, world, control.data_ports))
        control.gather(Entered)

    def worker_config(self, device: int) -> Config:
        """What ``device``'s worker is told when it joins: the model, the time limit, the heartbeat to beat to, and
        where its tensors live (the device's accelerator)."""
        monitor = self.control.monitor
        heartbeat = None
        if self.fault_tolerance is not None and monitor is not None:
            heartbeat = (*monitor.address, self.fault_tolerance.heartbeat.period_s)
        return Config(self.model.to_json(), self.timeout_s, self.fault_tolerance is not None, heartbeat,
                      self.layout.pool.devices[device].accelerator)

    def close(self) -> None:
        """Stop every worker (politely, then by force) and release the portal's sockets."""
        self.control.close()

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
        check_targets(inject, self.layout.devices, len(self.layout.pool))
        mode = mode_of(self.plan)
        mode.check_training(fault_tolerance=self.fault_tolerance is not None, tuning=self.tuning is not None)
        keys = self.layout.keys
        start = dict(zip(keys, self._checked(self.weights if weights is None else weights)))
        ref = dict(zip(keys, self._checked(reference))) if reference is not None else start
        optimization = Optimization(lr=lr, momentum=momentum, weight_decay=weight_decay, mu=mu)
        try:  # from here on a failure leaves the workers in an unknown state: stop them all
            result = mode.train(self, start, ref, x, y, sync_rounds, optimization, progress, inject)
        except BaseException:
            self.close()
            raise
        self.weights = result.weights
        return result

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
            return stream_inference(self.control, self.layout, self.weights, x)
        except BaseException:
            self.close()
            raise

    def _check_running(self, what: str, training: bool) -> None:
        if not self.control.running:
            raise HomePipelineError("the home pipeline is not running (use it as a context manager)")
        if mode_of(self.plan).objective != ("training" if training else "inference"):
            kind = "an inference" if training else "a training"
            raise ValueError(f"cannot {what} with {kind} plan ('{self.plan.schedule}'); plan with "
                             f"objective={'training' if training else 'inference'!r}")

    def _checked(self, weights: Weights) -> Weights:
        """``weights`` if they match the model's state (count and shapes), else ValueError."""
        keys = self.layout.keys
        if len(weights) != len(keys):
            raise ValueError(f"expected {len(keys)} weight arrays, got {len(weights)}")
        for key, current, given in zip(keys, self.weights, weights):
            if np.shape(given) != np.shape(current):
                raise ValueError(f"{key}: expected shape {np.shape(current)}, got {np.shape(given)}")
        return weights
