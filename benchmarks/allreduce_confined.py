"""A replicated stage's all-reduce on confined devices: one ring for its gradients and buffers, or a ring each.

A data-parallel group of a home (Asteroid's HPP: a stage replicated over
devices) sums its gradients at the flush with a ring all-reduce on sealed
links (:meth:`ecofl.net.mesh.EpochMesh.all_reduce`), and averages its float
buffers (batch-norm statistics) the same way. The cost model charges the
ring its gradients' bytes on the slowest link, 2(n-1)/n of them (Asteroid
eq. 5), and the runtime's time per operation for each of the 4(n-1)
messages a device sends and receives, at the slowest device's speed
(:func:`ecofl.pipeline.cost.ring_messages_s`).

Here two processes, each in a cgroup of its own (``--cores``: the mixed
home's Raspberry Pi and phone by default), all-reduce a layer range's
gradients and float buffers (``--model``, ``--ranges``) on loopback links
paced at ``--mbps`` as a stage's ring is. Before each all-reduce each burns
``--busy-ms`` of CPU at its quota (its last backward), so it enters with its
quota spent. Two policies, alternating (each first in every other pair):

- ``two rings``: the gradients, then the buffers (what the runtime did until 2026-12-05);
- ``one ring``: both in one tensor (:meth:`ecofl.pipeline.runtime.stage.ShareExecutor._reduce_grads`).

Each flattens what it sends first (a copy of the same bytes). Reported per
policy: an all-reduce's seconds from the last device entering it to the
last leaving it (median, mean, max over its rounds), each device's process
CPU in it, and the cost model's time for the ring.

    .venv/bin/python benchmarks/allreduce_confined.py [--cores 0.025,0.08] [--ranges 16-21,17-21] [--rounds 32]

(``--table-from JSON``: summarize a results file's rounds again, run nothing.)

Needs root and writable cgroups; writes benchmarks/results/allreduce_confined.json and the "allreduce-confined"
section of docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.cgroups import DeviceLimits, find_hierarchy, remove_stale  # noqa: E402
from ecofl.models.layers import layer_sequence  # noqa: E402
from ecofl.models.registry import build_model  # noqa: E402
from ecofl.pipeline.cost import ring_allreduce_s, ring_messages_s  # noqa: E402
from ecofl.pipeline.runtime.host_overhead import host_operation_overhead_s  # noqa: E402

POLICIES = ("two rings", "one ring")
MEMORY_BYTES = 2 << 30

CHILD = """
import json, sys, time
import torch
from ecofl.net.links import ALLREDUCE_TAG
from ecofl.net.mesh import DataListener, EpochMesh
from ecofl.net.pacing import TokenBucket
torch.set_num_threads(1)
setup = json.loads(sys.stdin.readline())
secret, rank, ranks = bytes.fromhex(setup["secret"]), setup["rank"], tuple(range(setup["devices"]))
listener = DataListener("127.0.0.1", secret)
print(json.dumps(listener.address), flush=True)
addresses = [tuple(a) for a in json.loads(sys.stdin.readline())]
mesh = EpochMesh(listener, secret, 0, rank, addresses, timeout_s=120)
ring = TokenBucket(setup["rate"])
grads, buffers, a = torch.randn(setup["grads"]), torch.randn(setup["buffers"]), torch.randn(64, 64)
print("ready", flush=True)
sys.stdin.readline()  # under the device's quota from here
rounds = []
for i in range(setup["rounds"]):
    pair = setup["policies"] if i // 2 % 2 == 0 else setup["policies"][::-1]  # neither always first
    policy = pair[i % 2]
    started = time.thread_time()
    while time.thread_time() - started < setup["busy_s"]:  # the last backward: the quota spent
        a = torch.tanh(a @ a)
    wall, cpu = time.monotonic(), time.process_time()
    if policy == "two rings":
        mesh.all_reduce(grads.clone(), ranks, ALLREDUCE_TAG, bucket=ring)
        mesh.all_reduce(buffers.clone(), ranks, ALLREDUCE_TAG, bucket=ring)
    else:
        mesh.all_reduce(torch.cat([grads, buffers]), ranks, ALLREDUCE_TAG, bucket=ring)
    rounds.append({"policy": policy, "entered": wall, "left": time.monotonic(), "cpu_s": time.process_time() - cpu})
