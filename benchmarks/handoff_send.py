"""How long a confined device's hand-off takes to leave it while it computes on: two policies, side by side.

A stage posts its output (an activation or a gradient) to a link's sender
thread and starts its next pass. On a device of less than one core the
sender thread shares the device's CPU quota with that pass, and each of its
wakes in a throttled cgroup may wait out a CFS period (``1 ms / cores``: 40
ms at 0.025 cores). Here a process in a cgroup of ``--cores`` runs passes of
``--op-ms`` CPU at the device's pace (torch matrix products, as a stage's
layers: the GIL is released in the kernels and held between them) and
posts ``--kib`` KiB after each on a sealed link emulated at ``--mbps``
(:class:`ecofl.net.links.PeerLink`; the receiver, outside the cgroup,
holds each tensor until the link could have carried it). Two policies,
alternating, ``--repeats`` times each:

- ``computes on``: post and start the next pass (a device with cores to spare);
- ``hand-off first``: post, wait until the sender thread has sealed and written it, then compute on (what
  :mod:`ecofl.pipeline.runtime.hand_off` does on a device of less than one core).

Reported: the hand-off's delay beyond its link time (posted to handed out at
the receiver, less ``bytes / rate``) and the passes the device completed a
second.

    .venv/bin/python benchmarks/handoff_send.py [--cores 0.025,0.1,0.25] [--kib 80] [--seconds 10] [--repeats 2]

Needs root and writable cgroups; writes benchmarks/results/handoff_send.json and the "handoff-send" section of
docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.cgroups import DeviceLimits, find_hierarchy, remove_stale  # noqa: E402
from ecofl.net.links import PeerLink  # noqa: E402
from ecofl.net.sealed import SealedSocket  # noqa: E402

POLICIES = ("computes on", "hand-off first")
TAG = 7

CHILD = """
import json, socket, sys, time
import torch
from ecofl.net.links import PeerLink
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.cpu_pace import CpuPace
fd, send_key, recv_key, policy = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
op_s, nbytes, rate, seconds = float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8])
torch.set_num_threads(1)
link = PeerLink(SealedSocket(socket.socket(fileno=fd), send_key, recv_key), peer=0)
bucket = TokenBucket(rate, burst_bytes=0)
a, out = torch.randn(64, 64), torch.zeros(nbytes // 4)
print("ready", flush=True)
sys.stdin.readline()  # under the device's quota from here
pace = CpuPace.of_this_process()
posted, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    started = pace.begin()
    while time.thread_time() - started[1] < op_s:
        a = torch.tanh(a @ a)
    pace.end(started)
    posted.append(time.monotonic())
    ticket = link.post(out, %d, bucket)
    if policy == "hand-off first":
        ticket.wait(60)
print(json.dumps({"posted": posted, "seconds": seconds}), flush=True)
link.close()
""" % TAG


def measure(cores: float, policy: str, args: argparse.Namespace) -> dict:
    """One run of ``policy`` in a cgroup of ``cores``: each hand-off's delay beyond its link time, passes a second."""
    found = find_hierarchy()
    if isinstance(found, str):
        sys.exit(f"handoff_send needs writable cgroups: {found}")
    remove_stale(found)
    near, far = socket.socketpair()
    to_child, to_here = os.urandom(32), os.urandom(32)
    group = found.create(f"handoff-send-{os.getpid()}", DeviceLimits(cores=1.0, memory_bytes=2 << 30))
    receiver = PeerLink(SealedSocket(near, to_here, to_child), peer=1)
    handed_out: list[float] = []

    def receive() -> None:  # the next stage: takes each hand-off once the link has carried it
        while True:
            try:
                receiver.take(TAG, 120)
            except (ConnectionError, TimeoutError):
                return
            handed_out.append(time.monotonic())

    nbytes, rate = args.kib << 10, args.mbps * 1e6 / 8
    try:
        child = subprocess.Popen(
            group.entry_command() + [sys.executable, "-c", CHILD, str(far.fileno()), to_child.hex(), to_here.hex(),
                                     policy, str(args.op_ms / 1e3), str(nbytes), str(rate), str(args.seconds)],
            pass_fds=[far.fileno()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        far.close()
        threading.Thread(target=receive, daemon=True).start()
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the device process did not start")
        group.set_cores(cores)  # its start-up (torch's import) at a full core, its passes at its quota
        child.stdin.write("go\n")
        child.stdin.flush()
        report = json.loads(child.stdout.readline())
        child.wait(timeout=120)
        deadline = time.monotonic() + 30
        while len(handed_out) < len(report["posted"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        receiver.close()
        group.remove()
    delays = sorted(1e3 * (got - sent - nbytes / rate) for sent, got in zip(report["posted"], handed_out))
    return {"cores": cores, "policy": policy, "handoffs": len(delays), "delay_mean_ms": statistics.mean(delays),
            "delay_median_ms": statistics.median(delays), "delay_p90_ms": delays[int(0.9 * len(delays))],
            "passes_per_s": len(report["posted"]) / report["seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="0.025,0.1,0.25")
    parser.add_argument("--op-ms", type=float, default=3.0, help="a pass's CPU time")
    parser.add_argument("--kib", type=int, default=80, help="a hand-off's size")
    parser.add_argument("--mbps", type=float, default=100.0, help="the emulated link's rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each run computes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    runs = []
    for cores in map(float, args.cores.split(",")):
        for repeat in range(args.repeats):
            for policy in POLICIES if repeat % 2 == 0 else POLICIES[::-1]:  # alternating: neither always first
                print(f"{cores:g} cores, {policy}, repeat {repeat + 1} ...", file=sys.stderr, flush=True)
                runs.append(measure(cores, policy, args))
    command = " ".join(["python benchmarks/handoff_send.py", *(sys.argv[1:] if argv is None else argv)])
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_before": round(load, 2), "op_ms": args.op_ms,
               "kib": args.kib, "mbps": args.mbps, "seconds": args.seconds, "runs": runs, "command": command}
    publish(results, ROOT / "benchmarks" / "results" / "handoff_send.json", render(results),
            ROOT / "docs" / "pipeline.md", "handoff-send")
    return 0


def render(results: dict) -> str:
    """The results as the "handoff-send" section of docs/pipeline.md: the mean over repeats."""
    lines = [f"Measured with `{results['command']}` ({results['date']}, load {results['load_before']} before): "
             f"passes of {results['op_ms']:g} ms CPU at the device's pace, each followed by a hand-off of "
             f"{results['kib']} KiB on a link emulated at {results['mbps']:g} Mbps; the delay is from the post to "
             "the receiver handing it out, less the link's time (a mean over the repeats of each run's figure).",
             "", "| cores | CFS period ms | policy | hand-offs | delay mean ms | median | p90 | passes/s |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[float, str], list[dict]] = {}
    for run in results["runs"]:
        groups.setdefault((run["cores"], run["policy"]), []).append(run)
    for (cores, policy), runs in groups.items():
        def mean(key: str) -> float:
            return statistics.mean(r[key] for r in runs)
        lines.append(f"| {cores:g} | {1 / cores:.1f} | {policy} | {sum(r['handoffs'] for r in runs)} | "
                     f"{mean('delay_mean_ms'):.1f} | {mean('delay_median_ms'):.1f} | {mean('delay_p90_ms'):.1f} | "
                     f"{mean('passes_per_s'):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
