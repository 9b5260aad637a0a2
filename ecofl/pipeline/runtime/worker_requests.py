"""What a joined worker does: the portal's requests, for every sync-round, epoch and re-plan.

:class:`Worker` holds a device's model, its role in the current pipeline
epoch and that role's executor, and serves the portal's requests::

    epoch        a pipeline epoch: my role, my rank, every rank's data port  -> entered
    setup        stage weights (+ FedProx reference), optimizer settings       -> ok
    weights      stage weights (inference)                                     -> loaded
    infer        stage 0: inputs [M, share, ...]; stream M micro-batches       -> inferred + events (+ outputs)
    state        layers' state at a version (heavy rescheduling's gather)      -> state
    round        stage 0: inputs [M, share, ...]; last stage: labels           -> done + measurements
    abort        (while in a round, or idle)                                   -> interrupted
    replicate    send my committed stage to my backup / keep others' replicas  -> replicated
    collect      my stage's weights (+ momentum)                               -> weights
    reconfigure  a new epoch: role, roll back to a version, migrate layers     -> reconfigured
    stop                                                                       -> (session over)

A sync-round that cannot finish (a peer died or froze, the portal aborted)
answers ``interrupted`` and the worker waits for a ``reconfigure``: its stage
is rolled back to the snapshot of a committed version, so a half-done round
is never applied (Asteroid §3.4's pipeline replay). With ``heartbeat`` in its
config a thread of its own beats to the portal (:mod:`.heartbeat`).
The process around it (joining, sessions) is :mod:`.worker`.
"""

from __future__ import annotations

import selectors
import time
from typing import Any

import numpy as np
import torch

