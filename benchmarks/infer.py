"""Inference benchmark: PipeEdge's plan against one device, an even partition and every device, streamed for real.

For two heterogeneous homes and two models, each plan is run by the runtime
(:meth:`ecofl.pipeline.runtime.portal.HomePipeline.infer`: one worker process
per device, sealed links, back-pressure) on emulated devices, side by side in
one invocation, and compared with the stream cost model's prediction
(:func:`ecofl.pipeline.stream.simulate_stream`):

- ``pipeedge``: PipeEdge §III-B, the DP that chooses which devices to use and
  in which order, for the inference objective;
- ``best single device``: the whole model on the device that streams it
  fastest (by the cost model), alone;
- ``even``: equal layers per device over every device, in pool order;
- ``every device``: the best (by the cost model) of the ``ecofl`` and
  ``hpp`` inference plans that use every device of the pool (they order,
  cut and share, but do not leave devices out).

Homes: **far-rpi** (a Nano portal, a TX2, an NX and a Raspberry Pi 4 in a
far corner of the house's Wi-Fi, its link at 0.2 Mbps: using it costs more
than it brings, so PipeEdge leaves it out for MobileNetV2) and
**ecofl-3stage** (Eco-FL's testbed: two Nano, a TX2 Max-Q). Models: MobileNetV2 (block
layers) and bert_small cut at attention / MLP units (PipeEdge §III-C), on
3x32x32 synthetic inputs.

**What is measured.** The devices are emulated: every forward sleeps until
the cost model's time for the emulated board (device speeds x``--slowdown``,
so a host core is at least 20x faster than any board and the emulation stays
ahead of real compute even on a loaded machine), and links are paced by
token buckets. So compute agrees with
the prediction by construction; what is really measured is the streaming
itself: transfers, back-pressure, scheduling and the runtime's overheads.
Throughput is the steady state (the second half of the stream), latency a
micro-batch's trip from the portal and back, both defined as the cost model
defines them.

With ``--emulate cgroup`` (root) nothing sleeps to the cost model: every device's worker runs in
a cgroup of its own at its preset's speed in host cores (no ``--slowdown``)
and memory, the devices first time the model's eval-mode forwards there, as
they will stream (:func:`~ecofl.pipeline.runtime.calibration.confine_pool`,
at micro-batch 8),
and every plan is made from the speeds they measured. Each planner then
plans again on the speeds its devices measure on their own stages (their
layers at their samples per call: a throttled device's speed depends on
both) until its plan's stages are measured, as ``ecofl home infer`` does
(:func:`~ecofl.pipeline.runtime.calibration.plan_on_measured_speeds`), and
each plan is predicted at its devices' stage speeds, with the runtime's
overheads per forward and per byte. Then predicted against
measured throughput is the stream model's real error.

    .venv/bin/python benchmarks/infer.py [--micro-batches 24] [--slowdown 0.25] [--emulate sleep|cgroup]

writes benchmarks/results/infer.json (``infer_cgroup.json``) and the results
section of docs/inference.md (its ``cgroup`` section).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402
from ecofl.devices import MBPS, HomePool  # noqa: E402
from ecofl.errors import UserError  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.pipeline.plan import STREAM_IN_FLIGHT, Plan, StagePlan  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import HomePipeline, ZooModel  # noqa: E402
from ecofl.pipeline.runtime.calibration import (  # noqa: E402
    ConfinedPool,
    Workload,
    confine_pool,
    plan_on_measured_speeds,
    plan_workload,
    whole_model,
)
from ecofl.pipeline.runtime.emulation import Emulation  # noqa: E402
from ecofl.pipeline.runtime.confinement import pool_limits  # noqa: E402
from ecofl.pipeline.runtime.host_overhead import runtime_overheads  # noqa: E402
from ecofl.pipeline.stream import simulate_stream  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

SHAPE, CLASSES = (3, 32, 32), 10
MODELS = {"mobilenet_v2": "block", "bert_small": "fine"}
BATCH = 64  # the planners try its divisors as micro-batch sizes
PLANNING_MICRO_BATCH = 8  # confined: the devices' speeds the plans are made from are measured at this size


def homes(slowdown: float) -> dict[str, HomePool]:
    """The two homes, every device's speed x ``slowdown``."""
    base = load_pool("nano-10w,tx2-maxn,nx,rpi4", 100)
    rpi = dataclasses.replace(base.devices[3], name="far-rpi4", bandwidth_bps=0.2 * MBPS)
    pools = {"far-rpi": HomePool("far-rpi", base.devices[:3] + (rpi,)), "ecofl-3stage": load_pool("ecofl-3stage", 100)}
    return {name: HomePool(name, tuple(dataclasses.replace(d, speed=d.speed * slowdown) for d in pool.devices))
            for name, pool in pools.items()}


