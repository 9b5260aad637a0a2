"""What a joined worker does: the portal's requests, for every sync-round, epoch and re-plan.

:class:`Worker` holds a device's model, its role in the current pipeline
epoch and that role's executor, and serves the portal's requests::

    epoch        a pipeline epoch: my role, my rank, every rank's data port  -> entered
    setup        stage weights (+ FedProx reference), optimizer settings       -> ok
    weights      stage weights (inference)                                     -> loaded
    infer        stage 0: inputs [M, share, ...]; stream M micro-batches       -> inferred + events (+ outputs)
    state        layers' state at a version (heavy rescheduling's gather)      -> state
    round        stage 0: inputs [M, share, ...]; last stage: labels           -> done + measurements
    abort        (while in a round, replication or re-configuration; or idle)  -> interrupted + holdings
    replicate    send my committed stage to my backup / keep others' replicas  -> replicated
    collect      my stage's weights (+ momentum)                               -> weights
    reconfigure  a new epoch: role, roll back to a version, migrate layers     -> reconfigured
    arm          a phase-targeted failure of this device (:mod:`.traps`)       -> armed
    stop                                                                       -> (session over)

A sync-round, a replication or a re-configuration that cannot finish (a peer
died or froze, the portal aborted) answers ``interrupted`` and the worker
waits: the live tensors are then *dirty* (half a round applied), and only a
``reconfigure`` that rolls them back to a committed copy makes them usable
again, so a half-done round is never applied (Asteroid §3.4's pipeline
replay). An abort's answer lists the worker's committed copies
(:meth:`.stage_state.StageState.holdings`): the portal restores from what
the survivors really hold. With ``heartbeat`` in its config a thread of its
own beats to the portal (:mod:`ecofl.net.heartbeat`).
The process around it (joining, sessions) is :mod:`.worker`.
"""

from __future__ import annotations

import selectors
import time
from typing import Any

import numpy as np
import torch

from ecofl.net.heartbeat import HeartbeatSender
from ecofl.net.links import MIGRATION_TAG, REPLICA_TAG, PeerLost, RoundAborted
from ecofl.net.mesh import DataListener, EpochMesh
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.instructions import Program, async_program, check_program
from ecofl.pipeline.plan import ScheduleKind
from ecofl.pipeline.runtime.migration_io import exchange_states, pace
from ecofl.pipeline.runtime.model_spec import spec_from_json, stage_module
from ecofl.pipeline.runtime.process_memory import peak_rss_bytes, reset_peak
from ecofl.pipeline.runtime.stage import Optimization, StageExecutor
from ecofl.pipeline.runtime.stage_state import StageState, as_arrays, from_arrays
from ecofl.pipeline.runtime.stream_stage import StreamExecutor
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.traps import Trap, Traps
from ecofl.pipeline.schedule import async_one_f_one_b

#: Failures of a sync-round that the portal can recover from (the worker stays and waits).
INTERRUPTIONS = (RoundAborted, PeerLost, TimeoutError)


