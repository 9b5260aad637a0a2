"""The pipeline side of the papers, measured by the runtime: Eco-FL Table 2 and Fig. 12, Asteroid Table 4.

Every figure is a run of :class:`ecofl.pipeline.runtime.HomePipeline` (one
worker process per device, sealed tensor links) on **emulated** devices: the
papers' results are about heterogeneous Jetsons, which this machine has
only as emulation. There each forward, backward and optimizer step sleeps
until the cost model's time for its device (host profile / device speed) and
every link is paced at its bandwidth, so *compute times are the cost model's
by construction*; what the runs really measure is communication and
scheduling (the schedule's bubbles, the links, the all-reduces, the
runtime's own overhead) and memory: the runtime's accounting of weights,
gradients, optimizer state and saved activations, and each worker process's
measured peak resident set (RSS). The cost model's prediction is printed
beside every measurement: where they part, the host did not keep up (a
shared machine) or the runtime added overhead.

- ``table2``: Eco-FL Table 2, 1F1B-Sync against GPipe (backward after
  forward) on EfficientNet-B0 over Eco-FL's TX2-N + Nano-H pair: the same
  partition at micro-batch 8 and M = 4, 8, 16 and 48 micro-batches per
  sync-round; throughput, stage busy fraction (the paper's GPU utilization),
  accounted and measured memory. The devices' memory budgets (7 and 3.5 GB)
  are enforced by the emulation's ledger: a run whose accounted peak would
  exceed one is refused (``EmulatedOOM``, nothing allocated).
- ``fig12``: Eco-FL Fig. 12, heterogeneity-aware partitioning (``ecofl``,
  ``hpp``) against ``even`` (equal FLOPs per device in pool order,
  PipeDream's balancing for identical devices) for MobileNetV2 and
  EfficientNet-B0 on Eco-FL's 2- and 3-device testbeds.
- ``table4``: Asteroid Table 4's shape: Asteroid's HPP (``hpp``) against
  the best device alone, data parallelism (``dp``, samples by speed) and a
  straight heterogeneity-balanced 1F1B pipeline (``ecofl``, the paper's PP)
  for MobileNetV2 and EfficientNet-B0 on Env A (5 Nano) and Env B (3 NX + 2
  TX2) at 100 Mbps.

With ``--emulate cgroup`` (root) the devices are confined instead
(docs/pipeline.md, "Confined devices"): each a worker in a cgroup of its own
with its scaled speed as a CPU quota and its memory budget as a memory limit,
planned from the speeds the devices measured in their cgroups (once per
model and pool); nothing sleeps to the cost model, an out-of-memory is the kernel's
(``DeviceOutOfMemory``), and the results and tables go beside the sleep
mode's (``<part>-cgroup``).

Inputs are 3x32x32 (CIFAR-10's size, as in Asteroid Table 4), synthetic,
10 classes, block granularity; each model is profiled right before its
runs into a fresh cache. ``--time-scale s`` multiplies every device's speed
*and* every link's bandwidth by s (time runs 1/s slower, every ratio of
compute to communication is kept), so that all of a pool's emulated devices
together need well under the one core a shared machine can spare.

    .venv/bin/python benchmarks/paper_pipeline.py [--only table2,fig12,table4] [--rounds 2] [--time-scale 0.5]
        [--emulate sleep|cgroup]

writes benchmarks/results/paper_pipeline.json (the parts run replace theirs)
and their sections of docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.home_runs import describe_plan, run_plan  # noqa: E402
from benchmarks.markdown_section import cell, replace_section  # noqa: E402
from ecofl.devices import HomePool, host_cores  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.pipeline.cost import simulate, stage_compute_s  # noqa: E402
from ecofl.pipeline.plan import Plan, ScheduleKind, StagePlan  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import EmulatedOOM, ZooModel  # noqa: E402
from ecofl.pipeline.runtime.calibration import (  # noqa: E402
    ConfinedPool, Workload, confine_pool, describe_workload, plan_on_measured_speeds)
from ecofl.pipeline.runtime.errors import DeviceOutOfMemory  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

SHAPE, CLASSES, GRANULARITY = (3, 32, 32), 10, "block"
PARTS = ("table2", "fig12", "table4")
MIB = 2**20

TABLE2_MODEL, TABLE2_POOL, TABLE2_MICRO_BATCH, TABLE2_M = "efficientnet_b0", "ecofl-hetero", 8, (4, 8, 16, 48)
FIG12_MODELS, FIG12_POOLS, FIG12_PLANNERS = ("mobilenet_v2", "efficientnet_b0"), (
    "ecofl-hetero", "ecofl-2stage", "ecofl-3stage"), ("ecofl", "hpp", "even")
TABLE4_MODELS, TABLE4_POOLS = ("mobilenet_v2", "efficientnet_b0"), ("asteroid-a", "asteroid-b")
TABLE4_METHODS = ("hpp", "ecofl", "dp")
SINGLE_MICRO_BATCHES = (4, 8, 16, 32)
#: Asteroid Table 4, 100 Mbps rows: Asteroid's speedup over the best device, DP and PP
#: (EfficientNet-B1 in the paper, B0 here).
ASTEROID_TABLE4 = {
    ("mobilenet_v2", "asteroid-a"): (4.5, 1.5, 3.5), ("mobilenet_v2", "asteroid-b"): (3.2, 2.3, 11.2),
    ("efficientnet_b0", "asteroid-a"): (4.4, 2.1, 2.8), ("efficientnet_b0", "asteroid-b"): (3.0, 4.8, 9.7),
}


def scaled(pool: HomePool, scale: float) -> HomePool:
    """``pool`` with every device's speed and link bandwidth times ``scale`` (the same ratios, slower time)."""
    devices = tuple(dataclasses.replace(d, speed=d.speed * scale, bandwidth_bps=d.bandwidth_bps * scale)
                    for d in pool.devices)
    return HomePool(pool.name, devices)


