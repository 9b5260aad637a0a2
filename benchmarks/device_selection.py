"""Does leaving a device out pay, as measured? Device selection side by side on one calibration.

Issue 43: the planner should maximise measured throughput. Where devices are confined, ``plan_as_run``
leaves out a device whose absence the cost model predicts to shorten the sync-round by more than 5%
(:func:`ecofl.pipeline.runtime.prediction.selected_devices`; PipeEdge §III-B selects devices). This runs
``ecofl home train --emulate cgroup --calibration FILE`` on the mixed home: the first run calibrates and
writes FILE with the plan on the devices selection keeps, and is not compared (its workers start warm from
calibrating). A copy of FILE carries the fastest plan on every device, at the same measured speeds (the
left-out device's from its whole-model calibration). Then the two plans run alternately, ``--pairs`` times
each, so that both see the same host.

Needs root (cgroups). Writes benchmarks/results/device_selection.json and the "device-selection" section of
docs/pipeline.md.
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

from benchmarks.home_runs import describe_plan  # noqa: E402
from benchmarks.markdown_section import cell, publish  # noqa: E402
from benchmarks.steady_runs import host_reference_s  # noqa: E402
from ecofl.cli.calibration_file import load_calibration  # noqa: E402
from ecofl.pipeline.profile import profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime.prediction import selected_devices  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

CLASSES = 10  # Fashion-MNIST


def command(model: str, pool: str, rounds: int, calibration: Path) -> list[str]:
    return [sys.executable, "-m", "ecofl", "home", "train", "--model", model, "--pool", pool, "--dataset",
            "fashion_mnist", "--emulate", "cgroup", "--json", "--rounds", str(rounds), "--calibration",
            str(calibration)]


def train(model: str, pool: str, rounds: int, calibration: Path, label: str) -> dict:
    """One run: its plan, sync-round measured and predicted, the load and the host's reference before it."""
    load, reference = os.getloadavg()[0], host_reference_s()
    done = subprocess.run(command(model, pool, rounds, calibration), cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {label} run failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return {"plan": label, "devices": sorted({d for s in report["stages"] for d in s["devices"]}),
            "stages": [s["layers"] for s in report["stages"]], "num_micro_batches": report["num_micro_batches"],
            "sync_round_s": report["sync_round_s"], "sync_rounds_s": report["sync_rounds_s"],
            "predicted_sync_round_s": report["predicted_sync_round_s"],
            "error": report["sync_round_s"] / report["predicted_sync_round_s"] - 1,
            "host_reference_s": round(reference, 4), "load_before": round(load, 2)}


def every_device_copy(selected: Path, every: Path) -> dict:
    """Write ``every``: ``selected``'s calibration with the fastest plan on every device; both plans described."""
    calibration = json.loads(selected.read_text())
    settings = calibration["settings"]
    confined, kept, _ = load_calibration(selected, settings, load_pool(settings["pool"]))
    pool = confined.pool
    profile = profile_zoo_model(settings["model"], tuple(settings["input_shape"]), CLASSES, settings["granularity"])
    plan, seconds = selected_devices(settings["planner"], profile, pool, settings["batch"], "cgroup", margin=1.0)
    calibration["plan"] = plan.to_dict()
    every.write_text(json.dumps(calibration, indent=2) + "\n")
    return {"selected": describe_plan(kept, pool), "every_device": describe_plan(plan, pool),
            "every_device_predicted_s": seconds, "speeds": calibration["speeds"],
            "left_out": sorted(set(range(len(pool.devices))) - {d for s in kept.stages for d in s.devices})}


def measure(model: str, pool: str, pairs: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        selected, every = Path(work) / "selected.json", Path(work) / "every.json"
        print("run 1: calibrating ...", flush=True)
        runs = [train(model, pool, rounds, selected, "selected")]
        plans = every_device_copy(selected, every)
        print(json.dumps(plans), flush=True)
        if not plans["left_out"]:
            raise SystemExit("selection kept every device on this calibration: nothing to compare; run again")
        for i in range(pairs):
            for label, file in (("every device", every), ("selected", selected)):
                print(f"pair {i + 1} of {pairs}: {label} ...", flush=True)
                runs.append(train(model, pool, rounds, file, label))
                print(json.dumps(runs[-1]), flush=True)
    return {"command": f"python benchmarks/device_selection.py --model {model} --pool {pool} --pairs {pairs} "
                       f"--rounds {rounds}",
            "runs_of": " ".join(["ecofl", *command(model, pool, rounds, Path("FILE"))[3:]]),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "measured_at": time.strftime("%Y-%m-%d %H:%M"), **plans, "runs": runs, **summary(runs)}


def summary(runs: list[dict]) -> dict:
    """Each plan's median over its compared runs, and every pair's sync-round ratio (every device / selected)."""
    compared = runs[1:]
    every = [r["sync_round_s"] for r in compared if r["plan"] == "every device"]
    kept = [r["sync_round_s"] for r in compared if r["plan"] == "selected"]
    return {"every_device_median_s": statistics.median(every), "selected_median_s": statistics.median(kept),
            "pair_ratios": [e / k for e, k in zip(every, kept)]}


def render(result: dict) -> str:
    ratios = result["pair_ratios"]
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}`; run 1 calibrates and writes FILE with the plan on the devices selection keeps "
        "and is not compared; a copy of FILE carries the fastest plan on every device at the same speeds. The "
        "two plans then run alternately.",
        "",
        f"- selected: {cell(result['selected'])}",
        f"- every device: {cell(result['every_device'])} (predicted {result['every_device_predicted_s']:.2f} s)",
        "",
        "| run | plan | devices | sync-round s (median) | predicted s | error | host reference s | load before |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
        *(f"| {i + 1} | {r['plan']} | {', '.join(map(str, r['devices']))} | {r['sync_round_s']:.2f} | "
          f"{r['predicted_sync_round_s']:.2f} | {r['error']:+.1%} | {r['host_reference_s']:.3f} | "
          f"{r['load_before']} |" for i, r in enumerate(result["runs"])),
        "",
        f"Medians of the compared runs: every device {result['every_device_median_s']:.2f} s, selected "
        f"{result['selected_median_s']:.2f} s. Each pair's every-device sync-round over the selected one's: "
        f"{', '.join(f'{r:.3f}' for r in ratios)} (mean {statistics.fmean(ratios):.3f}).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--pool", default="mixed-rpi")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each plan, alternating")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    result = measure(args.model, args.pool, args.pairs, args.rounds)
    publish(result, ROOT / "benchmarks" / "results" / "device_selection.json", render(result),
            ROOT / "docs" / "pipeline.md", "device-selection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