from ecofl.pipeline.instructions import Program, async_program, check_program
from ecofl.pipeline.runtime.heartbeat import HeartbeatSender
from ecofl.pipeline.runtime.links import MIGRATION_TAG, REPLICA_TAG, PeerLost, RoundAborted
from ecofl.pipeline.runtime.mesh import DataListener, EpochMesh
from ecofl.pipeline.runtime.migration_io import exchange_states, pace
from ecofl.pipeline.runtime.model_spec import spec_from_json, stage_module
from ecofl.pipeline.runtime.process_memory import peak_rss_bytes, reset_peak
from ecofl.pipeline.runtime.sealed import SealedSocket
from ecofl.pipeline.runtime.stage import Optimization, StageExecutor
from ecofl.pipeline.runtime.stage_state import StageState, as_arrays, from_arrays
from ecofl.pipeline.runtime.stream_stage import StreamExecutor
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.wire import recv_message, send_message
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
        self.version = 0
        self.replica_version: int | None = None
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
                              self.timeout_s)
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
        if self.role.schedule == "stream":
            self.stream = StreamExecutor(self.role, module, self.mesh, self.timeout_s)
            return
        self.executor = StageExecutor(self.role, module, self.mesh, self.timeout_s)
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

    def _snapshot(self) -> None:
        """Keep the committed state of ``version`` (and of the version the backup holds)."""
        if not self.keeps_snapshots or self.executor is None:
            return
        if self.version not in self.state.snapshots:
            self.state.snapshots[self.version] = self.state.capture(self.stage_layers, self._momentum(),
                                                                    self._with_momentum())
        keep = {self.version} | ({self.replica_version} if self.replica_version is not None else set())
        self.state.keep_snapshots(keep)

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
                send_message(self.sock, {"type": "interrupted", "reason": "aborted while idle",
                                         "token": header.get("token")})
            elif kind == "state":
                self._send_state(header)
            elif kind == "replicate":
                self._replicate(header)
            elif kind == "collect":
                self._collect(header)
            elif kind == "reconfigure":
                self._reconfigure(header, arrays)
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
        self.version, self.replica_version = 0, None
        self.state.snapshots.clear()
        self.state.replicas.clear()
        self._configure({})

    def _round(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.version = int(header.get("version", self.version))
        self._snapshot()
        executor = self.executor
        executor.slowdown = float(header.get("slowdown", 1.0))
        executor.reserved_bytes = self.state.replica_bytes()
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        labels = torch.from_numpy(arrays["labels"]) if "labels" in arrays else None
        reset_peak()
        try:
            stats = executor.run_round(inputs, labels, int(header["batch_size"]), self._abort_check,
                                       self._pass_program(int(header["num_micro_batches"])))
        except INTERRUPTIONS as error:
            token = error.args[0] if isinstance(error, RoundAborted) and error.args else None
            send_message(self.sock, {"type": "interrupted", "reason": f"{type(error).__name__}: {error}",
                                     "token": token})
            return
        self.version += 1
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
        if role.schedule != "async-1f1b":
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
            send_message(self.sock, {"type": "interrupted", "reason": f"{type(error).__name__}: {error}"})
            return
        outputs = {} if stats.outputs is None else {"outputs": stats.outputs.numpy()}
        send_message(self.sock, {"type": "inferred", "events": stats.events, "peak_held": stats.peak_held,
                                 "peak_rss_bytes": peak_rss_bytes(), "baseline_rss_bytes": self.baseline_rss},
                     outputs)

    def _replicate(self, header: dict[str, Any]) -> None:
        """Send my stage at ``version`` to my backup; keep the stages my peers send me (Asteroid §3.4)."""
        version = int(header["version"])
        self.version = version
        self._snapshot()
        with_momentum = self._with_momentum()
        sends = []
        if header.get("to") is not None:
            state = self.state.snapshots[version]
            sends = [(int(header["to"]), [state[k] for k in sorted(state)])]
        receives = {}
        for source, rank, first, last in header.get("from", []):
            buffers = {}
            for layer in range(first, last + 1):
                buffers.update(self.state.empty_like_layer(layer, with_momentum))
            receives[(int(source), int(rank))] = buffers
        started = time.time()
        received = exchange_states(self.mesh, sends, [(rank, [b[k] for k in sorted(b)])
                                                         for (_, rank), b in receives.items()],
                                   tag=REPLICA_TAG, rate_bps=header.get("link_bps"))
        self.state.replicas = {source: (version, buffers) for (source, _), buffers in receives.items()}
        self.replica_version = version
        send_message(self.sock, {"type": "replicated", "bytes": received, "seconds": time.time() - started})

    def _collect(self, header: dict[str, Any]) -> None:
        first_replica = self.role is not None and self.role.rank == self.role.replicas[0]
        state = {}
        if first_replica:
            with_momentum = bool(header.get("momentum"))
            state = as_arrays(self.state.capture(self.stage_layers, self._momentum(), with_momentum))
        send_message(self.sock, {"type": "weights", "version": self.version}, state)

    def _reconfigure(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Enter a new epoch: roll back to ``restore``, take the new role, migrate the layers it lacks."""
        started = time.time()
        version = int(header["restore"])
        if header.get("optimization") and self.settings is None:  # a device that joined a running pipeline
            self.settings = Optimization(**header["optimization"])
            self.version = version
        if version == self.version:
            self._snapshot()  # re-planned between sync-rounds: the current state is the one to keep
        momentum = self.state.restore(self.state.snapshots[version]) if version in self.state.snapshots else {}
        self.reference.update({k[len("reference/"):]: torch.from_numpy(np.array(v))
                               for k, v in arrays.items() if k.startswith("reference/")})
        from_portal = {k: v for k, v in arrays.items() if not k.startswith("reference/")}
        momentum.update(self.state.restore(from_arrays(from_portal)))
        self._enter_epoch(header)
        sends, receives, targets = [], [], []
        with_momentum = self._with_momentum()
        for layer, source_rank, target_rank, replica_of in header.get("moves", []):
            if source_rank == self.mesh.rank and target_rank == self.mesh.rank:  # from the replica I hold
                momentum.update(self.state.restore(self.state.layer_state(layer, version, replica_of)))
            elif source_rank == self.mesh.rank:
                state = self.state.layer_state(layer, version, replica_of)
                sends.append((target_rank, [state[k] for k in sorted(state)]))
            elif target_rank == self.mesh.rank:
                buffers = self.state.empty_like_layer(layer, with_momentum)
                receives.append((source_rank, [buffers[k] for k in sorted(buffers)]))
                targets.append(buffers)
        received = exchange_states(self.mesh, sends, receives, tag=MIGRATION_TAG, rate_bps=header.get("link_bps"))
        for buffers in targets:
            momentum.update(self.state.restore(buffers))
        self.version, self.replica_version = version, None
        self.state.snapshots.clear()
        self.state.replicas.clear()
        self._configure(momentum)
        self._snapshot()
        send_message(self.sock, {"type": "reconfigured", "bytes": received, "seconds": time.time() - started})

    def _send_state(self, header: dict[str, Any]) -> None:
        """Layers' state at a version, from my snapshot or a replica I hold (heavy rescheduling's gather)."""
        version, replica_of = int(header["version"]), header.get("replica_of")
        state = {}
        for layer in header["layers"]:
            state.update(self.state.layer_state(int(layer), version, replica_of))
        arrays = as_arrays(state)
        pace(sum(a.nbytes for a in arrays.values()), header.get("link_bps"))
        send_message(self.sock, {"type": "state"}, arrays)

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
