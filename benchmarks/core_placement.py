"""Confined devices held on host cores of their own against free to move: one plan, runs alternated.

A confined device runs a slice of its CPU quota, is throttled and runs again;
free to move, its next slice may start on another host core, whose caches
hold another device's work (:mod:`ecofl.core_placement`). Each pool here is
calibrated once (a first run, devices held, not compared), then runs on that
one plan alternate between ``ECOFL_PIN_DEVICES=0`` (free) and the default
(held). Each run's figure is the median of its sync-rounds after the first
(the first maps the run's memory), beside the plan's prediction; the host's
speed (:func:`benchmarks.steady_runs.host_reference_s`) and the load before
each run are given.

``python benchmarks/core_placement.py [--pairs 3] [--rounds 7] [--pools mixed-rpi ecofl-3stage]`` writes
``benchmarks/results/core_placement.json`` and a table in ``docs/pipeline.md``. Run it with the machine
otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.markdown_section import publish  # noqa: E402
from benchmarks.steady_runs import host_reference_s  # noqa: E402
from ecofl.core_placement import PIN_ENV  # noqa: E402

COMMAND = ["home", "train", "--model", "mobilenet_v2", "--dataset", "fashion_mnist", "--emulate", "cgroup", "--json"]


def train(pool: str, rounds: int, calibration: Path, held: bool) -> dict:
    """One run on ``pool``'s kept plan: its rounds, their median after the first, the prediction, the host."""
    load, reference = os.getloadavg()[0], host_reference_s()
    command = [sys.executable, "-m", "ecofl", *COMMAND, "--pool", pool, "--rounds", str(rounds),
               "--calibration", str(calibration)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, PIN_ENV: "1" if held else "0"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    steady = statistics.median(report["sync_rounds_s"][1:])
    return {"pool": pool, "held": held, "sync_rounds_s": report["sync_rounds_s"], "steady_median_s": steady,
            "predicted_sync_round_s": report["predicted_sync_round_s"],
            "error": steady / report["predicted_sync_round_s"] - 1,
            "host_cores": {d["name"]: d.get("host_cores") for d in report["devices"]},
            "host_reference_s": round(reference, 4), "load_before": round(load, 2)}


def measure(pools: list[str], pairs: int, rounds: int) -> dict:
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for pool in pools:
            calibration = Path(work) / f"{pool}.json"
            order = [True] + [False, True] * pairs  # the first calibrates and is not compared
            for i, held in enumerate(order):
                print(f"{pool}: run {i + 1} of {len(order)} ({'held' if held else 'free'}) ...", flush=True)
                run = train(pool, rounds, calibration, held)
                run["compared"] = i > 0
                runs.append(run)
                print(json.dumps(run), flush=True)
    return {"command": f"python benchmarks/core_placement.py --pairs {pairs} --rounds {rounds} --pools "
                       + " ".join(pools),
            "runs_of": "ecofl " + " ".join(COMMAND) + f" --pool POOL --rounds {rounds} --calibration FILE",
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "measured_at": time.strftime("%Y-%m-%d %H:%M"), "runs": runs, "by_pool": summary(runs)}


def summary(runs: list[dict]) -> dict:
    """Per pool: the median of the held and of the free runs' figures, and held over free."""
    result = {}
    for pool in dict.fromkeys(r["pool"] for r in runs):
        ours = [r for r in runs if r["pool"] == pool and r["compared"]]
        held = statistics.median(r["steady_median_s"] for r in ours if r["held"])
        free = statistics.median(r["steady_median_s"] for r in ours if not r["held"])
        predicted = next(r["predicted_sync_round_s"] for r in runs if r["pool"] == pool)
        result[pool] = {"held_s": held, "free_s": free, "held_over_free": held / free, "predicted_s": predicted}
    return result


def render(result: dict) -> str:
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}`, with `{PIN_ENV}=0` where free; the first run of each pool calibrates and is not "
        "compared.",
        "",
        "| pool | run | devices | sync-rounds s | median after the first s | predicted s | error | host reference s "
        "| load before |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
        *(f"| {r['pool']} | {i + 1}{'' if r['compared'] else ' (calibrates)'} | {'held' if r['held'] else 'free'} | "
          f"{', '.join(f'{s:.2f}' for s in r['sync_rounds_s'])} | {r['steady_median_s']:.2f} | "
          f"{r['predicted_sync_round_s']:.2f} | {r['error']:+.1%} | {r['host_reference_s']:.3f} | "
          f"{r['load_before']} |" for i, r in enumerate(result["runs"])),
        "",
        *(f"- {pool}: held {s['held_s']:.2f} s, free {s['free_s']:.2f} s (medians of the runs): held/free "
          f"{s['held_over_free']:.2f}; predicted {s['predicted_s']:.2f} s." for pool, s in result["by_pool"].items()),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pools", nargs="+", default=["mixed-rpi", "ecofl-3stage"])
    parser.add_argument("--table-from", default=None, help="only write the table from this results file")
    args = parser.parse_args()
    path = ROOT / "benchmarks" / "results" / "core_placement.json"
    if args.table_from:
        result = json.loads(Path(args.table_from).read_text())
    else:
        result = measure(args.pools, args.pairs, args.rounds)
    publish(result, path, render(result), ROOT / "docs" / "pipeline.md", "core_placement")
    return 0


if __name__ == "__main__":
    sys.exit(main())
