"""Confined devices: the planner's real error and the pipeline's efficiency on homes of truly different devices.

Every device is a worker process in a cgroup of its own, its CPU quota its
speed in host cores and its memory limit its budget (``--emulate cgroup``,
docs/pipeline.md, "Confined devices"); nothing sleeps to the cost model.
For each model (MobileNetV2 and EfficientNet-B0 cut into blocks, or with
``--granularity fine`` into every leaf module; 3x32x32 inputs, 10 classes,
synthetic data) and pool:

1. the host profile is measured now, into a fresh cache (with the runtime's
   overhead per operation, :mod:`ecofl.pipeline.runtime.host_overhead`);
2. each device times training steps in its cgroup, all at once
   (:mod:`ecofl.pipeline.runtime.calibration`): first of the whole model,
   then of the stage the plan on those speeds gives it (its layers at its
   share), until the plan's stages are ones its devices measured;
3. the planner plans on the measured speeds (of its plans at each
   micro-batch size, the one the cost model predicts fastest with the
   runtime's overheads, :func:`ecofl.pipeline.runtime.prediction.plan_as_run`,
   as the CLI plans), the cost model predicts the sync-round, and the plan runs confined: two warm-ups and ``--rounds``
   measured sync-rounds. **Planner error** = |predicted - measured| / measured
   (target: at most 10% on every row). Beside it, the error of the cost
   model re-learned in the pipeline (:func:`benchmarks.home_runs.in_pipeline_prediction`:
   each device's speed from its passes in the second warm-up, as a re-tune
   re-learns it), predicting rounds it did not see. **Pipeline efficiency** = measured
   throughput / the sum of every device's own training throughput of the
   whole model in its cgroup, timed at the samples per call it computes in
   the plan (:func:`ecofl.pipeline.runtime.calibration.whole_model_at_shares`;
   target: at least 0.85): against the schedule's bound M / (M + S - 1),
   which holds at equal calls, it shows what fill and drain, imbalance and
   hand-offs cost. Beside it, the same over the devices' throughput at the
   samples per call of their first calibration (4-16; what a smaller call
   costs too). Each device's quota, memory limit, cgroup peak and worker
   peak RSS are recorded.
4. Beside it, the same planner on the presets with every device sleeping to
   the cost model (``--emulate sleep``): the model's figure, where measured
   equals predicted by construction.
5. The host's own speed before calibrating, before the run and after it
   (``host_reference_s``, :mod:`benchmarks.steady_runs`: the CPU seconds
   of one fixed piece of work): on a shared virtual machine it moves by
   itself, and a run on a slower host than its calibration's misses its
   prediction for that reason alone.
6. Right after the run, each device times its stage again, the same work
   as the calibration the plan was predicted on, and the plan is predicted
   on those speeds too (:func:`calibrated_again`). Calibrations of one plan
   minutes apart have differed by 9-16% on this host, on all devices
   together, while the unconfined reference of 5. stayed flat
   (docs/pipeline.md, "The mixed home's CLI runs"). Where the measured
   sync-round lies between the two predictions (:func:`bracketed`), the
   devices themselves ran at speeds the run falls between, and a miss is
   theirs, not the cost model's; where it lies outside both, the model
   missed something the devices' own steps do not show.
7. Beside every calibration and the measured rounds, a probe process times
   one small fixed piece of work every 0.25 s (:mod:`benchmarks.host_probe`):
   the host's speed during the run against during the calibration it was
   predicted on, which the references of 5., taken with nothing running,
   cannot show.

Pools: Eco-FL's 3-stage testbed (``ecofl``), Asteroid's Env B (``hpp``;
its five boards need 1.64 cores, so its speeds are scaled by 0.9 to fit
this machine's two cores less half a core for the portal, and said so) and a
mixed home with a Raspberry Pi (``mixed-rpi``, ``ecofl``). Needs root and
writable cgroups (it says why not, and stops, where they are missing).

    .venv/bin/python benchmarks/confined.py [--rounds 3] [--batch 64] [--models mobilenet_v2,efficientnet_b0]

writes benchmarks/results/confined.json and the "confined" section of docs/pipeline.md. A larger
mini-batch (more micro-batches, a higher bound on efficiency) goes to a section of its own:

    .venv/bin/python benchmarks/confined.py --batch 256 --models mobilenet_v2 --pools ecofl-3stage:ecofl:1 \
        --json benchmarks/results/confined_batch256.json --section confined-batch256

the same with the micro-batch fixed (more micro-batches: a higher bound, more operations a round) to another:

    .venv/bin/python benchmarks/confined.py --batch 256 --micro-batch 8 --models mobilenet_v2 \
        --pools ecofl-3stage:ecofl:1 --json benchmarks/results/confined_batch256_mb8.json \
        --section confined-batch256-mb8

and the models split at every leaf module (a planner's finer choice of cuts) to one of its own too:

    .venv/bin/python benchmarks/confined.py --granularity fine --models efficientnet_b0 \
        --json benchmarks/results/confined_fine.json --section confined-fine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.home_runs import describe_plan, run_plan  # noqa: E402
from benchmarks.host_probe import HostProbe, relative_speed, summarize  # noqa: E402
from benchmarks.markdown_section import cell, replace_section  # noqa: E402
from benchmarks.steady_runs import host_reference_s  # noqa: E402
from ecofl.cgroups import find_hierarchy  # noqa: E402
from ecofl.devices import HomePool, host_cores  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.names import GRANULARITIES  # noqa: E402
from ecofl.pipeline.plan import Plan  # noqa: E402
from ecofl.pipeline.planners import make_plan  # noqa: E402
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import ZooModel  # noqa: E402
from ecofl.pipeline.runtime.calibration import (  # noqa: E402
    ConfinedPool, Workload, calibrated_on, confine_pool, plan_on_measured_speeds, plan_workload,
    whole_model_at_shares)
from ecofl.pipeline.runtime.device_timing import CALIBRATION_PRECISION  # noqa: E402
from ecofl.pipeline.runtime.host_overhead import operation_overhead_record  # noqa: E402
from ecofl.pipeline.runtime.prediction import plan_as_run, predict_sync_round  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

MODELS = ("mobilenet_v2", "efficientnet_b0")
SHAPE, CLASSES = (3, 32, 32), 10
CASES = (("ecofl-3stage", "ecofl", 1.0), ("asteroid-b", "hpp", 0.9), ("mixed-rpi", "ecofl", 1.0))
MIB = 2**20
#: A measured sync-round this close to one of its two predictions counts as between them (the calibration's own
#: precision, :data:`~ecofl.pipeline.runtime.device_timing.CALIBRATION_PRECISION`).
EDGE = CALIBRATION_PRECISION


def scaled(pool: HomePool, factor: float) -> HomePool:
    """``pool`` with every device's speed times ``factor`` (a pool too large for this machine's cores)."""
    if factor == 1.0:
        return pool
    devices = tuple(dataclasses.replace(d, speed=d.speed * factor) for d in pool.devices)
    return HomePool(f"{pool.name} x{factor:g}", devices, pool.bandwidth_bps)


def measure(model: str, pool_name: str, planner: str, factor: float, args: argparse.Namespace,
            cache_dir: str) -> dict:
    spec = ZooModel(model, SHAPE, CLASSES, args.granularity)
    profile = profile_zoo_model(model, SHAPE, CLASSES, args.granularity, cache_dir)
    presets = scaled(load_pool(pool_name), factor)
    fixed = {} if args.micro_batch is None else {"micro_batch": args.micro_batch}
    preset_plan = make_plan(planner, profile, presets, args.batch, **fixed)
    print(f"{model} on {presets.name}: each device times the model in its cgroup ...", file=sys.stderr, flush=True)
    reference = {"before_calibration": host_reference_s()}
    calibrated: dict[Workload, ConfinedPool] = {}
    probed: list[float] = []  # the host probe's samples during the calibrations, then during the one after the run

    def calibrate(work: Workload) -> ConfinedPool:
        with HostProbe() as probe:
            confined = confine_pool(spec, SHAPE, profile, presets, work, cache_dir=cache_dir)
        probed.extend(probe.samples)
        return confined

    confined, plan = plan_on_measured_speeds(lambda devices: plan_as_run(planner, profile, devices, args.batch,
                                                                         "cgroup", cache_dir, **fixed),
                                             profile, presets, calibrate, calibrated)
    whole = next(c for w, c in calibrated.items() if all(work.layers is None for _, work in w))
    at_shares = calibrated_on(whole_model_at_shares(plan, range(len(presets.devices))), calibrated, calibrate)
    reference["before_run"] = host_reference_s()
    host_probe = {"calibration": summarize(probed)}
    run = run_plan(spec, confined.pool, plan, profile, emulate="cgroup", limits=confined.limits, rounds=args.rounds,
                   timeout_s=args.timeout, cache_dir=cache_dir, relearn=True, probe_host=True)
    host_probe["run"] = run.pop("host_probe")
    alone = alone_throughput(at_shares)
    reference["after_run"] = host_reference_s()
    print(f"  confined: {run['sync_round_s']:.3f} s measured, {run['predicted_sync_round_s']:.3f} s predicted "
          f"({100 * run['planner_error']:.1f}%; re-learned in the pipeline "
          f"{run['in_pipeline']['predicted_sync_round_s']:.3f} s, {100 * run['in_pipeline']['planner_error']:.1f}%), "
          f"efficiency {run['throughput'] / alone:.2f}", file=sys.stderr)
    print("  each device times its stage again ...", file=sys.stderr, flush=True)
    probed.clear()
    again = calibrated_again(plan, profile, confined, calibrate(plan_workload(plan, range(len(presets.devices)))),
                             run["sync_round_s"], cache_dir)
    host_probe["calibration_after_run"] = summarize(probed)
    in_run = relative_speed(host_probe["run"], host_probe["calibration"])
    print(f"  timed again after the run: {again['predicted_sync_round_s']:.3f} s predicted "
          f"({100 * again['planner_error']:.1f}%); the host probe's work in the run against in calibration: "
          f"{'not measured' if in_run is None else f'{100 * in_run:+.1f}%'}", file=sys.stderr)
    sleep = run_plan(spec, presets, preset_plan, profile, emulate="sleep", rounds=args.rounds,
                     timeout_s=args.timeout, cache_dir=cache_dir)
    return {
        "model": model, "granularity": args.granularity, "pool": presets.name, "planner": planner, "scale": factor,
        "measured_speeds": {str(d): m for d, m in confined.measured.items()},
        "whole_model_speeds": {str(d): m for d, m in whole.measured.items()},
        "alone_at_shares_speeds": {str(d): m for d, m in at_shares.measured.items()},
        "devices_alone_throughput": alone, "efficiency": run["throughput"] / alone,
        "alone_at_first_calibration": {"throughput": alone_throughput(whole),
                                       "samples_per_call": operating_samples(whole)},
        "bound": schedule_bound(run), "of_bound": run["throughput"] / alone / schedule_bound(run),
        "predicted_of_bound": predicted_of_bound(run, alone),
        "confined": {**run, "plan_text": describe_plan(plan, confined.pool)},
        "sleep": {**sleep, "plan_text": describe_plan(preset_plan, presets)},
        "host_reference_s": {moment: round(seconds, 4) for moment, seconds in reference.items()},
        "calibrated_after_run": again,
        "host_probe": host_probe,
    }


def calibrated_again(plan: Plan, profile: ModelProfile, before: ConfinedPool, after: ConfinedPool,
                     measured_s: float, cache_dir: str) -> dict:
    """What the devices measured timing the same work again after the run (``after``), beside what the plan
    was predicted on (``before``): each device's speed and its change, and the plan's sync-round predicted on
    them with its error against the run's ``measured_s``."""
    predicted = predict_sync_round(plan, profile, after.pool, "cgroup", cache_dir=cache_dir).sync_round_s
    speeds = {d: report["measured_speed"] for d, report in after.measured.items()}
    return {"speeds": {str(d): speed for d, speed in sorted(speeds.items())},
            "speed_change": {str(d): speed / before.measured[d]["measured_speed"] - 1
                             for d, speed in sorted(speeds.items())},
            "predicted_sync_round_s": predicted, "planner_error": abs(predicted - measured_s) / measured_s}


