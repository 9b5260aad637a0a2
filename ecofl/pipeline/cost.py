"""Cost model of one sync-round: an event simulation of a plan's schedule on a home pool.

What is simulated (choices documented here, not in the papers):

- **Compute.** Every device of a stage runs the stage's action list
  (:mod:`ecofl.pipeline.schedule`) in order, each action as soon as its inputs
  have arrived. A device of a replicated stage (Asteroid's hybrid pipeline
  parallelism) is modelled *separately* (Asteroid Fig. 10): it computes only
  its share of each micro-batch, at the host time interpolated at that share
  size and scaled by its speed (:func:`ecofl.pipeline.profile.device_times`).
  A device belongs to at most one stage.
- **Samples between stages.** Each micro-batch's samples are split over a
  stage's devices in contiguous ranges by ``shares``; device i of stage s sends
  to device j of stage s+1 the activations of the samples their ranges share
  (a_l x samples, l = last layer of stage s), and j sends back the gradients
  (b_l x samples, l = first layer of stage s+1).
- **Links.** Every ordered device pair is its own channel at
  ``pool.bandwidth_bps[i, j]`` (full duplex; a device's sends to different
  devices do not share its link), carrying one tensor at a time in FIFO order.
  Sending is asynchronous, so communication overlaps computation.
- **Input.** The portal (device 0) sends each micro-batch's input samples to
  the devices of stage 0 that are not itself, back to back from time 0 (it
  holds the data and needs nothing to prefetch). Labels (8 bytes a sample) to
  the last stage are not modelled.
- **Flush.** When all of a replicated stage's devices have finished their
  last backward, they ring-all-reduce the stage's gradients,
  2(n-1)/n x W_s / (slowest link in the group) (Asteroid eq. 5), plus the
  runtime's time per operation for each of the 4(n-1) messages a device
  sends and receives in the ring, at the group's slowest pace of such work
  (a confined device's quota, else its speed); then every device runs its
  optimizer step (profiled host time plus the time per operation, / speed).
- **Shared cores** (``cores=C``, devices that are processes of one machine,
  as when a home is run at host speed on this one): an operation starts when
  it is ready, and while n operations run each gets min(1, C/n) of a core
  (processor sharing, how the kernel's time slices share cores among
  runnable processes), so operations last longer than their work whenever
  more devices compute than there are cores. The flush's optimizer steps
  take a free core each. ``cores=None``: every device is its own machine.
  (The two dispatch rules of :mod:`ecofl.pipeline.event_simulation`.)
- **The runtime's own time** (``operation_overhead_s``, host and confined
  runs): every forward, backward and optimizer step costs that much more host
  time than its layers' profiled time: the runtime's bookkeeping, the CPU its messages
  cost (framing, sealing, thread hand-offs) and the kernel's time slices,
  which are about the same per operation whatever its size. A device spends
  it at its speed, like its layers (a confined device under its CPU quota);
  a ring's messages at its quota where the pool knows it (``DeviceSpec.cores``).
  It is measured once per host by :mod:`ecofl.pipeline.runtime.host_overhead`
  on a model whose layers cost next to nothing; a device that sleeps to the
  cost model's time hides it (0 there).
- **The runtime's time per byte** (``byte_overhead_s``): a device also
  spends host seconds on every byte it sends or receives (copying a tensor
  into a frame, AES-GCM sealing or opening it, the reader thread's copies),
  charged to the forward or backward that sends or needs them, at the
  device's speed; at host speed it is next to nothing. Measured with the
  per-operation overhead, on a model whose activations are wide. A confined
  device's links are in the speed it calibrated instead (its steps carry
  their tensors through sealed links, :mod:`ecofl.pipeline.runtime.link_work`),
  so its predictions pass none.
- **Work beside the passes** (``background``): fault tolerance's copies
  (the replicas a device sends to its backups and keeps for others, its
  stage's part of the portal's global copy; :func:`ecofl.pipeline.replication.copy_bytes`)
  are sealed, sent, received and opened by threads of the device's own
  process, out of the quota it computes with. They start with the
  sync-round, so a device waiting for its first input (the schedule's fill)
  does them then, as far as its link has brought their bytes, for free: no
  pass of its own wants the quota yet. The rest runs beside its passes:
  the waits between passes are mostly shorter than a CFS period, and work
  done in them still spends quota the passes would have used (a cgroup's
  quota is spent by whichever of its threads runs; docs/pipeline.md,
  "Safety at idle priority"). So a device's seconds of such work in a
  sync-round fill its wait before its first pass, at most the share of
  its bytes its link (``bandwidth_bps``) carries in that wait, and what is
  left is spread evenly over its forwards and backwards: it lengthens the
  round where the device is on its critical path, and fills slack where it
  is not.
- **Memory.** Each device's peak by Asteroid eq. 3, with the forward tasks
  the schedule keeps resident (:mod:`ecofl.pipeline.memory_model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ecofl.devices import DeviceSpec, HomePool
from ecofl.pipeline.event_simulation import DispatchRule, Fifo, ProcessorSharing, Worker, run
from ecofl.pipeline.memory_model import peak_memory
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import (
    Plan,
    StagePlan,
    check_plan,
    plan_schedule,
    require_training,
    sample_ranges,
)
from ecofl.pipeline.profile import ModelProfile, device_times
from ecofl.pipeline.schedule import ActionKind
from ecofl.pipeline.timeline import TimelineEvent


@dataclass(frozen=True)
class SyncRoundCost:
    """Simulated sync-round of a plan; per-stage tuples are indexed by stage."""

    sync_round_s: float
    throughput: float  # samples per second: mini-batch / sync_round_s
    stage_busy_s: tuple[float, ...]  # compute time of the stage's busiest device
    busy_fraction: tuple[float, ...]  # stage_busy_s / sync_round_s
    ssb_s: float  # synchronous static bubble, Eco-FL eq. 2 (the same for every stage)
    ddb_s: tuple[float, ...]  # idle time beyond SSB and the flush (dependency bubbles and imbalance)
    flush_s: tuple[float, ...]  # all-reduce + optimizer step of each stage
    stage_memory_bytes: tuple[int, ...]  # peak over the stage's devices, Asteroid eq. 3
    device_memory_bytes: dict[int, int]  # peak per pool device index that is used
    device_busy_s: dict[int, float]
    timeline: tuple[TimelineEvent, ...]


@dataclass(frozen=True)
class Background:
    """A device's work beside its passes in a sync-round (fault tolerance's copies): the bytes its link
    carries for it, and the device's seconds for it at its speed."""

    carried_bytes: float
    seconds: float

    def __post_init__(self) -> None:
        if self.carried_bytes < 0 or self.seconds < 0:
            raise ValueError(f"background work must not be negative, got {self.carried_bytes} bytes and "
                             f"{self.seconds} s")


