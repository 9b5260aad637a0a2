"""Idle priority as a mechanism: a copy beside a stage that computes and waits, in one confined cgroup.

Would a confined device's safety work (replicas, the global copy) cost its
stage nothing at Linux's ``SCHED_IDLE``, taking only the quota the stage
leaves while it waits? A whole pipeline run could not show it on this host
(docs/pipeline.md, "Safety at idle priority": the host's speed moves by more
between runs than the copies cost). Here one process in a cgroup of its own
(a Jetson Nano's 0.1 core, as the confined runs give it) plays one stage's
sync-round again and again: ``ops`` convolutions, each followed by a wait for
a hand-off (``wait_s``), while a second thread copies a replica's bytes
(``copy_mb`` MB, ``copies`` times). Rounds without the copy, with it at normal
priority and with it at idle priority take turns, so all three see the same
host, with the process free to run on every core of the host and pinned to
one (priority orders the threads of one core's queue; a cgroup's quota is
shared by all cores). Reported per setting: the round (compute and waits,
then the copy if it is not done), the stage's compute alone, and when the
copy was done.

``python benchmarks/idle_priority.py [--rounds 6]`` (root, cgroups) writes
``benchmarks/results/idle_priority.json`` and a table in ``docs/pipeline.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.cgroups import DeviceLimits, find_hierarchy, remove_stale  # noqa: E402

CORES = 0.1  # a Jetson Nano's quota in the confined pools
SETTINGS = ("none", "normal", "idle")
#: (wait after each op s, copies of the replica's bytes): a wait shorter than a 0.1-core cgroup's CFS period
#: (10 ms), and one of two periods.
CASES = ((0.005, 6), (0.02, 6))


def play_round(copy: str, ops: int, wait_s: float, copy_mb: int, copies: int) -> dict[str, float | None]:
    """One sync-round of a stage (``ops`` convolutions, each followed by ``wait_s``) with a copy beside it
    (``copy``: none, or the copying thread's priority). Seconds from the round's start."""
    import torch

    x, conv = torch.randn(4, 32, 28, 28), torch.nn.Conv2d(32, 32, 3, padding=1)
    source = torch.randn(copy_mb * 2**18)
    target = torch.empty_like(source)
    copied: list[float] = []
    start = time.monotonic()

    def copy_bytes() -> None:
        if copy == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        for _ in range(copies):
            target.copy_(source)
        copied.append(time.monotonic() - start)

    thread = threading.Thread(target=copy_bytes) if copy != "none" else None
    if thread is not None:
        thread.start()
    with torch.no_grad():
        for _ in range(ops):
            conv(x)
            time.sleep(wait_s)
    computed = time.monotonic() - start
    if thread is not None:
        thread.join()
    return {"round_s": time.monotonic() - start, "compute_s": computed, "copy_done_s": copied[0] if copied else None}


def inside(rounds: int, ops: int, copy_mb: int) -> None:
    """In the cgroup: every case's rounds, each setting on every core and pinned to one by turns; JSON on
    stdout."""
    import torch

    torch.set_num_threads(1)
    every_core = os.sched_getaffinity(0)
    results = []
    for wait_s, copies in CASES:
        play_round("none", 2, wait_s, copy_mb, 1)  # warm up
        for _ in range(rounds):
            for pinned in (False, True):
                os.sched_setaffinity(0, {min(every_core)} if pinned else every_core)  # the copy's thread inherits it
                for copy in SETTINGS:
                    results.append({"wait_s": wait_s, "copies": copies, "pinned": pinned, "copy": copy,
                                    **play_round(copy, ops, wait_s, copy_mb, copies)})
    print(json.dumps(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each setting in each case")
    parser.add_argument("--ops", type=int, default=20, help="convolutions a round")
    parser.add_argument("--copy-mb", type=int, default=16, help="MB of a replica's bytes, copied once per copy")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.rounds, args.ops, args.copy_mb)
        return 0
    found = find_hierarchy()
    if isinstance(found, str):
        print(f"cannot confine the stage: {found}", file=sys.stderr)
        return 1
    remove_stale(found)
    group = found.create("idle-priority", DeviceLimits(CORES, 2 << 30))
    load = os.getloadavg()[0]
    try:
        done = subprocess.run(group.entry_command() + [sys.executable, __file__, "--inside", "--rounds",
                              str(args.rounds), "--ops", str(args.ops), "--copy-mb", str(args.copy_mb)],
                              stdout=subprocess.PIPE, text=True, check=True,  # its errors on our stderr
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        group.remove()
    rows = json.loads(done.stdout)
    summary = []
    for (wait_s, copies), pinned, copy in itertools.product(CASES, (False, True), SETTINGS):
        mine = [r for r in rows if r["wait_s"] == wait_s and r["pinned"] == pinned and r["copy"] == copy]
        summary.append({"wait_s": wait_s, "copies": copies, "pinned": pinned, "copy": copy,
                        **{key: statistics.median(r[key] for r in mine) if mine[0][key] is not None else None
                           for key in ("round_s", "compute_s", "copy_done_s")}})
    result = {"command": f"python benchmarks/idle_priority.py --rounds {args.rounds} --ops {args.ops} "
                         f"--copy-mb {args.copy_mb}",
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "measured_at": time.strftime("%Y-%m-%d %H:%M"), "load_before": round(load, 2), "cores": CORES,
              "summary": summary, "rounds": rows}
    none = {(s["wait_s"], s["pinned"]): s for s in summary if s["copy"] == "none"}

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']} (load "
        f"{result['load_before']} before): one process in a cgroup of {CORES} core, {args.ops} convolutions a "
        f"round, each followed by a wait, beside a thread copying {args.copy_mb} MB {CASES[0][1]} times; the "
        f"settings take turns, {args.rounds} rounds each (medians).",
        "",
        "| wait after each op s | cores | copy | round s | against no copy | compute s | copy done s |",
        "|---:|---|---|---:|---:|---:|---:|",
        *(f"| {s['wait_s']} | {'one' if s['pinned'] else 'every'} | {s['copy']} | {s['round_s']:.2f} | "
          f"{s['round_s'] / none[(s['wait_s'], s['pinned'])]['round_s'] - 1:+.1%} | {s['compute_s']:.2f} | "
          f"{seconds(s['copy_done_s'])} |" for s in summary),
    ]
    publish(result, ROOT / "benchmarks" / "results" / "idle_priority.json", "\n".join(lines),
            ROOT / "docs" / "pipeline.md", "idle_priority")
    return 0


if __name__ == "__main__":
    sys.exit(main())
