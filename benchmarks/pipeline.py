"""Home-pipeline benchmark: measured throughput of plans run for real on emulated devices.

Every figure comes from running workers (:class:`ecofl.pipeline.runtime.HomePipeline`,
one process per device, gloo between them) on emulated devices, all in one
run, side by side:

1. **Env hetero-3** (Jetson Nano-10W + TX2-MaxN + NX, 100 Mbps), MobileNetV2
   (block granularity, 3x32x32 inputs, 10 classes, synthetic data): the
   ``ecofl`` and ``hpp`` plans against each device alone (its best
   micro-batch), the ``even`` partition, data parallelism (``dp``), and
   ``torch.distributed.pipelining``'s ``Schedule1F1B`` on the ``ecofl``
   partition with the same emulated compute.
2. **Env Nano-10W + TX2-MaxN** (Eco-FL Fig. 12's heterogeneous pair, 100 Mbps):
   ``ecofl`` and ``hpp`` against ``even`` and each device alone.

Reported per run: the median measured sync-round, throughput = mini-batch /
that, the cost model's prediction (:func:`ecofl.pipeline.cost.simulate`) and
planner error = |predicted - measured| / measured; per environment: pipeline
efficiency = throughput / the sum of the devices' measured single-device
throughputs. Targets (issue 5): efficiency >= 0.8 for MobileNetV2 on the
3-device pool; heterogeneity-aware plan >= 1.3x ``even`` on Nano + TX2;
>= 1.0x torch.distributed.pipelining; planner error <= 15 %.

Emulation: every preset's speed is multiplied by ``--slowdown`` (0.5) so the
fastest device is more than 5x slower than one host core; each worker's
forward, backward and optimizer step then take the cost model's time (host
profile / speed) whenever the real computation is faster, so two shared cores
do not cap the result. Our runtime paces links with token buckets; the
torch.distributed.pipelining baseline gets the same compute dilation; the two
are compared on the same links, shaped by the kernel in network namespaces
when run as root (else both unshaped).

    .venv/bin/python benchmarks/pipeline.py [--rounds 3] [--batch 64] [--cache-dir DIR]

writes benchmarks/results/pipeline.json and the results section of docs/pipeline.md.
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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402
from ecofl.pipeline.profile import profile_zoo_model
from ecofl.devices import HomePool, make_pool
from ecofl.pipeline.cost import simulate, stage_compute_s
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners import make_plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime import HomePipeline, ZooModel
from ecofl.pipeline.runtime.netns import HomeNetwork, unavailable_reason

MODEL, SHAPE, CLASSES, GRANULARITY = "mobilenet_v2", (3, 32, 32), 10, "block"
ENVIRONMENTS = {
    "hetero-3": ["nano-10w", "tx2-maxn", "nx"],
    "nano+tx2": ["nano-10w", "tx2-maxn"],
}
SINGLE_MICRO_BATCHES = (4, 8, 16, 32)


def slowed_pool(name: str, presets: list[str], mbps: float, slowdown: float) -> HomePool:
    pool = make_pool(name, presets, mbps)
    devices = tuple(dataclasses.replace(d, speed=d.speed * slowdown) for d in pool.devices)
    return HomePool(name, devices)


def run_plan(plan: Plan, pool: HomePool, profile: ModelProfile, rounds: int, timeout_s: float,
             network: HomeNetwork | None = None) -> dict:
    """Train ``rounds`` sync-rounds of ``plan`` for real; measured and predicted figures."""
    spec = ZooModel(MODEL, SHAPE, CLASSES, GRANULARITY)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(plan.batch_size, *SHAPE, generator=generator)
    y = torch.randint(0, CLASSES, (plan.batch_size,), generator=generator)
    with HomePipeline(spec, pool, plan, profile=profile, emulate=True, timeout_s=timeout_s, network=network) as home:
        result = home.train(None, x, y, rounds, lr=0.01, momentum=0.9)
    measured = statistics.median(result.sync_round_s)
    predicted = simulate(plan, profile, pool).sync_round_s
    return {
        "plan": _describe(plan, pool),
        "sync_round_s": measured,
        "sync_rounds_s": list(result.sync_round_s),
        "throughput": plan.batch_size / measured,
        "predicted_sync_round_s": predicted,
        "planner_error": abs(predicted - measured) / measured,
        "busy_fraction": list(result.busy_fraction),
    }


def single_device_plan(profile: ModelProfile, device) -> Plan:
    """The whole model on one device at its best micro-batch (by the profile), two micro-batches."""
    last = profile.num_layers - 1
    best = max(SINGLE_MICRO_BATCHES, key=lambda b: b / sum(stage_compute_s(profile, device, (0, last), b)))
    return Plan("single", (StagePlan((0, last), (0,), (best,), 1),), best, 2)


# -- torch.distributed.pipelining baseline -------------------------------------------------------


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
    """A stage whose forward and backward last at least the cost model's times (as our workers do)."""

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


