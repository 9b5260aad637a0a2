"""Our home runtime against torch.distributed.pipelining: one partition, two kinds of links, alternating repeats.

Both runtimes train MobileNetV2 (block granularity, 3x32x32 synthetic inputs,
10 classes) on the partition the ``ecofl`` planner makes for a three-device
pool (Jetson Nano-10W + TX2-MaxN + NX, 100 Mbps), one process per stage, SGD
with momentum, one optimizer step per mini-batch, under two conditions:

- **unshaped, host speed**: no emulation on either side (no time dilation,
  no link pacing), every stage a process of this machine on loopback: what
  each runtime costs on top of the same computation (our links are
  authenticated and sealed with AES-GCM; gloo's are plain TCP).
- **shaped, 100 Mbps**: both runtimes in the same network namespaces, links
  shaped by the kernel (``tc tbf``, :class:`ecofl.net.netns.HomeNetwork`;
  root only), and both with the same emulated compute: each stage's forward
  and backward last the cost model's time for its device (our workers'
  emulation; :class:`DilatedStage` for torch's), speeds x ``--slowdown`` so
  that every device is more than 5x slower than a host core.
- **confined, 100 Mbps** (root): the same namespaces and links, and every
  stage process of *both* runtimes in a cgroup of its own with its device's
  (slowed) speed as a CPU quota (:mod:`ecofl.cgroups`), the cores kept
  awake for both (:mod:`ecofl.awake_cores`); nothing sleeps to a model on either side,
  so compute is real and both runtimes get the same CPU. Our workers keep
  their quota's pace (:mod:`ecofl.pipeline.runtime.cpu_pace`); torch's ranks
  do not, so they keep the burst CFS grants a cgroup after idling: an edge
  to torch where operations are short (rows measured before 2026-12-01 had
  the burst on both sides).

and two schedules each: our 1F1B-Sync (stage s keeps K_s = 2(S - s) - 1
forwards in flight, Eco-FL eq. 3) against torch's ``Schedule1F1B`` (S - s
warm-up forwards), which differ in schedule as well as runtime; and GPipe
against ``ScheduleGPipe``, the same schedule on both sides, so that there the
runtimes differ only as runtimes. Each measurement: one warm-up sync-round,
then the median of ``--rounds``; the repeats alternate which runtime runs
first. Targets (issue 13): ours / torch >= 1.0x unshaped, >= 1.15x at 100 Mbps.

Shaped rows also carry the cost model's predicted ratio of the two 1F1B
schedules (:func:`schedule_predictions`): with compute emulated on both
sides, the schedule is the only thing the prediction sees, so a measured
ratio near it says the runtimes differ by schedule and nothing else. Rows are
kept per bandwidth, so ``--mbps 25`` adds rows beside the 100 Mbps ones.

    .venv/bin/python benchmarks/versus_pipelining.py [--repeats 3] [--rounds 3] [--batch 64]
        [--conditions unshaped,shaped] [--mbps 100]

writes benchmarks/results/versus_pipelining.json and its section of docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.home_runs import LR, MOMENTUM, describe_plan, run_plan, synthetic_batch  # noqa: E402
from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.awake_cores import AwakeCores  # noqa: E402
from ecofl.cgroups import DeviceLimits, find_hierarchy  # noqa: E402
from ecofl.devices import HomePool, host_cores, make_pool  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.net.netns import HomeNetwork, unavailable_reason  # noqa: E402
from ecofl.pipeline.cost import simulate, stage_compute_s  # noqa: E402
from ecofl.pipeline.plan import Plan, ScheduleKind, StagePlan  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import load_profile, profile_zoo_model, save_profile  # noqa: E402
from ecofl.pipeline.runtime import ZooModel  # noqa: E402
from ecofl.pipeline.runtime.confinement import STARTUP_ALLOWANCE_BYTES, pool_limits  # noqa: E402

MODEL, SHAPE, CLASSES, GRANULARITY = "mobilenet_v2", (3, 32, 32), 10, "block"
PRESETS = ["nano-10w", "tx2-maxn", "nx"]
CONDITIONS = ("unshaped", "shaped", "confined")
SCHEDULES = {ScheduleKind.ONE_F_ONE_B: "Schedule1F1B", ScheduleKind.GPIPE: "ScheduleGPipe"}


def slowed_pool(presets: list[str], mbps: float, slowdown: float) -> HomePool:
    pool = make_pool("hetero-3", presets, mbps)
    return HomePool(pool.name, tuple(dataclasses.replace(d, speed=d.speed * slowdown) for d in pool.devices))


# -- torch.distributed.pipelining ------------------------------------------------------------------


class _BackwardStart(torch.autograd.Function):
    """Identity; its backward (the first of the stage's) notes when the stage's backward began."""

    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.box["backward_start"] = time.time()
        return grad, None


class _BackwardEnd(torch.autograd.Function):
    """Identity; its backward (the stage's last) sleeps until the backward lasted its emulated time."""

    @staticmethod
    def forward(ctx, x, anchor, box, seconds):
        ctx.box, ctx.seconds = box, seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(max(0.0, ctx.box["backward_start"] + ctx.seconds - time.time()))
        return grad, torch.zeros(0), None, None


class DilatedStage(nn.Module):
    """A stage whose forward and backward last at least the cost model's times (as our emulated workers do)."""

    def __init__(self, inner: nn.Module, forward_s: float, backward_s: float):
        super().__init__()
        self.inner, self.forward_s, self.backward_s = inner, forward_s, backward_s
        self.anchor = nn.Parameter(torch.zeros(0))  # makes the input end of the graph run backward
        self.box: dict[str, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.time()
        out = _BackwardStart.apply(self.inner(_BackwardEnd.apply(x, self.anchor, self.box, self.backward_s)), self.box)
        time.sleep(max(0.0, start + self.forward_s - time.time()))
        return out


def schedule1f1b_plan(plan: Plan) -> Plan:
    """``plan`` with torch's ``Schedule1F1B`` warm-up: S - s forwards in flight on stage s (Eco-FL eq. 3
    when communication is negligible), where 1F1B-Sync keeps 2(S - s) - 1."""
    num_stages = len(plan.stages)
    return dataclasses.replace(plan, schedule=ScheduleKind.ONE_F_ONE_B, stages=tuple(
        dataclasses.replace(stage, in_flight=num_stages - s) for s, stage in enumerate(plan.stages)))


def schedule_predictions(plan: Plan, profile, pool: HomePool) -> dict[str, float]:
    """What the cost model says of ``plan``'s partition on emulated devices (Eco-FL eq. 3: the deeper warm-up
    hides each link's transfer, and gains the more, the longer transfers are against a stage's compute).

    ``predicted_ratio``: the sync-round with ``Schedule1F1B``'s warm-up over 1F1B-Sync's. ``bound_s``: the
    least a sync-round can take under any schedule, the busiest device's forwards and backwards plus its
    stage's flush.
    """
    ours = simulate(dataclasses.replace(plan, schedule=ScheduleKind.ONE_F_ONE_B), profile, pool)
    theirs = simulate(schedule1f1b_plan(plan), profile, pool)
    return {"predicted_ratio": theirs.sync_round_s / ours.sync_round_s,
            "bound_s": max(busy + flush for busy, flush in zip(ours.stage_busy_s, ours.flush_s))}


def pipelining_worker(rank: int, setup_path: str) -> None:
    """One rank of torch.distributed.pipelining (run as its own process); rank 0 writes every rank's times."""
    from torch.distributed import pipelining

    from ecofl.models import build_model, layer_sequence

    setup = json.loads(Path(setup_path).read_text())
    torch.set_num_threads(1)
    plan = Plan(**{**setup["plan"], "stages": tuple(StagePlan(**s) for s in setup["plan"]["stages"])})
    world = len(plan.stages)
    dist.init_process_group("gloo", init_method=setup["init"], rank=rank, world_size=world)
    stage_plan = plan.stages[rank]
    first, last = stage_plan.layers
    layers = layer_sequence(build_model(MODEL, SHAPE, CLASSES), GRANULARITY)
    module: nn.Module = nn.Sequential(*layers[first : last + 1])
    step_s = 0.0
    if setup["emulate"]:  # the same emulated compute as our workers: the cost model's times
        profile = load_profile(setup["profile"])
        device = slowed_pool(PRESETS, setup["mbps"], setup["slowdown"]).devices[stage_plan.devices[0]]
        forward_s, backward_s = stage_compute_s(profile, device, stage_plan.layers, plan.micro_batch)
        module = DilatedStage(module, forward_s, backward_s)
        if profile.optimizer_step_s is not None:
            step_s = float(profile.optimizer_step_s[first : last + 1].sum()) / device.speed
    stage = pipelining.PipelineStage(module, rank, world, torch.device("cpu"))
    batch = plan.batch_size
    schedule = getattr(pipelining, SCHEDULES[plan.schedule])(
        stage, plan.num_micro_batches, loss_fn=lambda out, y: F.cross_entropy(out, y, reduction="sum") / batch)
    optimizer = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = synthetic_batch(ZooModel(MODEL, SHAPE, CLASSES, GRANULARITY), batch)
    times, cpu = [], []
    for _ in range(setup["rounds"] + 1):  # the first is the warm-up
        dist.barrier()
        started, cpu_started = time.time(), time.process_time()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        step_start = time.time()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        time.sleep(max(0.0, step_start + step_s - time.time()))
        dist.barrier()
        times.append(time.time() - started)
        cpu.append(time.process_time() - cpu_started)
    gathered: list[list[float]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, cpu[1:])
    if rank == 0:
        Path(setup["out"]).write_text(json.dumps({"times": times[1:], "cpu": gathered}))
    dist.destroy_process_group()


def run_torch_pipelining(plan: Plan, args: argparse.Namespace, profile_path: str, emulate: bool,
                         network: HomeNetwork | None, limits: dict[int, DeviceLimits] | None = None) -> dict:
    """torch.distributed.pipelining on ``plan``'s partition and schedule, one process per stage.

    With a ``network`` each rank runs in its device's namespace (links shaped
    by the kernel, as our workers there); without, on unshaped loopback.
    With ``limits`` each rank runs in a cgroup of its own at its device's quota
    (its memory: the budget plus room for its runtime), removed afterwards.
    """
    if any(len(s.devices) != 1 for s in plan.stages):
        raise ValueError("torch.distributed.pipelining runs one device per stage")
    devices = [s.devices[0] for s in plan.stages]
    host = network.address(devices[0]) if network is not None else "127.0.0.1"
    with tempfile.TemporaryDirectory() as tmp:
        setup = {
            "init": f"tcp://{host}:{_free_port()}", "profile": profile_path, "mbps": args.mbps,
            "slowdown": args.slowdown, "emulate": emulate, "plan": dataclasses.asdict(plan), "rounds": args.rounds,
            "out": os.path.join(tmp, "times.json"),
        }
        setup_path = os.path.join(tmp, "setup.json")
        Path(setup_path).write_text(json.dumps(setup))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0" if network else "lo"}
        groups, awake = {}, AwakeCores()
        started = time.time()
        try:
            if limits is not None:  # entered before the namespace: `ip netns exec` hides /sys/fs/cgroup
                awake.start()  # as our runtime's confined devices have them (ecofl.awake_cores)
                hierarchy = find_hierarchy()
                groups = {d: hierarchy.create(f"torch-rank{rank}",
                                              DeviceLimits(limits[d].cores,
                                                           limits[d].memory_bytes + STARTUP_ALLOWANCE_BYTES))
                          for rank, d in enumerate(devices)}
            processes = [
                subprocess.Popen((groups[d].entry_command() if groups else []) + (network.prefix(d) if network else [])
                                 + [sys.executable, __file__, "--pipelining-worker", str(rank), setup_path], env=env)
                for rank, d in enumerate(devices)
            ]
            try:
                codes = [p.wait(timeout=args.timeout) for p in processes]
            finally:
                for p in processes:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
        finally:
            awake.stop()
            for group in groups.values():
                group.remove()
        if any(codes):
            raise RuntimeError(f"torch.distributed.pipelining ranks exited with {codes}")
        measured = json.loads(Path(setup["out"]).read_text())
    median = statistics.median(measured["times"])
    return {"sync_round_s": median, "sync_rounds_s": measured["times"], "throughput": plan.batch_size / median,
            "cpu_s_per_round": sum(statistics.mean(c) for c in measured["cpu"]),
            "load_average": [os.getloadavg()[0]], "wall_s": time.time() - started}


def run_ours(plan: Plan, pool: HomePool, profile, args: argparse.Namespace, emulate: bool | str,
             network: HomeNetwork | None, limits: dict[int, DeviceLimits] | None = None) -> dict:
    spec = ZooModel(MODEL, SHAPE, CLASSES, GRANULARITY)
    report = run_plan(spec, pool, plan, profile, emulate=emulate, rounds=args.rounds, timeout_s=args.timeout,
                      network=network, limits=limits)
    return {key: report[key] for key in ("sync_round_s", "sync_rounds_s", "throughput", "cpu_s_per_round",
                                         "cpu_cores_used", "load_average", "compute_s", "predicted_sync_round_s")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the benchmark ----------------------------------------------------------------------------------


def measure(plan: Plan, pool: HomePool, profile, profile_path: str, args: argparse.Namespace) -> dict:
    """Every condition x schedule x repeat, ours and torch's back to back (first alternating by repeat)."""
    reason = unavailable_reason()
    cgroups = find_hierarchy()
    if isinstance(cgroups, str) and "confined" in args.conditions:
        reason = f"{reason + '; ' if reason else ''}confined: {cgroups}"
    conditions = [c for c in args.conditions if c == "unshaped" or (reason is None and not (
        c == "confined" and isinstance(cgroups, str)))]
    limits = pool_limits(pool)
    results: dict = {c: {s: {"ours": [], "torch": []} for s in SCHEDULES} for c in conditions}
    for repeat in range(args.repeats):
        for condition in conditions:
            for schedule in SCHEDULES:
                scheduled = dataclasses.replace(plan, schedule=schedule)
                order = ("ours", "torch") if repeat % 2 == 0 else ("torch", "ours")
                emulate = condition == "shaped"
                confined = condition == "confined"
                network = (HomeNetwork(pool, [s.devices[0] for s in plan.stages]) if condition != "unshaped"
                           else None)
                with network if network is not None else nullcontext():
                    for runtime in order:
                        if runtime == "ours":
                            run = run_ours(scheduled, pool, profile, args, "cgroup" if confined else emulate, network,
                                           limits if confined else None)
                        else:
                            run = run_torch_pipelining(scheduled, args, profile_path, emulate, network,
                                                       limits if confined else None)
                        results[condition][schedule][runtime].append(run)
                        print(f"[repeat {repeat}, {condition}, {schedule}] {runtime}: "
                              f"{run['throughput']:.2f} samples/s, "
                              f"{run['cpu_s_per_round']:.2f} CPU s per round, load {run['load_average'][0]:.1f}",
                              file=sys.stderr, flush=True)
    plan_name = describe_plan(plan, pool)
    keyed = {}
    for c, by_schedule in results.items():
        row = {"condition": c, "plan": plan_name, **by_schedule}
        if c == "shaped":
            row |= {"mbps": args.mbps, "slowdown": args.slowdown, **schedule_predictions(plan, profile, pool)}
        if c == "confined":
            row |= {"mbps": args.mbps, "slowdown": args.slowdown}
        keyed[f"{c}{f' {args.mbps:g}Mbps' if c != 'unshaped' else ''} "
              f"{plan.num_micro_batches}x{plan.micro_batch}"] = row
    return {"results": keyed, "shaped_skipped": reason}


def ratios(pair: dict) -> list[float]:
    return [o["throughput"] / t["throughput"] for o, t in zip(pair["ours"], pair["torch"])]


def _target(row: dict) -> str:
    if row["condition"] == "unshaped":
        return ">= 1.0x"
    return ">= 1.15x" if row.get("mbps") == 100 else ""


def markdown(report: dict) -> str:
    lines = [
        f"Generated by `python benchmarks/versus_pipelining.py --repeats {report['repeats']} "
        f"--rounds {report['rounds']} "
        f"--batch {report['batch']}` ({report['machine']}, {report['cores']} cores shared with other jobs, "
        f"{report['date']}; a row measured by an earlier run with other `--conditions`, `--micro-batch` or "
        "`--mbps` is kept). MobileNetV2 (block layers, 3x32x32 synthetic inputs) on the `ecofl` planner's partition of "
        "Nano-10W + TX2-MaxN + NX (column `plan`: micro-batches x samples [layers: device x samples | ...]; "
        f"the planner's micro-batch unless `--micro-batch`); samples/s from the median of {report['rounds']} "
        "sync-rounds after a warm-up one; ratio = ours / torch's per repeat (the two run back to back, "
        "alternating which goes first), median over repeats. `CPU s/round`: CPU seconds of all of a "
        "runtime's processes per sync-round (ours includes the portal). `unshaped`: host speed, no emulation on "
        "either side, loopback. `shaped`: both in the same network namespaces with `tc tbf` links at the "
        "row's bandwidth and the same emulated compute (device speeds x the row's slowdown: each "
        "forward and backward lasts the cost model's time, by construction on both sides). `predicted`: the "
        "cost model's sync-round with Schedule1F1B's warm-up (S - s forwards in flight) over 1F1B-Sync's "
        "(2(S - s) - 1), on the row's plan and links; the same schedule (GPipe) predicts 1.00x. `headroom`: "
        "torch's median sync-round over the least any schedule could take on the row's partition (its busiest "
        "device's emulated compute and flush): the most any runtime could gain over torch there. `confined`: "
        "the same links, and every stage process of both runtimes in a cgroup of its own at its device's "
        "speed in host cores (x the row's slowdown); nothing sleeps to a model on either side; our workers keep "
        "their quota's pace after idling (ecofl/pipeline/runtime/cpu_pace.py), torch's ranks keep CFS's burst.",
        "",
        "| links | plan | schedules (ours vs torch) | ours samples/s | torch samples/s | ratio per repeat | "
        "median ratio | predicted | headroom | target | CPU s/round ours, torch | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["results"].values():
        condition = row["condition"]
        links = {"shaped": f"shaped {row.get('mbps', 0):g} Mbps, x{row.get('slowdown', 0):g}",
                 "confined": f"confined, shaped {row.get('mbps', 0):g} Mbps, x{row.get('slowdown', 0):g}"}.get(
            condition, condition)
        plan = row["plan"].replace("|", r"\|")  # a table cell
        for schedule in SCHEDULES:
            pair = row[schedule]
            r = ratios(pair)
            ours = statistics.median(run["throughput"] for run in pair["ours"])
            theirs = statistics.median(run["throughput"] for run in pair["torch"])
            cpu = (statistics.median(run["cpu_s_per_round"] for run in pair["ours"]),
                   statistics.median(run["cpu_s_per_round"] for run in pair["torch"]))
            loads = [run["load_average"][0] for runs in pair.values() for run in runs]
            one_f_one_b = schedule == ScheduleKind.ONE_F_ONE_B
            names = ("1F1B-Sync vs Schedule1F1B (schedules differ)" if one_f_one_b
                     else "GPipe vs ScheduleGPipe (same schedule)")
            predicted = ("" if "predicted_ratio" not in row
                         else f"{row['predicted_ratio']:.2f}x" if one_f_one_b else "1.00x")
            torch_s = statistics.median(run["sync_round_s"] for run in pair["torch"])
            headroom = f"{torch_s / row['bound_s']:.2f}x" if "bound_s" in row else ""
            lines.append(
                f"| {links} | {plan} | {names} | {ours:.2f} | {theirs:.2f} | {', '.join(f'{x:.2f}' for x in r)} "
                f"| {statistics.median(r):.2f}x | {predicted} | {headroom} "
                f"| {_target(row) if schedule == '1f1b' else ''} "
                f"| {cpu[0]:.2f}, {cpu[1]:.2f} | {min(loads):.1f}-{max(loads):.1f} |")
    if report["shaped_skipped"]:
        lines += ["", f"Shaped links not measured: {report['shaped_skipped']}."]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help="comma-separated, of unshaped and shaped (each replaces its earlier results)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=None, help="default: the planner's")
    parser.add_argument("--mbps", type=float, default=100.0)
    parser.add_argument("--slowdown", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cache-dir", default=None, help="profile cache (default: a fresh one, profiled now)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "versus_pipelining.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    parser.add_argument("--pipelining-worker", nargs=2, metavar=("RANK", "SETUP"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pipelining_worker:
        pipelining_worker(int(args.pipelining_worker[0]), args.pipelining_worker[1])
        return 0
    args.conditions = args.conditions.split(",")
    if set(args.conditions) - set(CONDITIONS):
        parser.error(f"--conditions: valid ones are {', '.join(CONDITIONS)}")
    torch.set_num_threads(1)
    pool = slowed_pool(PRESETS, args.mbps, args.slowdown)
    if max(d.speed for d in pool.devices) > 0.2:
        parser.error(f"--slowdown {args.slowdown} leaves a device faster than 0.2 of a host core")
    with tempfile.TemporaryDirectory() as tmp:
        profile = profile_zoo_model(MODEL, SHAPE, CLASSES, GRANULARITY, args.cache_dir or tmp)
        profile_path = os.path.join(tmp, "profile.npz")
        save_profile(profile, profile_path)
        options = {} if args.micro_batch is None else {"micro_batch": args.micro_batch}
        plan = make_plan("ecofl", profile, pool, args.batch, **options)
        print(f"plan: {describe_plan(plan, pool)}", file=sys.stderr, flush=True)
        report = {
            "machine": platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "cores": host_cores(),
            "repeats": args.repeats, "rounds": args.rounds, "batch": args.batch, "mbps": args.mbps,
            "slowdown": args.slowdown,
            **measure(plan, pool, profile, profile_path, args),
        }
    path = Path(args.json)
    if path.exists():  # rows measured by an earlier run (other --conditions, --micro-batch or --mbps) are kept
        earlier = json.loads(path.read_text())
        kept = {}
        for key, row in earlier["results"].items():
            if row["condition"] == "shaped" and "mbps" not in row:  # from before rows carried their links
                row |= {"mbps": earlier["mbps"], "slowdown": earlier["slowdown"]}
                key = key.replace("shaped ", f"shaped {row['mbps']:g}Mbps ", 1)
            kept[key] = row
        report["results"] = {**{k: r for k, r in kept.items() if k not in report["results"]},
                             **report["results"]}
    publish(report, path, markdown(report), Path(args.doc), "versus-pipelining")
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
