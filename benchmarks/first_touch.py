"""A stage's first sync-round in a process that never ran it: the memory it touches first, and its cost.

A worker that takes new layers (a re-plan after a kill, or the run's first
round) allocates its stage's stash for the first time. The kernel maps each
new page on its first touch (a minor fault, zeroing 4 KiB), and a confined
device pays that CPU out of its quota. This benchmark measures it apart
from the pipeline: one process builds MobileNetV2 (block layers,
``--input-shape``), trains its old stage (``--before``, as the device did
before the re-plan), enters a cgroup of ``--cores`` host cores, then runs
``--rounds`` sync-rounds of the new stage (``--layers``) in 1F1B order with
at most ``--in-flight`` forwards held: each round's wall time, CPU time,
minor faults and the growth of its peak resident set (the memory it mapped
anew, as a worker reports it). The same once at host speed (no cgroup), for
scale. The defaults are the survivors' first stage after ``--inject
kill:2@4`` on ``ecofl home train --model mobilenet_v2 --pool ecofl-3stage
--dataset fashion_mnist --emulate cgroup``. Needs root and writable cgroups.

    .venv/bin/python benchmarks/first_touch.py [--cores 0.1] [--rounds 4]

writes benchmarks/results/first_touch.json and the "first-touch" section of docs/pipeline.md.
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
from ecofl.cgroups import DeviceLimits, find_hierarchy  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")

#: The timed process: the old stage warm, then ready; on go (in its cgroup by then) the new stage's rounds.
ROUNDS = """
import json, resource, sys, time
import torch
from ecofl.allocator import keep_freed_memory
from ecofl.pipeline.runtime import ZooModel
from ecofl.pipeline.runtime.heap import freeze_heap
from ecofl.pipeline.runtime.process_memory import mapped_since, resident_from_now
settings = json.loads(sys.argv[1])
torch.set_num_threads(1)
_, layers = ZooModel("mobilenet_v2", tuple(settings["input_shape"]), 10, "block").build()
freeze_heap()
keep_freed_memory()  # as a worker does (ecofl.allocator)

def one_round(first, last, micro_batch, micro_batches, in_flight):
    stage = torch.nn.Sequential(*layers[first:last + 1])
    x = torch.randn(micro_batch, *settings["input_shape"])
    with torch.no_grad():
        for layer in layers[:first]:
            x = layer(x)
    held = []
    def backward():
        out = held.pop(0)
        out.backward(torch.ones_like(out))
    for _ in range(micro_batches):  # 1F1B: a backward once in_flight forwards are held
        held.append(stage(x.clone().requires_grad_(first > 0)))
        if len(held) == in_flight:
            backward()
    while held:
        backward()
    stage.zero_grad(set_to_none=False)

def measured(*stage):
    resident, faults = resident_from_now(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu, wall = time.process_time(), time.perf_counter()
    one_round(*stage)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
            "mapped_bytes": mapped_since(resident)}

