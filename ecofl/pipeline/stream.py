"""Cost model of pipelined inference: micro-batches streaming forward through a plan's stages (PipeEdge).

A stream plan (``Plan.schedule`` is ``ScheduleKind.STREAM``, from ``make_plan(...,
objective="inference")``) runs forward only: no backward, no flush, no
optimizer. It is played by the cost model's event loop
(:func:`ecofl.pipeline.event_simulation.run`), each stage's actions a
forward per micro-batch. What is simulated, on the devices, links and sample
ranges of the training cost model (:mod:`ecofl.pipeline.cost`):

- **Compute.** Each device of a stage runs the forward of its share of every
  micro-batch, in order, as soon as the micro-batch has arrived (host time
  interpolated at the share, scaled by the device's speed).
- **Transfers.** A device sends each micro-batch's output samples to the
  devices of the next stage whose sample ranges overlap (a_l x samples over
  the pair's link). The portal (device 0) holds the data: it sends the inputs
  to stage 0's other devices and receives the last stage's outputs (the
  logits: the home wants the predictions). Every ordered device pair is a
  FIFO channel, full duplex, and sending is asynchronous, so communication
  overlaps computation: a stage's time per micro-batch is
  max(forward, transfer) at best (PipeEdge eq. 2) and forward + transfer at
  worst.
- **Holding (back-pressure).** A device of stage s holds at most
  K_s = ``in_flight`` micro-batches: one is held from the start of its
  transfer in (the start of its forward, for the portal's own share of
  stage 0) until its output has been sent on (computed, on the portal). A
  transfer into a full device waits. K = 3 (:data:`STREAM_IN_FLIGHT`) lets a
  device receive one micro-batch while it computes another and sends a third.

Predictions (:class:`StreamCost`): the steady-state throughput (the stream is
long enough that its second half repeats with the bottleneck's period; the
period is bounded below by the slowest device's forward and the slowest
channel's transfer of one micro-batch, which the second half of a short
stream, still filling, could otherwise undercut), the
per-sample latency (a sample's micro-batch from leaving the portal until its
result is back there), each stage's steady-state busy fraction, and the
timeline of every forward and transfer for a Gantt chart.

**Memory** per device, for ``y`` samples of each micro-batch and K held:

    MEM = W + y * (K * (x_in + x_out) + T)

with W the stage's weight bytes (no gradients, no optimizer state), x_in and
x_out the bytes per sample of the stage's input and output (a held
micro-batch keeps one or both), and T the working set of the forward running,
the largest of the stage's layers' stash + output per sample (what a layer
computes and autograd would keep for backward, here freed as soon as the next
layer has read it). Nothing is kept for backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ecofl.devices import HomePool
from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan, check_plan, sample_ranges
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.event_simulation import Fifo, Worker, run
from ecofl.pipeline.schedule import Action, ActionKind
from ecofl.pipeline.timeline import TimelineEvent

#: The simulated stream is at least this many micro-batches per stage, so that
#: its second half is in the steady state (each stage fills within K of them).
STEADY_MICRO_BATCHES_PER_STAGE = 8


@dataclass(frozen=True)
class StreamCost:
    """Simulated stream of a plan; per-stage tuples are indexed by stage."""

    num_micro_batches: int  # micro-batches streamed
    stream_s: float  # first input leaves the portal -> last result back at the portal
    stream_throughput: float  # samples per second over the whole stream, fill and drain included
    throughput: float  # samples per second in the steady state: micro_batch / period_s
    period_s: float  # steady-state interval between results (one micro-batch)
    latency_s: float  # steady-state seconds from a sample leaving the portal to its result there
    first_latency_s: float  # the same for the first micro-batch, through an empty pipeline
    stage_forward_s: tuple[float, ...]  # forward seconds of a micro-batch on the stage's slowest device
    stage_send_s: tuple[float, ...]  # the longest transfer of a micro-batch's output (to the next stage or portal)
    busy_fraction: tuple[float, ...]  # steady state: stage_forward_s / period_s
    stage_memory_bytes: tuple[int, ...]  # peak over the stage's devices (module docstring)
    device_memory_bytes: dict[int, int]  # per pool device index that is used
    device_busy_s: dict[int, float]  # forward seconds over the whole stream
    timeline: tuple[TimelineEvent, ...]


def stream_stage_memory_bytes(profile: ModelProfile, layers: tuple[int, int], samples: int, resident: int) -> int:
    """MEM = W + y * (K * (x_in + x_out) + T) of one device (module docstring)."""
    first, last = layers
    weights = int(profile.weight_bytes[first : last + 1].sum())
    x_in = profile.input_bytes if first == 0 else int(profile.activation_bytes[first - 1])
    x_out = int(profile.activation_bytes[last])
    working = int(max(profile.stash_bytes[l] + profile.activation_bytes[l] for l in range(first, last + 1)))
    return weights + samples * (resident * (x_in + x_out) + working)


def stream_memory_per_stage(plan: Plan, profile: ModelProfile) -> list[int]:
    """Peak bytes of each stage's most loaded device while streaming ``plan``."""
    _check_stream(plan)
    return [
        max(stream_stage_memory_bytes(profile, stage.layers, share, stage.in_flight) for share in stage.shares)
        for stage in plan.stages
    ]


