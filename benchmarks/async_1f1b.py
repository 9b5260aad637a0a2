"""Asynchronous 1F1B (FTPipeHD) against 1F1B-Sync: throughput and accuracy after the same samples, side by side.

Both schedules train the FedAvg CNN on the same Fashion-MNIST samples, in
the same order, on the same three-device home (Eco-FL's testbed:
``ecofl-3stage``), with the same plan (stages, micro-batch b, M micro-batches
per mini-batch) and learning rate:

- **1F1B-Sync** (Eco-FL §4): each mini-batch of M x b samples is one update,
  at a pipeline flush;
- **async 1F1B** (FTPipeHD §III-C, PipeDream's 1F1B with weight stashing):
  no flush; every micro-batch of b samples is its own update, S - s
  micro-batches in flight on stage s, and each stage averages its last S - s
  weight versions every S - s updates (FTPipeHD's aggregation; ``--aggregate-every``).

Each run is measured twice, alternating: on emulated devices (compute takes
the cost model's time for the boards by construction; what differs between
the schedules, the flush's bubble against the per-micro-batch weight
updates, is then what the measurement shows) and at host speed without
emulation (three worker processes sharing this machine's cores: real compute,
real contention). Accuracy is the test accuracy (2000 test samples) of the
weights each run returns.

    .venv/bin/python benchmarks/async_1f1b.py [--samples 2048] [--epochs 2] [--lr 0.05]

writes benchmarks/results/async_1f1b.json and the results section of docs/async_1f1b.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402
from ecofl.data import load_dataset  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.models import build_model  # noqa: E402
from ecofl.pipeline.plan import ScheduleKind  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import HomePipeline, ZooModel  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402
from ecofl.train import evaluate  # noqa: E402
from ecofl.weights import get_weights, set_weights  # noqa: E402

MODEL, POOL, DATASET = "cnn", "ecofl-3stage", "fashion_mnist"
SCHEDULES = (ScheduleKind.ONE_F_ONE_B, ScheduleKind.ASYNC_ONE_F_ONE_B)


def run(schedule: ScheduleKind, emulate: bool, args: argparse.Namespace, data, profile, pool, base_plan, start) -> dict:
    """Train the samples' epochs with ``schedule``; measured throughput and the test accuracy of the result."""
    plan = dataclasses.replace(base_plan, schedule=schedule)
    x, y = data.train.x[: args.samples], data.train.y[: args.samples]
    rounds = args.epochs * args.samples // plan.batch_size
    spec = ZooModel(MODEL, tuple(data.input_shape), data.num_classes)
    with HomePipeline(spec, pool, plan, profile=profile, emulate="sleep" if emulate else "none", timeout_s=args.timeout,
                      aggregate_every=args.aggregate_every) as home:
        result = home.train(start, x, y, rounds, lr=args.lr)
    model = build_model(MODEL, tuple(data.input_shape), data.num_classes)
    set_weights(model, result.weights)
    test = evaluate(model, data.test.x[:2000], data.test.y[:2000])
    staleness = [now - used for log in result.weight_versions.values() for _, used, now in log]
    updates = rounds * (plan.num_micro_batches if schedule == ScheduleKind.ASYNC_ONE_F_ONE_B else 1)
    return {"schedule": schedule, "emulated": emulate, "updates": updates,
            "samples": rounds * plan.batch_size, "seconds": sum(result.sync_round_s),
            "throughput": result.throughput, "test_accuracy": test.accuracy, "test_loss": test.loss,
            "mean_staleness": sum(staleness) / len(staleness) if staleness else 0.0}


def markdown(report: dict) -> str:
    plan = report["plan"]
    lines = [
        f"Measured {report['date']} on {report['machine']} (load average {report['load']}) with "
        f"`python benchmarks/async_1f1b.py --samples {report['samples']} --epochs {report['epochs']} "
        f"--lr {report['lr']}`: the FedAvg CNN on {report['samples']} Fashion-MNIST samples x {report['epochs']} "
        f"epochs on {POOL} ({plan}), plain SGD at lr {report['lr']} for both schedules. Emulated: compute takes the "
        "cost model's time for the boards by construction; host speed: three worker processes on this machine's "
        "cores, nothing emulated.",
        "",
        "| schedule | devices | updates | samples/s | test accuracy | mean staleness (updates) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:
        lines.append(f"| {r['schedule']} | {'emulated' if r['emulated'] else 'host speed'} | {r['updates']} | "
                     f"{r['throughput']:.1f} | {r['test_accuracy']:.4f} | {r['mean_staleness']:.2f} |")
    lines += ["", "| devices | async / sync throughput | async - sync test accuracy |", "|---|---:|---:|"]
    for emulated in (True, False):
        by = {r["schedule"]: r for r in report["runs"] if r["emulated"] == emulated}
        if len(by) == 2:
            lines.append(f"| {'emulated' if emulated else 'host speed'} | "
                         f"{by['async-1f1b']['throughput'] / by['1f1b']['throughput']:.2f}x | "
                         f"{by['async-1f1b']['test_accuracy'] - by['1f1b']['test_accuracy']:+.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="1F1B-Sync's mini-batch (M x b)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--aggregate-every", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "async_1f1b.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset(DATASET)
    shape = tuple(int(d) for d in data.input_shape)
    profile = profile_zoo_model(MODEL, shape, data.num_classes, "block", args.cache_dir)
    pool = load_pool(POOL, None)
    plan = make_plan("ecofl", profile, pool, args.batch)
    torch.manual_seed(0)
    start = get_weights(build_model(MODEL, shape, data.num_classes))
    runs = []
    for emulate in (True, False):
        for schedule in SCHEDULES:
            runs.append(run(schedule, emulate, args, data, profile, pool, plan, start))
            r = runs[-1]
            print(f"{schedule} ({'emulated' if emulate else 'host speed'}): {r['throughput']:.1f} samples/s, "
                  f"test accuracy {r['test_accuracy']:.4f}", flush=True)
    described = f"{len(plan.stages)} stages, {plan.num_micro_batches} x {plan.micro_batch}"
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "samples": args.samples,
              "epochs": args.epochs, "lr": args.lr, "plan": described, "runs": runs}
    table = markdown(report)
    print(table)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    if not replace_section(ROOT / "docs" / "async_1f1b.md", table):
        print("docs/async_1f1b.md has no benchmark section; table not written there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
