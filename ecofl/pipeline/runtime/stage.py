"""One device's part of a sync-round, or of an asynchronous pass: its program (:mod:`ecofl.pipeline.instructions`).

The executor of Asteroid's worker (Fig. 11): a forward's input comes from
the portal (stage 0, ``load``) or from the previous stage's devices
(``recv_activation``), a backward's output gradient from the loss (last
stage) or from the next stage's devices (``recv_grad``), both taken from
what the tensor links' reader threads received (:mod:`ecofl.net.mesh`); ``send_*``
post results to the links' sender threads; a device of less than one core
waits for them to leave before it computes on (:mod:`.hand_off`).
Gradients accumulate over the sync-round's micro-batches and the weights
update once, at the pipeline flush (Eco-FL §4.1): in a replicated stage the
devices first sum their gradients with an all-reduce. The last stage scales each sample's
loss by 1 / mini-batch size (as :func:`ecofl.train.accumulate_gradients`
does), so the sum over replicas *is* the sample-weighted mean gradient.
Float buffers (batch-norm running statistics) of replicas are averaged
weighted by their shares.

Asynchronous 1F1B (FTPipeHD §III-C, ``ScheduleKind.ASYNC_ONE_F_ONE_B``) has
no flush: each backward is followed by that micro-batch's own optimizer
step, the forward and backward of a micro-batch use the same weight version
(:mod:`.weight_stash`), and ``aggregate_weights`` averages the stage's last
S - s versions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ecofl.accelerator import finish, host_copy, module_device
from ecofl.net.links import ALLREDUCE_TAG, AbortCheck, Ticket, never_aborted
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.cost import ring_allreduce_s
from ecofl.pipeline.instructions import (
    AggregateWeights,
    Backward,
    Forward,
    LoadMicroBatch,
    OptimizerStep,
    Program,
    RecvActivation,
    RecvGrad,
    ReduceGrads,
    SendActivation,
    SendGrad,
)
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.emulation import MemoryLedger, dilate, saved_bytes
from ecofl.pipeline.runtime.hand_off import hand_off_first
from ecofl.pipeline.runtime.layer_abort import abort_between_layers
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.weight_stash import WeightVersions
from ecofl.pipeline.schedule import ActionKind
from ecofl.train import add_proximal_gradient


@dataclass
class RoundStats:
    """What a device measured in one sync-round (times are time.time() stamps)."""

    events: list[tuple[str, int, float, float]] = field(default_factory=list)  # kind, micro-batch, start, end
    loss_sum: float = 0.0  # summed per-sample loss (last stage only)
    peak_resident: int = 0  # most forward tasks resident at once
    peak_activation_bytes: int = 0
    fixed_bytes: int = 0  # weights + gradients + optimizer state
    weight_versions: list[tuple[int, int, int]] = field(default_factory=list)  # asynchronous: (m, used, current)
    pass_cpu_s: float = 0.0  # measured: this thread's CPU seconds in its forwards and backwards


@dataclass(frozen=True)
class Optimization:
    """The local objective's settings for one ``train`` call (SGD, optional FedProx term)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    mu: float = 0.0


