"""Homes with GPU devices planned on what those devices measured on their GPUs: the planner's error and the
speed-up over the same home on CPU threads (issue 42).

    .venv/bin/python -m benchmarks.accelerator_homes                        # MobileNetV2 and EfficientNet-B0
    .venv/bin/python -m benchmarks.accelerator_homes --models mobilenet_v2 --data-root .gpu/data

Each row is one ``ecofl home train --emulate none --json`` run, as a user runs it, on a pool file of three
devices (:data:`HOMES`): every device on the CPU (one worker thread each: the baseline), every device on
``cuda`` (three workers sharing this machine's GPU), and a mixed home whose portal trains on the CPU and whose
other two devices share the GPU. In the homes with GPU devices those devices first time their work on the GPU
(:mod:`ecofl.pipeline.runtime.accelerator_devices`) and the plan is made on what they measured; CPU devices are
one host core each. ``planner_error`` is |predicted - measured| / measured of the median sync-round of the
final plan; ``speedup_vs_cpu`` is the CPU home's sync-round (same model, batch and machine: measured in
the same invocation, else the last stored) over this one's. Training data: Fashion-MNIST's first
``batch x rounds`` training images.

Rows merge into ``benchmarks/results/pipeline_accelerators.json`` (its ``homes``) by machine, model and home;
the table goes to ``docs/pipeline_accelerators.md`` (section ``homes``). Exactness on a GPU is the other table's
(:mod:`benchmarks.pipeline_accelerators`) and the recovery tests' (``ECOFL_TEST_ACCELERATOR=cuda``): these
models have dropout, whose draws a single-process reference would not repeat.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.markdown_section import cell, replace_section
from benchmarks.pipeline_accelerators import DOC, RESULTS, machine, merge, speedup_cell
from ecofl.data.datasets import DEBIAN_FASHION_MNIST

#: Each home's devices, by where they train (device 0 is the portal).
HOMES = {"cpu": ("cpu", "cpu", "cpu"), "gpu": ("cuda", "cuda", "cuda"), "mixed": ("cpu", "cuda", "cuda")}
MODELS = ("mobilenet_v2", "efficientnet_b0")


def slice_fashion_mnist(target: Path, train: int = 4000, test: int = 1000, source: Path = DEBIAN_FASHION_MNIST) -> Path:
    """The first ``train`` and ``test`` images of Fashion-MNIST (Debian's files) as ``target/FashionMNIST/raw``, the
    torchvision layout ``--data-root target`` reads: 2 MB to carry to a GPU machine instead of 31 MB. Loaded, they
    are normalised on their own mean and deviation, a little off the whole set's (no timing depends on it)."""
    raw = target / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, keep in (("train", train), ("t10k", test)):
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            data = gzip.decompress((source / f"{split}-{kind}.gz").read_bytes())
            dims = struct.unpack(f">{data[3]}I", data[4 : 4 + 4 * data[3]])  # IDX: magic, then each dimension
            item = math.prod(dims[1:])
            body = data[4 + 4 * len(dims) :][: keep * item]
            header = data[:4] + struct.pack(f">{len(dims)}I", keep, *dims[1:])
            (raw / f"{split}-{kind}.gz").write_bytes(gzip.compress(header + body))
    return target


def write_pool(directory: Path, home: str) -> Path:
    """A pool file of ``home``'s devices: 8 GB budgets, 1 Gbps links (loopback here), speed 1 until measured."""
    devices = [{"name": f"{'gpu' if accelerator != 'cpu' else 'cpu'}-{d}", "speed": 1.0, "memory_gb": 8,
                "accelerator": accelerator} for d, accelerator in enumerate(HOMES[home])]
    path = directory / f"{home}-home.yaml"
    path.write_text(yaml.safe_dump({"name": f"{home}-home", "bandwidth_mbps": 1000, "devices": devices}))
    return path


def train(model: str, pool: Path, rounds: int, batch: int, data_root: str | None, timeout_s: float) -> dict:
    """One ``ecofl home train --json`` run's report (RuntimeError with its last words if it fails)."""
    command = [sys.executable, "-m", "ecofl", "home", "train", "--model", model, "--pool", str(pool), "--dataset",
               "fashion_mnist", "--rounds", str(rounds), "--batch", str(batch), "--emulate", "none", "--json"]
    if data_root is not None:
        command += ["--data-root", data_root]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def row(model: str, home: str, report: dict, wall_s: float, load: float) -> dict:
    measured, predicted = report["sync_round_s"], report["predicted_sync_round_s"]
    where = {d["device"]: d["accelerator"] for d in report["devices"]}
    stages = [f"{s['layers'][0]}-{s['layers'][1]}: " + "+".join(where[d] for d in s["devices"])
              for s in report["stages"]]
    return {
        "machine": machine(), "model": model, "home": home, "pool": f"{home}-home",
        "accelerator": "cuda" if "cuda" in HOMES[home] else "cpu",
        "accelerators": [d["accelerator"] for d in sorted(report["devices"], key=lambda d: d["device"])],
        "speeds": [d["speed"] for d in sorted(report["devices"], key=lambda d: d["device"])],
        "plan": f"{report['planner']} {report['num_micro_batches']}x{report['micro_batch']} [{' | '.join(stages)}]",
        "batch": report["batch_size"], "rounds": report["rounds_completed"], "sync_round_s": measured,
        "predicted_sync_round_s": predicted, "planner_error": abs(predicted - measured) / measured,
        "throughput": report["throughput"], "predicted_throughput": report["predicted_throughput"],
        "sync_rounds_s": report["sync_rounds_s"], "exact": None, "wall_s": wall_s, "load_before": load,
        "devices": report["devices"], "stages": report["stages"],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| machine | model | home (devices on) | plan | sync-round (s) | predicted (s) | planner error | "
             "samples/s | speed-up vs CPU home | load | date |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        devices = ", ".join(HOMES[r["home"]])  # the pool's, in order (the first rows' own field is in stage order)
        lines.append(f"| {r['machine']} | {r['model']} | {r['home']} ({devices}) | {cell(r['plan'])} "
                     f"| {r['sync_round_s']:.3f} | {r['predicted_sync_round_s']:.3f} | {100 * r['planner_error']:.1f}% "
                     f"| {r['throughput']:.0f} | {speedup_cell(r)} | {r['load_before']:.1f} | {r['date']} |")
    if not any(r["accelerator"] != "cpu" for r in rows):
        lines.append("| not measured | | gpu, mixed | | not measured | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--homes", nargs="+", default=list(HOMES), choices=list(HOMES),
                        help="cpu first: the others' speed-up is against it")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--data-root", default=None, help="Fashion-MNIST in torchvision layout (default: Debian's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--slice-data", type=Path, default=None, metavar="DIR",
                        help="only write Fashion-MNIST's first images to DIR (for --data-root DIR on a GPU machine)")
    args = parser.parse_args()
    if args.slice_data is not None:
        print(f"wrote {slice_fashion_mnist(args.slice_data) / 'FashionMNIST' / 'raw'}")
        return
    results = json.loads(args.json.read_text()) if args.json.exists() else {"rows": []}
    rows, written = [], False
    with tempfile.TemporaryDirectory() as directory:
        for model in args.models:
            cpu = next((r["sync_round_s"] for r in results.get("homes", []) if (r["machine"], r["model"], r["home"],
                        r["batch"]) == (machine(), model, "cpu", args.batch)), None)  # replaced by a new CPU run
            for home in args.homes:
                load, started = os.getloadavg()[0], time.perf_counter()
                report = train(model, write_pool(Path(directory), home), args.rounds, args.batch, args.data_root,
                               args.timeout)
                rows.append(row(model, home, report, time.perf_counter() - started, load))
                if home == "cpu":
                    cpu = rows[-1]["sync_round_s"]
                elif cpu is not None:
                    rows[-1]["speedup_vs_cpu"] = cpu / rows[-1]["sync_round_s"]
                print(json.dumps(rows[-1]), flush=True)
                results["homes"] = merge(results.get("homes", []), rows, ("machine", "model", "home"))
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1))  # after each run: a timeout keeps what ran
                written = replace_section(args.doc, markdown(results["homes"]), "homes")
    if not written:
        print(f"{args.doc} has no homes section")
    print(markdown(results["homes"]))


if __name__ == "__main__":
    main()
