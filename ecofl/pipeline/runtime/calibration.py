"""Confined devices measure themselves under their limits: each one's speed on the work it will do.

Asteroid §3.3 profiles every layer on every device before planning; Eco-FL
§4.2 plans from each device's measured compute. Here a confined device
(``--emulate cgroup``, :mod:`.confinement`) times training steps (forward,
loss or the gradient from the next stage, and backward of one micro-batch,
then what its links seal and open for it, :mod:`.link_work`) in its own
cgroup, at its own quota, for at least ``min_seconds``: many CFS periods,
so the burst of quota an idle device starts with does not flatter it; and
on, up to four times as long, until it knows its mean step to 2%
(:data:`~.device_timing.CALIBRATION_PRECISION`): a throttled device's
steps come in whole CFS periods, and a slow one times few of them. Its
speed for the planner is the host's time for the same step as the cost
model counts it (the profile's layers and the runtime's overhead per
operation) over the measured time (:func:`speed_from_step`); the cost model
then predicts the device's step on those layers as what it measured.

What a device times is a :class:`Work`: first the whole model, at the
samples per call the plan on the presets gives it; then the layers and the
share of the stage the plan on those speeds gives it
(:func:`plan_on_measured_speeds`). A throttled device's speed is not the
same on every layer, nor on the whole model as on a part of it: on
Eco-FL's 3-stage testbed (MobileNetV2), the stages ran from 17% slower to
33% faster inside the pipeline than the whole model had measured on the
same devices. So, as FTPipeHD §III-D re-estimates a device's capacity
from the layers it runs, the pool a plan is predicted on is the one its
devices measured on their own stages. A device that will stream inference
(PipeEdge) times eval-mode forwards without autograd instead, cheaper than
the profile's training-mode forwards.

Each device runs :mod:`.device_timing` as a process in its cgroup: it
imports torch, builds the model and computes its stage's input at the
start-up quota, says ``ready``, and times the steps once the portal has
put it under its own quota and said ``go``. The devices measure at the same
time, as they will train.
"""

from __future__ import annotations

import json
import selectors
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tqdm import tqdm

from ecofl.devices import HomePool
from ecofl.interrupt import interrupts_deferred
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replan import with_speeds
from ecofl.cgroups import DeviceLimits
from ecofl.pipeline.runtime.confinement import Confinement, pool_limits
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.host_overhead import runtime_overheads
from ecofl.pipeline.runtime.worker_environment import worker_environment
from ecofl.pipeline.runtime.model_spec import ModelSpec
from ecofl.net.schema import MalformedMessage
from ecofl.pipeline.runtime.device_timing import CALIBRATION_S, OBJECTIVES
from ecofl.pipeline.runtime.pipe_messages import CALIBRATION_REPLIES, Go, Timed, read_line, write_line


@dataclass(frozen=True)
class Work:
    """What a device times: ``samples`` per call through ``layers`` (first, last; ``None``: the whole model)."""

    samples: int
    layers: tuple[int, int] | None = None

    def layer_slice(self, profile: ModelProfile) -> slice:
        return slice(0, profile.num_layers) if self.layers is None else slice(self.layers[0], self.layers[1] + 1)


#: What each device of a pool times, by device index (a cache key: one calibration per workload).
Workload = tuple[tuple[int, Work], ...]


def whole_model(devices: Iterable[int], samples: int) -> Workload:
    """Every device times the whole model at ``samples`` per call."""
    return tuple((d, Work(samples)) for d in sorted(devices))


def plan_workload(plan: Plan, devices: Iterable[int]) -> Workload:
    """Each device of ``plan`` times its stage's layers at its share of a micro-batch; any other of ``devices``
    (which the plan leaves idle, and a re-plan may use) the whole model at the plan's operating micro-batch."""
    work = {d: Work(share, stage.layers) for stage in plan.stages for d, share in zip(stage.devices, stage.shares)
            if share}
    idle = Work(operating_micro_batch(plan))
    return tuple((d, work.get(d, idle)) for d in sorted(devices))


