"""``ecofl home infer``: pipelined inference (PipeEdge) of a trained model across a home's devices.

Profiles the model (cached), plans it for inference on the pool
(``make_plan(..., objective="inference")``: forward time plus transfer per
stage, memory = weights plus in-flight activations; the ``pipeedge`` planner
also chooses which devices to use and in which order, PipeEdge §III-B),
predicts the stream (:func:`ecofl.pipeline.stream.simulate_stream`), then
streams the first ``--samples`` test samples through one worker process per
device (:meth:`ecofl.pipeline.runtime.portal.HomePipeline.infer`) and prints
the measured against the predicted throughput and latency, per stage, and
the test accuracy.

The weights are the global model a run left behind: ``--checkpoint`` takes
a simulation's or deployment's output directory (its ``global_model.npz``,
else its newest checkpoint), a checkpoint file, or a weights file
(``--weights``). Without either, a freshly initialised model streams
(throughput and latency mean the same; accuracy is chance).

``--emulate cgroup`` (the default where cgroups are writable) confines each
device to its speed in cores and its memory budget; the devices time the
model in their cgroups and the planner plans from those speeds (as ``ecofl
home train``). ``--emulate sleep`` makes every forward sleep until the cost
model's time, so measured and predicted agree by construction except for
communication and scheduling; ``--emulate none`` (``--no-emulate``) runs the
devices at host speed, predicted as if each had a core of its own (the
stream model does not share cores); a device training on a GPU times its
forwards there first (:mod:`ecofl.pipeline.runtime.accelerator_devices`).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ecofl.accelerator import check_accelerators
from ecofl.cli.emulation_option import chosen_emulation
from ecofl.cli.stage_table import PLACEMENT_HEAD, aligned, placement_cells, stage_placement
from ecofl.cli.timeline_image import write_timeline
from ecofl.data import load_dataset
from ecofl.devices import host_pool
from ecofl.errors import UserError
from ecofl.fl.checkpoint import global_model_weights
from ecofl.models import build_model
from ecofl.pipeline.planners import check_planner, make_plan
from ecofl.pipeline.profile import profile_zoo_model
from ecofl.pipeline.runtime import HomePipelineError, ZooModel
from ecofl.pipeline.runtime.accelerator_devices import calibrate_accelerators, has_accelerators
from ecofl.pipeline.runtime.calibration import confine_pool, plan_on_measured_speeds
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.host_overhead import runtime_overheads
from ecofl.pipeline.runtime.portal import HomePipeline
from ecofl.pipeline.runtime.statistics import InferenceResult
from ecofl.pipeline.stream import StreamCost, simulate_stream
from ecofl.pools import load_pool
from ecofl.weights import get_weights


def run(args: argparse.Namespace) -> int:
    if args.samples < 1 or args.batch < 1:
        raise UserError(f"--samples and --batch must be positive, got {args.samples} and {args.batch}")
    check_planner(args.planner)
    pool = load_pool(args.pool, args.bandwidth)
    check_accelerators(pool.devices, f"pool {pool.name}")
    data = load_dataset(args.dataset, args.data_root, args.download)
    shape = tuple(int(d) for d in data.input_shape)
    spec = ZooModel(args.model, shape, data.num_classes, args.granularity)
    weights = _weights(args, spec)
    profile = profile_zoo_model(args.model, shape, data.num_classes, args.granularity, args.cache_dir)
    options = {} if args.micro_batch is None else {"micro_batch": args.micro_batch}
    mode = chosen_emulation(args)
    plan = make_plan(args.planner, profile, pool, args.batch, objective="inference", **options)
    limits, presets = None, pool

    def measure(work):  # the devices that time their forwards before the plan is made, as in home train
        if mode == Emulation.CGROUP:  # in their cgroups
            return confine_pool(spec, shape, profile, presets, work, objective="inference", cache_dir=args.cache_dir)
        return calibrate_accelerators(spec, shape, profile, presets, work, objective="inference")  # on their GPUs

    if mode == Emulation.CGROUP or (mode == Emulation.NONE and has_accelerators(pool)):
        confined, plan = plan_on_measured_speeds(
            lambda devices: make_plan(args.planner, profile, devices, args.batch, objective="inference", **options),
            profile, presets, measure)
        pool, limits = confined.pool, confined.limits if mode == Emulation.CGROUP else None
    x, y = data.test.x[: args.samples], data.test.y[: args.samples]
    count = -(-len(x) // plan.micro_batch)
    predicted = simulate_stream(plan, profile, host_pool(pool) if mode == Emulation.NONE else pool, count,
                                **runtime_overheads(mode, args.cache_dir))
    try:
        with HomePipeline(spec, pool, plan, profile=profile, emulate=mode, limits=limits,
                          timeout_s=args.timeout) as home:
            result = home.infer(weights, x)
    except HomePipelineError as error:
        raise UserError(str(error)) from None
    accuracy = float((torch.from_numpy(result.logits).argmax(1) == y).float().mean())
    report = describe(plan, pool, predicted, result, accuracy, mode)
    if args.timeline:
        write_timeline(args.timeline, result.timeline, f"inference: {args.model} on {pool.name} ({plan.planner})", pool)
    print(json.dumps(report) if args.json else table(report))
    return 0


def _weights(args: argparse.Namespace, spec: ZooModel):
    """The global model to stream (checked against the model's state), or a fresh one with a note."""
    path = args.weights or args.checkpoint
    fresh = get_weights(build_model(spec.name, spec.input_shape, spec.num_classes))
    if path is None:
        print("ecofl: note: no --weights or --checkpoint: a freshly initialised model (accuracy is chance)",
              file=sys.stderr)
        return fresh
    weights = global_model_weights(path)
    if len(weights) != len(fresh) or any(w.shape != f.shape for w, f in zip(weights, fresh)):
        raise UserError(f"the weights in {path} are not those of {spec.name} on {spec.input_shape} inputs "
                        f"with {spec.num_classes} classes ({len(weights)} arrays, the model has {len(fresh)})")
    return weights


def describe(plan, pool, predicted: StreamCost, result: InferenceResult, accuracy: float,
             emulation: Emulation | bool) -> dict:
    """Measured against predicted, as one JSON-ready object."""
    stages = []
    for s, stage in enumerate(plan.stages):
        stages.append({
            **stage_placement(s, stage, pool),
            "busy_fraction": result.busy_fraction[s],
            "predicted_busy_fraction": predicted.busy_fraction[s],
            "forward_s": result.forward_s[s],
            "predicted_forward_s": predicted.stage_forward_s[s],
            "peak_held": result.peak_held[s],
            "predicted_memory_bytes": predicted.stage_memory_bytes[s],
            "peak_rss_bytes": result.peak_rss_bytes[s],
            "training_rss_bytes": result.training_rss_bytes[s],
        })
    return {
        "emulation": str(Emulation.parse(emulation)),
        "planner": plan.planner,
        "devices_used": sorted(d for stage in plan.stages for d in stage.devices),
        "micro_batch": plan.micro_batch,
        "num_micro_batches": result.num_micro_batches,
        "samples": len(result.logits),
        "throughput": result.throughput,
        "predicted_throughput": predicted.throughput,
        "stream_throughput": result.stream_throughput,
        "predicted_stream_throughput": predicted.stream_throughput,
        "latency_s": result.latency_s,
        "predicted_latency_s": predicted.latency_s,
        "accuracy": accuracy,
        "stages": stages,
    }


def table(report: dict) -> str:
    rows = [(*PLACEMENT_HEAD, "busy (pred.)", "forward s (pred.)", "held/K", "RSS MiB")]
    for st in report["stages"]:
        rss = "-" if st["peak_rss_bytes"] is None else f"{st['peak_rss_bytes'] / 2**20:.0f}"
        rows.append((
            *placement_cells(st),
            f"{st['busy_fraction']:.2f} ({st['predicted_busy_fraction']:.2f})",
            f"{st['forward_s']:.4f} ({st['predicted_forward_s']:.4f})", f"{st['peak_held']}/{st['in_flight']}", rss,
        ))
    lines = aligned(rows)
    how = {"cgroup": "devices confined by cgroups (planned from the speeds they measured there)",
           "sleep": "devices sleeping to the cost model (compute = the model's by construction)",
           "none": "host speed (predicted as if each device had a core of its own)"}[report["emulation"]]
    return "\n".join([
        f"{report['planner']} inference plan on devices {report['devices_used']}: {report['samples']} samples in "
        f"{report['num_micro_batches']} micro-batches of {report['micro_batch']}; {how}",
        *lines,
        f"throughput {report['throughput']:.1f} samples/s measured, {report['predicted_throughput']:.1f} predicted "
        f"(steady state); latency {report['latency_s'] * 1e3:.1f} ms measured, "
        f"{report['predicted_latency_s'] * 1e3:.1f} ms predicted; test accuracy {report['accuracy']:.4f}",
    ])
