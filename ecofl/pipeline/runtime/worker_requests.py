"""What a joined worker does: the portal's requests, for every sync-round, epoch and re-plan.

:class:`Worker` holds a device's model, its role in the current pipeline
epoch and that role's executor, and serves the portal's requests::

    Epoch        a pipeline epoch: my role, my rank, every rank's data port  -> Entered
    Setup        stage weights (+ FedProx reference), optimizer settings       -> Ok
    Load         stage weights (inference)                                     -> Loaded
    Infer        stage 0: inputs [M, share, ...]; stream M micro-batches       -> Inferred (+ outputs)
    GetState     layers' state at a version (heavy rescheduling's gather)      -> State
    TrainPass    stage 0: inputs [M, share, ...]; last stage: labels; the        -> Done + measurements
                 replicas to send and keep meanwhile (:mod:`.replica`), my
                 stage for the global copy (:mod:`.global_copy`)            -> CopyPiece... first
    Abort        (while in a round or a re-configuration; or idle)             -> Interrupted + holdings
    Collect      my stage's weights                                            -> StageWeights
    Reconfigure  a new epoch: role, roll back to a version, migrate layers     -> Reconfigured
    Arm          a phase-targeted failure of this device (:mod:`.traps`)       -> Armed
    Stop                                                                       -> (session over)

The messages are typed and validated on receipt (:mod:`.control_messages`).

A sync-round or a re-configuration that cannot finish (a peer
died or froze, the portal aborted) answers ``Interrupted`` and the worker
waits: the live tensors are then *dirty* (half a round applied), and only a
``Reconfigure`` that rolls them back to a committed copy makes them usable
again, so a half-done round is never applied (Asteroid §3.4's pipeline
replay). An abort's answer lists the worker's committed copies
(:meth:`.stage_state.StageState.holdings`): the portal restores from what
the survivors really hold. With ``heartbeat`` in its config a thread of its
own beats to the portal (:mod:`.heartbeat`).
The process around it (joining, sessions) is :mod:`.worker`.
"""

from __future__ import annotations

import time
import numpy as np
import torch

from ecofl.accelerator import host_array, resolve_device
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.runtime.confinement import worker_threads
from ecofl.pipeline.runtime.control_messages import (
    REQUESTS,
    Abort,
    Arm,
    Armed,
    Collect,
    Config,
    Done,
    Entered,
    Epoch,
    GetState,
    Infer,
    Inferred,
    Load,
    Loaded,
    Ok,
    Reconfigure,
    Reconfigured,
    TrainPass,
    Setup,
    State,
    Stop,
    StageWeights,
)
from ecofl.net.heartbeat import HeartbeatSender
from ecofl.net.links import MIGRATION_TAG, PeerLost, RoundAborted
from ecofl.net.mesh import DataListener, EpochMesh
from ecofl.pipeline.runtime.migration_io import exchange_layer_states, paced
from ecofl.pipeline.runtime.model_spec import spec_from_json, stage_module
from ecofl.pipeline.runtime.process_memory import peak_rss_bytes, reset_peak
from ecofl.pipeline.runtime.round_copies import RoundCopies
from ecofl.pipeline.runtime.round_meter import RoundMeter
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.stage import Optimization, ShareExecutor
from ecofl.pipeline.runtime.stage_state import State as Tensors, StageState, as_arrays, from_arrays, with_momentum_of
from ecofl.pipeline.runtime.heap import freeze_heap
from ecofl.pipeline.runtime.stream_stage import StreamExecutor
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.traps import Trap, Traps
from ecofl.net.wire import recv_message
from ecofl.pipeline.runtime.worker_channel import WorkerChannel

Arrays = dict[str, np.ndarray]

#: Failures of a sync-round that the portal can recover from (the worker stays and waits).
INTERRUPTIONS = (RoundAborted, PeerLost, TimeoutError)