def bracketed(row: dict) -> bool:
    """Whether the row's measured sync-round lies between its predictions on the speeds calibrated before the
    run and after it (either one's error within :data:`EDGE`: at the edge counts as between)."""
    run, again = row["confined"], row["calibrated_after_run"]
    low, high = sorted((run["predicted_sync_round_s"], again["predicted_sync_round_s"]))
    return low * (1 - EDGE) <= run["sync_round_s"] <= high * (1 + EDGE)


def alone_throughput(calibrated: ConfinedPool) -> float:
    """The sum of the devices' own training throughput of the whole model, each at the samples per call it
    measured at."""
    return sum(m["micro_batch"] / m["step_s"] for m in calibrated.measured.values())


def operating_samples(calibrated: ConfinedPool) -> int:
    """The samples per call most of ``calibrated``'s devices measured at."""
    return int(statistics.median(m["micro_batch"] for m in calibrated.measured.values()))


def schedule_bound(run: dict) -> float:
    """M / (M + S - 1): a synchronous pipeline's busy fraction with stages of equal time and free links. A plan
    can pass it: where one stage is short, the fill and drain take less than S - 1 whole stages and the other
    devices are busier than this; the short stage's device idles more, which costs the home little where it is a
    small part of the home's speed (the Raspberry Pi's)."""
    m, stages = run["num_micro_batches"], len(run["stages"])
    return m / (m + stages - 1)


