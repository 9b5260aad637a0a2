"""Does the plan the cost model chooses pay, as measured? Two plans side by side on one calibration.

Issue 43: the planner should maximise measured throughput. Where devices are confined, ``plan_as_run``
(:func:`ecofl.pipeline.runtime.prediction.selected_devices`) leaves out a device whose absence the cost model
predicts to shorten the sync-round by more than 5% (PipeEdge §III-B selects devices), and weighs Asteroid's
hybrid stages (a data-parallel group of devices on one stage, §3.3) beside Eco-FL's one device a stage. This
runs ``ecofl home train --emulate cgroup --calibration FILE`` on a home: the first run calibrates and writes
FILE with the plan chosen, and is not compared (its workers start warm from calibrating). A copy of FILE
carries the plan the choice is compared with, at the same measured speeds (a left-out device's from its
whole-model calibration):

- ``--compare selection``: the fastest plan on every device (no device left out);
- ``--compare hybrid``: the fastest plan with one device a stage (no hybrid stage; devices still selected);
- ``--compare micro-batch``: the fastest plan at the next larger micro-batch the planners may take (fewer
  operations a round, a larger fill and drain), or where the chosen one is the largest, the next smaller, on
  the same devices. The cost model chooses the micro-batch; this measures whether its choice pays where the
  two are predicted close.

Then the two plans run alternately, ``--pairs`` times each, so that both see the same host.

Needs root (cgroups). Writes benchmarks/results/device_selection.json and the "device-selection" section of
docs/pipeline.md (``--compare hybrid``: hybrid_stages.json, "hybrid-stages"; ``--compare micro-batch``:
micro_batch_choice.json, "micro-batch-choice"); on another ``--pool``, the pool's name appended
(``micro_batch_choice_ecofl_3stage.json``, "micro-batch-choice-ecofl-3stage").
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
from ecofl.pipeline.replan import full_replans  # noqa: E402
from ecofl.pipeline.runtime.prediction import preferred_plan, selected_devices  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

CLASSES = 10  # Fashion-MNIST
DEFAULT_POOL = "mixed-rpi"  # another pool's results and section have its name appended


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


def at_the_next_micro_batch(planner: str, profile, pool, batch: int, chosen) -> tuple:
    """The plan predicted fastest (the planner's own and Asteroid's, as chosen) on the chosen plan's devices at
    the next larger micro-batch the planners may take, or where there is none the next smaller one; with its
    sync-round."""
    devices = tuple(sorted({d for s in chosen.stages for d in s.devices}))
    plans = full_replans(planner, profile, pool, devices, batch, hybrid=True)
    sizes = sorted({plan.micro_batch for plan in plans})
    larger = [size for size in sizes if size > chosen.micro_batch]
    smaller = [size for size in sizes if size < chosen.micro_batch]
    if not larger and not smaller:
        raise SystemExit(f"the planners take no micro-batch but {chosen.micro_batch}: nothing to compare")
    size = larger[0] if larger else smaller[-1]
    return preferred_plan([plan for plan in plans if plan.micro_batch == size], planner, profile, pool, "cgroup")


#: Per comparison: the alternative plan's label, how it is made (planner, profile, pool, batch, chosen plan),
#: the results' name.
COMPARISONS = {
    "selection": ("every device", lambda *home: selected_devices(*home[:4], "cgroup", margin=1.0),
                  "device_selection"),
    "hybrid": ("one device a stage", lambda *home: selected_devices(*home[:4], "cgroup", hybrid=False),
               "hybrid_stages"),
    "micro-batch": ("the next micro-batch", at_the_next_micro_batch, "micro_batch_choice"),
}


def alternative_copy(chosen: Path, alternative: Path, compare: str) -> dict:
    """Write ``alternative``: ``chosen``'s calibration with the plan ``compare`` names; both plans described."""
    calibration = json.loads(chosen.read_text())
    settings = calibration["settings"]
    confined, kept, _ = load_calibration(chosen, settings, load_pool(settings["pool"]))
    pool = confined.pool
    profile = profile_zoo_model(settings["model"], tuple(settings["input_shape"]), CLASSES, settings["granularity"])
    label, alternative_of, _ = COMPARISONS[compare]
    plan, seconds = alternative_of(settings["planner"], profile, pool, settings["batch"], kept)
    calibration["plan"] = plan.to_dict()
    alternative.write_text(json.dumps(calibration, indent=2) + "\n")
    used = {d for s in kept.stages for d in s.devices}
    return {"compare": compare, "alternative_label": label, "chosen": describe_plan(kept, pool),
            "alternative": describe_plan(plan, pool), "alternative_predicted_s": seconds,
            "chosen_planner": kept.planner, "planner": settings["planner"], "speeds": calibration["speeds"],
            "left_out": sorted(set(range(len(pool.devices))) - used)}


