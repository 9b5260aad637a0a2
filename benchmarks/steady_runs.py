"""Do confined runs repeat? The same home train command several times on one calibration, and once with
fault tolerance on the same plan.

Issue 43: two runs of ``ecofl home train --emulate cgroup`` each calibrated
afresh and planned on what they measured, so the same command predicted 4.93
and then 4.34 s per sync-round and measured 5.5 and then 4.0 s, and a
comparison of two runs moved with the calibration. Here every run shares one
``--calibration FILE`` (the first run measures and writes it, the others
reuse its speeds and plan): the runs differ only by the machine's noise and
by the factor compared. Reported: each run's measured and predicted
sync-round (median of its rounds), their spread, and what fault tolerance
(heartbeats, replication every sync-round, a global copy every 5) costs on the
same plan, beside the plain runs measured in the same sitting.

``python benchmarks/steady_runs.py [--runs 3] [--rounds 6]`` writes
``benchmarks/results/steady_runs.json`` and a table in ``docs/pipeline.md``.
Run it with the machine otherwise idle: the load is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.markdown_section import replace_section  # noqa: E402

COMMAND = ["home", "train", "--model", "mobilenet_v2", "--pool", "ecofl-3stage", "--dataset", "fashion_mnist",
           "--emulate", "cgroup", "--json"]


def train(rounds: int, calibration: Path, fault_tolerance: bool) -> dict:
    """One run: its sync-round measured and predicted, the load before it and its wall time."""
    load = os.getloadavg()[0]
    start = time.monotonic()
    command = [sys.executable, "-m", "ecofl", *COMMAND, "--rounds", str(rounds), "--calibration", str(calibration)]
    done = subprocess.run(command + (["--fault-tolerance"] if fault_tolerance else []), cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return {"fault_tolerance": fault_tolerance, "sync_round_s": report["sync_round_s"],
            "predicted_sync_round_s": report["predicted_sync_round_s"],
            "error": report["sync_round_s"] / report["predicted_sync_round_s"] - 1,
            "stages": [s["layers"] for s in report["stages"]], "rounds_completed": report["rounds_completed"],
            "load_before": round(load, 2), "wall_s": round(time.monotonic() - start, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="plain runs (then one with fault tolerance, then one "
                                                            "more plain)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        calibration = Path(work) / "calibration.json"
        order = [False] * args.runs + [True, False]
        runs = []
        for i, tolerant in enumerate(order):
            print(f"run {i + 1} of {len(order)}{' (fault tolerance)' if tolerant else ''} ...", flush=True)
            runs.append(train(args.rounds, calibration, tolerant))
            print(json.dumps(runs[-1]), flush=True)
    plain = [r["sync_round_s"] for r in runs if not r["fault_tolerance"]]
    tolerant = [r["sync_round_s"] for r in runs if r["fault_tolerance"]][0]
    result = {
        "command": f"python benchmarks/steady_runs.py --runs {args.runs} --rounds {args.rounds}",
        "runs_of": "ecofl " + " ".join(COMMAND) + f" --rounds {args.rounds} --calibration FILE",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "runs": runs,
        "plain_spread": max(plain) / min(plain) - 1,
        "fault_tolerance_cost": tolerant / (sum(plain) / len(plain)) - 1,
    }
    (ROOT / "benchmarks" / "results" / "steady_runs.json").write_text(json.dumps(result, indent=2) + "\n")
    table = "\n".join([
        f"Measured with `{result['command']}` on {result['machine']}: each run is `{result['runs_of']}`, all on "
        "one calibration (the first run measures and writes it).",
        "",
        "| run | fault tolerance | sync-round s | predicted s | error | load before |",
        "|---:|---|---:|---:|---:|---:|",
        *(f"| {i + 1} | {'on' if r['fault_tolerance'] else 'off'} | {r['sync_round_s']:.2f} | "
          f"{r['predicted_sync_round_s']:.2f} | {r['error']:+.1%} | {r['load_before']} |" for i, r in enumerate(runs)),
        "",
        f"Plain runs within {result['plain_spread']:.1%} of each other; fault tolerance "
        f"{result['fault_tolerance_cost']:+.1%} against their mean, on the same plan.",
    ])
    if not replace_section(ROOT / "docs" / "pipeline.md", table, "steady_runs"):
        print("docs/pipeline.md has no steady_runs section: the table is not written there", file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
