"""One device's part of pipelined inference (PipeEdge): forward only, micro-batches streaming with back-pressure.

The executor runs :func:`ecofl.pipeline.instructions.stream_program`: for
each micro-batch, its input (the portal's data on stage 0, else the previous
stage's devices), the stage's forward in evaluation mode without autograd,
and its output (to the next stage's devices, or back to the portal from the
last stage). There is no backward and no flush: micro-batches follow each
other as fast as the slowest stage allows.

Holding, as the stream cost model (:mod:`ecofl.pipeline.stream`) assumes: a
device holds a micro-batch from the moment it arrives until its output has
been sent on, and at most ``role.resident_bound`` (K) at once. A device
sends micro-batch m to a device of the next stage only when that device has
room, i.e. has released micro-batch m - K_next; a device that releases a
micro-batch tells each of its sources with a *credit* (a tiny tensor under
:data:`~ecofl.net.links.CREDIT_TAG`). Stage 0's input crosses
the portal's emulated link when the device has room; the last stage's
output crosses the link back (emulated, else at once). Measured events:
``recv`` (an input's transfer from the portal), ``F``, ``send`` (to the next
stage), ``output`` (the result back at the portal).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ecofl.accelerator import finish, module_device
from ecofl.pipeline.instructions import Forward, LoadMicroBatch, RecvActivation, SendActivation, SendOutput, \
    stream_program
from ecofl.net.links import CREDIT_TAG, POLL_S, AbortCheck, RoundAborted, Ticket, never_aborted
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.emulation import dilate
from ecofl.pipeline.runtime.hand_off import hand_off_first
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.schedule import ActionKind


@dataclass
class StreamStats:
    """What a device measured in one stream (times are time.time() stamps)."""

    events: list[tuple[str, int, float, float]] = field(default_factory=list)  # kind, micro-batch, start, end
    outputs: torch.Tensor | None = None  # last stage: [micro-batches, my samples, ...]
    peak_held: int = 0  # most micro-batches held at once


class StreamExecutor:
    """Runs streams of one device's inference role on its stage module."""

    def __init__(self, role: WorkerRole, module: nn.Module, mesh: EpochMesh, timeout_s: float):
        self.role, self.module, self.mesh, self.timeout_s = role, module, mesh, timeout_s
        self.device = module_device(module)  # the worker's accelerator (or the CPU)
        self.links = {p.rank: TokenBucket(p.bandwidth_bps) if p.bandwidth_bps else None for p in role.destinations}
        self.pace = CpuPace.of_this_process()  # a confined device's forwards: at its quota's pace

    def run(self, inputs: torch.Tensor | None, num_micro_batches: int, abort: AbortCheck = never_aborted
            ) -> StreamStats:
        """Stream ``num_micro_batches`` micro-batches (``inputs``: stage 0's [M, my samples, ...]).

        A device whose share of the micro-batch is empty (a plan may give one none) has nothing to do.
        """
        if self.role.samples == 0:
            return StreamStats()
        self.pace.refresh()
        stream = _Stream(self.role, self.mesh, num_micro_batches, abort, self.timeout_s, inputs)
        run = {LoadMicroBatch: self._load, RecvActivation: self._receive, Forward: self._forward,
               SendActivation: self._send, SendOutput: self._output}
        self.module.eval()
        try:
            with torch.no_grad():
                for instruction in stream_program(self.role.stage, self.role.num_stages, num_micro_batches):
                    run[type(instruction)](stream, instruction.micro_batch, inputs)
            stream.wait_released(num_micro_batches)
        finally:
            stream.close()
        stats = stream.stats
        if stream.outputs:
            stats.outputs = torch.stack([stream.outputs[m] for m in range(num_micro_batches)])
        return stats

    def _load(self, stream: "_Stream", m: int, inputs: torch.Tensor | None) -> None:
        """The portal's micro-batch m, once it has crossed the portal's link (:class:`_InputLink`)."""
        stream.wait_loaded(m)
        stream.arrived[m] = inputs[m]

    def _receive(self, stream: "_Stream", m: int, inputs: torch.Tensor | None) -> None:
        parts = [self.mesh.recv(p.rank, m, self.timeout_s, stream.abort) for p in self.role.sources]
        stream.hold(m, time.time())
        stream.arrived[m] = torch.cat(parts).to(self.device)

    def _forward(self, stream: "_Stream", m: int, inputs: torch.Tensor | None) -> None:
        started = self.pace.begin()
        y = self.module(stream.arrived.pop(m))
        finish(self.device)  # a GPU's forward is timed once its kernels are done
        end = (dilate(started[0], self.role.forward_s, self.role.speed, stream.abort) if self.role.sleeps
               else self.pace.end(started, stream.abort))
        stream.event(ActionKind.FORWARD, m, started[0], end)
        stream.results[m] = y

    def _send(self, stream: "_Stream", m: int, inputs: torch.Tensor | None) -> None:
        """Each device of the next stage gets its samples of m once it has room (a credit for m - K_next)."""
        y = stream.results.pop(m)
        role = self.role
        tickets = []
        for p in role.destinations:
            if m >= role.next_hold:
                self.mesh.recv(p.rank, CREDIT_TAG, self.timeout_s, stream.abort)
            part = y[p.lo - role.lo : p.hi - role.lo].contiguous()
            tickets.append(self.mesh.send(p.rank, part, m, self.links[p.rank]))
        stream.release_after(m, tickets)
        hand_off_first(self.pace, tickets, self.timeout_s, stream.abort)

    def _output(self, stream: "_Stream", m: int, inputs: torch.Tensor | None) -> None:
        """The result goes back to the portal (over the emulated link when there is one)."""
        y = stream.results.pop(m)
        stream.outputs[m] = y
        stream.to_portal(m, y.numel() * y.element_size())