def nothing_to_compare(plans: dict) -> str | None:
    """Why the chosen plan is no instance of what ``plans["compare"]`` measures (None where it is): selection
    left no device out, or the planner's own plan was chosen over the hybrid ones."""
    if plans["chosen"] == plans["alternative"]:
        return f"the plan chosen is the one with {plans['alternative_label']}"
    if plans["compare"] == "selection" and not plans["left_out"]:
        return "selection kept every device"
    if plans["compare"] == "hybrid" and plans["chosen_planner"] == plans["planner"]:
        return f"the {plans['planner']} planner's own plan was chosen"
    return None


def measure(model: str, pool: str, pairs: int, rounds: int, compare: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        chosen, alternative = Path(work) / "chosen.json", Path(work) / "alternative.json"
        print("run 1: calibrating ...", flush=True)
        runs = [train(model, pool, rounds, chosen, "chosen")]
        plans = alternative_copy(chosen, alternative, compare)
        print(json.dumps(plans), flush=True)
        if (reason := nothing_to_compare(plans)) is not None:
            raise SystemExit(f"on this calibration {reason}: nothing to compare; run again")
        for i in range(pairs):
            for label, file in ((plans["alternative_label"], alternative), ("chosen", chosen)):
                print(f"pair {i + 1} of {pairs}: {label} ...", flush=True)
                runs.append(train(model, pool, rounds, file, label))
                print(json.dumps(runs[-1]), flush=True)
    return {"command": f"python benchmarks/device_selection.py --model {model} --pool {pool} --pairs {pairs} "
                       f"--rounds {rounds} --compare {compare}",
            "runs_of": " ".join(["ecofl", *command(model, pool, rounds, Path("FILE"))[3:]]),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "measured_at": time.strftime("%Y-%m-%d %H:%M"), **plans, "runs": runs, **summary(runs)}


def summary(runs: list[dict]) -> dict:
    """Each plan's median over its compared runs, and every pair's sync-round ratio (alternative / chosen)."""
    compared = runs[1:]
    chosen = [r["sync_round_s"] for r in compared if r["plan"] == "chosen"]
    other = [r["sync_round_s"] for r in compared if r["plan"] != "chosen"]
    return {"alternative_median_s": statistics.median(other), "chosen_median_s": statistics.median(chosen),
            "pair_ratios": [o / c for o, c in zip(other, chosen)]}


def render(result: dict) -> str:
    ratios, label = result["pair_ratios"], result["alternative_label"]
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}`; run 1 calibrates and writes FILE with the plan the cost model chooses and is not "
        f"compared; a copy of FILE carries the fastest plan with {label} at the same speeds. The two plans then "
        "run alternately.",
        "",
        f"- chosen: {cell(result['chosen'])}",
        f"- {label}: {cell(result['alternative'])} (predicted {result['alternative_predicted_s']:.2f} s)",
        "",
        "| run | plan | devices | sync-round s (median) | predicted s | error | host reference s | load before |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
        *(f"| {i + 1} | {r['plan']} | {', '.join(map(str, r['devices']))} | {r['sync_round_s']:.2f} | "
          f"{r['predicted_sync_round_s']:.2f} | {r['error']:+.1%} | {r['host_reference_s']:.3f} | "
          f"{r['load_before']} |" for i, r in enumerate(result["runs"])),
        "",
        f"Medians of the compared runs: {label} {result['alternative_median_s']:.2f} s, chosen "
        f"{result['chosen_median_s']:.2f} s. Each pair's sync-round with {label} over the chosen plan's: "
        f"{', '.join(f'{r:.3f}' for r in ratios)} (mean {statistics.fmean(ratios):.3f}).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--pool", default=DEFAULT_POOL)
    parser.add_argument("--pairs", type=int, default=3, help="runs of each plan, alternating")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="selection",
                        help="selection: against every device; hybrid: against one device a stage; "
                             "micro-batch: against the next micro-batch size")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    result = measure(args.model, args.pool, args.pairs, args.rounds, args.compare)
    name = COMPARISONS[args.compare][2] + ("" if args.pool == DEFAULT_POOL else "_" + args.pool.replace("-", "_"))
    publish(result, ROOT / "benchmarks" / "results" / f"{name}.json", render(result), ROOT / "docs" / "pipeline.md",
            name.replace("_", "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