class ShareExecutor:
    """Runs one device's share of its stage (its layers, its samples of each micro-batch): the device program of
    each pass, from the mode's action list."""

    def __init__(self, role: WorkerRole, module: nn.Module, mesh: EpochMesh, timeout_s: float):
        self.role, self.module, self.mesh, self.timeout_s = role, module, mesh, timeout_s
        self.device = module_device(module)  # the worker's accelerator (or the CPU): received tensors go there
        self.params = list(module.parameters())
        self.buffers = [b for b in module.buffers() if b.is_floating_point()]
        # The emulated link to each neighbour (None: the kernel's pace)
        self.links = {p.rank: TokenBucket(p.bandwidth_bps) if p.bandwidth_bps else None
                      for p in role.sources + role.destinations}
        # ... and to the next replica of the stage's all-reduce ring (its slowest link, Asteroid eq. 5)
        self.ring_link = TokenBucket(role.allreduce_bps) if role.allreduce_bps else None
        self.slowdown = 1.0  # an injected load: every operation takes this many times as long
        self.pace = CpuPace.of_this_process()  # a confined device's operations: at its quota's pace
        self.reserved_bytes = 0  # replicas of other stages this device keeps (memory beside its own stage)
        self.abort: AbortCheck = never_aborted
        self.reached: Callable[[str], None] = lambda phase: None  # a phase point (:mod:`.traps`)
        self.optimizer: torch.optim.Optimizer | None = None
        self.settings: Optimization | None = None
        self.reference: list[torch.Tensor] = []
        window = mode_of(role).version_window(role.num_stages, role.stage)
        self.versions = WeightVersions(module, window) if window else None

    def configure(self, settings: Optimization, reference: list[torch.Tensor],
                  momentum_buffers: list[torch.Tensor | None] | None = None) -> None:
        """A fresh optimizer for one ``train`` call; ``reference`` is w_ref of FedProx per parameter.

        ``momentum_buffers`` (per parameter, None where SGD has none yet)
        continue an optimizer whose stage was re-planned or restored.
        """
        self.settings = settings
        self.reference = [r.to(self.device) for r in reference]
        if self.params:
            self.optimizer = torch.optim.SGD(
                self.params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay
            )
            for p, buffer in zip(self.params, momentum_buffers or []):
                if buffer is not None:
                    self.optimizer.state[p]["momentum_buffer"] = buffer.to(p.device, copy=True)

    def momentum_buffers(self) -> list[torch.Tensor | None]:
        """SGD's momentum buffer of each parameter (None before the first step or without momentum)."""
        if self.optimizer is None:
            return [None] * len(self.params)
        return [self.optimizer.state.get(p, {}).get("momentum_buffer") for p in self.params]

    def fixed_bytes(self) -> int:
        """MOD + OPT of Asteroid eq. 3: weights and accumulated gradients, buffers, momentum; plus replicas held."""
        weights = sum(p.numel() * p.element_size() for p in self.params)
        buffers = sum(b.numel() * b.element_size() for b in self.module.buffers())
        momentum = weights if self.settings is not None and self.settings.momentum > 0 else 0
        versions = self.versions.nbytes() if self.versions is not None else 0
        return 2 * weights + buffers + momentum + versions + self.reserved_bytes

    def run_round(self, inputs: torch.Tensor | None, labels: torch.Tensor | None, batch_size: int,
                  abort: AbortCheck = never_aborted, program: Program | None = None) -> RoundStats:
        """One sync-round: the role's program (or ``program``: an asynchronous pass's), instruction by instruction.
        ``inputs`` / ``labels``: [M, samples, ...]; each sample's loss is scaled by 1 / ``batch_size``.

        Gradients accumulate from zero: whatever an interrupted round left
        in ``.grad`` is dropped first. ``abort`` is checked in every wait and
        between layers (:mod:`.layer_abort`); an aborted round leaves weights,
        buffers and gradients half updated, so the caller restores the stage
        from a committed copy.
        """
        self.abort = abort
        try:
            with abort_between_layers(self.module, abort):
                return self._run_program(inputs, labels, batch_size, program)
        finally:
            self.abort = never_aborted

    def _run_program(self, inputs: torch.Tensor | None, labels: torch.Tensor | None, batch_size: int,
                     program: Program | None) -> RoundStats:
        role = self.role
        assert self.settings is not None, "configure() first"
        for p in self.params:
            p.grad = None
        stats = RoundStats(fixed_bytes=self.fixed_bytes())
        ledger = MemoryLedger(f"{role.device} ({role.device_name})", role.stage, role.memory_bytes, stats.fixed_bytes,
                              role.resident_bound, role.schedule, enforce=role.sleeps)
        program = role.program if program is None else program
        program = program if role.samples else tuple(i for i in program if i.micro_batch < 0)
        self.pace.refresh()
        sync_round = _SyncRound(inputs, labels, batch_size, time.time(), stats, ledger)
        self.module.train()
        for instruction in program:
            self._run[type(instruction)](self, sync_round, instruction.micro_batch)
        for m, ticket in sync_round.sends:
            ticket.wait(self.timeout_s, self.abort, "a send to the next or previous stage")
            stats.events.append((ActionKind.SEND, m, ticket.start, ticket.end))
        stats.peak_resident, stats.peak_activation_bytes = ledger.peak_count, ledger.peak_bytes
        if self.versions is not None:
            stats.weight_versions, self.versions.log = self.versions.log, []
        return stats

    def _load(self, r: "_SyncRound", m: int) -> None:
        x = r.inputs[m]
        if self.role.input_bps is not None:  # the portal sends micro-batches back to back from the start
            arrival = r.start + (m + 1) * x.numel() * x.element_size() / self.role.input_bps
            dilate(time.time(), arrival - time.time(), 1.0, self.abort)
        r.received[m] = x

    def _recv_activation(self, r: "_SyncRound", m: int) -> None:
        parts = [self.mesh.recv(p.rank, m, self.timeout_s, self.abort) for p in self.role.sources]
        r.received[m] = torch.cat(parts).to(self.device).requires_grad_()

    def _forward(self, r: "_SyncRound", m: int) -> None:
        role = self.role
        x = r.received.pop(m)
        self.reached("forward")
        started = self.pace.begin()
        weights = self.params + (self.versions.current() if self.versions is not None else [])
        with saved_bytes(weights) as nbytes:  # what the forward saves for backward, weights not counted
            out = self.versions.forward(x, m) if self.versions is not None else self.module(x)
            if role.stage == role.num_stages - 1:
                summed = F.cross_entropy(out, r.labels[m], reduction="sum")
                r.stats.loss_sum += summed.item()
                out = summed / r.batch_size
        end = self._end(started, role.forward_s)
        r.stats.pass_cpu_s += time.thread_time() - started[1]
        r.stats.events.append((ActionKind.FORWARD, m, started[0], end))
        r.ledger.forward(m, nbytes[0])
        r.stash[m] = (x, out)

    def _send_activation(self, r: "_SyncRound", m: int) -> None:
        out = r.stash[m][1]
        for p in self.role.destinations:
            part = out[p.lo - self.role.lo : p.hi - self.role.lo]
            r.sends.append((m, self.mesh.send(p.rank, part, m, self.links[p.rank])))
            self.reached("send")
        self._hand_off_first(r, len(self.role.destinations))

    def _hand_off_first(self, r: "_SyncRound", posted: int) -> None:
        """The ``posted`` hand-offs just posted leave before the next pass, on a device of less than one core."""
        hand_off_first(self.pace, (ticket for _, ticket in r.sends[len(r.sends) - posted:]), self.timeout_s,
                       self.abort)

    def _recv_grad(self, r: "_SyncRound", m: int) -> None:
        r.output_grads[m] = torch.cat([self.mesh.recv(p.rank, m, self.timeout_s, self.abort)
                                       for p in self.role.destinations]).to(self.device)

    def _backward(self, r: "_SyncRound", m: int) -> None:
        x, out = r.stash.pop(m)
        self.reached("backward")
        started = self.pace.begin()
        out.backward(r.output_grads.pop(m, None))  # the last stage's output is the scaled loss
        if self.versions is not None:  # at the version the forward used, for this micro-batch's own step
            r.step_grads[m] = self.versions.gradients(m)
        end = self._end(started, self.role.backward_s)
        r.stats.pass_cpu_s += time.thread_time() - started[1]
        r.stats.events.append((ActionKind.BACKWARD, m, started[0], end))
        r.ledger.backward(m)
        r.input_grads[m] = x.grad

    def _send_grad(self, r: "_SyncRound", m: int) -> None:
        grad = r.input_grads.pop(m)
        for p in self.role.sources:
            part = grad[p.lo - self.role.lo : p.hi - self.role.lo]
            r.sends.append((m, self.mesh.send(p.rank, part, m, self.links[p.rank])))
            self.reached("send")
        self._hand_off_first(r, len(self.role.sources))

    def _reduce_grads(self, r: "_SyncRound", m: int) -> None:
        """Sum gradients over the stage's replicas, average float buffers by share (Asteroid §4): in one ring."""
        role = self.role
        self.reached("allreduce")
        started = self.pace.begin()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        summed = self._all_reduce_together(grads + [b * role.replica_weight for b in self.buffers])
        for p, reduced in zip(self.params, summed):
            p.grad = reduced
        for b, reduced in zip(self.buffers, summed[len(grads):]):
            b.copy_(reduced)
        emulated = None
        if role.allreduce_bps is not None:  # the cost model's ring: the gradients' bytes (the buffers, ~1%, not)
            emulated = ring_allreduce_s(_bytes(self.params), len(role.replicas), role.allreduce_bps)
        r.stats.events.append((ActionKind.ALLREDUCE, -1, started[0], self._end(started, emulated)))

    def _all_reduce_together(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` summed over the stage's replicas, flattened into one ring all-reduce per dtype (one in
        all, as a rule): every ring costs each device 4(n-1) messages of the runtime's own time
        (:func:`ecofl.pipeline.cost.ring_messages_s`) and, on a real link, 2(n-1) round trips; on a confined
        Raspberry Pi one ring spent 10-20% less CPU than a ring each for gradients and buffers, in no
        measurably shorter time (benchmarks/allreduce_confined.py). Summed in place: a lone tensor's flat view
        is its own storage, which the sum replaces anyway."""
        summed: list[torch.Tensor] = list(tensors)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, tensor in enumerate(tensors):
            by_dtype.setdefault(tensor.dtype, []).append(i)
        for indices in by_dtype.values():  # in the parameters' order: the same rings on every replica
            group = [tensors[i] for i in indices]
            flat = self.mesh.all_reduce(host_copy(_flatten_dense_tensors(group)), self.role.replicas, ALLREDUCE_TAG,
                                        self.abort, self.ring_link).to(self.device)
            for i, reduced in zip(indices, _unflatten_dense_tensors(flat, group)):
                summed[i] = reduced
        return summed

    def _optimizer_step(self, r: "_SyncRound", m: int) -> None:
        """FedProx term, then one optimizer step for the mini-batch (Eco-FL §4.1 flush); asynchronous
        (``m`` >= 0): micro-batch m's step, with the gradient taken at its stashed version (PipeDream)."""
        started = self.pace.begin()
        if m >= 0:
            for p, grad in zip(self.params, r.step_grads.pop(m)):
                p.grad = grad
        if self.settings.mu > 0:
            add_proximal_gradient(self.params, self.reference, self.settings.mu)
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.reached("step")
        if self.versions is not None:
            self.versions.stepped()
        r.stats.events.append((ActionKind.STEP, m, started[0], self._end(started, self.role.step_s)))

    def _aggregate_weights(self, r: "_SyncRound", m: int) -> None:
        """FTPipeHD §III-C: the stage's weights become the mean of its last S - s versions."""
        self.versions.aggregate()

    _run = {
        LoadMicroBatch: _load, RecvActivation: _recv_activation, Forward: _forward,
        SendActivation: _send_activation, RecvGrad: _recv_grad, Backward: _backward, SendGrad: _send_grad,
        ReduceGrads: _reduce_grads, OptimizerStep: _optimizer_step, AggregateWeights: _aggregate_weights,
    }

    def _end(self, started: tuple[float, float], emulated_s: float | None) -> float:
        """End of an operation begun at ``started``: dilated to the emulated device's pace if sleeping, at
        least its CPU time over the device's cores if confined (:mod:`.cpu_pace`).

        A GPU's queued kernels are waited for first, so that the time is the operation's, not its launch's."""
        finish(self.device)
        if not self.role.sleeps:
            return self.pace.end(started, self.abort)
        emulated = None if emulated_s is None else emulated_s * self.slowdown
        return dilate(started[0], emulated, self.role.speed / self.slowdown, self.abort)


class _SyncRound:
    """One sync-round's data in flight on this device: what arrived, what waits for its backward or its send."""

    def __init__(self, inputs, labels, batch_size: int, start: float, stats: RoundStats, ledger: MemoryLedger):
        self.inputs, self.labels, self.batch_size, self.start = inputs, labels, batch_size, start
        self.stats, self.ledger = stats, ledger
        self.sends: list[tuple[int, Ticket]] = []  # (micro-batch, its posted send)
        self.received: dict[int, torch.Tensor] = {}  # micro-batch -> forward input
        self.stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (input, output) until backward
        self.output_grads: dict[int, torch.Tensor] = {}
        self.input_grads: dict[int, torch.Tensor] = {}
        self.step_grads: dict[int, list[torch.Tensor | None]] = {}  # asynchronous: micro-batch -> its gradient


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