def whole_model_at_shares(plan: Plan, devices: Iterable[int]) -> Workload:
    """Each of ``devices`` times the whole model at the samples per call it computes in ``plan`` (its share of
    a micro-batch; one the plan leaves idle, the plan's operating micro-batch): the devices' own throughput at
    the plan's call sizes, beside which a pipeline's efficiency is its schedule's (fill and drain, imbalance,
    hand-offs), not its smaller calls' (a device trains fewer samples a second at 4 per call than at 16)."""
    shares = {d: share for stage in plan.stages for d, share in zip(stage.devices, stage.shares) if share}
    idle = operating_micro_batch(plan)
    return tuple((d, Work(shares.get(d, idle))) for d in sorted(devices))


def describe_workload(workload: Workload) -> str:
    """E.g. ``whole model x4`` or ``0: 0-7 x4, 1: 8-13 x4``."""
    works = {work for _, work in workload}
    if len(works) == 1 and next(iter(works)).layers is None:
        return f"whole model x{next(iter(works)).samples}"
    return ", ".join(f"{d}: " + ("all" if w.layers is None else f"{w.layers[0]}-{w.layers[1]}") + f" x{w.samples}"
                     for d, w in workload)


def host_step_s(profile: ModelProfile, work: Work | int, objective: str = "training") -> float:
    """The host profile's seconds for one step of ``work`` (or of the whole model at so many samples): a training
    step's forward and backward of its layers, or an inference step's forwards."""
    work = Work(work) if isinstance(work, int) else work
    forward, backward = profile.layer_times(work.samples)
    layers = work.layer_slice(profile)
    return float(forward[layers].sum() + (backward[layers].sum() if objective == "training" else 0.0))


def speed_from_step(profile: ModelProfile, work: Work | int, measured_s: float, objective: str = "training",
                    operation_overhead_s: float = 0.0) -> float:
    """A device's speed (host cores) given its measured seconds per step of ``work``: the host's seconds for the
    step as the cost model counts them, over the measured ones.

    The cost model counts a step's layers (the profile) and the runtime's ``operation_overhead_s`` for each of
    its operations (a forward and a backward; a forward streaming), both at the device's speed
    (:mod:`ecofl.pipeline.cost`), so at this speed it predicts the step as measured. With the layers alone
    over the measured step, the per-call costs inside the step were charged twice, the second time at a speed
    they had lowered: on a stage of small layers and a small quota, many times its compute. The mixed home's
    Raspberry Pi (a quota of 0.025 cores) measured 0.138 s a step on MobileNetV2's last three layers at 4
    samples, a speed of 0.0042 by the layers alone, and a plan on it was predicted to give that device 6.58 s
    of compute a sync-round where it computed 1.06 s (``benchmarks/confined.py``, 2026-12-03 09:51).

    The profile's forwards are timed in training mode; an inference step (eval mode, no autograd) is cheaper.
    Measured as inference, the speed makes the cost model's forwards sum to what the device measured for its
    layers, split across them in the training profile's proportions."""
    operations = 2 if objective == "training" else 1
    return (host_step_s(profile, work, objective) + operations * operation_overhead_s) / measured_s


class TimedDevices(Protocol):
    """The devices :func:`measure_speeds` times, by index in ``limits``: each entered before its process starts
    (a cgroup and its environment), throttled once ready, released after. A :class:`.confinement.Confinement`,
    or a GPU home's :class:`~.accelerator_devices.AcceleratorDevices`."""

    limits: Mapping[int, DeviceLimits]

    def enter(self, device: int) -> tuple[object, dict[str, str]]: ...
    def throttle(self, device: int) -> None: ...
    def out_of_memory(self, device: int) -> bool: ...
    def release(self, device: int) -> None: ...