def predicted_of_bound(run: dict, alone: float) -> float:
    """The cost model's throughput of the plan over the devices' own, as a fraction of :func:`schedule_bound`:
    how near the bound the plan itself is on the speeds its devices measured (its stages' imbalance at the
    layers it may cut between, hand-offs, the runtime's work per operation), before it runs."""
    return run["predicted_throughput"] / alone / schedule_bound(run)


def model_cell(row: dict) -> str:
    """The row's model, with its layer granularity where it is not the default's (blocks)."""
    granularity = row.get("granularity", "block")
    return row["model"] if granularity == "block" else f"{row['model']} ({granularity} layers)"


def breakdown_cells(breakdown: dict | None) -> str:
    """A device's compute and hand-off waits, measured against predicted (``-`` where the run has none)."""
    if breakdown is None:
        return "- | - | - | -"
    m, p = breakdown["measured"], breakdown["predicted"]
    return (f"{m['compute_s']:.2f} / {p['compute_s']:.2f} | {m['idle_s']:.2f} / {p['idle_s']:.2f} "
            f"| {m['handoffs_waited']}: {m['handoff_wait_s']:.2f} s "
            f"| {p['handoffs_waited']}: {p['handoff_wait_s']:.2f} s")


def efficiency_cell(row: dict) -> str:
    """The row's efficiency at the plan's calls, and beside it at the first calibration's where they differ."""
    first = row.get("alone_at_first_calibration")
    if first is None or abs(first["throughput"] - row["devices_alone_throughput"]) < 1e-9:
        return f"{row['efficiency']:.2f}"
    at_first = row["confined"]["throughput"] / first["throughput"]
    return f"{row['efficiency']:.2f} ({at_first:.2f} at x{first['samples_per_call']})"