def pipelining_worker(rank: int, setup_path: str) -> None:
    """One rank of the torch.distributed.pipelining baseline (run as its own process)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from ecofl.models import build_model, layer_sequence
    from ecofl.pipeline.profile import load_profile

    setup = json.loads(Path(setup_path).read_text())
    torch.set_num_threads(1)
    world = len(setup["plan"]["stages"])
    dist.init_process_group("gloo", init_method=setup["init"], rank=rank, world_size=world)
    profile = load_profile(setup["profile"])
    pool = slowed_pool("pp", setup["presets"], setup["mbps"], setup["slowdown"])
    plan = Plan(**{**setup["plan"], "stages": tuple(StagePlan(**s) for s in setup["plan"]["stages"])})
    stage_plan = plan.stages[rank]
    device = pool.devices[stage_plan.devices[0]]
    first, last = stage_plan.layers
    layers = layer_sequence(build_model(MODEL, SHAPE, CLASSES), GRANULARITY)
    forward_s, backward_s = stage_compute_s(profile, device, stage_plan.layers, plan.micro_batch)
    module = DilatedStage(nn.Sequential(*layers[first : last + 1]), forward_s, backward_s)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    batch = plan.batch_size
    schedule = Schedule1F1B(stage, plan.num_micro_batches,
                            loss_fn=lambda out, y: F.cross_entropy(out, y, reduction="sum") / batch)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    step_s = 0.0
    if profile.optimizer_step_s is not None:
        step_s = float(profile.optimizer_step_s[first : last + 1].sum()) / device.speed
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *SHAPE, generator=generator)
    y = torch.randint(0, CLASSES, (batch,), generator=generator)
    times = []
    for _ in range(setup["rounds"]):
        dist.barrier()
        started = time.time()
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
    if rank == 0:
        Path(setup["out"]).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_torch_pipelining(plan: Plan, presets: list[str], args: argparse.Namespace, profile_path: str,
                         network: HomeNetwork | None) -> dict:
    """Schedule1F1B of torch.distributed.pipelining on ``plan``'s partition, one process per stage.

    With a ``network`` each rank runs in its device's namespace (links shaped by
    the kernel, as for our runtime there); without, on unshaped loopback.
    """
    if any(len(s.devices) != 1 for s in plan.stages):
        raise ValueError("torch.distributed.pipelining runs one device per stage")
    devices = [s.devices[0] for s in plan.stages]
    host = network.address(devices[0]) if network is not None else "127.0.0.1"
    with tempfile.TemporaryDirectory() as tmp:
        setup = {
            "init": f"tcp://{host}:{_free_port()}", "profile": profile_path, "presets": presets,
            "mbps": args.mbps, "slowdown": args.slowdown, "plan": dataclasses.asdict(plan),
            "rounds": args.rounds, "out": os.path.join(tmp, "times.json"),
        }
        setup_path = os.path.join(tmp, "setup.json")
        Path(setup_path).write_text(json.dumps(setup))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0" if network else "lo"}
        processes = [
            subprocess.Popen((network.prefix(d) if network else []) +
                             [sys.executable, __file__, "--pipelining-worker", str(rank), setup_path], env=env)
            for rank, d in enumerate(devices)
        ]
        try:
            codes = [p.wait(timeout=args.timeout) for p in processes]
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                p.wait()
        if any(codes):
            raise RuntimeError(f"torch.distributed.pipelining ranks exited with {codes}")
        times = json.loads(Path(setup["out"]).read_text())
    measured = statistics.median(times)
    return {"sync_round_s": measured, "sync_rounds_s": times, "throughput": plan.batch_size / measured,
            "links": "tc tbf in network namespaces" if network else "unshaped loopback"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the benchmark ----------------------------------------------------------------------------------


def _describe(plan: Plan, pool: HomePool) -> str:
    stages = " | ".join(
        f"{a}-{b}: " + "+".join(f"{pool.devices[d].name}x{y}" for d, y in zip(s.devices, s.shares))
        for s in plan.stages for a, b in [s.layers]
    )
    return f"{plan.planner} {plan.num_micro_batches}x{plan.micro_batch} [{stages}]"


def environment(name: str, presets: list[str], args: argparse.Namespace, profile: ModelProfile,
                profile_path: str, with_baselines: bool) -> dict:
    pool = slowed_pool(name, presets, args.mbps, args.slowdown)
    runs: dict[str, dict] = {}
    planners = ("ecofl", "hpp", "even", "dp") if with_baselines else ("ecofl", "hpp", "even")
    for planner in planners:
        plan = make_plan(planner, profile, pool, args.batch)
        print(f"[{name}] {planner}: {_describe(plan, pool)}", file=sys.stderr, flush=True)
        runs[planner] = run_plan(plan, pool, profile, args.rounds, args.timeout)
        print(f"  {runs[planner]['throughput']:.2f} samples/s", file=sys.stderr, flush=True)
    singles = {}
    for index, device in enumerate(pool.devices):
        alone = HomePool(device.name, (device,))
        plan = single_device_plan(profile, device)
        print(f"[{name}] {device.name} alone: {_describe(plan, alone)}", file=sys.stderr, flush=True)
        singles[f"{index}:{device.name}"] = run_plan(plan, alone, profile, args.rounds, args.timeout)
    total_single = sum(s["throughput"] for s in singles.values())
    report = {
        "pool": presets, "mbps": args.mbps, "speeds": [d.speed for d in pool.devices],
        "runs": runs, "single_devices": singles,
        "best_single_throughput": max(s["throughput"] for s in singles.values()),
        "sum_single_throughput": total_single,
        "efficiency": {p: r["throughput"] / total_single for p, r in runs.items()},
    }
    if with_baselines:
        report["versus_torch_pipelining"] = versus_torch_pipelining(pool, presets, args, profile, profile_path)
    return report


def versus_torch_pipelining(pool: HomePool, presets: list[str], args: argparse.Namespace, profile: ModelProfile,
                            profile_path: str) -> dict:
    """Our runtime and Schedule1F1B on the ecofl partition under the same links, back to back.

    In network namespaces with ``tc tbf`` when this machine allows it (both
    runtimes then see the same kernel-shaped 100 Mbps links), else both on
    unshaped loopback (our runtime's token buckets off: a pool of fast links).
    """
    plan = make_plan("ecofl", profile, pool, args.batch)
    reason = unavailable_reason()
    print(f"[versus] torch.distributed.pipelining Schedule1F1B on {_describe(plan, pool)}; "
          f"links: {'tc tbf' if reason is None else 'unshaped (' + reason + ')'}", file=sys.stderr, flush=True)
    if reason is None:
        with HomeNetwork(pool, [d for s in plan.stages for d in s.devices]) as network:
            ours = run_plan(plan, pool, profile, args.rounds, args.timeout, network=network)
            theirs = run_torch_pipelining(plan, presets, args, profile_path, network)
    else:
        unshaped = HomePool(pool.name, tuple(dataclasses.replace(d, bandwidth_bps=1e12) for d in pool.devices))
        ours = run_plan(plan, unshaped, profile, args.rounds, args.timeout)
        theirs = run_torch_pipelining(plan, presets, args, profile_path, None)
    return {"links": theirs["links"], "ecofl_runtime": ours, "torch_pipelining": theirs,
            "ratio": ours["throughput"] / theirs["throughput"]}


def markdown(results: dict) -> str:
    lines = [
        f"Generated by `python benchmarks/pipeline.py --rounds {results['rounds']} --batch {results['batch']}` "
        f"({results['machine']}, {results['date']}): MobileNetV2 ({GRANULARITY} layers, 3x32x32, synthetic data), "
        f"mini-batch {results['batch']}, {results['mbps']:.0f} Mbps links, device speeds x{results['slowdown']} "
        "(every device >5x slower than a host core). Throughput in samples/s from the median measured sync-round; "
        "all runs of one table were measured in the same invocation.",
        "",
    ]
    for name, env in results["environments"].items():
        lines += [f"### {name}: {', '.join(env['pool'])}", ""]
        lines += ["| run | plan | measured samples/s | predicted samples/s | planner error | efficiency |",
                  "|---|---|---|---|---|---|"]
        for planner, run in env["runs"].items():
            lines.append(
                f"| {planner} | {run['plan']} | {run['throughput']:.2f} | {results['batch'] / run['predicted_sync_round_s']:.2f} "
                f"| {100 * run['planner_error']:.1f}% | {env['efficiency'][planner]:.2f} |"
            )
        for device, run in env["single_devices"].items():
            batch = run["throughput"] * run["sync_round_s"]
            lines.append(
                f"| {device} alone | {run['plan']} | {run['throughput']:.2f} | {batch / run['predicted_sync_round_s']:.2f} "
                f"| {100 * run['planner_error']:.1f}% | |"
            )
        versus = env.get("versus_torch_pipelining")
        if versus:
            lines.append(f"| ecofl, {versus['links']} | same plan | {versus['ecofl_runtime']['throughput']:.2f} | | | |")
            lines.append(f"| torch.distributed.pipelining Schedule1F1B, {versus['links']} | same partition | "
                         f"{versus['torch_pipelining']['throughput']:.2f} | | | |")
        lines += ["", "| ratio | value | target |", "|---|---|---|"]
        best = env["best_single_throughput"]
        for planner in ("ecofl", "hpp"):
            run = env["runs"][planner]
            lines.append(f"| {planner} / best single device | {run['throughput'] / best:.2f}x | |")
            lines.append(f"| {planner} / even | {run['throughput'] / env['runs']['even']['throughput']:.2f}x | "
                         f"{'>= 1.3x' if name == 'nano+tx2' else ''} |")
            if "dp" in env["runs"]:
                lines.append(f"| {planner} / dp | {run['throughput'] / env['runs']['dp']['throughput']:.2f}x | |")
            lines.append(f"| {planner} efficiency | {env['efficiency'][planner]:.2f} | "
                         f"{'>= 0.8' if name == 'hetero-3' else ''} |")
        if versus:
            lines.append(f"| ecofl runtime / torch.distributed.pipelining (same partition and links) | "
                         f"{versus['ratio']:.2f}x | >= 1.0x |")
        worst = max(r["planner_error"] for r in list(env["runs"].values()) + list(env["single_devices"].values()))
        lines += [f"| largest planner error | {100 * worst:.1f}% | <= 15% |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--mbps", type=float, default=100.0)
    parser.add_argument("--slowdown", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "pipeline.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    parser.add_argument("--pipelining-worker", nargs=2, metavar=("RANK", "SETUP"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pipelining_worker:
        pipelining_worker(int(args.pipelining_worker[0]), args.pipelining_worker[1])
        return 0
    torch.set_num_threads(1)
    profile = profile_zoo_model(MODEL, SHAPE, CLASSES, GRANULARITY, args.cache_dir)
    fastest = max(d.speed for presets in ENVIRONMENTS.values()
                  for d in slowed_pool("check", presets, args.mbps, args.slowdown).devices)
    if fastest > 0.2:
        parser.error(f"--slowdown {args.slowdown} leaves a device at speed {fastest:.2f} (> 0.2 of a host core)")
    with tempfile.TemporaryDirectory() as tmp:
        from ecofl.pipeline.profile import save_profile

        profile_path = os.path.join(tmp, "profile.npz")
        save_profile(profile, profile_path)
        results = {
            "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"), "rounds": args.rounds,
            "batch": args.batch, "mbps": args.mbps, "slowdown": args.slowdown,
            "environments": {
                name: environment(name, presets, args, profile, profile_path, with_baselines=(name == "hetero-3"))
                for name, presets in ENVIRONMENTS.items()
            },
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    table = markdown(results)
    replace_section(Path(args.doc), table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