class _Stream:
    """One stream's state on this device: what arrived, what is held, released, and measured."""

    def __init__(self, role: WorkerRole, mesh: EpochMesh, count: int, abort: AbortCheck, timeout_s: float,
                 inputs: torch.Tensor | None):
        self.role, self.mesh, self.abort, self.timeout_s = role, mesh, abort, timeout_s
        self.stats = StreamStats()
        self.arrived: dict[int, torch.Tensor] = {}
        self.results: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._held: set[int] = set()
        self._loaded: set[int] = set()
        self._released: set[int] = set()
        self._changed = threading.Condition()
        self._errors: list[BaseException] = []
        self._stopped = threading.Event()
        self._portal_link: _PortalLink | None = None
        self._input_link: _InputLink | None = None
        if role.stage == role.num_stages - 1:
            self._portal_link = _PortalLink(role.output_bps, self._delivered)
        if role.stage == 0:
            self._input_link = _InputLink(self, inputs, count)

    def over(self) -> None:
        """The abort check of the stream's helper threads (only the executor's thread reads the portal's abort)."""
        if self._stopped.is_set():
            raise RoundAborted("the stream is over")

    def event(self, kind: ActionKind, m: int, start: float, end: float) -> None:
        with self._changed:
            self.stats.events.append((kind, m, start, end))

    def hold(self, m: int, start: float) -> None:
        with self._changed:
            self._held.add(m)
            self.stats.peak_held = max(self.stats.peak_held, len(self._held))

    def wait_room(self, m: int) -> None:
        """Until micro-batch m - K is released (this device holds at most K)."""
        self._wait(lambda: m < self.role.resident_bound or m - self.role.resident_bound in self._released,
                   f"room for micro-batch {m}", self.over)

    def wait_released(self, count: int) -> None:
        self._wait(lambda: len(self._released) == count, "the last outputs to leave", self.abort)

    def wait_loaded(self, m: int) -> None:
        self._wait(lambda: m in self._loaded, f"micro-batch {m} from the portal", self.abort)

    def loaded(self, m: int, start: float, end: float) -> None:
        """The portal's micro-batch m has crossed its link (held since ``start``)."""
        self.event(ActionKind.RECV, m, start, end)
        with self._changed:
            self._loaded.add(m)
            self._changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._changed:
            self._errors.append(error)
            self._changed.notify_all()

    def _wait(self, ready, what: str, abort: AbortCheck) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._changed:
            while not ready():
                if self._errors:
                    raise self._errors[0]
                self._changed.wait(POLL_S)
                if not ready():
                    abort()
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"waited {self.timeout_s:.0f} s for {what}")

    def release_after(self, m: int, tickets: list[Ticket]) -> None:
        """Release m once every part of it has been sent on."""
        left = [len(tickets)]

        def sent(ticket: Ticket) -> None:
            if ticket.error is not None:
                self.fail(ticket.error)
                return
            self.event(ActionKind.SEND, m, ticket.start, ticket.end)
            with self._changed:
                left[0] -= 1
                done = left[0] == 0
            if done:
                self._release(m)

        for ticket in tickets:
            ticket.then(sent)

    def to_portal(self, m: int, nbytes: int) -> None:
        self._portal_link.put(m, nbytes)

    def _delivered(self, m: int, start: float, end: float) -> None:
        self.event(ActionKind.OUTPUT, m, start, end)
        self._release(m)

    def _release(self, m: int) -> None:
        """Micro-batch m has left this device: room for another, and a credit to each source.

        The room is made before the credits go: a source that gets a credit may send the next micro-batch at
        once, and it must find m gone (else this device briefly counts K + 1 held)."""
        with self._changed:
            self._held.discard(m)
            self._released.add(m)
            self._changed.notify_all()
        for p in self.role.sources:
            self.mesh.send(p.rank, torch.zeros(1), CREDIT_TAG)

    def close(self) -> None:
        self._stopped.set()
        if self._portal_link is not None:
            self._portal_link.close()
        if self._input_link is not None:
            self._input_link.close()


