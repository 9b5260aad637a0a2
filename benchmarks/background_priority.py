"""What fault tolerance costs with its copies at idle priority, against at the stage's own: side by side.

Issue 43 asks that replication and the global copy cost at most 3% of a
confined run's throughput. Their CPU comes out of the device's quota
(0.02-0.05 CPU-s a sync-round at each stage of the mobilenet_v2 /
ecofl-3stage run, docs/pipeline.md); :mod:`ecofl.thread_priority` runs it at
``SCHED_IDLE``, while the stage waits. Here the same command runs plain, with
``--fault-tolerance`` and the copies at idle priority (the default of a
confined device), and with ``--fault-tolerance`` and them at normal priority
(``ECOFL_BACKGROUND_PRIORITY=normal``), each fault-tolerant run between two
plain ones, all on one calibration (``--calibration FILE``: one plan, one
prediction). Reported: each run's mean sync-round, its cost against the
plain runs either side, its stages' CPU outside their own threads, the share
of its quota each stage's own thread had while it computed (what the copies
take from it then; less noisy than the round on a host whose speed moves by
a tenth between runs), and the host's speed before it
(:func:`benchmarks.steady_runs.host_reference_s`).

``python benchmarks/background_priority.py [--pairs 2] [--rounds 6]`` writes
``benchmarks/results/background_priority.json`` and a table in
``docs/pipeline.md``. Run it with the machine otherwise idle: the load is given.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.markdown_section import publish  # noqa: E402
from benchmarks.steady_runs import COMMAND, _not_the_stages_thread, _stages, train  # noqa: E402
from ecofl.thread_priority import BACKGROUND_ENV  # noqa: E402

PLAIN, IDLE, NORMAL = "off", "on, copies at idle priority", "on, copies at normal priority"


def compute_share(run: dict) -> list[float]:
    """Each stage's CPU in its own thread over its wall time computing (forward and backward of its
    micro-batches), as a fraction of its quota: below 1 where other threads of its cgroup (or CFS's periods)
    took quota while it computed. Its sync-round can only be as short as this lets it compute."""
    quotas = {d["stage"]: d["quota_cores"] for d in run["devices"]}
    return [jobs.get("MainThread", 0.0) / (run["micro_batches"] * op_s) / quotas[stage]
            for stage, (jobs, op_s) in enumerate(zip(run["cpu_s_per_round_by_job"], run["op_s"]))]


def order(pairs: int) -> list[str]:
    """Plain runs with one fault-tolerant run between each two, idle and normal priority by turns."""
    runs = [PLAIN]
    for i in range(pairs):
        for variant in ((IDLE, NORMAL) if i % 2 == 0 else (NORMAL, IDLE)):
            runs += [variant, PLAIN]
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="runs of each priority, each between plain runs")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    variants = order(args.pairs)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        calibration = Path(work) / "calibration.json"
        for i, variant in enumerate(variants):
            print(f"run {i + 1} of {len(variants)}: fault tolerance {variant}...", flush=True)
            priority = "normal" if variant == NORMAL else "idle"
            run = train(args.rounds, calibration, variant != PLAIN, env={BACKGROUND_ENV: priority})
            runs.append({"variant": variant, "compute_share": compute_share(run),
                         **{k: v for k, v in run.items() if k != "devices"}})
    costs: dict[str, list[float]] = {IDLE: [], NORMAL: []}
    for i in range(1, len(runs) - 1, 2):
        either_side = (runs[i - 1]["mean_round_s"] + runs[i + 1]["mean_round_s"]) / 2
        runs[i]["cost"] = runs[i]["mean_round_s"] / either_side - 1
        costs[runs[i]["variant"]].append(runs[i]["cost"])
    result = {
        "command": f"python benchmarks/background_priority.py --pairs {args.pairs} --rounds {args.rounds}",
        "runs_of": "ecofl " + " ".join(COMMAND) + f" --rounds {args.rounds} --calibration FILE",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "runs": runs,
        "costs": costs,
        "mean_cost": {variant: statistics.fmean(c) for variant, c in costs.items() if c},
        "mean_compute_share": {variant: [statistics.fmean(share) for share in zip(
            *(r["compute_share"] for r in runs if r["variant"] == variant))] for variant in (PLAIN, IDLE, NORMAL)},
    }
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}` (`--fault-tolerance` where on; `{BACKGROUND_ENV}=normal` where the copies are at "
        "normal priority), all on one calibration (the first run measures and writes it).",
        "",
        "| run | fault tolerance | mean sync-round s | predicted s | against the plain runs either side | CPU s a "
        "sync-round (stages) | of it not the stage's thread | stage's thread's share of its quota while it "
        "computes | host reference s | load before |",
        "|---:|---|---:|---:|---:|---|---|---|---:|---:|",
        *(f"| {i + 1} | {r['variant']} | {r['mean_round_s']:.2f} | {r['predicted_sync_round_s']:.2f} | "
          f"{'-' if 'cost' not in r else format(r['cost'], '+.1%')} | {_stages(r['cpu_s_per_round'])} | "
          f"{_stages(_not_the_stages_thread(r))} | {_stages(r['compute_share'])} | {r['host_reference_s']:.3f} | "
          f"{r['load_before']} |" for i, r in enumerate(runs)),
        "",
        "Mean cost of fault tolerance: " + "; ".join(
            f"{variant}: {', '.join(f'{c:+.1%}' for c in costs[variant])} (mean {result['mean_cost'][variant]:+.1%})"
            for variant in (IDLE, NORMAL) if costs[variant]) + ". The stages' threads' mean share of their "
        "quota while they compute: " + "; ".join(f"{variant} {_stages(share)}" for variant, share in
                                                  result["mean_compute_share"].items()) + ".",
    ]
    publish(result, ROOT / "benchmarks" / "results" / "background_priority.json", "\n".join(lines),
            ROOT / "docs" / "pipeline.md", "background_priority")
    return 0


if __name__ == "__main__":
    sys.exit(main())