def single_device_plan(profile: ModelProfile, pool: HomePool, count: int) -> Plan:
    """The whole model on the one device that streams it fastest (by the cost model)."""
    best = None
    for device in range(len(pool)):
        for micro_batch in (b for b in range(1, BATCH + 1) if BATCH % b == 0):
            stage = StagePlan((0, profile.num_layers - 1), (device,), (micro_batch,), STREAM_IN_FLIGHT)
            plan = Plan("single", (stage,), micro_batch, count, schedule="stream")
            throughput = simulate_stream(plan, profile, pool, count).throughput
            if best is None or throughput > best[0]:
                best = (throughput, plan)
    return best[1]


def devices_computing(plan: Plan) -> list[int]:
    """The devices a plan gives a share of the samples (a planner may list a device with none)."""
    return [d for stage in plan.stages for d, share in zip(stage.devices, stage.shares) if share]


def plans(profile: ModelProfile, pool: HomePool, count: int,
          planned: Callable[[str], tuple[Plan, HomePool]]) -> dict[str, Plan]:
    """The four plans for a home whose devices have speeds ``pool``; ``planned(name)`` is the named planner's
    inference plan and the speeds it is to be judged at (confined: re-planned on its own stages' speeds)."""
    single = single_device_plan(profile, pool, count)
    candidates = [planned(name) for name in ("ecofl", "hpp")]
    everyone = [(plan, speeds) for plan, speeds in candidates if len(devices_computing(plan)) == len(pool)]
    chosen = {
        "pipeedge": planned("pipeedge")[0],
        "best single device": single,
        "even": planned("even")[0],
    }
    if everyone:
        chosen["every device"] = max(everyone, key=lambda pair: simulate_stream(
            pair[0], profile, pair[1], count).throughput)[0]
    return chosen


def measure(model: str, granularity: str, profile: ModelProfile, pool: HomePool, plan: Plan, count: int,
            timeout_s: float, limits: dict | None = None, cache_dir: str | None = None) -> dict:
    """Stream ``count`` micro-batches of synthetic inputs through ``plan`` (devices confined to ``limits`` if
    given, else sleeping to the model); measured and predicted figures."""
    x = torch.randn(count * plan.micro_batch, *SHAPE, generator=torch.Generator().manual_seed(0))
    spec = ZooModel(model, SHAPE, CLASSES, granularity)
    mode = Emulation.SLEEP if limits is None else Emulation.CGROUP
    with HomePipeline(spec, pool, plan, profile=profile, emulate=mode, limits=limits, timeout_s=timeout_s) as home:
        result = home.infer(None, x)
    predicted = simulate_stream(plan, profile, pool, count, **runtime_overheads(mode, cache_dir))
    return {
        "planner": plan.planner,
        "devices": [pool.devices[d].name for d in devices_computing(plan)],
        "stages": [list(stage.layers) for stage in plan.stages],
        "micro_batch": plan.micro_batch,
        "throughput": result.throughput, "predicted_throughput": predicted.throughput,
        "latency_s": result.latency_s, "predicted_latency_s": predicted.latency_s,
        "busy_fraction": list(result.busy_fraction), "peak_held": list(result.peak_held),
        "peak_rss_bytes": list(result.peak_rss_bytes),
    }


