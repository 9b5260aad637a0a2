"""How long a confined device takes to wake for a hand-off: the emulation's own wait, measured.

A pipeline stage idles until its input arrives, then computes one operation.
On a real board the input wakes it at once. A confined device is a cgroup
whose CFS quota is the kernel's minimum (1 ms) every ``1 ms / cores``
(:func:`ecofl.cgroups.cpu_bandwidth`): an input that arrives while the
device is throttled waits for the next period, up to 9 ms on a Nano (0.1
cores) and 66 ms on the phone (0.015). Here a process in a cgroup of
``--cores`` waits on a pipe, wakes, runs one operation of ``--op-ms`` CPU at
the device's pace (:class:`~ecofl.pipeline.runtime.cpu_pace.CpuPace`, as a
stage does) and answers; the portal side (outside the cgroup) sends the next
input after a random idle gap of up to ``--gap-ms``. Reported: the wake
latency (input sent to the device running) and the operation's wall time
over its CPU time / cores, for each cores value and the host (no cgroup).

    .venv/bin/python benchmarks/handoff_wait.py [--cores 0.1,0.25,0.5] [--op-ms 10] [--gap-ms 20] [--steps 200]

Needs root and writable cgroups; writes benchmarks/results/handoff_wait.json and the "handoff-wait" section of
docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402

CHILD = """
import sys, time
from ecofl.pipeline.runtime.cpu_pace import CpuPace
op_s = float(sys.argv[1])
pace = CpuPace.of_this_process()
cores = pace.cores or 1.0
print(cores, flush=True)
for line in sys.stdin:
    woke = time.monotonic()
    started = pace.begin()
    end = time.thread_time() + op_s
    while time.thread_time() < end:
        pass
    cpu = time.thread_time() - started[1]
    ended = pace.end(started)
    print(woke, (ended - started[0]) / (cpu / cores), flush=True)
"""


def measure(cores: float | None, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Wake latencies and paces of ``args.steps`` hand-offs to a process in a cgroup of ``cores`` (None: none)."""
    child = [sys.executable, "-c", CHILD, str(args.op_ms / 1e3)]
    command = child if cores is None else [
        sys.executable, "-m", "ecofl.cgroups", "run", "--cores", str(cores), "--memory-bytes", str(1 << 30),
        "--label", "handoff", "--", *child]
    rng = random.Random(seed)
    latencies, paces = [], []
    with subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as process:
        try:
            granted = float(process.stdout.readline())
            for _ in range(args.steps):
                time.sleep(rng.uniform(0, args.gap_ms / 1e3))
                sent = time.monotonic()
                process.stdin.write("go\n")
                process.stdin.flush()
                woke, pace = map(float, process.stdout.readline().split())
                latencies.append(woke - sent)
                paces.append(pace)
        finally:
            process.stdin.close()
            process.wait(timeout=60)
    latencies.sort()
    return {"cores": granted if cores is not None else None, "period_ms": None if cores is None else 1 / granted,
            "wake_mean_ms": 1e3 * statistics.mean(latencies), "wake_median_ms": 1e3 * statistics.median(latencies),
            "wake_p90_ms": 1e3 * latencies[int(0.9 * len(latencies))], "wake_max_ms": 1e3 * latencies[-1],
            "op_pace": statistics.mean(paces)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="0.1,0.25,0.5")
    parser.add_argument("--op-ms", type=float, default=10.0, help="an operation's CPU time")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="the longest idle gap before an input")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--table-only", action="store_true",
                        help="rewrite the docs table from benchmarks/results/handoff_wait.json, measuring nothing")
    args = parser.parse_args(argv)
    if args.table_only:
        write_table(json.loads((ROOT / "benchmarks" / "results" / "handoff_wait.json").read_text()))
        return 0
    load = os.getloadavg()[0]
    rows = {"host": measure(None, args, 0)}
    for cores in map(float, args.cores.split(",")):
        print(f"{cores:g} cores ...", file=sys.stderr, flush=True)
        rows[f"{cores:g}"] = measure(cores, args, 0)
    command = " ".join(["python benchmarks/handoff_wait.py", *(sys.argv[1:] if argv is None else argv)])
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_before": round(load, 2), "op_ms": args.op_ms,
               "gap_ms": args.gap_ms, "steps": args.steps, "rows": rows, "command": command}
    (ROOT / "benchmarks" / "results" / "handoff_wait.json").write_text(json.dumps(results, indent=2) + "\n")
    write_table(results)
    return 0


def write_table(results: dict) -> None:
    """The results as the "handoff-wait" section of docs/pipeline.md (and printed)."""
    lines = [f"Measured with `{results['command']}` ({results['date']}, load {results['load_before']} before): "
             f"an operation of {results['op_ms']:g} ms CPU at the device's pace after a random idle gap of up to "
             f"{results['gap_ms']:g} ms, {results['steps']} hand-offs each; the wake is from the input sent to the "
             "device running.", "",
             "| device | CFS period ms | wake mean ms | median | p90 | max | operation wall / (CPU / cores) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in results["rows"].items():
        period = "-" if row["period_ms"] is None else f"{row['period_ms']:.1f}"
        device = name if row["cores"] is None else f"{name} cores"
        lines.append(f"| {device} | {period} | {row['wake_mean_ms']:.2f} | {row['wake_median_ms']:.2f} | "
                     f"{row['wake_p90_ms']:.2f} | {row['wake_max_ms']:.2f} | {row['op_pace']:.2f} |")
    table = "\n".join(lines)
    print(table)
    replace_section(ROOT / "docs" / "pipeline.md", table, "handoff-wait")


if __name__ == "__main__":
    sys.exit(main())
