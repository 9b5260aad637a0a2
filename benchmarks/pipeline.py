"""Home-pipeline benchmark: the cost model's prediction against the runtime, at host speed and emulated.

For each model (MobileNetV2 and EfficientNet-B0, block granularity, 3x32x32
inputs, 10 classes, synthetic data) the host profile is measured first, into
a fresh cache (the same conditions as the runs that follow it: a profile
measured under another load is another machine). Then, for each pool of
``conf/home`` (Eco-FL's 2- and 3-stage testbeds with the ``ecofl`` planner,
Asteroid's Env B with ``hpp``, whose replicated stages add all-reduces), the
plan the planner makes for the emulated pool is run twice, alternately:

- **host speed** (``emulate="none"``): every device is a process of this
  machine computing at host speed, no time dilation, no link pacing; the
  prediction is :func:`ecofl.pipeline.cost.simulate` on the host pool with
  the devices sharing this machine's cores (``ecofl home train --no-emulate``).
  Nothing forces the two to agree: the difference is the cost model's error.
- **emulated** (``emulate="sleep"``): every operation sleeps until the cost
  model's time for its emulated device and links are paced, so measured
  equals predicted *by construction*; only communication and scheduling
  overhead are measured there.

Every run reports per stage the memory model's prediction (Asteroid eq. 3),
the runtime's accounting (weights, gradients, optimizer state and the bytes
autograd saved) and the worker process's measured peak resident set (RSS)
during a sync-round, in total and above the process before any model was
built. The machine is shared, so each run also records the load average and
the CPU its processes received (``cpu_cores_used``). At host speed the
prediction includes the runtime's own time per operation, measured first
into the same fresh cache (:mod:`ecofl.pipeline.runtime.host_overhead`);
the prediction without it is given beside.

    .venv/bin/python benchmarks/pipeline.py [--rounds 3] [--batch 128] [--micro-batch 16] [--cache-dir DIR]

writes benchmarks/results/pipeline.json and the benchmark section of docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.home_runs import run_plan  # noqa: E402
from benchmarks.markdown_section import cell, replace_section  # noqa: E402
from ecofl.devices import host_cores, host_pool  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.pipeline.cost import simulate  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import ZooModel  # noqa: E402
from ecofl.pipeline.runtime.host_overhead import operation_overhead_record  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

MODELS = ("mobilenet_v2", "efficientnet_b0")
SHAPE, CLASSES, GRANULARITY = (3, 32, 32), 10, "block"
CASES = (("ecofl-2stage", "ecofl"), ("ecofl-3stage", "ecofl"), ("asteroid-b", "hpp"))
MODES = ("host", "emulated")
MIB = 2**20


def measure_model(model: str, args: argparse.Namespace, cache_dir: str) -> dict:
    """Profile ``model`` now, then run each case's plan at host speed and emulated, alternately."""
    started = time.time()
    profile = profile_zoo_model(model, SHAPE, CLASSES, GRANULARITY, cache_dir)
    print(f"[{model}] profiled in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    spec = ZooModel(model, SHAPE, CLASSES, GRANULARITY)
    runs: dict[str, dict] = {}
    for pool_name, planner in args.cases:
        pool = load_pool(pool_name, None)
        plan = make_plan(planner, profile, pool, args.batch, micro_batch=args.micro_batch)
        runs[pool_name] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                report = run_plan(spec, pool, plan, profile, emulate=(mode == "emulated"), rounds=args.rounds,
                                  timeout_s=args.timeout, cache_dir=cache_dir)
                if mode == "host":
                    report["predicted_without_overhead_s"] = simulate(plan, profile, host_pool(pool),
                                                                      cores=host_cores()).sync_round_s
                runs[pool_name][mode].append(report)
                print(f"[{model} on {pool_name}, {mode}] {report['plan_text']}: {report['sync_round_s']:.3f} s "
                      f"measured, {report['predicted_sync_round_s']:.3f} s predicted "
                      f"({100 * report['planner_error']:.1f}%), {report['cpu_cores_used']:.2f} cores used, "
                      f"load {report['load_average'][0]:.1f}", file=sys.stderr, flush=True)
    return runs


def markdown(results: dict) -> str:
    lines = [
        f"Generated by `python benchmarks/pipeline.py --rounds {results['rounds']} --batch {results['batch']} "
        f"--micro-batch {results['micro_batch']} --repeats {results['repeats']}` ({results['machine']}, "
        f"{results['cores']} cores shared with other jobs, {results['date']}). Models at block granularity, "
        "3x32x32 synthetic inputs, 10 classes, each profiled right before its runs into a fresh cache. Each run: "
        f"one warm-up sync-round, then the median of {results['rounds']} measured ones; host speed and emulated "
        "runs of a plan alternate. `CPU used`: CPU seconds of the workers and the portal during the measured "
        "rounds per wall second (the host has "
        f"{results['cores']} cores; less means other jobs held the rest). `load`: 1-minute load average at the start.",
        "",
        "### Host speed (no emulation): the cost model's error",
        "",
        "Every device is a process of this machine at host speed; predicted by the cost model on the host pool "
        f"with the devices sharing {results['cores']} cores and every forward and backward lasting the runtime's "
        f"overhead on this host longer (`ecofl home train --no-emulate`): "
        f"{1000 * results['overhead']['operation_overhead_s']:.2f} ms, measured first on a model of six 16-wide "
        f"linear layers (3 workers, {results['overhead']['micro_batches']} micro-batches of one sample: "
        f"{results['overhead']['measured_sync_round_s']:.3f} s measured, "
        f"{results['overhead']['predicted_without_overhead_s']:.3f} s predicted without it). "
        "`no overhead`: the prediction without it.",
        "",
        "| model | pool | plan | measured s | predicted s | error | predicted s, no overhead | CPU used | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, runs in results["models"].items():
        for pool, modes in runs.items():
            for r in modes["host"]:
                lines.append(
                    f"| {model} | {pool} | {cell(r['plan_text'])} | {r['sync_round_s']:.3f} "
                    f"| {r['predicted_sync_round_s']:.3f} "
                    f"| {100 * r['planner_error']:.1f}% | {r['predicted_without_overhead_s']:.3f} "
                    f"| {r['cpu_cores_used']:.2f} "
                    f"| {r['load_average'][0]:.1f} |")
    lines += [
        "",
        "### Emulated devices: agreement by construction",
        "",
        "Each forward, backward and optimizer step sleeps until the cost model's time for its emulated device, "
        "links are paced at the pool's 100 Mbps: measured equals predicted by construction, except for the "
        "communication and scheduling overhead these figures do measure.",
        "",
        "| model | pool | measured s | predicted s | difference | CPU used | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, runs in results["models"].items():
        for pool, modes in runs.items():
            for r in modes["emulated"]:
                lines.append(
                    f"| {model} | {pool} | {r['sync_round_s']:.3f} | {r['predicted_sync_round_s']:.3f} "
                    f"| {100 * r['planner_error']:.1f}% | {r['cpu_cores_used']:.2f} | {r['load_average'][0]:.1f} |")
    lines += [
        "",
        "### Memory per stage: predicted, accounted, measured",
        "",
        "MiB of the stage's most loaded device. `model`: Asteroid eq. 3 (2 x weights + optimizer state + K_p "
        "resident forwards x stashed bytes), what the planner budgets. `accounted`: the runtime's ledger "
        "(weights, gradients, buffers, momentum, plus the bytes autograd saved for the resident forwards, "
        "measured with saved-tensor hooks). `RSS peak`: the worker process's measured peak resident set "
        "during a sync-round (`VmHWM`, reset at the round's start; it includes Python, torch and the whole "
        "model every worker builds). `RSS training`: that peak less the process's resident set before any "
        "model was built. First run of each mode.",
        "",
        "| model | pool | run | stage | devices | model MiB | accounted MiB | RSS peak MiB | RSS training MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, runs in results["models"].items():
        for pool, modes in runs.items():
            for mode in MODES:
                for st in modes[mode][0]["stages"]:
                    rss, training = st["peak_rss_bytes"], st["training_rss_bytes"]
                    lines.append(
                        f"| {model} | {pool} | {mode} | {st['stage']} | {'+'.join(st['device_names'])} "
                        f"| {st['predicted_memory_bytes'] / MIB:.0f} | {st['peak_memory_bytes'] / MIB:.0f} "
                        f"| {'-' if rss is None else f'{rss / MIB:.0f}'} "
                        f"| {'-' if training is None else f'{training / MIB:.0f}'} |")
    host = [r for runs in results["models"].values() for modes in runs.values() for r in modes["host"]]
    worst = max(r["planner_error"] for r in host)
    lines += ["", f"Largest error at host speed: {100 * worst:.1f}% (target <= 15%).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured sync-rounds per run (after one warm-up)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="runs per plan and mode (modes alternate)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the earlier results of models not measured now (one model at a time)")
    parser.add_argument("--pools", default=",".join(f"{p}:{planner}" for p, planner in CASES),
                        help="pool:planner pairs, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cache-dir", default=None, help="profile cache (default: a fresh one, profiled now)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "pipeline.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    args = parser.parse_args(argv)
    args.cases = [tuple(item.split(":")) for item in args.pools.split(",")]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as fresh:
        cache_dir = args.cache_dir or fresh
        results = {
            "machine": platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "cores": host_cores(),
            "rounds": args.rounds, "batch": args.batch, "micro_batch": args.micro_batch, "repeats": args.repeats,
            "overhead": operation_overhead_record(cache_dir),
            "models": {model: measure_model(model, args, cache_dir) for model in args.models.split(",")},
        }
    path = Path(args.json)
    if path.exists() and args.keep_others:  # models measured by an earlier run with the same settings
        earlier = json.loads(path.read_text())
        results["models"] = {**{m: r for m, r in earlier["models"].items() if m not in results["models"]},
                             **results["models"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    replace_section(Path(args.doc), table)
    print(table)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