def relearned_cell(relearned: dict | None) -> str:
    """The prediction re-learned in the pipeline and its error (``-``: a run that did not re-learn)."""
    if relearned is None:
        return "-"
    return f"{relearned['predicted_sync_round_s']:.3f} ({100 * relearned['planner_error']:.1f}%)"


def again_cell(row: dict) -> str:
    """The plan predicted on the speeds calibrated again after the run, its error, and ``*`` where the measured
    sync-round lies between that and the prediction it ran on (``-``: a run without the second calibration)."""
    again = row.get("calibrated_after_run")
    if again is None:
        return "-"
    mark = " *" if bracketed(row) else ""
    return f"{again['predicted_sync_round_s']:.3f} ({100 * again['planner_error']:.1f}%){mark}"


def own_speed_cell(row: dict, device: int) -> str:
    """A device's speed on its own stage, and its change when it timed the same work again after the run."""
    speed = row["measured_speeds"][str(device)]["measured_speed"]
    change = row.get("calibrated_after_run", {}).get("speed_change", {}).get(str(device))
    return f"{speed:.3f}" if change is None else f"{speed:.3f} (after: {100 * change:+.0f}%)"


def host_cell(row: dict) -> str:
    """The host probe's work during the run against during the calibrations, and during the timing after the run
    against the same (``-``: a run without the probe)."""
    probe = row.get("host_probe")
    if probe is None:
        return "-"
    run = relative_speed(probe["run"], probe["calibration"])
    after = relative_speed(probe["calibration_after_run"], probe["calibration"])
    text = "-" if run is None else f"{100 * run:+.0f}%"
    return text if after is None else f"{text} (after: {100 * after:+.0f}%)"