class _InputLink:
    """The portal's link to a stage-0 device: micro-batch m starts across it once the device has room for m,
    in order, paced when emulated (the portal sends from its own data, so it never waits for anything else)."""

    def __init__(self, stream: _Stream, inputs: torch.Tensor, count: int):
        self.stream = stream
        self._thread = threading.Thread(target=self._run, args=(inputs, count), daemon=True, name="from-portal")
        self._thread.start()

    def _run(self, inputs: torch.Tensor, count: int) -> None:
        stream, rate = self.stream, self.stream.role.input_bps
        link = TokenBucket(rate, burst_bytes=0) if rate else None
        try:
            for m in range(count):
                stream.wait_room(m)
                start = time.time()
                stream.hold(m, start)
                if link is not None:
                    link.consume(inputs[m].numel() * inputs[m].element_size(), stream.over)
                stream.loaded(m, start, time.time() if link is not None else start)
        except RoundAborted:
            return  # the stream ended (or failed) before every input crossed
        except BaseException as error:  # noqa: BLE001 - handed to the executor's waits
            stream.fail(error)

    def close(self) -> None:
        self._thread.join(timeout=5)


class _PortalLink:
    """The last stage's link back to the portal: results cross it in order, paced when emulated."""

    def __init__(self, rate_bps: float | None, delivered):
        self.link = TokenBucket(rate_bps, burst_bytes=0) if rate_bps else None
        self.delivered = delivered
        self._queue: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="to-portal")
        self._thread.start()

    def put(self, m: int, nbytes: int) -> None:
        self._queue.put((m, nbytes))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            m, nbytes = item
            start = time.time()
            if self.link is not None:
                self.link.consume(nbytes)
            self.delivered(m, start, time.time() if self.link is not None else start)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