print(json.dumps(rounds), flush=True)
mesh.close()
listener.close()
"""


def range_sizes(model_name: str, first: int, last: int) -> tuple[int, int]:
    """Elements of the parameters and of the float buffers of ``model_name``'s layers ``first``..``last``
    (blocks, at Fashion-MNIST's input: the mixed home's CLI run)."""
    layers = layer_sequence(build_model(model_name, (1, 28, 28), 10))[first : last + 1]
    params = sum(p.numel() for layer in layers for p in layer.parameters())
    buffers = sum(b.numel() for layer in layers for b in layer.buffers() if b.is_floating_point())
    return params, buffers


def measure(cores: list[float], grads: int, buffers: int, args: argparse.Namespace) -> list[dict]:
    """One pair (or ring) of confined processes all-reducing ``args.rounds`` times, the policies alternating:
    each process's rounds."""
    found = find_hierarchy()
    if isinstance(found, str):
        sys.exit(f"allreduce_confined needs writable cgroups: {found}")
    remove_stale(found)
    secret = os.urandom(32).hex()
    groups, children = [], []
    try:
        for rank in range(len(cores)):
            groups.append(found.create(f"allreduce-{rank}", DeviceLimits(cores=1.0, memory_bytes=MEMORY_BYTES)))
            children.append(subprocess.Popen(
                groups[-1].entry_command() + [sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}))
            setup = {"secret": secret, "rank": rank, "devices": len(cores), "rate": args.mbps * 1e6 / 8,
                     "grads": grads, "buffers": buffers, "rounds": args.rounds, "busy_s": args.busy_ms / 1e3,
                     "policies": POLICIES}
            children[-1].stdin.write(json.dumps(setup) + "\n")
            children[-1].stdin.flush()
        addresses = [json.loads(child.stdout.readline()) for child in children]
        for child in children:
            child.stdin.write(json.dumps(addresses) + "\n")
            child.stdin.flush()
        if any(child.stdout.readline().strip() != "ready" for child in children):
            raise RuntimeError("a device process did not build its mesh")
        for group, share in zip(groups, cores):
            group.set_cores(share)  # its start-up (torch's import) at a full core, its all-reduces at its quota
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        rounds = [json.loads(child.stdout.readline()) for child in children]
        for child in children:
            child.wait(timeout=120)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        for group in groups:
            group.remove()
    return rounds


def summarize(rounds: list[list[dict]], policy: str) -> dict:
    """A policy's all-reduces, each from the moment the last device entered it to the moment the last left it
    (the one that entered first waits for the others; host-wide monotonic clock), and each device's CPU in
    one."""
    spans = [max(r["left"] for r in same) - max(r["entered"] for r in same)
             for same in zip(*rounds) if same[0]["policy"] == policy]
    return {"policy": policy, "rounds": len(spans), "wall_median_s": statistics.median(spans),
            "wall_mean_s": statistics.mean(spans), "wall_max_s": max(spans),
            "cpu_s_by_device": [statistics.mean(r["cpu_s"] for r in device if r["policy"] == policy)
                                for device in rounds]}


