"""The runtime's own time per operation on this host: what host-speed predictions add to every forward and backward.

A layer profile (:mod:`ecofl.pipeline.profile`) times the layers' compute.
Inside the runtime each forward and backward also costs time that does not
scale with the layers: the stage executor's bookkeeping, the CPU its messages
cost at both ends (framing, AES-GCM sealing, thread hand-offs) and, when the
workers outnumber the cores, the kernel's time slices. On 20 ms operations
this is a tenth of the time; on 100 ms ones it vanishes (docs/pipeline.md).

It is measured on a model whose layers cost next to nothing (a few 16-wide
linear layers, micro-batches of one sample), run by the real runtime at host
speed on three worker processes, which is what a home run here looks like:
the overhead is the ``o`` for which the cost model, every forward and
backward lasting ``o`` longer, reproduces the measured sync-round
(bisection; the cost model's round only grows with ``o``). The models whose
error the benchmarks report are never part of this fit. The result is cached
per host (torch version, cores) beside the profiles.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from ecofl.devices import host_cores, host_pool, make_pool
from ecofl.pipeline.cost import simulate
from ecofl.pipeline.planners import make_plan
from ecofl.pipeline.profile import DEFAULT_CACHE_DIR, PROFILE_METHOD, profile_model
from ecofl.pipeline.runtime.model_spec import LayerList
from ecofl.pipeline.runtime.portal import HomePipeline

WIDTH, LAYERS, DEVICES = 16, 6, 3


def calibration_model() -> LayerList:
    """Six 16-wide linear layers with ReLUs between, ten classes: compute next to nothing."""
    layers: list[tuple[str, dict]] = []
    for i in range(LAYERS):
        layers.append(("Linear", {"in_features": WIDTH, "out_features": WIDTH if i < LAYERS - 1 else 10}))
        if i < LAYERS - 1:
            layers.append(("ReLU", {}))
    return LayerList(tuple(layers))


def host_operation_overhead_s(cache_dir: str | None = None) -> float:
    """Seconds the runtime adds to each forward and backward on this host (measured once, then cached)."""
    return float(operation_overhead_record(cache_dir)["operation_overhead_s"])


def operation_overhead_record(cache_dir: str | None = None) -> dict:
    """The cached calibration of this host (:func:`measure_operation_overhead`'s record), measured if missing."""
    path = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    path = path / f"runtime-overhead-m{PROFILE_METHOD}-torch{torch.__version__}-{host_cores()}cores.json"
    if path.exists():
        return json.loads(path.read_text())
    measured = measure_operation_overhead(cache_dir=cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured, indent=1))
    return measured


def measure_operation_overhead(micro_batches: int = 48, rounds: int = 3, timeout_s: float = 120.0,
                               cache_dir: str | None = None) -> dict:
    """Run the calibration model at host speed and fit the per-operation overhead (see the module docstring)."""
    spec = calibration_model()
    _, layers = spec.build()
    profile = profile_model(layers, (WIDTH,), name="runtime-calibration", cache_dir=cache_dir)
    pool = make_pool("calibration", ["nano-10w"] * DEVICES)
    plan = make_plan("even", profile, pool, micro_batches, micro_batch=1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(plan.batch_size, WIDTH, generator=generator)
    y = torch.randint(0, 10, (plan.batch_size,), generator=generator)
    with HomePipeline(spec, pool, plan, profile=profile, emulate=False, timeout_s=timeout_s) as home:
        home.train(None, x, y, 1, lr=0.0, momentum=0.0)  # warm-up: one-time costs of fresh processes
        measured = statistics.median(home.train(None, x, y, rounds, lr=0.0, momentum=0.0).sync_round_s)
    machine, cores = host_pool(pool), host_cores()

    def predicted(overhead_s: float) -> float:
        return simulate(plan, profile, machine, cores=cores, operation_overhead_s=overhead_s).sync_round_s

    low, high = 0.0, measured / plan.num_micro_batches
    if predicted(low) >= measured:
        high = 0.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < measured else (low, middle)
    return {"operation_overhead_s": high, "measured_sync_round_s": measured,
            "predicted_without_overhead_s": predicted(0.0), "micro_batches": plan.num_micro_batches,
            "stages": len(plan.stages), "cores": cores}