def stage_compute_s(
    profile: ModelProfile, device: DeviceSpec, layers: tuple[int, int], samples: int,
    operation_overhead_s: float = 0.0,
) -> tuple[float, float]:
    """Forward and backward seconds of layers[0]..layers[1] on ``device`` for ``samples`` samples, each with the
    runtime's ``operation_overhead_s`` (host seconds) at the pace of its runtime's work
    (:attr:`~ecofl.devices.DeviceSpec.operation_speed`: a CPU device's speed, a GPU device's host core)."""
    if samples == 0:
        return 0.0, 0.0
    forward, backward = device_times(profile, device, samples)
    first, last = layers
    overhead = operation_overhead_s / device.operation_speed
    return float(forward[first : last + 1].sum()) + overhead, float(backward[first : last + 1].sum()) + overhead


def simulate(plan: Plan, profile: ModelProfile, pool: HomePool, cores: int | None = None,
             operation_overhead_s: float = 0.0, byte_overhead_s: float = 0.0,
             background: Mapping[int, Background] | None = None) -> SyncRoundCost:
    """Event simulation of one sync-round of ``plan`` (see the module docstring for the model).

    Operations run in the order they become ready (time order); with
    ``cores`` they share that many cores (processor sharing). Every forward
    and backward lasts ``operation_overhead_s`` longer than its layers, and
    ``byte_overhead_s`` longer per byte it sends or receives (host seconds,
    both at the device's speed). ``background``: each device's work beside
    its passes in the sync-round: first in its wait before its first pass
    (as far as its link has carried the work's bytes), the rest spread over
    its forwards and backwards.
    """
    require_training(plan)
    check_plan(plan, profile, pool)
    if cores is not None and cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    if operation_overhead_s < 0 or byte_overhead_s < 0:
        raise ValueError(f"overheads must not be negative, got {operation_overhead_s} per operation and "
                         f"{byte_overhead_s} per byte")
    spread_s = _beside_passes(plan, profile, pool, cores, operation_overhead_s, byte_overhead_s, background or {})
    schedule = plan_schedule(plan)
    workers = [_stage_workers(s, stage, profile, pool, plan, operation_overhead_s)
               for s, stage in enumerate(plan.stages)]
    _connect(plan, profile, pool, workers, byte_overhead_s)
    _spread(workers, plan.num_micro_batches, spread_s)
    timeline: list[TimelineEvent] = []
    rule = Fifo() if cores is None else ProcessorSharing(cores)
    run(workers, schedule, rule, timeline)
    flush_end, flush_s = _flush(plan, profile, pool, workers, timeline, rule, operation_overhead_s)
    sync_round = max(flush_end)
    busy = [max((w.busy for w in ws), default=0.0) for ws in workers]
    ssb = _static_bubble(workers)
    stage_memory, device_memory = peak_memory(plan, profile, schedule)
    return SyncRoundCost(
        sync_round_s=sync_round,
        throughput=plan.batch_size / sync_round if sync_round > 0 else float("inf"),
        stage_busy_s=tuple(busy),
        busy_fraction=tuple(b / sync_round if sync_round > 0 else 0.0 for b in busy),
        ssb_s=ssb,
        ddb_s=tuple(max(0.0, sync_round - b - f - ssb) for b, f in zip(busy, flush_s)),
        flush_s=tuple(flush_s),
        stage_memory_bytes=tuple(stage_memory),
        device_memory_bytes=device_memory,
        device_busy_s={w.device: w.busy for ws in workers for w in ws},
        timeline=tuple(timeline),
    )