def again_summary(rows: list[dict]) -> str:
    """How many rows missed by over 10%, and of those how many lie between their two predictions."""
    timed = [row for row in rows if "calibrated_after_run" in row]
    if not timed:
        return "devices not timed again after the run"
    misses = [row for row in timed if row["confined"]["planner_error"] > 0.10]
    hosts = [host_cell(row) for row in misses if "host_probe" in row]
    probed = f"; the host probe during those runs against their calibrations: {', '.join(hosts)}" if hosts else ""
    return (f"{len(misses)} of {len(timed)} rows over 10%, {sum(map(bracketed, misses))} of them between the "
            f"predictions on the speeds calibrated before and after the run{probed}")


def cpu_cell(calibrated: dict, stage: dict, micro_batches: int) -> str:
    """A device's process CPU a step in its calibration (the cores that gave it) and a micro-batch in the run."""
    cpu_s = calibrated.get("own_cpu_s_per_step")
    calibration = "-" if cpu_s is None else f"{cpu_s:.3f} ({cpu_s / calibrated['own_step_s']:.2f})"
    if len(stage["devices"]) != 1:
        return f"{calibration} / -"
    passes = stage.get("pass_cpu_s_per_round")
    thread = stage["cpu_s_per_round_by_job"].get("MainThread")
    run = (f"{stage['cpu_s_per_round'] / micro_batches:.3f}"
           + ("" if thread is None else f", stage thread {thread / micro_batches:.3f}")
           + ("" if passes is None else f", its passes {passes / micro_batches:.3f}"))
    return f"{calibration} / {run}"


