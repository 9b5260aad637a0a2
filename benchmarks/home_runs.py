"""One benchmark run of a plan on the home runtime: measured against the cost model, with the CPU it got.

The benchmarks of the home pipeline (``pipeline.py``, ``versus_pipelining.py``,
``paper_pipeline.py``) all run a plan the same way:
:class:`ecofl.pipeline.runtime.HomePipeline` with one worker process per
device, one warm-up sync-round (a fresh process's first round pays one-time
costs: lazy imports, allocator growth), then ``rounds`` measured sync-rounds
on synthetic data. The report is ``ecofl home train --json``'s
(:func:`ecofl.cli.home_train.describe`: measured and predicted sync-round, per-stage
memory as the model predicts it, as the runtime accounts it and as the
worker's resident set measures it) plus what a shared machine needs beside
it: the load average and the CPU the run's processes actually received.

The prediction is the CLI's (:func:`ecofl.cli.home_train.predict`): with
confined devices (``cgroup``) the cost model of the speeds the devices
measured in their cgroups (:func:`ecofl.pipeline.runtime.calibration.confine_pool`:
``pool`` is then the measured pool and ``limits`` the presets' quotas), with
devices that sleep to the model (``sleep``) the emulated pool's (measured
equals predicted by construction but for communication and scheduling), the
host pool's with the devices sharing this machine's cores at host speed
(``none``).

With ``relearn``, a second prediction beside it: the cost model re-learned
in the pipeline (:func:`in_pipeline_prediction`), from a second warm-up
sync-round's passes, which the measured rounds that follow are not part of.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks.host_probe import HostProbe
from ecofl.cli.home_train import describe
from ecofl.cgroups import DeviceLimits
from ecofl.devices import HomePool
from ecofl.net.netns import HomeNetwork
from ecofl.pipeline.plan import Plan, ScheduleKind
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.round_breakdown import DeviceBreakdown, round_breakdown
from ecofl.pipeline.runtime import HomePipeline, PipelineResult, ZooModel
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.pipeline_tuning import mapping_s, pipeline_speeds
from ecofl.pipeline.runtime.prediction import predict_sync_round
from ecofl.pipeline.schedule import PASSES, ActionKind
from ecofl.pipeline.timeline import TimelineEvent

LR, MOMENTUM = 0.01, 0.9
_TICK = os.sysconf("SC_CLK_TCK")


def synthetic_batch(spec: ZooModel, samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` random inputs of the model's shape and random labels (the same for a given seed)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, *spec.input_shape, generator=generator)
    y = torch.randint(0, spec.num_classes, (samples,), generator=generator)
    return x, y


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def describe_plan(plan: Plan, pool: HomePool) -> str:
    """``planner MxB [first-last: device x share | ...]`` (schedule added unless 1F1B-Sync)."""
    stages = " | ".join(
        f"{a}-{b}: " + "+".join(f"{pool.devices[d].name}x{y}" for d, y in zip(s.devices, s.shares))
        for s in plan.stages for a, b in [s.layers]
    )
    schedule = "" if plan.schedule == ScheduleKind.ONE_F_ONE_B else f" {plan.schedule}"
    return f"{plan.planner}{schedule} {plan.num_micro_batches}x{plan.micro_batch} [{stages}]"


def run_plan(spec: ZooModel, pool: HomePool, plan: Plan, profile: ModelProfile, *, emulate: bool | str, rounds: int,
             timeout_s: float, network: HomeNetwork | None = None, cache_dir: str | None = None,
             limits: dict[int, DeviceLimits] | None = None, relearn: bool = False, probe_host: bool = False
             ) -> dict:
    """Train one warm-up (two with ``relearn``) and ``rounds`` measured sync-rounds of ``plan``; measured against
    predicted.

    Adds to :func:`ecofl.cli.home_train.describe`'s report: ``plan_text``,
    ``planner_error`` (|predicted - measured| / measured, median round),
    ``cpu_cores_used`` (CPU seconds of the workers and this portal during
    the measured rounds / their wall time: below the host's cores when other
    jobs took the rest; ``cpu_s_per_round`` the same seconds per round),
    ``load_average`` (1 min, before and after), the
    timeline's compute time per device (``compute_s``) and, per device, the
    last measured round's compute, idle time and hand-off waits beside the
    prediction's (``breakdown``: synchronous schedules whose plan did not change); with ``relearn``, the
    prediction re-learned in the pipeline and its error (``in_pipeline``); with ``probe_host``, the host's speed
    during the measured rounds (``host_probe``, :class:`~benchmarks.host_probe.HostProbe`).
    """
    x, y = synthetic_batch(spec, plan.batch_size)
    load_before = os.getloadavg()[0]
    with HomePipeline(spec, pool, plan, profile=profile, emulate=emulate, limits=limits, timeout_s=timeout_s,
                      network=network) as home:
        warm = home.train(None, x, y, 2 if relearn else 1, lr=LR, momentum=MOMENTUM)
        pids = [*home.worker_pids.values(), os.getpid()]
        cpu_before, started = sum(map(cpu_seconds, pids)), time.time()
        with HostProbe() if probe_host else nullcontext() as probe:
            result = home.train(None, x, y, rounds, lr=LR, momentum=MOMENTUM)
        wall = time.time() - started
        cpu = sum(map(cpu_seconds, pids)) - cpu_before
        confined = home.confinement_report()
    predicted = predict_sync_round(plan, profile, pool, emulate, cache_dir=cache_dir)
    report = describe(plan, pool, predicted, result, emulate)
    compute: dict[int, float] = {}
    for event in result.timeline:
        if event.kind in (*PASSES, ActionKind.STEP, ActionKind.ALLREDUCE):
            compute[event.device] = compute.get(event.device, 0.0) + event.end - event.start
    report.update(
        plan_text=describe_plan(plan, pool),
        planner_error=abs(report["predicted_sync_round_s"] - report["sync_round_s"]) / report["sync_round_s"],
        cpu_cores_used=cpu / wall,
        cpu_s_per_round=cpu / rounds,
        load_average=[load_before, os.getloadavg()[0]],
        compute_s={str(d): s / rounds for d, s in sorted(compute.items())},
        network="tc tbf in network namespaces" if network is not None else None,
        confined={str(d): r for d, r in confined.items()},
        breakdown=breakdowns(result.timeline, predicted.timeline, rounds)
        if plan.schedule != ScheduleKind.ASYNC_ONE_F_ONE_B and not result.events else None,
    )
    if probe_host:
        report["host_probe"] = probe.summary()
    if relearn:
        relearned = in_pipeline_prediction(warm, plan, profile, pool, emulate, cache_dir)
        error = abs(relearned["predicted_sync_round_s"] - report["sync_round_s"]) / report["sync_round_s"]
        report["in_pipeline"] = {**relearned, "planner_error": error}
    return report


def in_pipeline_prediction(warm: PipelineResult, plan: Plan, profile: ModelProfile, pool: HomePool,
                           emulate: bool | str, cache_dir: str | None) -> dict:
    """The cost model re-learned in the pipeline, as a re-tune re-learns it (FTPipeHD eqs. 1-3,
    :func:`~ecofl.pipeline.runtime.pipeline_tuning.pipeline_speeds`): each device's speed from its forwards and
    backwards in ``warm``'s last sync-round (not its first: that one maps the stage's memory), less what it still
    mapped anew in it, and ``plan``'s sync-round predicted at those speeds. Unlike a re-tune's, a confined
    device's speed here may read above its calibration: it predicts the same plan, whose passes stay as short."""
    mapped = warm.first_touched_by_device[-1] if warm.first_touched_by_device else {}
    passes = {d: b.compute_s - mapping_s(mapped.get(d), pool.devices[d])
              for d, b in round_breakdown(warm.timeline, len(warm.sync_round_s)).items()}
    speeds = pipeline_speeds(plan, profile, pool, Emulation.parse(emulate), passes, cache_dir)
    predicted = predict_sync_round(plan, profile, with_speeds(pool, speeds), emulate, cache_dir=cache_dir)
    return {"speeds": {str(d): speed for d, speed in sorted(speeds.items())},
            "predicted_sync_round_s": predicted.sync_round_s}


def breakdowns(measured: tuple[TimelineEvent, ...], predicted: tuple[TimelineEvent, ...], rounds: int
               ) -> dict[str, dict]:
    """Per device, the last measured sync-round's breakdown beside the predicted one's
    (:mod:`ecofl.pipeline.round_breakdown`): compute, idle, and the hand-offs it waited for."""
    def summary(breakdown: DeviceBreakdown) -> dict:
        return {"compute_s": breakdown.compute_s, "idle_s": breakdown.idle_s,
                "handoffs_waited": len(breakdown.handoff_waits_s), "handoff_wait_s": sum(breakdown.handoff_waits_s)}

    last, model = round_breakdown(measured, rounds), round_breakdown(predicted)
    return {str(d): {"stage": last[d].stage, "measured": summary(last[d]), "predicted": summary(model[d])}
            for d in last if d in model}
