"""What the in-home pipeline tests share: small models, host-speed pools, data, the single-process reference.

Also the exactness and clean-up checks, random profiles and pools of the
planner tests, and :func:`train_exactly`, the fault-tolerant run whose
weights must equal one process's. Imported by the test modules as a plain
module (``from pipeline_kit import ...``), so no test module imports
another.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ecofl.devices import DeviceSpec, HomePool
from ecofl.net.liveness import LivenessSettings
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime import HomePipeline, LayerList
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
from ecofl.train import accumulate_gradients
from ecofl.weights import get_weights, set_weights

# -- models, pools, data (the transparency tests) ----------------------------------------------------

WITH_BATCH_NORM = LayerList((
    ("Linear", {"in_features": 6, "out_features": 16}),
    ("BatchNorm1d", {"num_features": 16}),
    ("ReLU", {}),
    ("Linear", {"in_features": 16, "out_features": 12}),
    ("BatchNorm1d", {"num_features": 12}),
    ("Tanh", {}),
    ("Linear", {"in_features": 12, "out_features": 3}),
))
WITHOUT_BATCH_NORM = LayerList((
    ("Linear", {"in_features": 6, "out_features": 16}),
    ("ReLU", {}),
    ("Linear", {"in_features": 16, "out_features": 12}),
    ("Tanh", {}),
    ("Linear", {"in_features": 12, "out_features": 3}),
))
#: Where the pipeline tests' devices train: the CPU, or with ECOFL_TEST_ACCELERATOR=cuda a GPU of this machine
#: (the recovery tests on a GPU home: benchmarks/accelerators_gpu.sh); their references stay on the CPU.
ACCELERATOR = os.environ.get("ECOFL_TEST_ACCELERATOR", "cpu")
HOST = DeviceSpec("host", speed=1.0, memory_bytes=1 << 30, bandwidth_bps=1e9, accelerator=ACCELERATOR)


def pool(n: int) -> HomePool:
    return HomePool("test", (HOST,) * n)


def data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def proximal_term(model: torch.nn.Module, reference: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's mu/2 ||w - w_ref||^2 as a loss (Li et al.): the reference the closed-form gradient is checked
    against."""
    return 0.5 * mu * sum(((p - r) ** 2).sum() for p, r in zip(model.parameters(), reference))


def single_process(spec, weights, x, y, plan, rounds, lr, momentum=0.0, mu=0.0):
    """Sync-round r = gradient accumulation over the same M micro-batches, then one SGD step."""
    model, _ = spec.build()
    set_weights(model, weights)
    reference = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for r in range(rounds):
        index = (r * plan.batch_size + np.arange(plan.batch_size)) % len(x)
        accumulate_gradients(model, x[index], y[index], plan.num_micro_batches)
        if mu > 0:
            proximal_term(model, reference, mu).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return get_weights(model)