def busiest_device_s(plan: Plan, profile: ModelProfile, pool: HomePool, operation_overhead_s: float = 0.0,
                     byte_overhead_s: float = 0.0) -> float:
    """A floor under :func:`simulate`'s sync-round of ``plan`` with these overheads, whatever its ``cores`` and
    ``background``: the busiest device's forwards and backwards back to back (a device runs its passes one at
    a time, each at least as long as its work). No event is simulated, so a search over plans can skip a plan
    whose floor already loses (:func:`ecofl.pipeline.runtime.prediction.fastest_plan`)."""
    return max(device_passes_s(plan, profile, pool, operation_overhead_s, byte_overhead_s).values())


def device_passes_s(plan: Plan, profile: ModelProfile, pool: HomePool, operation_overhead_s: float = 0.0,
                    byte_overhead_s: float = 0.0) -> dict[int, float]:
    """``{device: its forwards and backwards of a sync-round back to back}`` for every device of ``plan`` with a
    share (no event simulated)."""
    require_training(plan)
    workers = [_stage_workers(s, stage, profile, pool, plan, operation_overhead_s)
               for s, stage in enumerate(plan.stages)]
    _connect(plan, profile, pool, workers, byte_overhead_s)
    return {w.device: plan.num_micro_batches * (w.forward_s + w.backward_s) for ws in workers for w in ws}


def _stage_workers(index: int, stage: StagePlan, profile: ModelProfile, pool: HomePool, plan: Plan,
                   overhead_s: float) -> list[Worker]:
    """The devices of a stage with a non-empty share, each with its sample range and times (asynchronous
    1F1B: with its optimizer step after every backward)."""
    workers = []
    for device, lo, hi in sample_ranges(stage):
        f, b = stage_compute_s(profile, pool.devices[device], stage.layers, hi - lo, overhead_s)
        worker = Worker(device, index, len(workers), lo, hi, f, b, plan.num_micro_batches)
        if mode_of(plan).steps_after_every_backward:
            worker.step_s = _optimizer_step_s(profile, stage.layers, pool.devices[device], overhead_s)
        workers.append(worker)
    return workers