def markdown(report: dict) -> str:
    if report["emulate"] == "cgroup":
        command = f"python benchmarks/infer.py --micro-batches {report['micro_batches']} --emulate cgroup"
        how = ("devices **confined by cgroups** at their presets' speeds in host cores and their memory, plans "
               "made from the speeds the devices measured in their cgroups (" + "; ".join(
                   f"{home}: {speeds}" for home, speeds in report["measured_speeds"].items())
               + "), each plan predicted at the speeds its devices measured again on their own stages, cores kept "
               "awake by idle-priority spinners; nothing sleeps to the cost model: compute, transfers and overheads "
               "are all measured")
    else:
        command = (f"python benchmarks/infer.py --micro-batches {report['micro_batches']} "
                   f"--slowdown {report['slowdown']}")
        how = ("emulated devices (compute is the cost model's by construction; transfers, back-pressure and the "
               "runtime's overheads are measured)")
    lines = [
        f"Measured {report['date']} on {report['machine']} (load average {report['load']}) with `{command}`: "
        f"{how}, links paced at their rates, synthetic 3x32x32 inputs. Throughput is "
        "the steady state in samples/s; latency a micro-batch's trip from the portal and back.",
        "",
        "| home | model | plan | planner | devices used | micro-batch | measured samples/s | predicted | "
        "latency ms (pred.) |",
        "|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for key, runs in report["runs"].items():
        home, model = key.split("/")
        for name, run in runs.items():
            lines.append(
                f"| {home} | {model} | {name} | {run['planner']} | {', '.join(run['devices'])} | "
                f"{run['micro_batch']} | "
                f"{run['throughput']:.1f} | {run['predicted_throughput']:.1f} | "
                f"{run['latency_s'] * 1e3:.0f} ({run['predicted_latency_s'] * 1e3:.0f}) |"
            )
    lines += ["", "| home | model | pipeedge / best single | pipeedge / even | pipeedge / every device |",
              "|---|---|---:|---:|---:|"]
    for key, runs in report["runs"].items():
        home, model = key.split("/")
        ours = runs["pipeedge"]["throughput"]
        every = f"{ours / runs['every device']['throughput']:.2f}x" if "every device" in runs else "-"
        lines.append(f"| {home} | {model} | {ours / runs['best single device']['throughput']:.2f}x | "
                     f"{ours / runs['even']['throughput']:.2f}x | {every} |")
    return "\n".join(lines)


def save(args: argparse.Namespace, runs: dict[str, dict], speeds: dict[str, str]) -> dict:
    """Write the runs measured so far to ``args.output``; returns the report."""
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "micro_batches": args.micro_batches,
              "slowdown": args.slowdown, "emulate": args.emulate, "measured_speeds": speeds, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=24, help="micro-batches streamed per plan")
    parser.add_argument("--slowdown", type=float, default=0.25,
                        help="sleep mode: every device's speed is multiplied by this")
    parser.add_argument("--emulate", choices=("sleep", "cgroup"), default="sleep",
                        help="devices sleeping to the cost model, or confined by cgroups at their presets (root)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a plan's stream may take at least (slow plans get twice their prediction)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--output", default=None, help="default: benchmarks/results/infer[_cgroup].json")
    args = parser.parse_args(argv)
    confined = args.emulate == "cgroup"
    if confined:
        args.slowdown = 1.0  # a device's quota is its preset's speed
    suffix = "_cgroup" if confined else ""
    args.output = args.output or str(ROOT / "benchmarks" / "results" / f"infer{suffix}.json")
    torch.set_num_threads(1)
    runs: dict[str, dict] = {}
    speeds: dict[str, str] = {}
    for home, presets in homes(args.slowdown).items():
        for model, granularity in MODELS.items():
            profile = profile_zoo_model(model, SHAPE, CLASSES, granularity, args.cache_dir)
            key = f"{home}/{model}"
            pool, limits = presets, None
            devices = range(len(presets.devices))
            calibrated: dict[Workload, ConfinedPool] = {}  # the devices' speeds by what they timed

            def speeds_on(workload: Workload) -> ConfinedPool:
                if workload not in calibrated:
                    calibrated[workload] = confine_pool(ZooModel(model, SHAPE, CLASSES, granularity), SHAPE,
                                                        profile, presets, workload, objective="inference",
                                                        cache_dir=args.cache_dir)
                return calibrated[workload]

            def planned(name: str) -> tuple[Plan, HomePool]:
                if not confined:
                    return make_plan(name, profile, pool, BATCH, objective="inference"), pool
                measured, plan = plan_on_measured_speeds(
                    lambda devices: make_plan(name, profile, devices, BATCH, objective="inference"), profile,
                    presets, speeds_on, calibrated)
                return plan, measured.pool

            if confined:  # the devices time the model's forwards in their cgroups; every plan is made from that
                pool = speeds_on(whole_model(devices, PLANNING_MICRO_BATCH)).pool
                limits = pool_limits(presets)
                speeds[key] = ", ".join(f"{d.name} {d.speed:.3f} (quota {limits[i].cores:.3f})"
                                        for i, d in enumerate(pool.devices))
                print(f"{key}: measured speeds {speeds[key]}", flush=True)
            runs[key] = {}
            for name, plan in plans(profile, pool, args.micro_batches, planned).items():
                # predicted at the speeds its devices measured on their own stages
                run_pool = speeds_on(plan_workload(plan, devices)).pool if confined else pool
                # A slow plan (the even partition over a 0.2 Mbps link) streams for minutes: wait for it.
                expected_s = plan.micro_batch * args.micro_batches / simulate_stream(
                    plan, profile, run_pool, args.micro_batches).throughput
                try:
                    runs[key][name] = measure(model, granularity, profile, run_pool, plan, args.micro_batches,
                                              max(args.timeout, 2 * expected_s + 120), limits, args.cache_dir)
                except UserError as error:
                    raise SystemExit(f"{key} {name}: {error}")
                run = runs[key][name]
                print(f"{key} {name}: {', '.join(run['devices'])}: {run['throughput']:.1f} samples/s "
                      f"(predicted {run['predicted_throughput']:.1f})", flush=True)
                save(args, runs, speeds)  # nothing measured is lost if a later plan fails
    report = save(args, runs, speeds)
    table = markdown(report)
    print(table)
    if not replace_section(ROOT / "docs" / "inference.md", table, "cgroup" if confined else None):
        print("docs/inference.md has no benchmark section for this mode; table not written there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
