"""Confined devices measure themselves under their limits: each one's speed on the model it will run.

Asteroid §3.3 profiles every layer on every device before planning; Eco-FL
§4.2 plans from each device's measured compute. Here a confined device
(``--emulate cgroup``, :mod:`.confinement`) times whole training steps of
the model (forward, loss and backward of one micro-batch) in its own
cgroup, at its own quota, for at least ``min_seconds``: many CFS periods,
so the burst of quota an idle device starts with does not flatter it. Its
speed for the planner is the host profile's time for the same step over
the measured time (:func:`speed_from_step`), so the cost model's time for
the whole model on the device is what the device measured, split across
layers in the host profile's proportions. A device that will stream
inference (PipeEdge) times eval-mode forwards without autograd instead,
cheaper than the profile's training-mode forwards.

Each device runs :func:`main` (``python -m ecofl.pipeline.runtime.calibration``)
as a process in its cgroup: it imports torch and builds the model at the
start-up quota, says ``ready``, and times the steps once the portal has put
it under its own quota and said ``go``. The devices measure at the same
time, as they will train.
"""

from __future__ import annotations

import argparse
import json
import selectors
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ecofl.devices import HomePool
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replan import with_speeds
from ecofl.cgroups import DeviceLimits
from ecofl.pipeline.runtime.heap import freeze_heap
from ecofl.pipeline.runtime.confinement import Confinement, pool_limits, worker_threads
from ecofl.pipeline.runtime.worker_environment import worker_environment
from ecofl.pipeline.runtime.model_spec import ModelSpec, spec_from_json

READY, GO = "ready", "go"
OBJECTIVES = ("training", "inference")  # what a device times: the steps it will run
#: Seconds of timed steps per device. Asteroid Env B's five devices at 4 samples, calibrated 6 times each:
#: 2 s varied by 4.5-7.4% (coefficient of variation; up to 1.24x between two runs), 6 s by 2.0-6.2%.
CALIBRATION_S = 5.0


def seconds_per_call(step: Callable[[], object], min_seconds: float, min_calls: int = 3) -> float:
    """Mean seconds of ``step`` over at least ``min_calls`` calls lasting at least ``min_seconds`` in all."""
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        step()
        calls += 1
    return (time.perf_counter() - start) / calls


def host_step_s(profile: ModelProfile, micro_batch: int, objective: str = "training") -> float:
    """The host profile's seconds for one step: a training step's forward and backward of every layer, or an
    inference step's forwards."""
    forward, backward = profile.layer_times(micro_batch)
    return float(forward.sum() + (backward.sum() if objective == "training" else 0.0))


def speed_from_step(profile: ModelProfile, micro_batch: int, measured_s: float, objective: str = "training"
                    ) -> float:
    """A device's speed (host cores) given its measured seconds per step of ``micro_batch``.

    The profile's forwards are timed in training mode; an inference step (eval mode, no autograd) is cheaper.
    Measured as inference, the speed makes the cost model's forwards sum to what the device measured for the
    whole model, split across layers in the training profile's proportions."""
    return host_step_s(profile, micro_batch, objective) / measured_s


