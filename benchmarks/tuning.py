"""Does re-tuning a confined home's plan on the speeds its pipeline shows pay? Side by side, on one calibration.

Issue 43: on confined devices, compute inside the pipeline differs from each
device's stage calibration by up to a third, so the plan made on the
calibration is unbalanced for the speeds the devices really run at
(docs/pipeline.md, "Confined devices"). ``--tune-after T``
(:mod:`ecofl.pipeline.runtime.pipeline_tuning`) re-estimates every device's
speed from sync-rounds 1..T-1 and moves to a re-plan when the cost model
predicts it faster. Here, per pool, plain runs alternate with tuned runs of
``ecofl home train --model mobilenet_v2 --emulate cgroup`` on one
``--calibration FILE`` (the first run measures it; all start from its
plan), so a pair differs only by the tuning and the machine's noise. Per
run: the median sync-round from round T on (the rounds the tuned plan runs;
the plain run's same rounds), the up-front prediction, and for a tuned run
what it found (each device's speed in the pipeline against its calibration,
the plan it chose, the prediction at those speeds, the seconds and bytes the
re-tune itself took between rounds T-1 and T).

``python benchmarks/tuning.py [--pairs 2] [--rounds 8] [--tune-after 2] [--pools ecofl-3stage mixed-rpi]``
writes ``benchmarks/results/tuning.json`` and a table in ``docs/pipeline.md``.
Run it with the machine otherwise idle: the load and the host's reference
speed before each run are given.
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

from benchmarks.markdown_section import replace_section  # noqa: E402
from benchmarks.steady_runs import host_reference_s  # noqa: E402

COMMAND = ["home", "train", "--model", "mobilenet_v2", "--dataset", "fashion_mnist", "--emulate", "cgroup", "--json"]


def train(pool: str, rounds: int, calibration: Path, tune_after: int | None) -> dict:
    """One run: every sync-round, the median of those from ``tune_after`` on, the predictions, the re-tune."""
    load, reference = os.getloadavg()[0], host_reference_s()
    command = [sys.executable, "-m", "ecofl", *COMMAND, "--pool", pool, "--rounds", str(rounds),
               "--calibration", str(calibration)]
    command += ["--tune-after", str(tune_after)] if tune_after else []
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return {"pool": pool, "tuned": bool(tune_after), "sync_rounds_s": report["sync_rounds_s"],
            "predicted_sync_round_s": report["predicted_sync_round_s"], "tuning": (report.get("tunings") or [None])[0],
            "plan": f"{report['num_micro_batches']}x{report['micro_batch']} "
                    + " | ".join(f"{s['layers'][0]}-{s['layers'][1]}: {','.join(s['device_names'])}"
                                 for s in report["stages"]),
            "host_reference_s": round(reference, 4), "load_before": round(load, 2)}


def after(run: dict, first: int) -> float:
    """The median sync-round from round ``first`` on."""
    return statistics.median(run["sync_rounds_s"][first:])


def tuned_prediction(run: dict) -> float | None:
    """A tuned run's prediction for its rounds after the re-tune, at the speeds the pipeline showed."""
    tuning = run["tuning"]
    if tuning is None:
        return None
    return tuning["best_sync_round_s"] if tuning["switched"] else tuning["current_sync_round_s"]


def speeds_line(tuning: dict) -> str:
    return ", ".join(f"{d}: {v / tuning['planned_speeds'][d]:.2f}" for d, v in tuning["speeds"].items())


def gains_of(runs: list[dict], pools: list[str], t: int) -> dict[str, list[float]]:
    """Per pool, each tuned run's rounds from ``t`` on against the mean of the plain runs either side."""
    gains = {}
    for pool in pools:
        mine = [r for r in runs if r["pool"] == pool]
        gains[pool] = [after(mine[i], t) / ((after(mine[i - 1], t) + after(mine[i + 1], t)) / 2) - 1
                       for i in range(1, len(mine) - 1, 2)]
    return gains


def markdown(result: dict) -> str:
    t, runs = result["tune_after"], result["runs"]
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}`, every run of a pool on one calibration (its first run measures it). `rounds "
        f"{t}+`: the median sync-round from round {t} on (the tuned plan's rounds). `speeds in the pipeline`: each "
        "device's speed re-estimated from its operations in rounds 1..T-1, over its calibrated speed. `re-tune "
        "s`: deciding and migrating, between rounds (not in any round's time).",
        "",
        "| pool | run | tuned | rounds T+ s | predicted s (up front) | error | at the pipeline's speeds | error | "
        "speeds in the pipeline | plan run from round T | re-tune s (MiB moved) | host reference s | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for pool in result["pools"]:
        for i, r in enumerate(x for x in runs if x["pool"] == pool):
            measured, tuned = after(r, t), r["tuning"]
            at_speeds = tuned_prediction(r)
            lines.append(
                f"| {pool} | {i + 1} | {'yes' if r['tuned'] else 'no'} | {measured:.2f} | "
                f"{r['predicted_sync_round_s']:.2f} | {measured / r['predicted_sync_round_s'] - 1:+.1%} | "
                + (f"{at_speeds:.2f} | {measured / at_speeds - 1:+.1%} | {speeds_line(tuned)} | "
                   if tuned else "- | - | - | ")
                + f"{r['plan'].replace('|', '/')} | "
                + (f"{tuned['seconds']:.2f} ({tuned['bytes_moved'] / 2**20:.1f})" if tuned else "-")
                + f" | {r['host_reference_s']:.3f} | {r['load_before']} |")
    gains = result["tuned_against_plain"]
    lines += ["", "Tuned against the plain runs either side (rounds T+): "
              + "; ".join(f"{pool} {', '.join(f'{g:+.1%}' for g in g_list)}" for pool, g_list in gains.items()) + "."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="tuned runs per pool, each after a plain one")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tune-after", type=int, default=2)
    parser.add_argument("--pools", nargs="+", default=["ecofl-3stage", "mixed-rpi"])
    parser.add_argument("--table-only", action="store_true",
                        help="rewrite the docs table from benchmarks/results/tuning.json, measuring nothing")
    args = parser.parse_args()
    path = ROOT / "benchmarks" / "results" / "tuning.json"
    if args.table_only:
        result = json.loads(path.read_text())
    else:
        result = measure(args)
        path.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    if not replace_section(ROOT / "docs" / "pipeline.md", table, "tuning"):
        print("docs/pipeline.md has no tuning section: the table is not written there", file=sys.stderr)
    print(table)
    return 0


def measure(args: argparse.Namespace) -> dict:
    """Per pool, plain and tuned runs alternating on one calibration (see the module docstring)."""
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for pool in args.pools:
            calibration = Path(work) / f"{pool}.json"
            order = [None, args.tune_after] * args.pairs + [None]
            for i, tune in enumerate(order):
                print(f"{pool}: run {i + 1} of {len(order)}{' (tuned)' if tune else ''} ...", flush=True)
                runs.append(train(pool, args.rounds, calibration, tune))
                print(json.dumps(runs[-1]), flush=True)
    t = args.tune_after
    return {
        "command": f"python benchmarks/tuning.py --pairs {args.pairs} --rounds {args.rounds} --tune-after {t} "
                   f"--pools {' '.join(args.pools)}",
        "runs_of": "ecofl " + " ".join(COMMAND) + f" --pool POOL --rounds {args.rounds} --calibration FILE "
                   f"[--tune-after {t}]",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "tune_after": t,
        "pools": args.pools,
        "runs": runs,
        "tuned_against_plain": gains_of(runs, args.pools, t),
    }


if __name__ == "__main__":
    sys.exit(main())
