"""``ecofl plan``: plan a model on a home pool and predict its sync-round, or (``--inference``) its stream.

Profiles the model's layers on this host (cached on disk, see
:func:`ecofl.pipeline.profile.profile_model`), runs a planner
(:mod:`ecofl.pipeline.planners`), and simulates one sync-round of the plan
(:func:`ecofl.pipeline.cost.simulate`) or, with ``--inference``, plans for
pipelined inference and simulates the stream
(:func:`ecofl.pipeline.stream.simulate_stream`: steady-state throughput,
per-sample latency, busy fractions). ``--pool`` is a named pool
(``conf/home``), a pool file or comma-separated device presets (:func:`ecofl.pools.load_pool`).
"""

from __future__ import annotations

import argparse
import json
import time

from ecofl.cli.stage_table import PLACEMENT_HEAD, aligned, placement_cells, stage_placement
from ecofl.cli.timeline_image import write_timeline
from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.cost import SyncRoundCost, simulate, stage_compute_s
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners import check_planner, make_plan
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model
from ecofl.pipeline.stream import StreamCost, simulate_stream
from ecofl.pools import load_pool


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"--input-shape must be three positive integers C,H,W, got {text!r}")
    return shape  # type: ignore[return-value]


def describe(plan: Plan, profile: ModelProfile, pool: HomePool, cost: SyncRoundCost, planning_s: float) -> dict:
    """The plan and its predicted sync-round as one JSON-ready object."""
    stages = []
    for s, stage in enumerate(plan.stages):
        times = [sum(stage_compute_s(profile, pool.devices[d], stage.layers, y))
                 for d, y in zip(stage.devices, stage.shares)]
        stages.append({**_stage(s, plan, pool, cost.stage_memory_bytes[s]), "stage_time_s": max(times),
                       "busy_fraction": cost.busy_fraction[s]})
    return {
        **_header(plan, profile, pool, planning_s),
        "stages": stages,
        "sync_round_s": cost.sync_round_s,
        "throughput": cost.throughput,
    }


def describe_stream(plan: Plan, profile: ModelProfile, pool: HomePool, cost: StreamCost, planning_s: float) -> dict:
    """An inference plan and its predicted stream as one JSON-ready object."""
    stages = [
        {**_stage(s, plan, pool, cost.stage_memory_bytes[s]), "stage_time_s": cost.stage_forward_s[s],
         "send_s": cost.stage_send_s[s], "busy_fraction": cost.busy_fraction[s]}
        for s in range(len(plan.stages))
    ]
    return {
        **_header(plan, profile, pool, planning_s),
        "stages": stages,
        "throughput": cost.throughput,
        "latency_s": cost.latency_s,
        "first_latency_s": cost.first_latency_s,
        "period_s": cost.period_s,
        "stream_micro_batches": cost.num_micro_batches,
        "stream_s": cost.stream_s,
    }


def _header(plan: Plan, profile: ModelProfile, pool: HomePool, planning_s: float) -> dict:
    return {
        "objective": plan.objective,
        "planner": plan.planner,
        "model": profile.model,
        "pool": pool.name,
        "num_layers": profile.num_layers,
        "batch_size": plan.batch_size,
        "micro_batch": plan.micro_batch,
        "num_micro_batches": plan.num_micro_batches,
        "schedule": plan.schedule,
        "planning_s": planning_s,
    }


def _stage(s: int, plan: Plan, pool: HomePool, memory_bytes: int) -> dict:
    stage = plan.stages[s]
    return {
        **stage_placement(s, stage, pool),
        "memory_bytes": memory_bytes,
        "budget_bytes": min(pool.devices[d].memory_bytes for d in stage.devices),
    }


def _table(report: dict) -> str:
    stream = report["objective"] == "inference"
    rows = [(*PLACEMENT_HEAD, "held" if stream else "K_p", "memory / budget (MiB)",
             "forward (s)" if stream else "stage time (s)", *(("send (s)", "busy") if stream else ()))]
    for st in report["stages"]:
        rows.append((
            *placement_cells(st),
            str(st["in_flight"]),
            f"{st['memory_bytes'] / 2**20:.0f} / {st['budget_bytes'] / 2**20:.0f}",
            f"{st['stage_time_s']:.4f}",
            *((f"{st['send_s']:.4f}", f"{st['busy_fraction']:.2f}") if stream else ()),
        ))
    lines = aligned(rows)
    if stream:
        title = (f"{report['planner']} inference plan of {report['model']} ({report['num_layers']} layers) on "
                 f"{report['pool']}: micro-batches of {report['micro_batch']} streaming, {_times(report)}")
        summary = (f"predicted throughput {report['throughput']:.2f} samples/s (steady state), latency "
                   f"{report['latency_s']:.3f} s per sample ({report['first_latency_s']:.3f} s through an empty "
                   f"pipeline)")
    else:
        title = (f"{report['planner']} plan of {report['model']} ({report['num_layers']} layers) on {report['pool']}: "
                 f"mini-batch {report['batch_size']} = {report['num_micro_batches']} x {report['micro_batch']}, "
                 f"{_times(report)}")
        summary = (f"predicted sync-round {report['sync_round_s']:.3f} s, "
                   f"throughput {report['throughput']:.2f} samples/s")
    return "\n".join([title, *lines, summary])


def _times(report: dict) -> str:
    return f"profiled in {report['profiling_s']:.1f} s, planned in {report['planning_s']:.3f} s"


def run(args: argparse.Namespace) -> int:
    check_planner(args.planner)
    if args.batch < 1:
        raise UserError(f"--batch must be positive, got {args.batch}")
    pool = load_pool(args.pool, args.bandwidth)
    started = time.perf_counter()
    profile = profile_zoo_model(args.model, parse_shape(args.input_shape), args.classes, args.granularity,
                                args.cache_dir)
    profiling_s = time.perf_counter() - started
    options: dict[str, object] = {} if args.micro_batch is None else {"micro_batch": args.micro_batch}
    if args.micro_batch_rule is not None:
        options["micro_batch_rule"] = args.micro_batch_rule
    objective = "inference" if args.inference else "training"
    started = time.perf_counter()
    plan = make_plan(args.planner, profile, pool, args.batch, objective=objective, **options)
    planning_s = time.perf_counter() - started
    if args.inference:
        cost: SyncRoundCost | StreamCost = simulate_stream(plan, profile, pool)
        report = describe_stream(plan, profile, pool, cost, planning_s)
    else:
        cost = simulate(plan, profile, pool)
        report = describe(plan, profile, pool, cost, planning_s)
    report["profiling_s"] = profiling_s  # measuring the layers on this host, or reading them from the cache
    if args.gantt:
        what = "stream" if args.inference else "sync-round"
        title = f"{args.planner} {what}: {profile.model} on {pool.name}"
        write_timeline(args.gantt, cost.timeline, title, pool, "gantt")
    print(json.dumps(report) if args.json else _table(report))
    return 0