class Profiles:
    """Each model's host profile, measured on first use (right before its runs) into one cache."""

    def __init__(self, cache_dir: str):
        self.cache_dir, self.profiles = cache_dir, {}

    def __call__(self, model: str) -> ModelProfile:
        if model not in self.profiles:
            started = time.time()
            self.profiles[model] = profile_zoo_model(model, SHAPE, CLASSES, GRANULARITY, self.cache_dir)
            print(f"[{model}] profiled in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
        return self.profiles[model]


class Devices:
    """The pools the runs plan on and their plans: the scaled presets (sleep), or the speeds the confined
    devices measured in their cgroups (cgroup), with the limits they run under.

    A confined device's speed depends on the layers and the samples per call it computes (a throttled process
    loses more of its quota to per-call work on small micro-batches), so each method's plan is predicted on the
    speeds its devices measured on their own stages
    (:func:`~ecofl.pipeline.runtime.calibration.plan_on_measured_speeds`; once per model, pool and workload),
    as Asteroid §3.3 profiles each layer on each device per batch size.
    """

    def __init__(self, args: argparse.Namespace):
        self.args, self.calibrated = args, {}

    def __call__(self, model: str, pool_name: str, profile: ModelProfile, plan_for: Callable[[HomePool], Plan]
                 ) -> tuple[HomePool, Plan, dict | None]:
        presets = scaled(load_pool(pool_name, None), self.args.time_scale)
        if self.args.emulate == "sleep":
            return presets, plan_for(presets), None

        def measure(workload: Workload) -> ConfinedPool:
            confined = confine_pool(ZooModel(model, SHAPE, CLASSES, GRANULARITY), SHAPE, profile, presets, workload)
            print(f"[{model} {pool_name} {describe_workload(workload)}] speeds measured in the cgroups: " + ", ".join(
                f"{d.name} {d.speed:.3f} (quota {confined.limits[i].cores:.3f})"
                for i, d in enumerate(confined.pool.devices)), file=sys.stderr, flush=True)
            return confined

        confined, plan = plan_on_measured_speeds(plan_for, profile, presets, measure,
                                                 self.calibrated.setdefault((model, pool_name), {}))
        return confined.pool, plan, confined.limits


def emulated_run(model: str, pool: HomePool, plan: Plan, profile: ModelProfile, args: argparse.Namespace,
                 label: str, limits: dict | None = None) -> dict:
    """One run (devices sleeping to the model, or confined with ``limits``); an out-of-memory, the emulation's
    or the kernel's, is a result (``oom``), not a failure."""
    try:
        report = run_plan(ZooModel(model, SHAPE, CLASSES, GRANULARITY), pool, plan, profile, emulate=args.emulate,
                          limits=limits, rounds=args.rounds, timeout_s=args.timeout)
    except (EmulatedOOM, DeviceOutOfMemory) as error:
        print(f"[{label}] {describe_plan(plan, pool)}: {error}", file=sys.stderr, flush=True)
        return {"plan_text": describe_plan(plan, pool), "oom": str(error),  # beside what the model said
                "model_memory_bytes": [int(b) for b in simulate(plan, profile, pool).stage_memory_bytes]}
    print(f"[{label}] {report['plan_text']}: {report['throughput']:.2f} samples/s measured, "
          f"{report['predicted_throughput']:.2f} predicted, {report['cpu_cores_used']:.2f} cores used, "
          f"load {report['load_average'][0]:.1f}", file=sys.stderr, flush=True)
    return report


def table2(args: argparse.Namespace, profiles: Profiles, devices: Devices) -> dict:
    """1F1B-Sync and GPipe on one partition, for each M (Eco-FL Table 2)."""
    profile = profiles(TABLE2_MODEL)
    counts = [int(m) for m in args.table2_m.split(",")]
    pool, base, limits = devices(TABLE2_MODEL, TABLE2_POOL, profile, lambda pool: make_plan(
        "ecofl", profile, pool, TABLE2_MICRO_BATCH * max(counts), micro_batch=TABLE2_MICRO_BATCH))
    runs = []
    for m in counts:
        for schedule in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
            plan = dataclasses.replace(base, num_micro_batches=m, schedule=schedule)
            runs.append({"schedule": schedule, "M": m,
                         **emulated_run(TABLE2_MODEL, pool, plan, profile, args, f"table2 {schedule} M={m}",
                                        limits)})
    return {"model": TABLE2_MODEL, "pool": TABLE2_POOL, "micro_batch": TABLE2_MICRO_BATCH,
            "budgets_bytes": [d.memory_bytes for d in pool.devices], "runs": runs}


def fig12(args: argparse.Namespace, profiles: Profiles, devices: Devices) -> dict:
    """Heterogeneity-aware plans against even partitioning (Eco-FL Fig. 12)."""
    runs = []
    for model in FIG12_MODELS:
        profile = profiles(model)
        for pool_name in FIG12_POOLS:
            for planner in FIG12_PLANNERS:
                options = {"balance": "flops"} if planner == "even" else {}
                pool, plan, limits = devices(model, pool_name, profile, lambda pool: make_plan(
                    planner, profile, pool, args.batch, **options))
                runs.append({"model": model, "pool": pool_name, "planner": planner,
                             **emulated_run(model, pool, plan, profile, args, f"fig12 {model} {pool_name} {planner}",
                                            limits)})
    return {"runs": runs}


def single_device_plan(profile: ModelProfile, device) -> Plan:
    """The whole model on one device at its best micro-batch (by the profile), two micro-batches."""
    last = profile.num_layers - 1
    best = max(SINGLE_MICRO_BATCHES, key=lambda b: b / sum(stage_compute_s(profile, device, (0, last), b)))
    return Plan("single", (StagePlan((0, last), (0,), (best,), 1),), best, 2)


def table4(args: argparse.Namespace, profiles: Profiles, devices: Devices) -> dict:
    """HPP against the best device, DP and a straight pipeline (Asteroid Table 4)."""
    runs = []
    for model in TABLE4_MODELS:
        profile = profiles(model)
        for pool_name in TABLE4_POOLS:
            for planner in TABLE4_METHODS:
                pool, plan, limits = devices(model, pool_name, profile, lambda pool: make_plan(
                    planner, profile, pool, args.table4_batch))
                runs.append({"model": model, "pool": pool_name, "method": planner,
                             **emulated_run(model, pool, plan, profile, args, f"table4 {model} {pool_name} {planner}",
                                            limits)})
            pool, plan, limits = devices(model, pool_name, profile, lambda pool: single_device_plan(
                profile, max(pool.devices, key=lambda d: d.speed)))
            index = max(range(len(pool)), key=lambda d: pool.devices[d].speed)
            fastest = pool.devices[index]
            alone = HomePool(fastest.name, (fastest,))
            runs.append({"model": model, "pool": pool_name, "method": "device",
                         **emulated_run(model, alone, plan, profile, args,
                                        f"table4 {model} {pool_name} {fastest.name} alone",
                                        None if limits is None else {0: limits[index]})})
    return {"batch": args.table4_batch, "runs": runs}


# -- Markdown ------------------------------------------------------------------------------------


def _per_stage(values: list, fmt: str) -> str:
    return " / ".join("-" if v is None else format(v, fmt) for v in values)


def _mib(values: list) -> str:
    return _per_stage([None if v is None else v / MIB for v in values], ".0f")


def conditions(results: dict) -> str:
    if results.get("emulate", "sleep") == "cgroup":
        calibrated = ("and predicted at the speeds they measured on their own stages of its plan (cores kept awake by "
                      "idle-priority spinners)" if results.get("calibration") == "stages" else
                      "at the samples per call its plan gives them")  # runs from before stage calibration
        how = (f"devices **confined by cgroups** at time scale {results['time_scale']} (quotas = preset speeds "
               f"x{results['time_scale']} cores, links paced at the bandwidths x{results['time_scale']}, a "
               "replicated stage's all-reduce too), each method planned from the speeds the devices measured in "
               f"their cgroups {calibrated}; nothing sleeps to the cost model. `pred.`: the cost model on those "
               "speeds, "
               "with the runtime's overhead per operation and per byte; measured and predicted "
               "are free to differ. An OOM is the kernel's, at the cgroup's memory limit (budget + the worker's "
               "runtime)")
    else:
        how = (f"devices **sleeping to the cost model** at time scale {results['time_scale']} (speeds and link "
               f"bandwidths x{results['time_scale']}: samples/s are of the scaled pool, ratios are unchanged). "
               "`pred.`: the cost model's prediction, which emulated compute follows by construction (these are "
               "the model's figures). An OOM is the emulation's ledger's")
    return (f"Generated by `{results['command']}` ({results['machine']}, {results['cores']} cores shared with "
            f"other jobs, {results['date']}); {how}; one warm-up sync-round, then the median of "
            f"{results['rounds']}. `load`: 1-minute load average at the run's start; `CPU`: cores the run's "
            "processes received.")


def markdown_table2(results: dict) -> str:
    part = results["table2"]
    lines = [
        conditions(results), "",
        f"{part['model']} on {part['pool']} (stage 0 / stage 1 in each cell), micro-batch {part['micro_batch']}, "
        "the same partition for every row. Busy: the stage's compute time / sync-round (the paper's GPU "
        "utilization). Memory in MiB: `accounted` by the runtime (weights, gradients, momentum, buffers and "
        "the bytes autograd saved for the resident forwards), `model` = Asteroid eq. 3 as the planner "
        "budgets it, `RSS` = the worker's measured peak resident set during a sync-round above the process "
        "before any model was built.", "",
        "| schedule | M | samples/s (pred.) | busy | accounted MiB | model MiB | RSS MiB "
        "| resident forwards | load, CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in part["runs"]:
        name = "GPipe" if ScheduleKind.from_str(run["schedule"]) == ScheduleKind.GPIPE else "1F1B-Sync"
        if "oom" in run:
            model = " / ".join(f"{b / MIB:.0f}" for b in run.get("model_memory_bytes", []))
            lines.append(f"| {name} | {run['M']} | OOM: {run['oom']} | | | {model} | | | |")
            continue
        stages = run["stages"]
        lines.append(
            f"| {name} | {run['M']} | {run['throughput']:.2f} ({run['predicted_throughput']:.2f}) "
            f"| {_per_stage([s['busy_fraction'] for s in stages], '.2f')} "
            f"| {_mib([s['peak_memory_bytes'] for s in stages])} "
            f"| {_mib([s['predicted_memory_bytes'] for s in stages])} "
            f"| {_mib([s['training_rss_bytes'] for s in stages])} "
            f"| {_per_stage([s['peak_resident'] for s in stages], 'd')} "
            f"| {run['load_average'][0]:.1f}, {run['cpu_cores_used']:.2f} |")
    return "\n".join(lines + [""])


def markdown_fig12(results: dict) -> str:
    part = results["fig12"]
    lines = [
        conditions(results), "",
        f"Mini-batch {results['batch']}; each planner chooses its micro-batch. `even`: equal forward FLOPs per "
        "device in pool order (PipeDream's balancing, which assumes identical devices). Busy: each stage's "
        "compute time / sync-round.", "",
        "| model | pool | planner | plan | samples/s (pred.) | busy per stage | / even | load, CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    even = {(r["model"], r["pool"]): r.get("throughput") for r in part["runs"] if r["planner"] == "even"}
    for run in part["runs"]:
        if "oom" in run:
            lines.append(f"| {run['model']} | {run['pool']} | {run['planner']} | {cell(run['plan_text'])} "
                         f"| OOM | | | |")
            continue
        base = even[(run["model"], run["pool"])]
        ratio = f"{run['throughput'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {run['model']} | {run['pool']} | {run['planner']} | {cell(run['plan_text'])} "
            f"| {run['throughput']:.2f} ({run['predicted_throughput']:.2f}) "
            f"| {_per_stage([s['busy_fraction'] for s in run['stages']], '.2f')} | {ratio} "
            f"| {run['load_average'][0]:.1f}, {run['cpu_cores_used']:.2f} |")
    return "\n".join(lines + [""])


def markdown_table4(results: dict) -> str:
    part = results["table4"]
    lines = [
        conditions(results), "",
        f"Mini-batch {part['batch']} for the pooled methods (Asteroid: 2048); the best device alone trains two "
        "micro-batches of its best size. Env A = 5 Nano (10 W), Env B = 3 NX + 2 TX2 (Max-N), 100 Mbps "
        "before scaling. `hpp` is Asteroid's planner, `ecofl` the straight pipeline with heterogeneity-aware "
        "balancing and 1F1B (the paper's PP), `dp` data parallelism with samples by speed.", "",
        "| model | env | method | plan | samples/s (pred.) | load, CPU |",
        "|---|---|---|---|---|---|",
    ]
    by_key = {}
    for run in part["runs"]:
        by_key[(run["model"], run["pool"], run["method"])] = run
        if "oom" in run:
            lines.append(f"| {run['model']} | {run['pool']} | {run['method']} | {cell(run['plan_text'])} | OOM | |")
            continue
        lines.append(f"| {run['model']} | {run['pool']} | {run['method']} | {cell(run['plan_text'])} "
                     f"| {run['throughput']:.2f} ({run['predicted_throughput']:.2f}) "
                     f"| {run['load_average'][0]:.1f}, {run['cpu_cores_used']:.2f} |")
    lines += [
        "", "Speedup of `hpp` (Asteroid) over the best device, DP and PP: measured (predicted) here, and Asteroid "
        "Table 4's (100 Mbps rows; EfficientNet-B1 there).", "",
        "| model | env | over device | over DP | over PP | Asteroid: device, DP, PP |",
        "|---|---|---|---|---|---|",
    ]
    for (model, pool), paper in ASTEROID_TABLE4.items():
        hpp = by_key.get((model, pool, "hpp"))
        if hpp is None or "oom" in hpp:
            continue
        cells = []
        for other in ("device", "dp", "ecofl"):
            run = by_key.get((model, pool, other))
            if run is None or "oom" in run:
                cells.append("-")
            else:
                cells.append(f"{hpp['throughput'] / run['throughput']:.2f}x "
                             f"({hpp['predicted_throughput'] / run['predicted_throughput']:.2f}x)")
        lines.append(f"| {model} | {pool} | {' | '.join(cells)} | {', '.join(f'{x}x' for x in paper)} |")
    return "\n".join(lines + [""])


MARKDOWN = {"table2": markdown_table2, "fig12": markdown_fig12, "table4": markdown_table4}
RUN = {"table2": table2, "fig12": fig12, "table4": table4}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=2, help="measured sync-rounds per run (after one warm-up)")
    parser.add_argument("--batch", type=int, default=64, help="mini-batch of Fig. 12's runs")
    parser.add_argument("--table2-m", default=",".join(map(str, TABLE2_M)),
                        help="Table 2's numbers of micro-batches M (the partition is planned for the largest)")
    parser.add_argument("--table4-batch", type=int, default=128, help="mini-batch of Table 4's pooled runs")
    parser.add_argument("--time-scale", type=float, default=0.5, help="device speeds and link bandwidths x this")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--emulate", choices=("sleep", "cgroup"), default="sleep",
                        help="devices sleeping to the cost model, or confined by cgroups (root)")
    parser.add_argument("--cache-dir", default=None, help="profile cache (default: a fresh one, profiled now)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "paper_pipeline.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "RESULTS.md"))
    args = parser.parse_args(argv)
    parts = args.only.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; valid: {', '.join(PARTS)}")
    torch.set_num_threads(1)
    path = Path(args.json)
    results = json.loads(path.read_text()) if path.exists() else {}
    results.update(machine=platform.machine(), cores=host_cores())
    suffix = "" if args.emulate == "sleep" else f"-{args.emulate}"
    with tempfile.TemporaryDirectory() as fresh:
        profiles, devices = Profiles(args.cache_dir or fresh), Devices(args)
        for part in parts:
            measured = RUN[part](args, profiles, devices)
            # The conditions travel with each part, so parts measured at different times keep their own.
            measured["conditions"] = {
                "command": "python benchmarks/paper_pipeline.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": args.rounds, "time_scale": args.time_scale,
                "batch": args.batch, "emulate": args.emulate, "calibration": "stages"}
            results[part + suffix] = measured
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1))  # nothing lost if a later part fails
    for part in PARTS:
        for key in (part, f"{part}-cgroup"):  # each mode's figures in a section of their own
            if key in results:
                view = {**results, part: results[key], **results[key]["conditions"]}
                table = MARKDOWN[part](view)
                if not replace_section(Path(args.doc), table, f"paper-{key}"):
                    print(f"(no paper-{key} section in {args.doc}: not written there)", file=sys.stderr)
                print(table)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
