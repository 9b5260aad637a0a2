"""A confined device's speed with this machine's cores left to halt, and kept awake (ecofl/awake_cores.py).

One process builds MobileNetV2 (block layers, 3x32x32 inputs, 10 classes)
at host speed, then enters a cgroup of ``--cores`` host cores (1 ms of quota
per period, as every confined device) and times training steps of
``--samples`` samples for ``--chunks`` chunks of ``--chunk-s`` seconds
each: steps per second in each chunk. It does so with the cores left to
halt between the device's quota slices and with an idle-priority spinner on
each core, alternating, ``--repeats`` times each, and once at host speed
(no cgroup) for scale. Needs root and writable cgroups.

    .venv/bin/python benchmarks/awake_cores.py [--repeats 2] [--chunks 8] [--chunk-s 4]

writes benchmarks/results/awake_cores.json and the "awake-cores" section of docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.awake_cores import AwakeCores  # noqa: E402
from ecofl.cgroups import DeviceLimits, find_hierarchy  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402

#: The timed process: builds the model, says ready, waits for go (by then in its cgroup), prints chunk rates.
STEPS = """
import json, sys, time
import torch
torch.set_num_threads(1)
from ecofl.pipeline.runtime import ZooModel
from ecofl.pipeline.runtime.heap import freeze_heap
samples, chunk_s, chunks = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
model, _ = ZooModel("mobilenet_v2", (3, 32, 32), 10, "block").build()
x, y = torch.randn(samples, 3, 32, 32), torch.randint(0, 10, (samples,))
def step():
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
for _ in range(3):
    step()
freeze_heap()
print("ready", flush=True)
sys.stdin.readline()
rates = []
for _ in range(chunks):
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < chunk_s:
        step()
        n += 1
    rates.append(n / (time.perf_counter() - start))
print(json.dumps(rates), flush=True)
"""


def chunk_rates(args: argparse.Namespace, cores: float | None, awake: bool) -> list[float]:
    """Steps per second in each chunk, in a cgroup of ``cores`` (None: at host speed), spinners or not."""
    process = subprocess.Popen([sys.executable, "-c", STEPS, str(args.samples), str(args.chunk_s), str(args.chunks)],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group, spinners = None, AwakeCores()
    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the timed process did not start")
        if cores is not None:
            group = find_hierarchy().create("awake-probe", DeviceLimits(cores, 4 << 30))
            for procs in group.procs_files:
                Path(procs).write_text(str(process.pid))
        if awake:
            spinners.start()
        process.stdin.write("go\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())
    finally:
        spinners.stop()
        process.kill()
        process.wait()
        if group is not None:
            group.remove()


def summary(rates: list[float]) -> dict:
    mean = statistics.mean(rates)
    return {"rates": rates, "mean": mean, "cv": statistics.stdev(rates) / mean if len(rates) > 1 else 0.0}


def markdown(results: dict) -> str:
    host = results["host"]["mean"]
    lines = [
        f"Measured on {results['machine']} ({results['date']}), `{results['command']}`: MobileNetV2 training steps "
        f"of {results['samples']} samples, {results['chunks']} chunks of {results['chunk_s']:g} s each, in a cgroup "
        f"of {results['cores']:g} cores (1 ms of quota per period), the modes alternating. `of quota`: steps/s "
        f"over {results['cores']:g} x the host-speed rate ({host:.2f} steps/s, no cgroup). `cv`: coefficient "
        "of variation between the chunks.", "",
        "| repeat | cores | steps/s | of quota | cv |", "|---|---|---:|---:|---:|"]
    for run in results["runs"]:
        lines.append(f"| {run['repeat']} | {'kept awake' if run['awake'] else 'left to halt'} | {run['mean']:.2f} "
                     f"| {run['mean'] / (results['cores'] * host):.2f} | {100 * run['cv']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, default=0.1, help="the device's quota (a Jetson Nano at 10 W)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--chunk-s", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "awake_cores.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    args = parser.parse_args(argv)
    found = find_hierarchy()
    if isinstance(found, str):
        print(f"needs writable cgroups: {found}", file=sys.stderr)
        return 1
    results = {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
               "date": time.strftime("%Y-%m-%d %H:%M"), "cores": args.cores, "samples": args.samples,
               "chunks": args.chunks, "chunk_s": args.chunk_s, "runs": [],
               "command": " ".join(["python benchmarks/awake_cores.py", *(sys.argv[1:] if argv is None else argv)])}
    with sigterm_as_interrupt():
        results["host"] = summary(chunk_rates(argparse.Namespace(**{**vars(args), "chunk_s": 1.0}), None, False))
        for repeat in range(1, args.repeats + 1):
            for awake in (False, True):
                run = {"repeat": repeat, "awake": awake, **summary(chunk_rates(args, args.cores, awake))}
                print(f"repeat {repeat}, cores {'kept awake' if awake else 'left to halt'}: {run['mean']:.2f} "
                      f"steps/s, cv {100 * run['cv']:.1f}%", file=sys.stderr, flush=True)
                results["runs"].append(run)
    publish(results, Path(args.json), markdown(results), Path(args.doc), "awake-cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