def markdown(results: dict) -> str:
    lines = [
        f"Measured on {results['machine']}, {results['cores']} cores ({results['date']}; 1-minute load "
        f"{results['load_before']:.2f} before), {results['hierarchy']}; batch {results['batch']}, "
        f"{results['rounds']} measured sync-rounds after {results.get('warm_ups', 1)} warm-up(s), "
        f"`{results.get('command', 'python benchmarks/confined.py')}`. **Confined**: every device a worker in a "
        "cgroup of its own at its preset's speed in cores and its memory budget, planned from the speeds the "
        "devices measured in their cgroups; nothing sleeps to the cost model, so measured and predicted are free "
        "to differ. "
        "**Sleep**: the same planner on the presets, every device sleeping to the cost model (the model's "
        "figure: measured = predicted by construction). Links paced at 100 Mbps in both. `efficiency`: "
        "confined throughput / the sum of the devices' own training throughput of the whole model in their "
        "cgroups, each timed at the samples per call it computes in the plan (in brackets: at the samples per "
        "call of their first calibration, xN, where they differ; a device trains fewer samples a second in "
        "smaller calls). `bound`: a synchronous schedule's busy fraction, "
        "M / (M + S - 1) for M micro-batches over S stages of equal time and free communication (fill and drain "
        "idle; a plan whose short stage's device idles more than the rest can pass it). `of bound`: efficiency / "
        "bound, measured (the cost model's prediction of the same plan): what the prediction misses is the "
        "runtime's or the host's, what it already predicts is the plan's. `re-learned`: the cost model with "
        "each device's speed re-learned from its passes in the last warm-up round (as a re-tune re-learns it, "
        "but not held to its calibration), "
        "predicting the measured rounds, which it did not see (its error in brackets). `calibrated after`: the "
        "same plan predicted on the speeds its devices measured timing the same work again right after the run "
        "(its error in brackets; `*`: the measured sync-round lies between the two predictions, within the "
        "calibration's 2% of either, so the devices' own timings before and after the run account for it). "
        "`host in run`: the median CPU time of one fixed convolution timed every 0.25 s beside the devices "
        "(benchmarks/host_probe.py) during the measured rounds, against during the calibrations (in brackets: "
        "during the timing after the run): + where the host computed slower.",
        "",
        "| model | pool | planner | plan (confined, measured speeds) | sync-round s measured | predicted | "
        "error | re-learned (error) | calibrated after (error) | host in run | efficiency | bound | of bound (pred.) "
        "| samples/s | sleep: plan on presets | sleep: sync-round s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        c, s = row["confined"], row["sleep"]
        lines.append(
            f"| {model_cell(row)} | {row['pool']} | {row['planner']} | {cell(c['plan_text'])} "
            f"| {c['sync_round_s']:.3f} | {c['predicted_sync_round_s']:.3f} | {100 * c['planner_error']:.1f}% "
            f"| {relearned_cell(c.get('in_pipeline'))} | {again_cell(row)} | {host_cell(row)} | {efficiency_cell(row)} "
            f"| {schedule_bound(c):.2f} | {row['efficiency'] / schedule_bound(c):.2f} "
            f"({predicted_of_bound(c, row['devices_alone_throughput']):.2f}) "
            f"| {c['throughput']:.1f} | {cell(s['plan_text'])} | {s['sync_round_s']:.3f} |")
    lines += ["", "Per device (confined): quota, speed measured in its cgroup on the whole model and on its own stage "
              "(the one the prediction uses; in brackets its change timed again after the run), memory limit "
              "(budget + the worker's own runtime), the cgroup's peak and the worker's peak resident set; then, in "
              "the last measured sync-round against the prediction (ecofl/pipeline/round_breakdown.py), its compute"
              " (forwards and backwards), its idle time between its first and last operation, and the hand-offs it "
              "waited for (a neighbour's activations or gradient, from the end of the operation that produced it to"
              " the start of the one that used it): how many, and their seconds in all; the rest of its idle time "
              "is the schedule's fill and drain and the runtime's time between operations. `CPU s a micro-batch`: "
              "the device's process (every thread) in its calibration's steps on its own stage, with the cores that"
              " gave it (CPU over the steps' time), then in the run (a sync-round's over its micro-batches; `-` "
              "where a stage has several devices): the process, its stage thread, and that thread in its forwards "
              "and backwards.", "",
              "| model | pool | device | quota cores | speed, whole model | speed, own stage | limit MiB "
              "| cgroup peak MiB | RSS peak MiB | compute s measured / predicted | idle s measured / predicted "
              "| hand-off waits measured | predicted | CPU s a micro-batch: calibration (cores) / run |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        c = row["confined"]
        for st in c["stages"]:
            for d, name in zip(st["devices"], st["device_names"]):
                box = c["confined"].get(str(d), {})
                whole = row.get("whole_model_speeds", {}).get(str(d), {}).get("measured_speed")
                peak = box.get("cgroup_peak_bytes")
                lines.append(f"| {model_cell(row)} | {row['pool']} | {d}: {name} | {box.get('cpu_quota', 0):.3f} "
                             f"| {'-' if whole is None else f'{whole:.3f}'} | {own_speed_cell(row, d)} "
                             f"| {box.get('memory_limit_bytes', 0) / MIB:.0f} "
                             f"| {'-' if peak is None else f'{peak / MIB:.0f}'} | {st['peak_rss_bytes'] / MIB:.0f} "
                             f"| {breakdown_cells((c.get('breakdown') or {}).get(str(d)))} "
                             f"| {cpu_cell(row['measured_speeds'][str(d)], st, c['num_micro_batches'])} |")
    worst = max(row["confined"]["planner_error"] for row in results["rows"])
    relearned = [row["confined"]["in_pipeline"]["planner_error"] for row in results["rows"]
                 if "in_pipeline" in row["confined"]]
    least = min(row["efficiency"] for row in results["rows"])
    nearest = min(row["efficiency"] / schedule_bound(row["confined"]) for row in results["rows"])
    planned = min(predicted_of_bound(row["confined"], row["devices_alone_throughput"]) for row in results["rows"])
    largest_relearned = f"{100 * max(relearned):.1f}%" if relearned else "not measured"
    lines += ["", f"Largest planner error: {100 * worst:.1f}% (target <= 10%), re-learned in the pipeline "
              f"{largest_relearned}; lowest efficiency {least:.2f} "
              f"(target >= 0.85); lowest fraction of the bound {nearest:.2f} measured, {planned:.2f} predicted "
              f"(target >= 0.95). Timed again after each run: {again_summary(results['rows'])}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured sync-rounds per run (after two warm-ups)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="fix the micro-batch size (default: of the planner's plans at each size, the one the "
                             "cost model predicts fastest)")
    parser.add_argument("--pools", default=",".join(f"{p}:{planner}:{f:g}" for p, planner, f in CASES),
                        help="pool:planner:speed-scale triples, comma-separated")
    parser.add_argument("--granularity", default="block", choices=GRANULARITIES,
                        help="the models' layers: blocks (children) or fine (every leaf module)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "confined.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "pipeline.md"))
    parser.add_argument("--section", default="confined", help="the doc's marked section to write the table into")
    args = parser.parse_args(argv)
    hierarchy = find_hierarchy()
    if isinstance(hierarchy, str):
        print(f"benchmarks/confined.py needs writable cgroups: {hierarchy}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    cases = [(p, planner, float(f)) for p, planner, f in (item.split(":") for item in args.pools.split(","))]
    with tempfile.TemporaryDirectory() as cache_dir:
        results = {"machine": platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "cores": host_cores(),
                   "hierarchy": hierarchy.name, "load_before": os.getloadavg()[0], "rounds": args.rounds, "warm_ups": 2,
                   "batch": args.batch, "overhead": operation_overhead_record(cache_dir), "rows": [],
                   "command": " ".join(["python benchmarks/confined.py", *(sys.argv[1:] if argv is None else argv)])}
        for model in args.models.split(","):
            for pool_name, planner, factor in cases:
                results["rows"].append(measure(model, pool_name, planner, factor, args, cache_dir))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    if not replace_section(Path(args.doc), table, args.section):
        print(f"{args.doc} has no section {args.section!r}: the table is only printed", file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and cgroups are cleaned up
        sys.exit(main())