def assert_same(expected, actual, atol=1e-5):
    assert len(expected) == len(actual)
    for i, (a, b) in enumerate(zip(expected, actual)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        np.testing.assert_allclose(b, a, atol=atol, rtol=0, err_msg=f"state entry {i}")


def assert_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -- random profiles and pools (the planner tests) ---------------------------------------------------

SIZES = (1, 2, 4, 8)


def random_profile(rng: np.random.Generator, layers: int, weight_scale: float = 1.0) -> ModelProfile:
    """A profile whose time grows sub-linearly and unevenly with batch size (Asteroid Fig. 6)."""
    base = rng.uniform(0.01, 0.1, layers)
    forward = np.stack([base * b ** rng.uniform(0.5, 1.0, layers) for b in SIZES], axis=1)
    return ModelProfile(
        model="random",
        layer_names=tuple(f"l{i}" for i in range(layers)),
        batch_sizes=SIZES,
        forward_s=forward,
        backward_s=forward * rng.uniform(1.5, 2.5, (layers, 1)),
        activation_bytes=rng.uniform(1e3, 1e5, layers),
        gradient_bytes=rng.uniform(1e3, 1e5, layers),
        stash_bytes=rng.uniform(1e4, 1e6, layers),
        weight_bytes=rng.uniform(1e4, 1e6, layers) * weight_scale,
        optimizer_bytes=rng.uniform(1e4, 1e6, layers) * weight_scale,
        flops=rng.uniform(1e6, 1e7, layers),
        input_bytes=3000,
    )


def random_pool(rng: np.random.Generator, size: int, duplicates: bool) -> HomePool:
    devices: list[DeviceSpec] = []
    for k in range(size):
        if duplicates and devices and rng.random() < 0.5:
            devices.append(devices[-1])
            continue
        devices.append(DeviceSpec(f"d{k}", float(rng.uniform(0.2, 2.0)), int(rng.uniform(2e6, 2e7)),
                                  float(rng.uniform(1e5, 1e7))))
    return HomePool("random", tuple(devices))


def instances(seed: int, count: int, layers=(4, 8), devices=(2, 5)):
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n_layers, n_devices = int(rng.integers(*layers)), int(rng.integers(*devices))
        yield rng, random_profile(rng, n_layers), random_pool(rng, n_devices, duplicates=trial % 2 == 0)


# -- a fault-tolerant run that must be exact (the recovery tests) -------------------------------------

T_F, T_B = 0.01, 0.02  # host seconds per sample of every layer of a synthetic profile


def synthetic_profile(layers: int, activation: float = 0.0, weight: float = 1e6, step: float = 0.0) -> ModelProfile:
    """Every layer costs the same; times linear in batch size."""
    sizes = (1, 64)
    per_size = np.array(sizes, dtype=float)
    return ModelProfile(
        model="synthetic",
        layer_names=tuple(f"layer{i}" for i in range(layers)),
        batch_sizes=sizes,
        forward_s=np.outer(np.full(layers, T_F), per_size),
        backward_s=np.outer(np.full(layers, T_B), per_size),
        activation_bytes=np.full(layers, activation),
        gradient_bytes=np.full(layers, activation),
        stash_bytes=np.full(layers, 1000.0),
        weight_bytes=np.full(layers, weight),
        optimizer_bytes=np.full(layers, weight),
        flops=np.full(layers, 1e6),
        input_bytes=int(activation),
        optimizer_step_s=np.full(layers, step),
    )


PROFILE = random_profile(np.random.default_rng(0), 5)
THREE_STAGES = Plan("hand", (StagePlan((0, 1), (0,), (4,), 5), StagePlan((2, 3), (1,), (4,), 3),
                             StagePlan((4, 4), (2,), (4,), 1)), micro_batch=4, num_micro_batches=6)
# Fast enough for a test, slow enough that a loaded machine does not make a live device look dead (a full-suite
# run once failed the exactness check with 0.5 s bounds, and three test processes beside another job once made
# 3 s too short at start-up; a live device declared dead is another test's matter).
FAST_HEARTBEAT = LivenessSettings(period_s=0.1, suspect_after_s=5.0, probe_timeout_s=5.0)


def train_exactly(plan: Plan, events: list[str], devices: int = 3, *, spec=WITHOUT_BATCH_NORM, profile=PROFILE,
                  rounds=8, mu=0.0, **settings):
    """Train ``rounds`` sync-rounds with ``events`` injected (FedProx's ``mu`` toward the starting weights); the
    weights equal one process's, every round completed, no worker left. The result and the final plan."""
    x, y = data()
    ft = FaultTolerance(heartbeat=FAST_HEARTBEAT, **settings)
    with HomePipeline(spec, pool(devices), plan, profile=profile, emulate="none", timeout_s=120,
                      fault_tolerance=ft) as home:
        pids = list(home.worker_pids.values())
        start = home.weights
        result = home.train(None, x, y, rounds, lr=0.1, momentum=0.9, mu=mu,
                            inject=[Injection.parse(e) for e in events])
        final_plan = home.plan
    assert_gone(pids)
    expected = single_process(spec, start, x, y, plan, rounds, lr=0.1, momentum=0.9, mu=mu)
    assert_same(expected, result.weights)
    assert result.rounds_completed == rounds
    return result, final_plan