class Worker:
    """The state of one joined worker: its model, its role in the current epoch, its executor."""

    def __init__(self, sock: SealedSocket, config: dict[str, Any], secret: bytes, listener: DataListener,
                 baseline_rss: int | None = None):
        self.sock, self.secret, self.listener = sock, secret, listener
        self.baseline_rss = baseline_rss  # the process's resident set before any model was built
        self.device = int(config["device"])
        self.timeout_s = float(config["timeout_s"])
        self.keeps_snapshots = bool(config.get("snapshots", False))
        torch.set_num_threads(int(config.get("threads", 1)))
        self.model, self.layers = spec_from_json(config["model"]).build()
        self.state = StageState(self.model, self.layers)
        self.settings: Optimization | None = None
        self.reference: dict[str, torch.Tensor] = {}
        self.version = 0  # committed sync-rounds of the live tensors
        self.clean = True  # False: an interrupted round or re-configuration left the live tensors half updated
        self.traps = Traps(lambda message: send_message(self.sock, message))
        self.executor: StageExecutor | None = None  # a training role's
        self.stream: StreamExecutor | None = None  # an inference role's
        self.heartbeat = None
        if config.get("heartbeat"):
            beat_host, beat_port, period = config["heartbeat"]
            self.heartbeat = HeartbeatSender((beat_host, int(beat_port)), secret, self.device, float(period))
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self.mesh: EpochMesh | None = None

    # -- epochs ----------------------------------------------------------------------

    def _enter_epoch(self, header: dict[str, Any]) -> None:
        """Link to the epoch's ranks (closing the old epoch's links) and build the stage of my role (None: idle)."""
        if self.mesh is not None:
            self.mesh.close()  # its waits on a lost peer end here
            self.mesh = None
        addresses = [tuple(a) for a in header["addresses"]]
        self.mesh = EpochMesh(self.listener, self.secret, int(header["epoch"]), int(header["rank"]), addresses,
                              self.timeout_s, self._abort_check)
        role = header.get("role")
        self.executor, self.stream, self.role = None, None, None
        if role is None:
            return
        self.role = WorkerRole.from_json(role)
        first, last = self.role.layers
        self.stage_layers = range(first, last + 1)
        self.stage_keys = self.state.keys(self.stage_layers)
        self.parameter_keys = [k for k in self.stage_keys if k in self.state.parameter_keys]
        module = stage_module(self.layers, first, last)
        if self.role.schedule == ScheduleKind.STREAM:
            self.stream = StreamExecutor(self.role, module, self.mesh, self.timeout_s)
            return
        self.executor = StageExecutor(self.role, module, self.mesh, self.timeout_s)
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
        send_message(self.sock, {"type": "interrupted", "reason": f"{type(error).__name__}: {error}",
                                 "token": token, "holdings": self._holdings()})

    def _holdings(self) -> dict[str, list[int]]:
        return {str(version): layers for version, layers in self.state.holdings().items()}

    # -- serving ---------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            header, arrays = recv_message(self.sock)
            kind = header.get("type")
            if kind == "epoch":
                self._enter_epoch(header)
                send_message(self.sock, {"type": "entered"})
            elif kind == "setup":
                self._setup(header, arrays)
                send_message(self.sock, {"type": "ok"})
            elif kind == "weights":
                self._load_weights(arrays)
                send_message(self.sock, {"type": "loaded"})
            elif kind == "infer":
                self._infer(header, arrays)
            elif kind == "round":
                self._round(header, arrays)
            elif kind == "abort":
                self._interrupted(RoundAborted(header.get("token"), "aborted while idle"))
            elif kind == "state":
                self._send_state(header)
            elif kind == "replicate":
                self._replicate(header)
            elif kind == "collect":
                self._collect(header)
            elif kind == "reconfigure":
                self._reconfigure(header, arrays)
            elif kind == "arm":
                self.traps.arm(Trap(str(header["signal"]), str(header["phase"]), int(header["count"])))
                send_message(self.sock, {"type": "armed"})
            elif kind == "stop":
                return
            else:
                raise ValueError(f"unknown request {kind!r}")

    def _abort_check(self) -> None:
        """Raise :class:`RoundAborted` if the portal sent ``abort`` (checked while a round waits)."""
        if self.sock.pending() or self._selector.select(timeout=0):
            header, _ = recv_message(self.sock)
            if header.get("type") != "abort":
                raise ValueError(f"unexpected {header.get('type')!r} during a sync-round")
            raise RoundAborted(header.get("token"))

    def _load_weights(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for key in self.stage_keys:
                self.state.tensors[key].copy_(torch.from_numpy(arrays[key]))

    def _setup(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self._load_weights(arrays)
        self.settings = Optimization(**header["optimization"])
        self.reference = {k[len("reference/"):]: torch.from_numpy(np.array(v))
                          for k, v in arrays.items() if k.startswith("reference/")}
        self.state.copies.clear()
        self._configure({})
        self._commit(0)

    def _round(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Sync-round ``version``: from the committed state of that version; commits ``version + 1``.

        ``keep``: the versions the portal may still restore from; copies of others are dropped.
        """
        version = int(header["version"])
        self._require_clean(f"run sync-round {version}")
        if version != self.version:
            raise RuntimeError(f"asked for sync-round {version}, but my state is at version {self.version}")
        self.state.keep({version, *(int(v) for v in header.get("keep", ()))})
        executor = self.executor
        executor.slowdown = float(header.get("slowdown", 1.0))
        executor.reserved_bytes = self.state.held_bytes(self.stage_keys)
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        labels = torch.from_numpy(arrays["labels"]) if "labels" in arrays else None
        reset_peak()
        self.clean = False
        try:
            stats = executor.run_round(inputs, labels, int(header["batch_size"]), self._abort_check,
                                       self._pass_program(int(header["num_micro_batches"])))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        self._commit(version + 1)
        send_message(self.sock, {
            "type": "done",
            "events": stats.events,
            "loss_sum": stats.loss_sum,
            "peak_resident": stats.peak_resident,
            "peak_activation_bytes": stats.peak_activation_bytes,
            "fixed_bytes": stats.fixed_bytes,
            "peak_rss_bytes": peak_rss_bytes(),  # measured: the process's peak during this sync-round
            "baseline_rss_bytes": self.baseline_rss,
            "weight_versions": stats.weight_versions,
        })

    def _pass_program(self, count: int) -> Program | None:
        """An asynchronous pass's program for ``count`` micro-batches, built here and checked (None: the role's)."""
        role = self.role
        if role.schedule != ScheduleKind.ASYNC_ONE_F_ONE_B:
            return None
        actions = async_one_f_one_b(role.num_stages, count)[role.stage]
        program = async_program(actions, role.stage, role.num_stages, role.aggregate_every)
        check_program(program, role.stage, role.num_stages, replicated=False, asynchronous=True)
        return program

    def _infer(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Stream the call's micro-batches through my stage (pipelined inference)."""
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        reset_peak()
        try:
            stats = self.stream.run(inputs, int(header["num_micro_batches"]), self._abort_check)
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        outputs = {} if stats.outputs is None else {"outputs": stats.outputs.numpy()}
        send_message(self.sock, {"type": "inferred", "events": stats.events, "peak_held": stats.peak_held,
                                 "peak_rss_bytes": peak_rss_bytes(), "baseline_rss_bytes": self.baseline_rss},
                     outputs)

    def _replicate(self, header: dict[str, Any]) -> None:
        """Send my stage at ``version`` to my backup; keep the stages my peers send me (Asteroid §3.4).

        A replica is kept only once all of it arrived; an interrupted copy
        leaves the copies held before untouched.
        """
        version = int(header["version"])
        self._require_clean("replicate")
        if version != self.version:
            raise RuntimeError(f"asked to replicate version {version}, but my state is at version {self.version}")
        with_momentum = self._with_momentum()
        sends = []
        if header.get("to") is not None:
            state = {k: v for layer in self.stage_layers for k, v in self.state.layer_state(layer, version).items()}
            sends = [(int(header["to"]), [state[k] for k in sorted(state)])]
        receives = []
        for _source, rank, first, last in header.get("from", []):
            buffers = {}
            for layer in range(first, last + 1):
                buffers.update(self.state.empty_like_layer(layer, with_momentum))
            receives.append((int(rank), buffers))
        started = time.time()
        try:
            received = exchange_states(self.mesh, sends, [(rank, [b[k] for k in sorted(b)]) for rank, b in receives],
                                       tag=REPLICA_TAG, rate_bps=header.get("link_bps"), abort=self._abort_check,
                                       posted=lambda: self.traps.reached("replicate"))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        for _, buffers in receives:
            self.state.hold(version, buffers)
        send_message(self.sock, {"type": "replicated", "bytes": received, "seconds": time.time() - started})

    def _collect(self, header: dict[str, Any]) -> None:
        """My stage's live weights (+ momentum), from the first replica of a stage only."""
        self.traps.reached("global-copy")
        self._require_clean("send my weights")
        first_replica = self.role is not None and self.role.rank == self.role.replicas[0]
        state = {}
        if first_replica:
            with_momentum = bool(header.get("momentum"))
            state = as_arrays(self.state.capture(self.stage_layers, self._momentum(), with_momentum))
        send_message(self.sock, {"type": "weights", "version": self.version}, state)

    def _reconfigure(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Enter a new epoch at committed version ``restore``: roll back, take the new role, migrate the layers.

        Every layer held at that version is restored from my copies; the
        ``moves`` ([layer, from rank, to rank]) bring the rest from the ranks
        that hold them, and the portal's arrays (its global copy, or a heavy
        re-schedule) come last. Interrupted, the live state stays dirty and
        the copies untouched: the portal recovers again.
        """
        started = time.time()
        if header.get("recovery"):
            self.traps.reached("recover")
        version = int(header["restore"])
        if header.get("optimization") and self.settings is None:  # a device that joined a running pipeline
            self.settings = Optimization(**header["optimization"])
        self.clean = False
        momentum = self.state.restore(self.state.copies.get(version, {}))
        self.reference.update({k[len("reference/"):]: torch.from_numpy(np.array(v))
                               for k, v in arrays.items() if k.startswith("reference/")})
        from_portal = {k: v for k, v in arrays.items() if not k.startswith("reference/")}
        try:
            self._enter_epoch(header)
            sends, receives = [], []
            with_momentum = self._with_momentum()
            for layer, source_rank, target_rank in header.get("moves", []):
                if source_rank == target_rank:
                    continue  # restored from my own copy above
                if source_rank == self.mesh.rank:
                    state = self.state.layer_state(layer, version)
                    sends.append((target_rank, [state[k] for k in sorted(state)]))
                elif target_rank == self.mesh.rank:
                    receives.append((source_rank, self.state.empty_like_layer(layer, with_momentum)))
            received = exchange_states(self.mesh, sends, [(rank, [b[k] for k in sorted(b)]) for rank, b in receives],
                                       tag=MIGRATION_TAG, rate_bps=header.get("link_bps"), abort=self._abort_check,
                                       posted=lambda: self.traps.reached("migrate"))
        except INTERRUPTIONS as error:
            self._interrupted(error)
            return
        for _, buffers in receives:
            momentum.update(self.state.restore(buffers))
        momentum.update(self.state.restore(from_arrays(from_portal)))
        self._configure(momentum)
        self._commit(version)
        send_message(self.sock, {"type": "reconfigured", "bytes": received, "seconds": time.time() - started})

    def _send_state(self, header: dict[str, Any]) -> None:
        """Layers' committed state at a version, from my copies (heavy rescheduling's gather)."""
        version = int(header["version"])
        state = {}
        for layer in header["layers"]:
            state.update(self.state.layer_state(int(layer), version))
        arrays = as_arrays(state)
        pace(sum(a.nbytes for a in arrays.values()), header.get("link_bps"))
        send_message(self.sock, {"type": "state"}, arrays)

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