def simulate_stream(
    plan: Plan, profile: ModelProfile, pool: HomePool, num_micro_batches: int | None = None,
    operation_overhead_s: float = 0.0, byte_overhead_s: float = 0.0,
) -> StreamCost:
    """Simulate streaming micro-batches through ``plan`` (see the module docstring for the model).

    ``num_micro_batches`` defaults to the plan's horizon, and at least
    :data:`STEADY_MICRO_BATCHES_PER_STAGE` per stage. As in the training
    model (:func:`ecofl.pipeline.cost.simulate`), every forward may cost the
    runtime's own ``operation_overhead_s`` and every byte a device receives or
    sends ``byte_overhead_s`` (host seconds, at the device's speed): what a
    confined or host-speed run pays besides the layers
    (:mod:`ecofl.pipeline.runtime.host_overhead`).
    """
    _check_stream(plan)
    check_plan(plan, profile, pool)
    count = num_micro_batches if num_micro_batches is not None else max(
        plan.num_micro_batches, STEADY_MICRO_BATCHES_PER_STAGE * len(plan.stages)
    )
    if count < 1:
        raise ValueError(f"need at least one micro-batch, got {count}")
    stages = _workers(plan, profile, pool, count, operation_overhead_s, byte_overhead_s)
    timeline: list[TimelineEvent] = []
    actions = [[Action(s, ActionKind.FORWARD, m) for m in range(count)] for s in range(len(stages))]
    run(stages, actions, Fifo(), timeline)
    # A micro-batch is admitted when its inputs leave the portal (its forward starts, on the portal's own share).
    admitted = [np.inf] * count
    for event in timeline:
        if (event.stage, event.kind) == (-1, ActionKind.SEND) or \
                (event.stage, event.device, event.kind) == (0, 0, ActionKind.FORWARD):
            admitted[event.micro_batch] = min(admitted[event.micro_batch], event.start)
    done = [max(w.release[m] for w in stages[-1]) for m in range(count)]

    half = count // 2
    stream_s = done[-1] - min(admitted)
    forward = [max(w.forward_s for w in workers) for workers in stages]
    send = [max((sec for w in workers for _, sec in w.send_f), default=0.0) for workers in stages]
    # Every device computes its share of every micro-batch and every channel carries it, so the slowest
    # resource bounds the steady-state period from below; a short stream's second half can still carry
    # some fill (a late micro-batch from a device that started late), which would make it look faster.
    measured = (done[-1] - done[half - 1]) / (count - half) if count > 1 else stream_s
    period = max(measured, *forward, *send)
    latencies = [done[m] - admitted[m] for m in range(half, count)]
    device_memory = {
        device: stream_stage_memory_bytes(profile, stage.layers, share, stage.in_flight)
        for stage in plan.stages for device, share in zip(stage.devices, stage.shares)
    }
    return StreamCost(
        num_micro_batches=count,
        stream_s=stream_s,
        stream_throughput=count * plan.micro_batch / stream_s if stream_s > 0 else float("inf"),
        throughput=plan.micro_batch / period if period > 0 else float("inf"),
        period_s=period,
        latency_s=float(np.mean(latencies)),
        first_latency_s=done[0] - admitted[0],
        stage_forward_s=tuple(forward),
        stage_send_s=tuple(send),
        busy_fraction=tuple(min(1.0, f / period) if period > 0 else 0.0 for f in forward),
        stage_memory_bytes=tuple(max(device_memory[d] for d in stage.devices) for stage in plan.stages),
        device_memory_bytes=device_memory,
        device_busy_s={w.device: w.busy for workers in stages for w in workers},
        timeline=tuple(timeline),
    )


def _check_stream(plan: Plan) -> None:
    if mode_of(plan).objective != "inference":
        raise ValueError(
            f"a '{plan.schedule}' plan is for training: plan with objective='inference' to stream it "
            "(ecofl.pipeline.cost.simulate predicts its sync-round)"
        )


def _workers(plan: Plan, profile: ModelProfile, pool: HomePool, count: int, operation_overhead_s: float,
             byte_overhead_s: float) -> list[list[Worker]]:
    """Each stage's devices with a share, holding K micro-batches and connected to the next stage's
    (overlapping samples) or the portal; a forward costs the overheads of its operation and of the bytes its
    device receives and sends."""
    last = len(plan.stages) - 1
    bandwidth = pool.bandwidth_bps
    stages = []
    for s, stage in enumerate(plan.stages):
        first, end = stage.layers
        x_in = profile.input_bytes if first == 0 else float(profile.activation_bytes[first - 1])
        x_out = float(profile.activation_bytes[end])
        workers = []
        for device, lo, hi in sample_ranges(stage):
            spec = pool.devices[device]
            received = x_in if s > 0 or device != 0 else 0.0  # the portal holds the inputs
            sent = x_out if s < last or device != 0 else 0.0  # ... and wants the results
            forward = stage_compute_s(profile, spec, stage.layers, hi - lo, operation_overhead_s)[0] \
                + byte_overhead_s * (received + sent) * (hi - lo) / spec.operation_speed
            worker = Worker(device, s, len(workers), lo, hi, forward, 0.0, count)
            worker.hold = stage.in_flight
            if s == 0:
                worker.input_s = 0.0 if device == 0 else x_in * (hi - lo) / float(bandwidth[0, device])
            workers.append(worker)
        stages.append(workers)
    for s, workers in enumerate(stages):
        output = float(profile.activation_bytes[plan.stages[s].layers[1]])
        for a in workers:
            if s == last:
                if a.device != 0:
                    a.send_f.append((None, output * (a.hi - a.lo) / float(bandwidth[a.device, 0])))
                continue
            for b in stages[s + 1]:
                samples = min(a.hi, b.hi) - max(a.lo, b.lo)
                if samples > 0:
                    a.send_f.append((b, output * samples / float(bandwidth[a.device, b.device])))
                    b.pending_f = [p + 1 for p in b.pending_f]
    return stages