for _ in range(2):
    one_round(*settings["before"])
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps([measured(*settings["after"]) for _ in range(settings["rounds"])]), flush=True)
"""


def rounds_of(settings: dict, cores: float | None) -> list[dict]:
    """The new stage's rounds, timed in a cgroup of ``cores`` (None: at host speed)."""
    process = subprocess.Popen([sys.executable, "-c", ROUNDS, json.dumps(settings)], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group = None
    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the timed process did not start")
        if cores is not None:
            group = find_hierarchy().create("first-touch", DeviceLimits(cores, 4 << 30))
            for procs in group.procs_files:
                Path(procs).write_text(str(process.pid))
        process.stdin.write("go\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())
    finally:
        process.kill()
        process.wait()
        if group is not None:
            group.remove()


def first_against_later(rounds: list[dict]) -> dict:
    """The first round's extra wall and CPU time over the later rounds' medians, its first-touched MiB (the growth
    of its peak resident set beyond theirs, as a worker reports it: ``Done.first_touched_bytes``), and the CPU
    each first-touched MiB cost."""
    later = rounds[1:]
    extra_cpu = rounds[0]["cpu_s"] - statistics.median(r["cpu_s"] for r in later)
    if any(r["mapped_bytes"] is None for r in rounds):  # the kernel cannot reset the peak: count faulted pages
        touched = (rounds[0]["minor_faults"] - statistics.median(r["minor_faults"] for r in later)) * PAGE / 2**20
    else:
        touched = (rounds[0]["mapped_bytes"] - statistics.median(r["mapped_bytes"] for r in later)) / 2**20
    return {"rounds": rounds, "extra_wall_s": rounds[0]["wall_s"] - statistics.median(r["wall_s"] for r in later),
            "extra_cpu_s": extra_cpu, "first_touched_mib": touched,
            "cpu_ms_per_mib": 1000 * extra_cpu / touched if touched > 0 else None}


def markdown(results: dict) -> str:
    first, last, micro_batch, micro_batches, in_flight = results["after"]
    lines = [
        f"Measured on {results['machine']} ({results['date']}, load {results['load_before']:.2f} before), "
        f"`{results['command']}`: MobileNetV2 ({'x'.join(map(str, results['input_shape']))} inputs), layers "
        f"{first}-{last} trained for the first time in a process that trained layers "
        f"{results['before'][0]}-{results['before'][1]} before: {micro_batches} micro-batches of {micro_batch}, at "
        f"most {in_flight} forwards held (1F1B). `extra`: the first round over the later rounds' median. "
        "`first-touched`: the growth of its peak resident set beyond theirs, in MiB (whatever the page size; "
        f"where the peak cannot be reset, their minor faults at {PAGE} bytes).", "",
        "| where | first round s | later rounds s (median) | extra s | extra CPU s | first-touched MiB "
        "| CPU ms per MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for where, run in results["runs"].items():
        later = statistics.median(r["wall_s"] for r in run["rounds"][1:])
        per_mib = "-" if run["cpu_ms_per_mib"] is None else f"{run['cpu_ms_per_mib']:.2f}"
        lines.append(f"| {where} | {run['rounds'][0]['wall_s']:.2f} | {later:.2f} | {run['extra_wall_s']:.2f} "
                     f"| {run['extra_cpu_s']:.3f} | {run['first_touched_mib']:.0f} | {per_mib} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, default=0.1, help="the device's quota (a Jetson Nano at 10 W)")
    parser.add_argument("--input-shape", default="1,28,28", help="one sample's shape (Fashion-MNIST's)")
    parser.add_argument("--before", default="9,13,4,16,5", metavar="FIRST,LAST,MB,M,HELD",
                        help="the stage the process trained before: layers, micro-batch size and count, held")
    parser.add_argument("--layers", default="0,9,16,4,3", metavar="FIRST,LAST,MB,M,HELD",
                        help="the new stage, timed")
    parser.add_argument("--rounds", type=int, default=4, help="sync-rounds of the new stage (the first is cold)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "first_touch.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first round is compared with the later ones")
    found = find_hierarchy()
    if isinstance(found, str):
        print(f"needs writable cgroups: {found}", file=sys.stderr)
        return 1
    settings = {"input_shape": [int(n) for n in args.input_shape.split(",")], "rounds": args.rounds,
                "before": [int(n) for n in args.before.split(",")], "after": [int(n) for n in args.layers.split(",")]}
    results = {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
               "date": time.strftime("%Y-%m-%d %H:%M"), "load_before": os.getloadavg()[0], **settings,
               "cores": args.cores, "runs": {},
               "command": " ".join(["python benchmarks/first_touch.py", *(sys.argv[1:] if argv is None else argv)])}
    with sigterm_as_interrupt():
        for where, cores in (("host speed", None), (f"{args.cores:g} cores", args.cores)):
            results["runs"][where] = run = first_against_later(rounds_of(settings, cores))
            print(f"{where}: first round {run['rounds'][0]['wall_s']:.2f} s, {run['extra_wall_s']:+.2f} s over the "
                  f"later ones, {run['first_touched_mib']:.0f} MiB first touched", file=sys.stderr, flush=True)
    publish(results, Path(args.json), markdown(results), Path(args.doc), "first-touch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