def with_summaries(results: dict) -> dict:
    """``results`` with each row's policies summarized from its rounds, and the cost model's time for its ring:
    the gradients' bytes on the link and the runtime's time for the ring's messages at the slowest device's
    cores (its speed, as a confined device measures it, is a little under its cores)."""
    messages = ring_messages_s(len(results["cores"]), results["operation_overhead_s"], min(results["cores"]))
    for row in results["rows"]:
        row["policies"] = [summarize(row["rounds"], policy) for policy in POLICIES]
        row["model_s"] = row["model_link_s"] + messages
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="0.025,0.08", help="each device's cores (the Raspberry Pi, the phone)")
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--ranges", default="16-21,17-21", help="the replicated stages' layers (blocks)")
    parser.add_argument("--mbps", type=float, default=100.0, help="the ring's links")
    parser.add_argument("--busy-ms", type=float, default=2.0, help="CPU each device burns before an all-reduce")
    parser.add_argument("--rounds", type=int, default=32, help="all-reduces per range, the policies alternating")
    parser.add_argument("--table-from", metavar="JSON",
                        help="run nothing: summarize a results file's rounds again (into it, and the doc's section)")
    args = parser.parse_args(argv)
    path = ROOT / "benchmarks" / "results" / "allreduce_confined.json"
    if args.table_from:  # written back where it was read
        path = Path(args.table_from)
        results = with_summaries(json.loads(path.read_text()))
    else:
        results = with_summaries(run(args, " ".join(["python benchmarks/allreduce_confined.py",
                                                     *(sys.argv[1:] if argv is None else argv)])))
    publish(results, path, render(results), ROOT / "docs" / "pipeline.md", "allreduce-confined")
    return 0


def run(args: argparse.Namespace, command: str) -> dict:
    """Each layer range's all-reduces on confined devices: the rounds of every device."""
    cores = [float(c) for c in args.cores.split(",")]
    load = os.getloadavg()[0]
    rate = args.mbps * 1e6 / 8
    rows = []
    for text in args.ranges.split(","):
        first, last = (int(x) for x in text.split("-"))
        grads, buffers = range_sizes(args.model, first, last)
        print(f"layers {first}-{last}: {4 * grads / 1e6:.2f} MB of gradients, {4 * buffers / 1e3:.1f} kB of "
              f"buffers, {args.rounds} all-reduces ...", file=sys.stderr, flush=True)
        rows.append({"layers": [first, last], "grad_bytes": 4 * grads, "buffer_bytes": 4 * buffers,
                     "model_link_s": ring_allreduce_s(4 * grads, len(cores), rate),
                     "rounds": measure(cores, grads, buffers, args)})
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "load_before": round(load, 2), "cores": cores,
            "model": args.model, "mbps": args.mbps, "busy_ms": args.busy_ms, "rows": rows, "command": command,
            "operation_overhead_s": host_operation_overhead_s()}


def render(results: dict) -> str:
    """The results as the "allreduce-confined" section of docs/pipeline.md."""
    cores = " and ".join(f"{c:g}" for c in results["cores"])
    lines = [f"Measured with `{results['command']}` ({results['date']}, load {results['load_before']} before): "
             f"{results['model']}'s layer ranges all-reduced by {len(results['cores'])} confined processes of "
             f"{cores} cores on loopback links paced at {results['mbps']:g} Mbps, each after {results['busy_ms']:g} "
             "ms of CPU at its quota, the policies alternating (each first in every other pair); an all-reduce's "
             "seconds from the last device entering it to the last leaving it. `link`: 2(n-1)/n of the gradients' "
             "bytes on the slowest link (the buffers, about 1% more, not counted); `cost model`: that and the "
             f"runtime's {1e3 * results['operation_overhead_s']:.2f} ms a message for the ring's 4(n-1) messages "
             f"at the slowest device's cores. `CPU`: each device's process in an all-reduce ({cores} cores).",
             "", "| layers | gradients MB | buffers kB | policy | rounds | wall median s | mean | max | link s | "
             "cost model s | CPU ms by device |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in results["rows"]:
        first, last = row["layers"]
        for p in row["policies"]:
            cpu = ", ".join(f"{1e3 * c:.1f}" for c in p["cpu_s_by_device"])
            lines.append(f"| {first}-{last} | {row['grad_bytes'] / 1e6:.2f} | {row['buffer_bytes'] / 1e3:.1f} | "
                         f"{p['policy']} | {p['rounds']} | {p['wall_median_s']:.3f} | {p['wall_mean_s']:.3f} | "
                         f"{p['wall_max_s']:.3f} | {row['model_link_s']:.3f} | {row['model_s']:.3f} | {cpu} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