def _connect(plan: Plan, profile: ModelProfile, pool: HomePool, workers: list[list[Worker]],
             byte_overhead_s: float) -> None:
    """Who sends what to whom between consecutive stages (overlapping sample ranges); each byte sent or
    received costs its device ``byte_overhead_s`` host seconds in the pass that sends or needs it."""
    bandwidth = pool.bandwidth_bps
    for worker in workers[0]:  # the input samples the portal sends: received by stage 0's other devices
        worker.input_s = 0.0
        if worker.device != 0:
            worker.input_s = profile.input_bytes * (worker.hi - worker.lo) / float(bandwidth[0, worker.device])
            worker.forward_s += byte_overhead_s * profile.input_bytes * (worker.hi - worker.lo) \
                / pool.devices[worker.device].operation_speed
    for s in range(len(plan.stages) - 1):
        activation = float(profile.activation_bytes[plan.stages[s].layers[1]])
        gradient = float(profile.gradient_bytes[plan.stages[s + 1].layers[0]])
        for a in workers[s]:
            for b in workers[s + 1]:
                samples = min(a.hi, b.hi) - max(a.lo, b.lo)
                if samples <= 0:
                    continue
                a.send_f.append((b, activation * samples / float(bandwidth[a.device, b.device])))
                b.send_b.append((a, gradient * samples / float(bandwidth[b.device, a.device])))
                for worker in (a, b):
                    per_byte = byte_overhead_s / pool.devices[worker.device].operation_speed
                    worker.forward_s += per_byte * activation * samples
                    worker.backward_s += per_byte * gradient * samples
                b.pending_f = [x + 1 for x in b.pending_f]
                a.pending_b = [x + 1 for x in a.pending_b]


def _beside_passes(plan: Plan, profile: ModelProfile, pool: HomePool, cores: int | None, operation_overhead_s: float,
                   byte_overhead_s: float, background: Mapping[int, Background]) -> dict[int, float]:
    """Each device's seconds of ``background`` left for its passes once its wait before its first forward (in
    the round without it) has taken what its link brought in that wait."""
    if not background:
        return {}
    without = simulate(plan, profile, pool, cores, operation_overhead_s, byte_overhead_s)
    first: dict[int, float] = {}
    for event in without.timeline:
        if event.kind == ActionKind.FORWARD:
            first[event.device] = min(first.get(event.device, event.start), event.start)
    left = {}
    for device, work in background.items():
        wait = first.get(device, 0.0)
        carried = pool.devices[device].bandwidth_bps * wait  # what its link brings in the wait
        arrived = min(1.0, carried / work.carried_bytes) if work.carried_bytes else 1.0
        left[device] = work.seconds - min(wait, work.seconds * arrived)
    return left


def _spread(workers: list[list[Worker]], num_micro_batches: int, seconds: Mapping[int, float]) -> None:
    """Each device's ``seconds`` spread evenly over its forwards and backwards (one of each per micro-batch)."""
    for worker in (w for ws in workers for w in ws):
        extra = seconds.get(worker.device, 0.0) / (2 * num_micro_batches)
        worker.forward_s += extra
        worker.backward_s += extra


