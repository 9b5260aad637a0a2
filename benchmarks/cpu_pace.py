"""A confined device's pace, measured: short steps in a cgroup with and without :mod:`ecofl.pipeline.runtime.cpu_pace`.

In a cgroup of ``--cores`` (``python -m ecofl.cgroups run``), a step burns
``--step-ms`` of CPU, back to back or after ``--idle-ms`` of idling, either
left to the kernel's quota alone or kept at the pace (the step lasts at least
its CPU time over the cores). Reported: each step's wall time over its CPU
time / cores (1.0: the device's own speed; below 1: a burst the device does
not have). Needs root and writable cgroups.

    .venv/bin/python benchmarks/cpu_pace.py [--cores 0.1,0.25] [--step-ms 3] [--idle-ms 50] [--steps 20]

writes benchmarks/results/cpu_pace.json and the "cpu-pace" section of docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402

CHILD = """
import json, sys, time
from ecofl.pipeline.runtime.cpu_pace import CpuPace
step_s, idle_s, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
pace = CpuPace.of_this_process()
cores = pace.cores
def spin():
    end = time.thread_time() + step_s
    while time.thread_time() < end:
        pass
out = {}
for paced in (False, True):
    for idle in (0.0, idle_s):
        wall = cpu = 0.0
        for _ in range(steps):
            time.sleep(idle)
            started = pace.begin()
            spin()
            cpu += time.thread_time() - started[1]
            end = pace.end(started) if paced else time.time()
            wall += end - started[0]
        out[f"{'paced' if paced else 'kernel'}, {'after idle' if idle else 'back to back'}"] = wall / (cpu / cores)
print(json.dumps(out))
"""


def measure(cores: float, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-m", "ecofl.cgroups", "run", "--cores", str(cores), "--memory-bytes",
                           str(1 << 30), "--label", "pace", "--", sys.executable, "-c", CHILD,
                           str(args.step_ms / 1e3), str(args.idle_ms / 1e3), str(args.steps)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"cpu_pace: the confined step failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", default="0.1,0.25")
    parser.add_argument("--step-ms", type=float, default=3.0)
    parser.add_argument("--idle-ms", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    rows = {}
    for cores in map(float, args.cores.split(",")):
        print(f"{cores:g} cores ...", file=sys.stderr, flush=True)
        rows[f"{cores:g}"] = measure(cores, args)
    command = "python benchmarks/cpu_pace.py" + (f" {' '.join(argv)}" if argv else "")
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "step_ms": args.step_ms, "idle_ms": args.idle_ms,
               "steps": args.steps, "wall_over_cpu_per_cores": rows, "command": command}
    (ROOT / "benchmarks" / "results" / "cpu_pace.json").write_text(json.dumps(results, indent=2) + "\n")
    kinds = list(next(iter(rows.values())))
    lines = [f"Measured with `{command}` ({results['date']}): a {args.step_ms:g} ms (CPU) step, back to back or "
             f"after {args.idle_ms:g} ms idle, {args.steps} steps each; wall time / (CPU time / cores), 1.00 the "
             "device's own speed.", "", "| cores | " + " | ".join(kinds) + " |",
             "|---:|" + "---:|" * len(kinds)]
    lines += [f"| {c} | " + " | ".join(f"{row[k]:.2f}" for k in kinds) + " |" for c, row in rows.items()]
    table = "\n".join(lines)
    print(table)
    replace_section(ROOT / "docs" / "pipeline.md", table, "cpu-pace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
