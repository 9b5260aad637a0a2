"""The runtime's own time per operation on this host: what predictions add to every pass and optimizer step.

A layer profile (:mod:`ecofl.pipeline.profile`) times the layers' compute.
Inside the runtime each forward and backward also costs time that does not
scale with the layers: the stage executor's bookkeeping, the CPU its messages
cost at both ends (framing, AES-GCM sealing, thread hand-offs) and, when the
workers outnumber the cores, the kernel's time slices. On 20 ms operations
this is a tenth of the time; on 100 ms ones it vanishes (docs/pipeline.md).

It is measured on a model whose layers cost next to nothing (a few 16-wide
linear layers, micro-batches of one sample), run by the real runtime at host
speed on three worker processes, which is what a home run here looks like:
the overhead is the ``o`` for which the cost model, every forward,
backward and optimizer step lasting ``o`` longer, reproduces the measured
sync-round (bisection; the cost model's round only grows with ``o``). The
steps were charged it from 2026-12-05; a record fitted before, without
them, is kept: one step a device beside 96 passes moves the fit by under
1%, less than measuring it again does. Then, with ``o``
fixed, the time per byte a device sends or receives is the ``c`` that
reproduces the sync-round of a second model, as cheap to compute but whose
activations between stages are wide (:func:`wide_model`: 64 KiB a sample).
The models whose error the benchmarks report are never part of this fit. The
result is cached per host (torch version, cores) beside the profiles.
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
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.model_spec import LayerList
from ecofl.pipeline.runtime.portal import HomePipeline

WIDTH, LAYERS, DEVICES = 16, 6, 3
WIDE = 16384  # floats a sample between the wide model's stages
RECORD_VERSION = 2  # 2: with the time per byte


def calibration_model() -> LayerList:
    """Six 16-wide linear layers with ReLUs between, ten classes: compute next to nothing."""
    layers: list[tuple[str, dict]] = []
    for i in range(LAYERS):
        layers.append(("Linear", {"in_features": WIDTH, "out_features": WIDTH if i < LAYERS - 1 else 10}))
        if i < LAYERS - 1:
            layers.append(("ReLU", {}))
    return LayerList(tuple(layers))


def wide_model() -> LayerList:
    """A 16 -> 16384 linear layer, four ReLUs and a 16384 -> 10 one: wide activations, little compute."""
    return LayerList((("Linear", {"in_features": WIDTH, "out_features": WIDE}), *[("ReLU", {})] * 4,
                      ("Linear", {"in_features": WIDE, "out_features": 10})))


def host_operation_overhead_s(cache_dir: str | None = None) -> float:
    """Seconds the runtime adds to each forward, backward and optimizer step here (measured once, then cached)."""
    return float(operation_overhead_record(cache_dir)["operation_overhead_s"])


def host_byte_overhead_s(cache_dir: str | None = None) -> float:
    """Seconds the runtime spends on each byte a device sends or receives on this host (measured once, cached)."""
    return float(operation_overhead_record(cache_dir)["byte_overhead_s"])


def runtime_overheads(emulation: Emulation, cache_dir: str | None = None) -> dict[str, float]:
    """The cost models' overhead arguments for a run in ``emulation``: this host's, measured once and cached,
    where devices compute for real; none where they sleep to the model. A confined device's time per byte is
    in the speed it calibrated (its steps carry their tensors through sealed links, :mod:`.link_work`), so
    confined runs add the per-operation overhead only. A deployed home's machines (``real``) are charged
    this host's overheads at their speeds: a device's own were not measured (its speed at join was)."""
    if emulation == Emulation.SLEEP:
        return {}
    if emulation == Emulation.CGROUP:
        return {"operation_overhead_s": host_operation_overhead_s(cache_dir)}
    return {"operation_overhead_s": host_operation_overhead_s(cache_dir),
            "byte_overhead_s": host_byte_overhead_s(cache_dir)}


def record_path(cache_dir: str | None = None) -> Path:
    """Where this host's record is cached (per record version, profiling method, torch version and cores)."""
    path = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    return path / (f"runtime-overhead-v{RECORD_VERSION}-m{PROFILE_METHOD}-torch{torch.__version__}-"
                   f"{host_cores()}cores.json")


def operation_overhead_record(cache_dir: str | None = None) -> dict:
    """The cached calibration of this host (:func:`measure_operation_overhead`'s record), measured if missing."""
    path = record_path(cache_dir)
    if path.exists():
        return json.loads(path.read_text())
    measured = measure_operation_overhead(cache_dir=cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured, indent=1))
    return measured


def measure_operation_overhead(micro_batches: int = 48, rounds: int = 3, timeout_s: float = 120.0,
                               cache_dir: str | None = None) -> dict:
    """Run the two calibration models at host speed and fit the overheads (see the module docstring)."""
    narrow = _Calibration("runtime-calibration", calibration_model(), 1, micro_batches, rounds, timeout_s, cache_dir)
    operation = _fit(lambda o: narrow.predict(o, 0.0), narrow.measured, narrow.measured / micro_batches)
    wide = _Calibration("runtime-calibration-wide", wide_model(), 4, micro_batches // 4, rounds, timeout_s,
                        cache_dir)
    wide_bytes = float(wide.profile.activation_bytes.max()) * wide.plan.batch_size * 2 * (DEVICES - 1)
    byte = _fit(lambda c: wide.predict(operation, c), wide.measured, 10 * wide.measured / wide_bytes)
    return {"operation_overhead_s": operation, "byte_overhead_s": byte, "measured_sync_round_s": narrow.measured,
            "predicted_without_overhead_s": narrow.predict(0.0, 0.0), "micro_batches": micro_batches,
            "wide_measured_sync_round_s": wide.measured, "wide_predicted_without_bytes_s": wide.predict(operation, 0.0),
            "stages": len(narrow.plan.stages), "cores": host_cores()}


class _Calibration:
    """One calibration model's median sync-round at host speed, and the cost model's for given overheads."""

    def __init__(self, name: str, spec: LayerList, micro_batch: int, micro_batches: int, rounds: int,
                 timeout_s: float, cache_dir: str | None):
        _, layers = spec.build()
        self.profile = profile_model(layers, (WIDTH,), name=name, cache_dir=cache_dir)
        pool = make_pool("calibration", ["nano-10w"] * DEVICES)
        self.plan = make_plan("even", self.profile, pool, micro_batches * micro_batch, micro_batch=micro_batch)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.plan.batch_size, WIDTH, generator=generator)
        y = torch.randint(0, 10, (self.plan.batch_size,), generator=generator)
        with HomePipeline(spec, pool, self.plan, profile=self.profile, emulate="none", timeout_s=timeout_s) as home:
            home.train(None, x, y, 1, lr=0.0, momentum=0.0)  # warm-up: one-time costs of fresh processes
            self.measured = statistics.median(home.train(None, x, y, rounds, lr=0.0, momentum=0.0).sync_round_s)
        self.machine = host_pool(pool)

    def predict(self, operation_s: float, byte_s: float) -> float:
        return simulate(self.plan, self.profile, self.machine, cores=host_cores(), operation_overhead_s=operation_s,
                        byte_overhead_s=byte_s).sync_round_s


def _fit(predicted, measured: float, high: float) -> float:
    """The overhead for which ``predicted`` (growing with it) equals ``measured``, by bisection in [0, high]
    (0 when even no overhead predicts more than was measured)."""
    low = 0.0
    if predicted(low) >= measured:
        return 0.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < measured else (low, middle)
    return high
