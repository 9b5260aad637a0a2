"""``ecofl home train``: train a model through a real (emulated) home pipeline.

Profiles the model (cached), plans it on the pool (:mod:`ecofl.pipeline.planners`; where devices
compute for real, the planner's plan at the micro-batch size predicted fastest with the runtime's
own overheads, :func:`ecofl.pipeline.runtime.prediction.plan_as_run`), predicts its sync-round
(:func:`ecofl.pipeline.cost.simulate`), then runs it: one worker process per device on this machine,
each emulating its device (:mod:`ecofl.pipeline.runtime.emulation`), for ``--rounds`` sync-rounds on
the first samples of the dataset's training split. Prints per-stage utilisation and memory, measured
against predicted; ``--json`` prints one object; ``--timeline FILE`` draws the measured timeline as
a Gantt chart.

``--emulate cgroup`` (the default where cgroups are writable) confines each
device's worker to its speed in cores and its memory budget; the devices
first time the whole model, then their own stages, in their cgroups
(:mod:`ecofl.pipeline.runtime.calibration`), the planner plans from those
measured speeds, and nothing forces measured
and predicted to agree: the difference is the planner's error on a home of
truly different devices; ``--calibration FILE`` keeps those speeds and the
plan in FILE for later runs (:mod:`ecofl.cli.calibration_file`), so that
runs compared side by side share one plan. ``--emulate sleep`` makes every operation sleep
until the cost model's time, so the two agree by construction except for
communication and scheduling overhead. ``--emulate none`` (``--no-emulate``)
runs every device at host speed (no link pacing, no memory budgets),
predicted from the host profile with the devices sharing this machine's
cores (:func:`ecofl.devices.host_pool`); a device training on a GPU
(``accelerator: cuda``) times its work there first, as a confined device
does in its cgroup (:mod:`ecofl.pipeline.runtime.accelerator_devices`). Memory is reported as accounted
(weights, gradients, optimizer state, saved activations) and as measured
(each worker's peak resident set; confined: each cgroup's peak and limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ecofl.accelerator import check_accelerators
from ecofl.cli.calibration_file import load_calibration, save_calibration
from ecofl.cli.stage_table import PLACEMENT_HEAD, aligned, placement_cells, stage_placement
from ecofl.cli.timeline_image import write_timeline
from ecofl.devices import HomePool, host_cores
from ecofl.pools import load_pool
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model
from ecofl.data import load_dataset
from ecofl.errors import UserError
from ecofl.pipeline.cost import SyncRoundCost
from ecofl.pipeline.first_touch import first_round_extra_s
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners import check_planner
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.replication import copy_bytes, spared_devices
from ecofl.pipeline.runtime import HomePipelineError, PipelineResult, ZooModel
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection, check_devices
from ecofl.pipeline.runtime.pipeline_tuning import decided_plan
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.pipeline.runtime.portal import HomePipeline
from ecofl.pipeline.runtime.prediction import plan_as_run, predict_sync_round, weighs_hybrid
from ecofl.pipeline.runtime.accelerator_devices import calibrate_accelerators, has_accelerators
from ecofl.pipeline.runtime.calibration import ConfinedPool, confine_pool, plan_on_measured_speeds
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.cli.emulation_option import chosen_emulation


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.batch < 1:
        raise UserError(f"--rounds and --batch must be positive, got {args.rounds} and {args.batch}")
    tuning = None
    if args.tune_every and not args.tune_after:
        raise UserError("--tune-every re-tunes again after the first re-tune: give --tune-after too")
    if args.tune_after:
        tuning = Tuning(after_rounds=args.tune_after, every_rounds=args.tune_every, planner=args.planner,
                        micro_batch=args.micro_batch)
        if args.tune_after >= args.rounds:
            raise UserError(f"--tune-after {args.tune_after} leaves none of the {args.rounds} sync-rounds to the "
                            "re-tuned plan: train more --rounds")
    check_planner(args.planner)
    pool = load_pool(args.pool, args.bandwidth)
    check_accelerators(pool.devices, f"pool {pool.name}")
    data = load_dataset(args.dataset, args.data_root, args.download)
    shape = tuple(int(d) for d in data.input_shape)
    mode = chosen_emulation(args)  # after the data: a missing dataset is the one line a user sees
    if args.calibration is not None and mode != Emulation.CGROUP:
        raise UserError(f"--calibration keeps a confined home's measurements: it needs --emulate cgroup, not {mode}")
    profile = profile_zoo_model(args.model, shape, data.num_classes, args.granularity, args.cache_dir)
    spec = ZooModel(args.model, shape, data.num_classes, args.granularity)
    plan = _plan(args, profile, pool, mode)
    events = [Injection.parse(text) for text in args.inject]
    check_devices(events, len(pool.devices))  # before calibrating; whether each strikes a stage, once planned
    try:  # before any device calibrates: async 1F1B has no sync-rounds to replay or re-tune between
        mode_of(plan).check_training(fault_tolerance=bool(events or args.fault_tolerance), tuning=tuning is not None)
    except ValueError as error:
        raise UserError(str(error)) from None
    limits, calibration = None, {}
    if mode == Emulation.CGROUP:  # the devices time the model in their cgroups; the planner plans from that
        confined, plan = _calibrate(args, spec, shape, profile, pool)
        pool, limits, calibration = confined.pool, confined.limits, confined.measured
    elif mode == Emulation.NONE and has_accelerators(pool):  # the GPU devices time their work on their GPUs
        confined, plan = _calibrate_accelerators(args, spec, shape, profile, pool)
        pool, calibration = confined.pool, confined.measured
    x, y = data.train.x[: args.batch * args.rounds], data.train.y[: args.batch * args.rounds]
    tolerance = None
    if events or args.fault_tolerance:
        tolerance = FaultTolerance(replan=args.replan, replicate_every=args.replicate_every,
                                   global_copy_every=args.global_copy_every, planner=args.planner,
                                   backups=args.backups)
    predicted = _predict(plan, profile, pool, mode, args, tolerance)
    try:
        with HomePipeline(spec, pool, plan, profile=profile, emulate=mode, limits=limits, timeout_s=args.timeout,
                          fault_tolerance=tolerance, aggregate_every=args.aggregate_every, tuning=tuning,
                          cache_dir=args.cache_dir) as home:
            result = home.train(None, x, y, args.rounds, lr=args.lr, momentum=args.momentum,
                                progress=None if args.json else _progress(args.rounds), inject=events)
            final_plan, confined = home.plan, home.confinement_report()
    except HomePipelineError as error:
        raise UserError(str(error)) from None
    if final_plan != plan:
        predicted = _predict(final_plan, profile, pool, mode, args, tolerance)
    report = describe(final_plan, pool, predicted, result, mode, args.rounds)
    report["predicted_first_round_s"] = _first_round(report, final_plan, plan, profile, pool)
    report["devices"] = device_report(final_plan, pool, result, calibration, confined)
    if tuning is not None:
        report["tunings"] = _tunings(result, final_plan.schedule, profile, pool, mode, args, tolerance)
    if args.timeline:
        write_timeline(args.timeline, result.timeline, f"measured: {args.model} on {pool.name} ({plan.planner})", pool)
    print(json.dumps(report) if args.json else table(report))
    return 0


def _predict(plan: Plan, profile: ModelProfile, pool: HomePool, mode: Emulation, args: argparse.Namespace,
             tolerance: FaultTolerance | None) -> SyncRoundCost:
    """The cost model's sync-round of ``plan`` as this run trains it: with fault tolerance's copies charged
    to the devices that seal and open them (:func:`ecofl.pipeline.replication.copy_bytes`)."""
    copies = None
    if tolerance is not None:
        memory = {d: spec.memory_bytes for d, spec in enumerate(pool.devices)}
        copies = copy_bytes(plan, profile, tolerance.replicate_every, tolerance.global_copy_every, memory,
                            spared_devices(tolerance.backups, plan, profile, pool))
    return predict_sync_round(plan, profile, pool, mode, args.rounds, args.cache_dir, copies)


def _tunings(result: PipelineResult, schedule: str, profile: ModelProfile, pool: HomePool, mode: Emulation,
             args: argparse.Namespace, tolerance: FaultTolerance | None) -> list[dict]:
    """Each re-tune with ``after``: the sync-rounds its plan ran until the next re-tune (not a new plan's first,
    which maps its memory, nor those after a recovery or a slow-down moved to another plan) against that plan
    predicted at the speeds the pipeline re-learned, fault tolerance's copies included: the cost model tried on
    rounds it did not learn from."""
    reports = []
    for k, tuning in enumerate(result.tunings):
        first = tuning["after_round"] + 1  # the decided plan's first round, in its epoch
        end = result.tunings[k + 1]["after_round"] + 1 if k + 1 < len(result.tunings) else len(result.sync_round_s)
        epochs = result.round_epochs or (0,) * len(result.sync_round_s)
        rounds = [result.sync_round_s[i] for i in range(first + tuning["switched"], end) if epochs[i] == epochs[first]]
        relearned = with_speeds(pool, {int(d): speed for d, speed in tuning["speeds"].items()})
        plan = decided_plan(tuning, schedule)
        predicted = _predict(plan, profile, relearned, mode, args, tolerance).sync_round_s
        measured = statistics.median(rounds) if rounds else None
        after = {"rounds": len(rounds), "sync_round_s": measured, "predicted_sync_round_s": predicted,
                 "error": None if measured is None else abs(predicted - measured) / measured}
        reports.append({**tuning, "after": after})
    return reports


def _calibrate(args: argparse.Namespace, spec: ZooModel, shape: tuple, profile, presets) -> tuple[ConfinedPool, Plan]:
    """The devices' speeds measured in their cgroups and the plan made on them, or those kept in
    ``--calibration`` (written there when it does not exist yet)."""
    settings = {"model": args.model, "input_shape": list(shape), "pool": presets.name, "batch": args.batch,
                "micro_batch": args.micro_batch, "planner": args.planner, "schedule": args.schedule,
                "granularity": args.granularity, "bandwidth": args.bandwidth}
    kept = Path(args.calibration) if args.calibration is not None else None
    if kept is not None and kept.exists():
        confined, plan, measured_at = load_calibration(kept, settings, presets)
        if not args.json:
            print(f"reusing the speeds and plan measured at {measured_at} ({kept})", file=sys.stderr)
        return confined, plan
    if not args.json:
        print(f"each device times {args.model} in its cgroup ...", file=sys.stderr, flush=True)
    confined, plan = plan_on_measured_speeds(
        lambda devices: _plan(args, profile, devices, Emulation.CGROUP), profile, presets,
        lambda work: confine_pool(spec, shape, profile, presets, work, cache_dir=args.cache_dir))
    if kept is not None:
        save_calibration(kept, settings, confined, plan)
    return confined, plan


def _calibrate_accelerators(args: argparse.Namespace, spec: ZooModel, shape: tuple, profile, presets
                            ) -> tuple[ConfinedPool, Plan]:
    """The GPU devices' speeds measured on their GPUs (:mod:`ecofl.pipeline.runtime.accelerator_devices`), the
    CPU devices at host speed, and the plan made on them."""
    if not args.json:
        print(f"each GPU device times {args.model} on its GPU ...", file=sys.stderr, flush=True)
    return plan_on_measured_speeds(
        lambda devices: _plan(args, profile, devices, Emulation.NONE), profile, presets,
        lambda work: calibrate_accelerators(spec, shape, profile, presets, work))


def _plan(args: argparse.Namespace, profile, pool, mode: Emulation) -> Plan:
    options = {} if args.micro_batch is None else {"micro_batch": args.micro_batch}
    hybrid = args.schedule is None or weighs_hybrid(args.schedule, mode)
    plan = plan_as_run(args.planner, profile, pool, args.batch, mode, args.cache_dir, hybrid=hybrid, **options)
    if args.schedule is not None:
        try:
            plan = dataclasses.replace(plan, schedule=args.schedule)
        except ValueError as error:
            raise UserError(f"{args.planner} plan with {args.schedule}: {error}") from None
    return plan


def _first_round(report: dict, final_plan: Plan, plan: Plan, profile, pool) -> float | None:
    """The final plan's first sync-round predicted: its sync-round, plus the memory its devices map for the first
    time (beyond what they mapped on the plan the run started with, if it changed: a run that re-planned twice
    is predicted from its first plan), at each device's seconds per byte measured in its calibration (None: not
    calibrated; :mod:`ecofl.pipeline.first_touch`)."""
    extra = first_round_extra_s(final_plan, profile, pool, None if final_plan == plan else plan)
    return None if extra is None else report["predicted_sync_round_s"] + extra


def device_report(plan: Plan, pool, result: PipelineResult, calibration: dict, confined: dict) -> list[dict]:
    """Per device of the plan: its speed for the planner (measured in its cgroup when confined), its quota,
    memory limit and the cgroup's peak, and its worker's peak resident set (the stage's largest)."""
    devices = []
    for s, stage in enumerate(plan.stages):
        for device in stage.devices:
            devices.append({"device": device, "name": pool.devices[device].name, "stage": s,
                            "accelerator": pool.devices[device].accelerator,
                            "speed": pool.devices[device].speed, **calibration.get(device, {}),
                            **confined.get(device, {}), "peak_rss_bytes": result.peak_rss_bytes[s]})
    return devices


def _event_line(event: dict) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    stopping = "" if event["stopping_s"] is None else f"survivors stopped in {seconds(event['stopping_s'])}, "
    cause = "" if event["cause"] is None else f" ({event['cause']})"
    rescheduled = seconds(event["rescheduling_s"])
    if event["planning_s"] is not None and event["reconfigured_s"]:
        slowest = max(event["reconfigured_s"], key=event["reconfigured_s"].get)
        rescheduled += (f" (planning {seconds(event['planning_s'])}, slowest device {slowest} "
                        f"{seconds(event['reconfigured_s'][slowest])}, {seconds(event['linking_s'][slowest])} of it "
                        "opening links)")
    return (f"event {event['kind']} device {event['device']} at sync-round {event['round']}: detected after "
            f"{seconds(event['detected_after_s'])}{cause}, {stopping}"
            f"re-scheduled in {rescheduled}, "
            f"resumed after {seconds(event['resumed_after_s'])}, recovered after "
            f"{seconds(event['recovered_after_s'])} ({event['replan'] or 'no'} re-plan, "
            f"{event['bytes_moved'] / 2**20:.2f} MiB moved, {event['lost_rounds']} rounds replayed); "
            f"samples/s {rate(event['throughput_before'])} -> {rate(event['throughput_after'])}")


def _tuning_line(tuning: dict) -> str:
    speeds = ", ".join(f"{d}: {tuning['planned_speeds'][d]:.3f} -> {v:.3f}" for d, v in tuning["speeds"].items())
    outcome = (f"moved to {tuning['num_micro_batches']} x {tuning['micro_batch']} over "
               + " | ".join(f"{s['layers'][0]}-{s['layers'][1]}: {','.join(map(str, s['devices']))}"
                            for s in tuning["stages"])
               if tuning["switched"] else "kept the plan")
    return (f"re-tuned after sync-round {tuning['after_round']}: speeds in the pipeline {speeds}; predicted at them "
            f"{tuning['current_sync_round_s']:.3f} s, best re-plan {tuning['best_sync_round_s']:.3f} s (migration "
            f"{tuning['migration_s']:.2f} s, first-round mapping {tuning['first_round_s']:.2f} s, "
            f"{tuning['rounds_left']} rounds left): {outcome} (took "
            f"{tuning['seconds']:.2f} s, {tuning['bytes_moved'] / 2**20:.2f} MiB moved)" + _after_line(tuning["after"]))


def _after_line(after: dict) -> str:
    if after["sync_round_s"] is None:
        return "; no sync-round after it to measure"
    return (f"; after it {after['sync_round_s']:.3f} s measured ({after['rounds']} rounds), "
            f"{after['predicted_sync_round_s']:.3f} s predicted at the re-learned speeds "
            f"({100 * after['error']:.1f}% off)")


def _progress(total: int):
    def show(r: int, seconds: float) -> None:
        done = r + 1
        bar = "#" * (20 * done // total)
        end = "\n" if done == total else ""
        print(f"\rsync-round {done}/{total} [{bar:<20}] {seconds:.2f} s", end=end, file=sys.stderr, flush=True)

    return show


def describe(plan: Plan, pool, predicted: SyncRoundCost, result: PipelineResult,
             emulation: Emulation | bool = Emulation.SLEEP, rounds: int = 1) -> dict:
    """Measured against predicted, as one JSON-ready object (sync-round: median over the final plan's rounds).

    ``plan`` is the one the pipeline ran last (a re-planned pipeline reports
    its final stages, and its measured sync-round and throughput are those of
    the rounds that plan ran, beside its prediction; ``throughput_all_rounds``
    covers every round); ``events`` are the injected or detected events with
    their detection and recovery times and the throughput before and after
    each (:class:`~ecofl.pipeline.runtime.faults.FaultEvent`).
    An asynchronous 1F1B pass of ``rounds`` x M micro-batches has no sync-rounds: its time per M
    micro-batches (pass / ``rounds``) stands in for one, measured and predicted alike.
    """
    emulation = Emulation.parse(emulation)
    per_pass = mode_of(plan).rounds_per_pass(rounds)
    measured = statistics.median(result.final_plan_round_s) / per_pass
    stages = []
    for s, stage in enumerate(plan.stages):
        stages.append({
            **stage_placement(s, stage, pool),
            "busy_fraction": result.busy_fraction[s],
            "predicted_busy_fraction": predicted.busy_fraction[s],
            "cpu_s_per_round": result.cpu_s[s],  # measured: CPU seconds of the busiest worker process a round
            "cpu_s_per_round_by_job": result.cpu_s_by_job[s],  # the same by what its threads do
            "pass_cpu_s_per_round": result.pass_cpu_s[s],  # its stage thread's in its forwards and backwards
            "peak_memory_bytes": result.peak_memory_bytes[s],
            "predicted_memory_bytes": predicted.stage_memory_bytes[s],
            "peak_rss_bytes": result.peak_rss_bytes[s],
            "peak_accelerator_bytes": result.peak_accelerator_bytes[s],
            "training_rss_bytes": result.training_rss_bytes[s],
            "peak_resident": result.peak_resident[s],
            "forward_s": result.forward_s[s],
            "backward_s": result.backward_s[s],
        })
    return {
        "emulation": str(emulation),
        "cores": host_cores() if emulation == Emulation.NONE else None,
        "planner": plan.planner,
        "schedule": plan.schedule,
        "batch_size": plan.batch_size,
        "micro_batch": plan.micro_batch,
        "num_micro_batches": plan.num_micro_batches,
        "throughput": plan.batch_size / measured,
        "predicted_throughput": predicted.throughput,
        "throughput_all_rounds": result.throughput,
        "final_plan_rounds": len(result.final_plan_round_s),
        "sync_round_s": measured,
        "predicted_sync_round_s": predicted.sync_round_s / per_pass,
        "sync_rounds_s": list(result.sync_round_s),
        # the most memory one device touched for the first time in each round (a new stage maps its stash)
        "first_touched_mib_by_round": [None if b is None else b / 2**20 for b in result.first_touched_bytes],
        "loss": result.loss,
        "stages": stages,
        "rounds_completed": result.rounds_completed,
        "lost_rounds": result.lost_rounds,
        "events": list(result.events),
        "weight_versions": {str(d): [list(v) for v in log] for d, log in result.weight_versions.items()},
    }


def _rss(stage: dict) -> str:
    """Measured peak resident set of the stage's worker, and the part above the process without a model."""
    if stage["peak_rss_bytes"] is None:
        return "-"
    training = stage["training_rss_bytes"]
    return f"{stage['peak_rss_bytes'] / 2**20:.0f} ({'-' if training is None else f'{training / 2**20:.0f}'})"


def table(report: dict) -> str:
    rows = [(*PLACEMENT_HEAD, "busy (pred.)", "memory MiB (pred.)", "RSS MiB (training)", "resident", "F / B s")]
    for st in report["stages"]:
        rows.append((
            *placement_cells(st),
            f"{st['busy_fraction']:.2f} ({st['predicted_busy_fraction']:.2f})",
            f"{st['peak_memory_bytes'] / 2**20:.0f} ({st['predicted_memory_bytes'] / 2**20:.0f})",
            _rss(st),
            str(st["peak_resident"]),
            f"{st['forward_s']:.3f} / {st['backward_s']:.3f}",
        ))
    lines = aligned(rows)
    for event in report["events"]:
        lines.append(_event_line(event))
    lines += [_tuning_line(tuning) for tuning in report.get("tunings", [])]
    error = abs(report["predicted_sync_round_s"] - report["sync_round_s"]) / report["sync_round_s"]
    how = {
        "cgroup": "devices confined by cgroups (real CPU quota and memory limit; planned from their measured speeds)",
        "sleep": "devices sleeping to the cost model (measured = predicted by construction, but for communication "
                 "and scheduling)",
        "none": f"host speed, {report['cores']} shared cores, no emulation",
    }[report["emulation"]]
    return "\n".join([
        f"{report['planner']} plan, {report['schedule']}: mini-batch {report['batch_size']} = "
        f"{report['num_micro_batches']} x {report['micro_batch']}, mean loss {report['loss']:.4f}; {how}",
        *lines,
        f"sync-round {report['sync_round_s']:.3f} s measured (median), {report['predicted_sync_round_s']:.3f} s "
        f"predicted (error {100 * error:.1f}%); throughput {report['throughput']:.2f} samples/s"
        + (f" (final plan's {report['final_plan_rounds']} rounds; all rounds {report['throughput_all_rounds']:.2f})"
           if report["final_plan_rounds"] < report["rounds_completed"] else ""),
        *first_round_line(report),
    ])


def first_round_line(report: dict) -> list[str]:
    """The final plan's first sync-round, measured and predicted with the memory its devices mapped anew."""
    if report.get("predicted_first_round_s") is None:
        return []
    first = len(report["sync_rounds_s"]) - report["final_plan_rounds"]
    mapped = report["first_touched_mib_by_round"][first]
    return [f"its first sync-round {report['sync_rounds_s'][first]:.3f} s measured, "
            f"{report['predicted_first_round_s']:.3f} s predicted (a device mapped up to "
            f"{'-' if mapped is None else f'{mapped:.0f}'} MiB for the first time)"]