def measure_speeds(model: ModelSpec, input_shape: tuple[int, ...], profile: ModelProfile, pool: HomePool,
                   confinement: Confinement, micro_batch: int, min_seconds: float = CALIBRATION_S,
                   timeout_s: float = 300.0, objective: str = "training") -> tuple[HomePool, dict]:
    """``pool`` with each confined device's speed as measured in its cgroup on ``objective``'s steps (training:
    forward, loss and backward; inference: an eval-mode forward without autograd), and what each measured."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    devices = sorted(confinement.limits)
    processes: dict[int, subprocess.Popen] = {}
    try:
        for device in devices:
            group, env = confinement.enter(device)
            command = [sys.executable, "-m", "ecofl.pipeline.runtime.calibration", "--model", json.dumps(
                model.to_json()), "--input-shape", ",".join(map(str, input_shape)), "--micro-batch",
                str(micro_batch), "--seconds", str(min_seconds), "--objective", objective]
            processes[device] = subprocess.Popen(group.entry_command() + command, env=worker_environment(env),
                                                 text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for device, process in processes.items():
            said = _line(process, timeout_s)
            if not said.startswith(READY):
                raise RuntimeError(f"device {device} could not calibrate: {said or 'it exited'}")
            confinement.throttle(device)
        for process in processes.values():
            process.stdin.write(GO + "\n")
            process.stdin.flush()
        measured = {}
        for device, process in processes.items():
            said = _line(process, timeout_s)
            if not said:
                why = "out of memory" if confinement.out_of_memory(device) else f"exit code {process.wait()}"
                raise RuntimeError(f"device {device} could not calibrate: {why}")
            measured[device] = json.loads(said)["seconds_per_step"]
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
        for device in processes:
            confinement.release(device)
    speeds = {d: speed_from_step(profile, micro_batch, s, objective) for d, s in measured.items()}
    report = {d: {"quota_cores": confinement.limits[d].cores, "objective": objective, "micro_batch": micro_batch,
                  "step_s": measured[d], "measured_speed": speeds[d]} for d in devices}
    return with_speeds(pool, speeds), report


def operating_micro_batch(plan: Plan) -> int:
    """The samples a device of ``plan`` computes per call (the median of the devices' shares): where to measure
    its speed, which depends on it (a throttled device loses more of its quota to per-call work on small
    micro-batches; Asteroid §3.3 profiles per batch size)."""
    return int(statistics.median(share for stage in plan.stages for share in stage.shares if share))


@dataclass(frozen=True)
class ConfinedPool:
    """A pool of confined devices: the speeds they measured at ``micro_batch`` samples per call (for the planner
    and the cost model), the limits they run under (from the presets), and what each measured."""

    pool: HomePool
    limits: dict[int, DeviceLimits]
    measured: dict[int, dict]
    micro_batch: int


def confine_pool(model: ModelSpec, input_shape: tuple[int, ...], profile: ModelProfile, presets: HomePool,
                 micro_batch: int, min_seconds: float = CALIBRATION_S, objective: str = "training") -> ConfinedPool:
    """Each device of ``presets`` confined to its speed in cores and its budget, its speed measured there on
    ``objective``'s steps (:func:`measure_speeds`)."""
    limits = pool_limits(presets)
    pool, measured = measure_speeds(model, input_shape, profile, presets, Confinement(limits), micro_batch,
                                    min_seconds, objective=objective)
    return ConfinedPool(pool, limits, measured, micro_batch)


#: At most this many micro-batch sizes calibrated in search of a plan that runs at a size its speeds were
#: measured at (then once more, at the size the last plan runs).
MAX_CALIBRATIONS = 3


def plan_on_measured_speeds(plan_for: Callable[[HomePool], Plan], presets: HomePool,
                            measure: Callable[[int], ConfinedPool],
                            calibrated: dict[int, ConfinedPool] | None = None) -> tuple[ConfinedPool, Plan]:
    """A plan made from the devices' measured speeds, and the speeds measured at the size it runs them at.

    A confined device's speed depends on its samples per call (:func:`operating_micro_batch`), and the plan's
    micro-batch depends on the speeds. So the devices measure (``measure(size)``, e.g. :func:`confine_pool`)
    at the size the plan on the ``presets`` gives, ``plan_for`` plans on what they measured, and where that
    plan runs another size they measure there and plan again, until a plan runs at a size already measured.
    The pool returned is the one measured at the returned plan's own size, so the cost model predicts the
    plan at the speeds it runs at (Asteroid §3.3 profiles each device at every batch size it plans with).
    ``calibrated`` caches the measurements by size, across calls on the same model and devices.
    """
    calibrated = {} if calibrated is None else calibrated
    size = operating_micro_batch(plan_for(presets))
    for _ in range(MAX_CALIBRATIONS):
        if size not in calibrated:
            calibrated[size] = measure(size)
        plan = plan_for(calibrated[size].pool)
        runs_at = operating_micro_batch(plan)
        if runs_at in calibrated:
            break
        size = runs_at
    if runs_at not in calibrated:
        calibrated[runs_at] = measure(runs_at)
    return calibrated[runs_at], plan


def _line(process: subprocess.Popen, timeout_s: float) -> str:
    """The next line ``process`` prints ("" if it exits first), within ``timeout_s``."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise TimeoutError(f"a calibrating device said nothing in {timeout_s:.0f} s")
    return process.stdout.readline().strip()


def main() -> int:
    parser = argparse.ArgumentParser(description="time steps of a model here (in a device's cgroup)")
    parser.add_argument("--model", required=True, help="the model as JSON (ModelSpec.to_json)")
    parser.add_argument("--input-shape", required=True, help="one sample's shape, e.g. 1,28,28")
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=CALIBRATION_S)
    parser.add_argument("--objective", choices=OBJECTIVES, default="training")
    args = parser.parse_args()
    torch.set_num_threads(worker_threads())
    model, _ = spec_from_json(json.loads(args.model)).build()
    freeze_heap()  # as a worker does: no full collection of torch's objects inside the timed steps
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.micro_batch, *map(int, args.input_shape.split(",")), generator=generator)
    with torch.no_grad():
        classes = model(x).shape[1]
    y = torch.randint(0, classes, (args.micro_batch,), generator=generator)

    def train() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    def infer() -> None:  # as a streaming stage runs (.stream_stage)
        with torch.no_grad():
            model(x)

    if args.objective == "inference":
        model.eval()
    step = train if args.objective == "training" else infer

    step()  # allocations and first-call work, not measured
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        return 1
    print(json.dumps({"seconds_per_step": seconds_per_call(step, args.seconds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
