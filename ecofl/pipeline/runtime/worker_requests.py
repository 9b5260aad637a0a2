"""What a joined worker does: the portal's requests, for every sync-round, epoch and re-plan.

:class:`Worker` holds a device's model, its role in the current pipeline
epoch and that role's executor, and serves the portal's requests::

    Epoch        a pipeline epoch: my role, my rank, every rank's data port  -> Entered
    Setup        stage weights (+ FedProx reference), optimizer settings       -> Ok
    Load         stage weights (inference)                                     -> Loaded
    Infer        stage 0: inputs [M, share, ...]; stream M micro-batches       -> Inferred (+ outputs)
    GetState     layers' state at a version (heavy rescheduling's gather)      -> State
    Round        stage 0: inputs [M, share, ...]; last stage: labels           -> Done + measurements
    Abort        (while in a round, replication or re-configuration; or idle)  -> Interrupted + holdings
    Replicate    send my committed stage to my backup / keep others' replicas  -> Replicated
    Collect      my stage's weights (+ momentum)                               -> Weights
    Reconfigure  a new epoch: role, roll back to a version, migrate layers     -> Reconfigured
    Arm          a phase-targeted failure of this device (:mod:`.traps`)       -> Armed
    Stop                                                                       -> (session over)

The messages are typed and validated on receipt (:mod:`.control_messages`).

A sync-round, a replication or a re-configuration that cannot finish (a peer
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

import selectors
import time
import numpy as np
import torch

from ecofl.net.schema import encode
from ecofl.pipeline.instructions import Program
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
    Interrupted,
    Load,
    Loaded,
    Ok,
    Reconfigure,
    Reconfigured,
    Replicate,
    Replicated,
    Reply,
    Round,
    Setup,
    State,
    Stop,
    Weights,
)
from ecofl.net.heartbeat import HeartbeatSender
from ecofl.net.links import MIGRATION_TAG, REPLICA_TAG, PeerLost, RoundAborted
from ecofl.net.mesh import DataListener, EpochMesh
from ecofl.pipeline.runtime.migration_io import exchange_states, pace
from ecofl.pipeline.runtime.model_spec import spec_from_json, stage_module
from ecofl.pipeline.runtime.process_memory import peak_rss_bytes, reset_peak
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.stage import Optimization, StageExecutor
from ecofl.pipeline.runtime.stage_state import StageState, as_arrays, from_arrays
from ecofl.pipeline.runtime.heap import freeze_heap
from ecofl.pipeline.runtime.stream_stage import StreamExecutor
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.traps import Trap, Traps
from ecofl.net.wire import recv_message, send_message

Arrays = dict[str, np.ndarray]

#: Failures of a sync-round that the portal can recover from (the worker stays and waits).
INTERRUPTIONS = (RoundAborted, PeerLost, TimeoutError)


class Worker:
    """The state of one joined worker: its model, its role in the current epoch, its executor."""

    def __init__(self, sock: SealedSocket, device: int, config: Config, secret: bytes, listener: DataListener,
                 baseline_rss: int | None = None):
        self.sock, self.secret, self.listener = sock, secret, listener
        self.baseline_rss = baseline_rss  # the process's resident set before any model was built
        self.device = device
        self.timeout_s = config.timeout_s
        self.keeps_snapshots = config.snapshots
        torch.set_num_threads(worker_threads())  # one, or a confined device's whole cores
        self.model, self.layers = spec_from_json(config.model).build()
        freeze_heap()  # before the heartbeat: a full collection must not silence it (.heap)
        self.state = StageState(self.model, self.layers)
        self.settings: Optimization | None = None
        self.reference: dict[str, torch.Tensor] = {}
        self.version = 0  # committed sync-rounds of the live tensors
        self.clean = True  # False: an interrupted round or re-configuration left the live tensors half updated
        self.traps = Traps(self._reply)
        self.executor: StageExecutor | None = None  # a training role's
        self.stream: StreamExecutor | None = None  # an inference role's
        self.heartbeat = None
        if config.heartbeat is not None:
            beat_host, beat_port, period = config.heartbeat
            self.heartbeat = HeartbeatSender((beat_host, beat_port), secret, self.device, period)
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self.mesh: EpochMesh | None = None

    # -- epochs ----------------------------------------------------------------------

    def _enter_epoch(self, entry: Epoch | Reconfigure) -> None:
        """Link to the epoch's ranks (closing the old epoch's links) and build the stage of my role (None: idle)."""
        if self.mesh is not None:
            self.mesh.close()  # its waits on a lost peer end here
            self.mesh = None
        self.mesh = EpochMesh(self.listener, self.secret, entry.epoch, entry.rank, list(entry.addresses),
                              self.timeout_s, self._abort_check)
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
        if self.executor is None:
            return {}
        return {k: b for k, b in zip(self.parameter_keys, self.executor.momentum_buffers()) if b is not None}

    def _with_momentum(self) -> bool:
        return bool(self.settings and self.settings.momentum > 0)

    def _configure(self, momentum: dict[str, torch.Tensor]) -> None:
        if self.executor is None or self.settings is None:
            return
        reference = [self.reference[k] for k in self.parameter_keys] if self.settings.mu else []
        self.executor.configure(self.settings, reference, [momentum.get(k) for k in self.parameter_keys])

    def _commit(self, version: int) -> None:
        """The live tensors are the committed state of ``version``: keep a copy of my stage at it (fault tolerance)."""
        self.version, self.clean = version, True
        if self.keeps_snapshots and self.executor is not None:
            self.state.hold(version, self.state.capture(self.stage_layers, self._momentum(), self._with_momentum()))

    def _require_clean(self, what: str) -> None:
        if not self.clean:
            raise RuntimeError(f"asked to {what} while the live state is half updated (roll back first)")

    def _interrupted(self, error: BaseException) -> None:
        """Answer that the current request cannot finish: why, the abort's token, what I hold committed."""
        token = error.args[0] if isinstance(error, RoundAborted) and error.args else None
        holdings = {str(version): layers for version, layers in self.state.holdings().items()}
        self._reply(Interrupted(f"{type(error).__name__}: {error}", token, holdings))

    def _reply(self, reply: Reply, arrays: dict[str, np.ndarray] | None = None) -> None:
        send_message(self.sock, encode(reply), arrays)

    # -- serving ---------------------------------------------------------------------

    def serve(self) -> None:
        """Serve the portal's requests until it says :class:`Stop`; each handler sends its own reply."""
        handlers = {
            Epoch: self._epoch, Setup: self._setup, Load: self._load, Infer: self._infer, Round: self._round,
            Replicate: self._replicate, Collect: self._collect, GetState: self._send_state,
            Reconfigure: self._reconfigure, Arm: self._arm, Abort: self._abort,
        }
        while True:
            header, arrays = recv_message(self.sock)
            request = REQUESTS.decode(header)
            if isinstance(request, Stop):
                return
            handlers[type(request)](request, arrays)

    def _epoch(self, request: Epoch, _arrays: Arrays) -> None:
        self._enter_epoch(request)
        self._reply(Entered())

    def _arm(self, request: Arm, _arrays: Arrays) -> None:
        self.traps.arm(Trap(request.signal, request.phase, request.count))
        self._reply(Armed())

    def _abort(self, request: Abort, _arrays: Arrays) -> None:
        self._interrupted(RoundAborted(request.token, "aborted while idle"))

    def _abort_check(self) -> None:
        """Raise :class:`RoundAborted` if the portal sent :class:`Abort` (checked while a round waits)."""
        if self.sock.pending() or self._selector.select(timeout=0):
            header, _ = recv_message(self.sock)
            request = REQUESTS.decode(header)
            if not isinstance(request, Abort):
                raise ValueError(f"unexpected {request.TYPE!r} during a sync-round")
            raise RoundAborted(request.token)

    def _load(self, _request: Load, arrays: Arrays) -> None:
        self._load_weights(arrays)
        self._reply(Loaded())

    def _load_weights(self, arrays: Arrays) -> None:
        with torch.no_grad():
            for key in self.stage_keys:
                self.state.tensors[key].copy_(torch.from_numpy(arrays[key]))

    def _setup(self, request: Setup, arrays: Arrays) -> None:
        self._load_weights(arrays)
        self.settings = request.optimization
        self.reference = {k[len("reference/"):]: torch.from_numpy(np.array(v))
                          for k, v in arrays.items() if k.startswith("reference/")}
        self.state.copies.clear()
        self._configure({})
        self._commit(0)
        self._reply(Ok())

    def _round(self, request: Round, arrays: Arrays) -> None:
        """Sync-round ``version``: from the committed state of that version; commits ``version + 1``.

        ``keep``: the versions the portal may still restore from; copies of others are dropped.
        """
        version = request.version
        self._require_clean(f"run sync-round {version}")
        if version != self.version:
            raise RuntimeError(f"asked for sync-round {version}, but my state is at version {self.version}")
        self.state.keep({version, *request.keep})
        executor = self.executor
        executor.slowdown = request.slowdown
        executor.reserved_bytes = self.state.held_bytes(self.stage_keys)
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        labels = torch.from_numpy(arrays["labels"]) if "labels" in arrays else None
        reset_peak()
        self.clean = False
        try:
            stats = executor.run_round(inputs, labels, request.batch_size, self._abort_check,
                                       self._pass_program(request.num_micro_batches))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        self._commit(version + 1)
        self._reply(Done(
            events=stats.events, loss_sum=float(stats.loss_sum), peak_resident=stats.peak_resident,
            peak_activation_bytes=stats.peak_activation_bytes, fixed_bytes=stats.fixed_bytes,
            peak_rss_bytes=peak_rss_bytes(),  # measured: the process's peak during this sync-round
            baseline_rss_bytes=self.baseline_rss, weight_versions=stats.weight_versions,
        ))

    def _pass_program(self, count: int) -> Program | None:
        """An asynchronous pass's program for ``count`` micro-batches, built here and checked (None: the role's)."""
        return mode_of(self.role).pass_program(self.role, count)

    def _infer(self, request: Infer, arrays: Arrays) -> None:
        """Stream the call's micro-batches through my stage (pipelined inference)."""
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        reset_peak()
        try:
            stats = self.stream.run(inputs, request.num_micro_batches, self._abort_check)
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        outputs = {} if stats.outputs is None else {"outputs": stats.outputs.numpy()}
        self._reply(Inferred(stats.events, stats.peak_held, peak_rss_bytes(), self.baseline_rss), outputs)

    def _replicate(self, request: Replicate, _arrays: Arrays) -> None:
        """Send my stage at ``version`` to my backup; keep the stages my peers send me (Asteroid §3.4).

        A replica is kept only once all of it arrived; an interrupted copy
        leaves the copies held before untouched.
        """
        version = request.version
        self._require_clean("replicate")
        if version != self.version:
            raise RuntimeError(f"asked to replicate version {version}, but my state is at version {self.version}")
        with_momentum = self._with_momentum()
        sends = []
        if request.to is not None:
            state = {k: v for layer in self.stage_layers for k, v in self.state.layer_state(layer, version).items()}
            sends = [(request.to, [state[k] for k in sorted(state)])]
        receives = []
        for _source, rank, first, last in request.sources:
            buffers = {}
            for layer in range(first, last + 1):
                buffers.update(self.state.empty_like_layer(layer, with_momentum))
            receives.append((rank, buffers))
        started = time.time()
        try:
            received = exchange_states(self.mesh, sends, [(rank, [b[k] for k in sorted(b)]) for rank, b in receives],
                                       tag=REPLICA_TAG, rate_bps=request.link_bps, abort=self._abort_check,
                                       posted=lambda: self.traps.reached("replicate"))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        for _, buffers in receives:
            self.state.hold(version, buffers)
        self._reply(Replicated(received, time.time() - started))

    def _collect(self, request: Collect, _arrays: Arrays) -> None:
        """My stage's live weights (+ momentum), from the first replica of a stage only."""
        self.traps.reached("global-copy")
        self._require_clean("send my weights")
        first_replica = self.role is not None and self.role.rank == self.role.replicas[0]
        state = {}
        if first_replica:
            state = as_arrays(self.state.capture(self.stage_layers, self._momentum(), request.momentum))
        self._reply(Weights(self.version), state)

    def _reconfigure(self, request: Reconfigure, arrays: Arrays) -> None:
        """Enter a new epoch at committed version ``restore``: roll back, take the new role, migrate the layers.

        Every layer held at that version is restored from my copies; the
        ``moves`` ([layer, from rank, to rank]) bring the rest from the ranks
        that hold them, and the portal's arrays (its global copy, or a heavy
        re-schedule) come last. Interrupted, the live state stays dirty and
        the copies untouched: the portal recovers again.
        """
        started = time.time()
        if request.recovery:
            self.traps.reached("recover")
        version = request.restore
        if self.settings is None:  # a device that joined a running pipeline
            self.settings = request.optimization
        self.clean = False
        momentum = self.state.restore(self.state.copies.get(version, {}))
        self.reference.update({k[len("reference/"):]: torch.from_numpy(np.array(v))
                               for k, v in arrays.items() if k.startswith("reference/")})
        from_portal = {k: v for k, v in arrays.items() if not k.startswith("reference/")}
        try:
            self._enter_epoch(request)
            sends, receives = [], []
            with_momentum = self._with_momentum()
            for layer, source_rank, target_rank in request.moves:
                if source_rank == target_rank:
                    continue  # restored from my own copy above
                if source_rank == self.mesh.rank:
                    state = self.state.layer_state(layer, version)
                    sends.append((target_rank, [state[k] for k in sorted(state)]))
                elif target_rank == self.mesh.rank:
                    receives.append((source_rank, self.state.empty_like_layer(layer, with_momentum)))
            received = exchange_states(self.mesh, sends, [(rank, [b[k] for k in sorted(b)]) for rank, b in receives],
                                       tag=MIGRATION_TAG, rate_bps=request.link_bps, abort=self._abort_check,
                                       posted=lambda: self.traps.reached("migrate"))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        for _, buffers in receives:
            momentum.update(self.state.restore(buffers))
        momentum.update(self.state.restore(from_arrays(from_portal)))
        self._configure(momentum)
        self._commit(version)
        self._reply(Reconfigured(received, time.time() - started))

    def _send_state(self, request: GetState, _arrays: Arrays) -> None:
        """Layers' committed state at a version, from my copies (heavy rescheduling's gather)."""
        state = {}
        for layer in request.layers:
            state.update(self.state.layer_state(layer, request.version))
        arrays = as_arrays(state)
        pace(sum(a.nbytes for a in arrays.values()), request.link_bps)
        self._reply(State(), arrays)

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