class Worker:
    """The state of one joined worker: its model, its role in the current epoch, its executor."""

    def __init__(self, sock: SealedSocket, device: int, config: Config, secret: bytes, listener: DataListener,
                 baseline_rss: int | None = None):
        self.channel, self.secret, self.listener = WorkerChannel(sock), secret, listener
        self.baseline_rss = baseline_rss  # the process's resident set before any model was built
        self.device, self.timeout_s, self.keeps_snapshots = device, config.timeout_s, config.snapshots
        torch.set_num_threads(worker_threads())  # one, or a confined device's whole cores
        self.model, self.layers = spec_from_json(config.model).build()
        self.accelerator = resolve_device(config.accelerator, f"device {device}: accelerator")  # after the fork
        self.model.to(self.accelerator)  # the whole model, at hand for a re-plan's layers
        freeze_heap()  # before the heartbeat: a full collection must not silence it (.heap)
        self.state = StageState(self.model, self.layers)
        self.settings: Optimization | None = None
        self.reference: dict[str, torch.Tensor] = {}
        self.version = 0  # committed sync-rounds of the live tensors
        self.clean = True  # False: an interrupted round or re-configuration left the live tensors half updated
        self.traps = Traps(self.channel.reply)
        self.executor: ShareExecutor | None = None  # a training role's
        self.stream: StreamExecutor | None = None  # an inference role's
        beat = config.heartbeat  # the portal's monitor (host, port, period), with fault tolerance on
        self.heartbeat = HeartbeatSender(tuple(beat[:2]), secret, device, beat[2]) if beat is not None else None
        self.mesh: EpochMesh | None = None
        self.meter: RoundMeter | None = None  # started at a round's commit, for the next round (.round_meter)

    # -- epochs ----------------------------------------------------------------------

    def _enter_epoch(self, entry: Epoch | Reconfigure) -> None:
        """Link to the epoch's ranks (closing the old epoch's links) and build the stage of my role (None: idle)."""
        if self.mesh is not None:
            self.mesh.close()  # its waits on a lost peer end here
            self.mesh = None
        self.mesh = EpochMesh(self.listener, self.secret, entry.epoch, entry.rank, list(entry.addresses),
                              self.timeout_s, self.channel.abort_check)
        self.executor, self.stream, self.role = None, None, None
        if entry.role is None:
            return
        self.role = WorkerRole.from_json(entry.role)
        first, last = self.role.layers
        self.stage_layers = range(first, last + 1)
        self.stage_keys = self.state.keys(self.stage_layers)
        self.parameter_keys = [k for k in self.stage_keys if k in self.state.parameter_keys]
        module = stage_module(self.layers, first, last)
        mode = mode_of(self.role)
        if mode.objective == "inference":
            self.stream = mode.executor(self.role, module, self.mesh, self.timeout_s)
            return
        self.executor = mode.executor(self.role, module, self.mesh, self.timeout_s)
        self.executor.reached = self.traps.reached
        if [id(p) for p in self.executor.params] != [id(self.state.tensors[k]) for k in self.parameter_keys]:
            raise RuntimeError("stage parameters are not in state_dict order")

    def _momentum(self) -> dict[str, torch.Tensor]:
        buffers = self.executor.momentum_buffers() if self.executor is not None else []
        return {k: b for k, b in zip(self.parameter_keys, buffers) if b is not None}

    def _with_momentum(self) -> bool:
        return bool(self.settings and self.settings.momentum > 0)

    def _configure(self, momentum: dict[str, torch.Tensor]) -> None:
        if self.executor is None or self.settings is None:
            return
        reference = [self.reference[k] for k in self.parameter_keys] if self.settings.mu else []
        self.executor.configure(self.settings, reference, [momentum.get(k) for k in self.parameter_keys])

    def _commit(self, version: int, snapshot: bool = False) -> None:
        """The live tensors are committed at ``version``: keep a copy of my stage (fault tolerance, or ``snapshot``)."""
        self.version, self.clean = version, True
        if (self.keeps_snapshots or snapshot) and self.executor is not None:
            self.state.hold(version, self.state.capture(self.stage_layers, self._momentum(), self._with_momentum()))

    def _require_clean(self, what: str) -> None:
        if not self.clean:
            raise RuntimeError(f"asked to {what} while the live state is half updated (roll back first)")

    # -- serving ---------------------------------------------------------------------

    def serve(self) -> None:
        """Serve the portal's requests until it says :class:`Stop`; each handler sends its own reply."""
        handlers = {Epoch: self._epoch, Setup: self._setup, Load: self._load, Infer: self._infer,
                    TrainPass: self._round, Collect: self._collect, GetState: self._send_state,
                    Reconfigure: self._reconfigure, Arm: self._arm, Abort: self._abort}
        while True:
            header, arrays = recv_message(self.channel.sock)
            request = REQUESTS.decode(header)
            if not isinstance(request, TrainPass):
                self.meter = None  # a meter started at a commit measures the next sync-round only
            if isinstance(request, Stop):
                return
            handlers[type(request)](request, arrays)

    def _epoch(self, request: Epoch, _arrays: Arrays) -> None:
        self._enter_epoch(request)
        self.channel.reply(Entered())

    def _arm(self, request: Arm, _arrays: Arrays) -> None:
        self.traps.arm(Trap(request.signal, request.phase, request.count))
        self.channel.reply(Armed())

    def _abort(self, request: Abort, _arrays: Arrays) -> None:
        self.channel.interrupted(RoundAborted(request.token, "aborted while idle"), self.state.holdings())

    def _load(self, _request: Load, arrays: Arrays) -> None:
        self._load_weights(arrays)
        self.channel.reply(Loaded())

    def _load_weights(self, arrays: Arrays) -> None:
        with torch.no_grad():
            for key in self.stage_keys:
                self.state.tensors[key].copy_(torch.from_numpy(arrays[key]))

    def _setup(self, request: Setup, arrays: Arrays) -> None:
        self._load_weights(arrays)
        self.settings = request.optimization
        self.reference = {k[len("reference/"):]: torch.from_numpy(np.array(v)).to(self.accelerator)
                          for k, v in arrays.items() if k.startswith("reference/")}
        self.state.copies.clear()
        self._configure({})
        self._commit(0)
        self.channel.reply(Ok())

    def _round(self, request: TrainPass, arrays: Arrays) -> None:
        """Sync-round ``version``, from the committed state of that version; commits ``version + 1`` after replying.

        ``keep``: the versions the portal may still restore from; copies of
        others are dropped. ``replicate``: the replicas of ``version`` that
        travel while the round computes (:mod:`.replica`); ``global_copy``: my
        stage at ``version`` to the portal meanwhile (:mod:`.global_copy`;
        both: :mod:`.round_copies`). The round is done when they are.
        """
        version = request.version
        self._require_clean(f"run sync-round {version}")
        if version != self.version:
            raise RuntimeError(f"asked for sync-round {version}, but my state is at version {self.version}")
        self.state.keep({version, *request.keep})
        executor = self.executor
        executor.slowdown = request.slowdown
        inputs = torch.from_numpy(arrays["inputs"]).to(self.accelerator) if "inputs" in arrays else None
        labels = torch.from_numpy(arrays["labels"]).to(self.accelerator) if "labels" in arrays else None
        meter, self.meter, self.clean = self.meter or RoundMeter(self.accelerator), None, False  # since my commit
        copies = RoundCopies(request, self.state, self.stage_layers, self._with_momentum(), self.mesh,
                             executor.links, self.channel.reply, self.traps)
        executor.reserved_bytes = self.state.held_bytes(self.stage_keys) + copies.received_bytes
        try:
            program = mode_of(self.role).pass_program(self.role, request.num_micro_batches)  # None: the role's
            stats = executor.run_round(inputs, labels, request.batch_size, self.channel.abort_check, program)
            copies.finish(self.channel.abort_check)
        except INTERRUPTIONS as error:
            copies.stop()  # before the holdings: a replica not complete is not kept
            self.channel.interrupted(error, self.state.holdings())
            return
        finally:
            copies.stop()
        self.channel.reply(Done(
            events=stats.events, loss_sum=float(stats.loss_sum), peak_resident=stats.peak_resident,
            peak_activation_bytes=stats.peak_activation_bytes, fixed_bytes=stats.fixed_bytes,
            baseline_rss_bytes=self.baseline_rss, weight_versions=stats.weight_versions, pass_cpu_s=stats.pass_cpu_s,
            replica_after_s=copies.replica_after_s, global_copy_after_s=copies.global_copy_after_s,
            **meter.figures(copies.ended_cpu_s()),
        ))
        self.meter = RoundMeter(self.accelerator)  # the commit counts in the next round (.round_meter)
        self._commit(version + 1)  # replied first: the next request is served once the copy is taken

    def _infer(self, request: Infer, arrays: Arrays) -> None:
        """Stream the call's micro-batches through my stage (pipelined inference)."""
        inputs = torch.from_numpy(arrays["inputs"]).to(self.accelerator) if "inputs" in arrays else None
        reset_peak()
        try:
            stats = self.stream.run(inputs, request.num_micro_batches, self.channel.abort_check)
        except INTERRUPTIONS as error:
            self.channel.interrupted(error, self.state.holdings())
            return
        outputs = {} if stats.outputs is None else {"outputs": host_array(stats.outputs)}
        self.channel.reply(Inferred(stats.events, stats.peak_held, peak_rss_bytes(), self.baseline_rss), outputs)

    def _collect(self, request: Collect, _arrays: Arrays) -> None:
        """My stage's live weights (the trained model), from the first replica of a stage only, paced at my link."""
        self._require_clean("send my weights")
        first = self.role is not None and self.role.rank == self.role.replicas[0]  # a stage's first replica
        arrays = as_arrays(self.state.capture(self.stage_layers, {}, with_momentum=False) if first else {})
        self.channel.reply(StageWeights(self.version), paced(arrays, request.link_bps))

    def _reconfigure(self, request: Reconfigure, arrays: Arrays) -> None:
        """Enter a new epoch at committed version ``restore``: roll back, take the new role, migrate the layers.

        Only the new stage is restored (no other layer's live tensors are used): from my copies at that
        version, the ``moves`` ([layer, from rank, to rank]) from the ranks that hold the rest, the portal's
        arrays (its global copy, or a heavy re-schedule) last. Its commit clones nothing (about half of a
        0.1-core device's recovery). Interrupted, the live state stays dirty and the copies untouched.
        """
        started = time.time()
        if request.recovery:
            self.traps.reached("recover")
        version = request.restore
        if not self.keeps_snapshots and self.clean and version == self.version:  # a re-tune without fault
            self._commit(version, snapshot=True)  # tolerance keeps no copies: migrate from my live state
        if self.settings is None:  # a device that joined a running pipeline
            self.settings = request.optimization
        self.clean = False
        self.reference.update({k[len("reference/"):]: torch.from_numpy(np.array(v)).to(self.accelerator)
                               for k, v in arrays.items() if k.startswith("reference/")})
        from_portal = {k: v for k, v in arrays.items() if not k.startswith("reference/")}
        try:
            self._enter_epoch(request)
            me = self.mesh.rank  # a layer that stays with its rank is restored from my own copy below
            sends = [(to, self.state.layers_state([layer], version)) for layer, source, to in request.moves
                     if source == me != to]
            receives = [(source, self.state.empty_like_layers([layer], self._with_momentum()))
                        for layer, source, to in request.moves if to == me != source]
            received = exchange_layer_states(self.mesh, sends, receives, MIGRATION_TAG, request.link_bps,
                                             self.channel.abort_check, lambda: self.traps.reached("migrate"))
        except INTERRUPTIONS as error:
            self.channel.interrupted(error, self.state.holdings())
            return
        stage_keys = self.stage_keys if self.executor is not None else []
        momentum = self.state.restore(with_momentum_of(self.state.copies.get(version, {}), stage_keys))
        arrived: Tensors = {}
        for _, buffers in receives:
            arrived.update(buffers)
        arrived.update({k: v.to(self.accelerator) for k, v in from_arrays(from_portal).items()})  # the portal's last
        momentum.update(self.state.restore(arrived))
        self._configure(momentum)
        self._commit_restored(version, arrived)
        self.channel.reply(Reconfigured(received, time.time() - started, self.mesh.linking_s))

    def _commit_restored(self, version: int, arrived: Tensors) -> None:
        """The live tensors, just rolled back to ``version``, are committed there: keep what ``arrived``
        (nothing else holds those tensors); my copies at ``version`` hold the rest of my stage already, and a
        layer neither holds is captured."""
        self.version, self.clean = version, True
        if not self.keeps_snapshots or self.executor is None:
            return
        self.state.hold(version, arrived)
        held = self.state.holdings().get(version, [])
        missing = [layer for layer in self.stage_layers if layer not in held]
        if missing:
            self.state.hold(version, self.state.capture(missing, self._momentum(), self._with_momentum()))

    def _send_state(self, request: GetState, _arrays: Arrays) -> None:
        """Layers' committed state at a version, from my copies (heavy rescheduling's gather)."""
        arrays = as_arrays(self.state.layers_state(request.layers, request.version))
        self.channel.reply(State(), paced(arrays, request.link_bps))

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
        self.channel.close()