def measure_speeds(model: ModelSpec, input_shape: tuple[int, ...], profile: ModelProfile, pool: HomePool,
                   confinement: TimedDevices, workload: Workload | int, min_seconds: float = CALIBRATION_S,
                   timeout_s: float = 300.0, objective: str = "training", operation_overhead_s: float = 0.0
                   ) -> tuple[HomePool, dict]:
    """``pool`` with each confined device's speed as measured in its cgroup on ``objective``'s steps (training:
    forward, loss or a gradient, and backward; inference: an eval-mode forward without autograd) of its work
    (``workload``; a number: the whole model at that many samples), and what each measured. The devices timed
    are ``confinement``'s (each on its own ``accelerator``): a pool's confined devices, or its GPU devices at
    host speed (:class:`~.accelerator_devices.AcceleratorDevices`), the others as they were.
    ``operation_overhead_s``: what the cost model adds to each operation (:func:`speed_from_step`)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    devices = sorted(confinement.limits)
    work = dict(whole_model(devices, workload) if isinstance(workload, int) else workload)
    processes: dict[int, subprocess.Popen] = {}
    # on a terminal only: each device builds its work in its cgroup, then all time it together for min_seconds
    bar = tqdm(total=2 * len(devices), desc=f"calibrating {len(devices)} devices ({objective} "
               f"steps, at least {min_seconds:.0f} s together)", unit="step", disable=None, leave=False)
    try:
        for device in devices:
            command = [sys.executable, "-m", "ecofl.pipeline.runtime.device_timing", "--model", json.dumps(
                model.to_json()), "--input-shape", ",".join(map(str, input_shape)), "--micro-batch",
                str(work[device].samples), "--seconds", str(min_seconds), "--objective", objective,
                "--accelerator", pool.devices[device].accelerator]
            if work[device].layers is not None:
                command += ["--layers", ",".join(map(str, work[device].layers))]
            group, env = confinement.enter(device)
            processes[device] = subprocess.Popen(group.entry_command() + command, env=worker_environment(env),
                                                 text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        first_touch = {}  # device -> its CPU per byte mapped anew, at host speed (before its quota)
        for device, process in processes.items():
            ready = _timed(device, _line(process, timeout_s) or "it exited")
            if ready.seconds_per_step is not None:
                raise RuntimeError(f"device {device} could not calibrate: it timed before it was told to")
            first_touch[device] = ready.first_touch_cpu_s_per_byte
            confinement.throttle(device)
            bar.update()
        bar.set_postfix_str("timing", refresh=False)
        for process in processes.values():
            write_line(process.stdin, Go())
        measured, cpu_s, error = {}, {}, {}
        for device, process in processes.items():
            said = _line(process, timeout_s)
            if not said:
                why = "out of memory" if confinement.out_of_memory(device) else f"exit code {process.wait()}"
                raise RuntimeError(f"device {device} could not calibrate: {why}")
            timed = _timed(device, said)
            if timed.seconds_per_step is None:
                raise RuntimeError(f"device {device} could not calibrate: it said it was ready twice")
            measured[device], cpu_s[device] = timed.seconds_per_step, timed.cpu_s_per_step
            error[device] = timed.relative_error
            bar.update()
    finally:
        bar.close()
        with interrupts_deferred():  # a second Ctrl-C must not leave a cgroup or a process behind
            for process in processes.values():
                process.kill()
                process.wait()
            for device in devices:  # also one whose process had not started (or not been recorded)
                confinement.release(device)
    step_s = shared_by_identical(measured, confinement.limits, work)
    first_touch = shared_by_kind(first_touch, confinement.limits)
    speeds = {d: speed_from_step(profile, work[d], s, objective, operation_overhead_s) for d, s in step_s.items()}
    cores = {d: confinement.limits[d].cores for d in devices}
    report = {d: {"quota_cores": cores[d], "objective": objective,
                  "micro_batch": work[d].samples, "layers": work[d].layers, "step_s": step_s[d],
                  "own_step_s": measured[d], "own_step_s_error": error[d], "own_cpu_s_per_step": cpu_s[d],
                  "measured_speed": speeds[d],
                  # at its quota: the kernel maps a new page out of the device's own CPU time
                  "first_touch_s_per_byte": None if first_touch[d] is None else first_touch[d] / cores[d]}
              for d in devices}
    return measured_pool(pool, report), report


def measured_pool(pool: HomePool, reports: Mapping[int, dict]) -> HomePool:
    """``pool`` with each reported device's measured speed, seconds per byte mapped anew and quota's cores (its
    calibration's ``reports``, :func:`measure_speeds`); other devices as they were."""
    return with_speeds(pool, {d: report["measured_speed"] for d, report in reports.items()},
                       {d: report.get("first_touch_s_per_byte") for d, report in reports.items()},
                       {d: report["quota_cores"] for d, report in reports.items()})


def shared_by_identical(step_s: Mapping[int, float], limits: Mapping[int, DeviceLimits],
                        work: Mapping[int, Work]) -> dict[int, float]:
    """Each device's seconds per step, identical devices sharing one measurement: devices confined alike that
    timed the same work get the mean of what they measured (two Jetson Nanos are one kind of device; the
    planner should not tell them apart by the noise of their calibrations)."""
    kinds: dict[tuple[DeviceLimits, Work], list[int]] = {}
    for device in step_s:
        kinds.setdefault((limits[device], work[device]), []).append(device)
    return {device: statistics.fmean(step_s[twin] for twin in kinds[(limits[device], work[device])])
            for device in step_s}


def shared_by_kind(per_byte: Mapping[int, float | None], limits: Mapping[int, DeviceLimits]
                   ) -> dict[int, float | None]:
    """Each device's seconds per byte mapped anew, devices confined alike sharing the mean of those that measured
    it (a byte costs a kind of device the same whatever its stage; None where none of its kind did)."""
    kinds: dict[DeviceLimits, list[float]] = {}
    for device, seconds in per_byte.items():
        if seconds is not None:
            kinds.setdefault(limits[device], []).append(seconds)
    return {device: statistics.fmean(kinds[limits[device]]) if limits[device] in kinds else None
            for device in per_byte}


def operating_micro_batch(plan: Plan) -> int:
    """The samples a device of ``plan`` computes per call (the median of the devices' shares): where to measure
    its speed, which depends on it (a throttled device loses more of its quota to per-call work on small
    micro-batches; Asteroid §3.3 profiles per batch size)."""
    return int(statistics.median(share for stage in plan.stages for share in stage.shares if share))


@dataclass(frozen=True)
class ConfinedPool:
    """A pool of confined devices: the speeds they measured on ``workload`` (for the planner and the cost
    model), the limits they run under (from the presets), and what each measured."""

    pool: HomePool
    limits: dict[int, DeviceLimits]
    measured: dict[int, dict]
    workload: Workload


def confine_pool(model: ModelSpec, input_shape: tuple[int, ...], profile: ModelProfile, presets: HomePool,
                 workload: Workload | int, min_seconds: float = CALIBRATION_S, objective: str = "training",
                 cache_dir: str | None = None) -> ConfinedPool:
    """Each device of ``presets`` confined to its speed in cores and its budget, its speed measured there on
    ``objective``'s steps of its work (:func:`measure_speeds`), against this host's per-operation overhead as
    the confined predictions count it (:func:`.host_overhead.runtime_overheads`, cached in ``cache_dir``)."""
    limits = pool_limits(presets)
    if isinstance(workload, int):
        workload = whole_model(limits, workload)
    overhead_s = runtime_overheads(Emulation.CGROUP, cache_dir)["operation_overhead_s"]
    pool, measured = measure_speeds(model, input_shape, profile, presets, Confinement(limits), workload,
                                    min_seconds, objective=objective, operation_overhead_s=overhead_s)
    return ConfinedPool(pool, limits, measured, workload)


#: At most this many workloads calibrated in search of a plan whose devices measured their own stages (then
#: once more, on the stages of the last plan).
MAX_CALIBRATIONS = 3


def seconds_per_sample(plan: Plan, profile: ModelProfile, pool: HomePool) -> float:
    """The cost model's time per sample of ``plan`` on ``pool``: its sync-round over its mini-batch (Eco-FL
    eqs. 1-2), or, streaming, its inverse throughput (PipeEdge §III-B)."""
    return mode_of(plan).seconds_per_sample(plan, profile, pool)


def plan_on_measured_speeds(plan_for: Callable[[HomePool], Plan], profile: ModelProfile, presets: HomePool,
                            measure: Callable[[Workload], ConfinedPool],
                            calibrated: dict[Workload, ConfinedPool] | None = None) -> tuple[ConfinedPool, Plan]:
    """A plan made from the devices' measured speeds, and the speeds its devices measured on their own stages.

    The devices first time the whole model (``measure(workload)``, e.g. :func:`confine_pool`) at the samples
    per call the plan on the ``presets`` gives them (:func:`operating_micro_batch`); ``plan_for`` plans on
    what they measured. Then each times its stage of that plan (its layers at its share,
    :func:`plan_workload`), and ``plan_for`` plans again on those speeds, until a plan's stages are ones
    already measured. Of the plans made, each now measured on its own stages, the one the cost model predicts
    fastest at those speeds is returned, with them: a plan made on speeds measured elsewhere can be worse than
    the one they were measured on. So the cost model predicts each device at the speed it showed on the layers
    and samples it will run (Asteroid §3.3 profiles each layer on each device at every batch size it plans
    with; FTPipeHD §III-D re-estimates a device's capacity from the layers it runs). ``calibrated`` caches the
    measurements by workload, across calls on the same model and devices; a workload whose every device's work
    was timed by a device confined alike (a plan with two identical devices swapped) is not measured again.
    """
    calibrated = {} if calibrated is None else calibrated
    devices = range(len(presets.devices))
    workload = whole_model(devices, operating_micro_batch(plan_for(presets)))
    plans: list[Plan] = []
    for _ in range(MAX_CALIBRATIONS):
        plans.append(plan_for(calibrated_on(workload, calibrated, measure).pool))
        workload = plan_workload(plans[-1], devices)
        if _known(workload, calibrated):
            break
    calibrated_on(workload, calibrated, measure)
    measured = [(plan, calibrated[plan_workload(plan, devices)]) for plan in plans]
    plan, confined = min(measured, key=lambda pair: seconds_per_sample(pair[0], profile, pair[1].pool))
    return confined, plan


def calibrated_on(workload: Workload, calibrated: dict[Workload, ConfinedPool],
                  measure: Callable[[Workload], ConfinedPool]) -> ConfinedPool:
    """The devices' speeds on ``workload``: from ``calibrated`` where they (or devices confined alike) measured
    it already, else measured now (``measure(workload)``) and added to it."""
    if not _known(workload, calibrated):
        calibrated[workload] = measure(workload)
    return calibrated[workload]


def _known(workload: Workload, calibrated: dict[Workload, ConfinedPool]) -> bool:
    """Whether ``workload`` is measured already: itself, or each device's work by a device confined alike (the
    same plan with two identical devices swapped needs no new measurement; only the devices that calibrate
    count: a GPU home's CPU devices do not); such a workload is added to ``calibrated`` with its devices'
    speeds taken from their twins' reports."""
    if workload in calibrated:
        return True
    if not calibrated:
        return False
    reports: dict[tuple[DeviceLimits, Work], dict] = {}
    for confined in calibrated.values():
        for device, report in confined.measured.items():
            layers = report.get("layers")
            work = Work(report["micro_batch"], None if layers is None else tuple(layers))
            reports.setdefault((confined.limits[device], work), report)
    base = next(iter(calibrated.values()))
    twins = {device: reports.get((base.limits[device], work))
             for device, work in workload if device in base.limits}
    if any(report is None for report in twins.values()):
        return False
    calibrated[workload] = ConfinedPool(measured_pool(base.pool, twins), base.limits, twins, workload)
    return True


def _timed(device: int, said: str) -> Timed:
    """What a calibrating device said (its seconds per step, or ready to time); RuntimeError otherwise."""
    try:
        return read_line(said, CALIBRATION_REPLIES)
    except MalformedMessage:
        raise RuntimeError(f"device {device} could not calibrate: {said}") from None


def _line(process: subprocess.Popen, timeout_s: float) -> str:
    """The next line ``process`` prints ("" if it exits first), within ``timeout_s``."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise TimeoutError(f"a calibrating device said nothing in {timeout_s:.0f} s")
    return process.stdout.readline().strip()