def _flush(
    plan: Plan, profile: ModelProfile, pool: HomePool, workers: list[list[Worker]], timeline: list[TimelineEvent],
    rule: DispatchRule, operation_overhead_s: float,
) -> tuple[list[float], list[float]]:
    """All-reduce inside replicated stages (Asteroid eq. 5, and the runtime's time for the ring's messages:
    :func:`ring_messages_s`), then each device's optimizer step.

    Returns each stage's end time and its flush duration (all-reduce + slowest step); asynchronous 1F1B
    has no flush (its steps followed every backward).
    """
    ends, durations = [], []
    for s, stage in enumerate(plan.stages):
        finished = {w.device: w.free for w in workers[s]}
        start = max(finished.values())
        if mode_of(plan).steps_after_every_backward:
            ends.append(start)
            durations.append(0.0)
            continue
        first, last = stage.layers
        n = len(stage.devices)
        allreduce = 0.0
        if n > 1:
            links = pool.bandwidth_bps[np.ix_(stage.devices, stage.devices)]
            slowest = float(links[~np.eye(n, dtype=bool)].min())
            allreduce = ring_allreduce_s(float(profile.weight_bytes[first : last + 1].sum()), n, slowest)
            pace = min(pool.devices[d].cpu_speed for d in stage.devices)
            allreduce += ring_messages_s(n, operation_overhead_s, pace)
            for d in stage.devices:
                timeline.append(TimelineEvent(d, s, ActionKind.ALLREDUCE, -1, start, start + allreduce))
        end, slowest_step = 0.0, 0.0
        for d in stage.devices:
            t0 = start + allreduce if n > 1 else finished.get(d, 0.0)
            step = _optimizer_step_s(profile, stage.layers, pool.devices[d], operation_overhead_s)
            t0 = rule.flush_start(t0, step) if step > 0 else t0
            if step > 0:
                timeline.append(TimelineEvent(d, s, ActionKind.STEP, -1, t0, t0 + step))
            end, slowest_step = max(end, t0 + step), max(slowest_step, step)
        ends.append(end)
        durations.append(allreduce + slowest_step)
    return ends, durations


def ring_allreduce_s(nbytes: float | np.ndarray, devices: int, link_bps: float) -> float | np.ndarray:
    """Seconds a ring all-reduce of ``nbytes`` (or of each of an array of sizes) over ``devices`` takes on
    links of ``link_bps`` bytes/s: each device sends 2(n-1)/n of the bytes (reduce-scatter, then all-gather;
    Asteroid eq. 5)."""
    return 2 * (devices - 1) / devices * nbytes / link_bps


def ring_messages_s(devices: int, operation_overhead_s: float, slowest_speed: float) -> float:
    """The runtime's own time in a ring all-reduce over ``devices``, beyond its bytes on the links: each device
    sends and receives 2(n-1) messages, each charged the runtime's time per operation (host seconds) at the
    slowest member's pace of such work (:attr:`ecofl.devices.DeviceSpec.cpu_speed`: a confined device's quota),
    as it holds up the ring. On a confined pair of the Raspberry Pi's and the phone's quotas the ring took
    0.06-0.08 s longer than its bytes' time, about this (benchmarks/allreduce_confined.py, docs/pipeline.md
    "A replicated stage's flush in one ring")."""
    return 4 * (devices - 1) * operation_overhead_s / slowest_speed


def _optimizer_step_s(profile: ModelProfile, layers: tuple[int, int], device: DeviceSpec,
                      operation_overhead_s: float) -> float:
    """Seconds of ``device``'s optimizer step of the layers: the profile's host time and, as for a forward or
    backward, the runtime's time per operation, at its speed (0 when the profile did not time the step). On
    the mixed home's confined devices the steps took a median 2.75x the profile's time alone, 1.32x of this
    (69 device-steps of 18 runs, 2026-12-05)."""
    if profile.optimizer_step_s is None:
        return 0.0
    return (float(profile.optimizer_step_s[layers[0] : layers[1] + 1].sum()) / device.speed
            + operation_overhead_s / device.operation_speed)


def _static_bubble(workers: list[list[Worker]]) -> float:
    """Eco-FL eq. 2: SSB = sum over s < S-1 of T_f^s + T_b^s + T_cf^s + T_cb^s, per micro-batch."""
    total = 0.0
    for s in range(len(workers) - 1):
        total += max(w.forward_s for w in workers[s]) + max(w.backward_s for w in workers[s])
        total += max((sec for w in workers[s] for _, sec in w.send_f), default=0.0)
        total += max((sec for w in workers[s + 1] for _, sec in w.send_b), default=0.0)
    return total
