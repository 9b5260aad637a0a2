"""Memory of the running pipeline: 1F1B-Sync holds K_p micro-batches, GPipe holds M (Eco-FL Table 2).

Resident activations are measured by the workers from the tensors autograd
saves in each forward (:func:`ecofl.pipeline.runtime.emulation.saved_bytes`).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

from ecofl.devices import GB, HomePool, preset
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import EmulatedOOM, HomePipeline, LayerList
from ecofl.pipeline.runtime.emulation import saved_bytes
from ecofl.pipeline.schedule import default_in_flight

pytestmark = pytest.mark.timeout(240)

SMALL_CNN = LayerList((
    ("Conv2d", {"in_channels": 3, "out_channels": 8, "kernel_size": 3, "padding": 1}),
    ("ReLU", {}),
    ("Conv2d", {"in_channels": 8, "out_channels": 8, "kernel_size": 3, "padding": 1}),
    ("Tanh", {}),
    ("AvgPool2d", {"kernel_size": 8}),
    ("Flatten", {}),
    ("Linear", {"in_features": 8, "out_features": 4}),
))

# Stage 1 keeps ~544 MiB per micro-batch of 8 (a 4 x 2112 x 2112 feature map per sample, saved by
# the pooling) at little compute: 8 of them (GPipe, M = 8) overflow 4 GB, one (1F1B-Sync, K_1 = 1) fits.
WIDE_MAPS = LayerList((
    ("Conv2d", {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}),
    ("Upsample", {"scale_factor": 132, "mode": "nearest"}),
    ("AvgPool2d", {"kernel_size": 2112}),
    ("Flatten", {}),
    ("Linear", {"in_features": 4, "out_features": 10}),
))


def host_speed(name: str, memory_bytes: int | None = None):
    """A preset device that computes at host speed (these tests are about memory, not time)."""
    spec = preset(name)
    return dataclasses.replace(spec, speed=1.0, memory_bytes=memory_bytes or spec.memory_bytes)


def micro_batch_bytes(spec: LayerList, layers: tuple[int, int], x: torch.Tensor, y: torch.Tensor | None) -> int:
    """What one forward task of a stage keeps for its backward, measured in this process."""
    _, modules = spec.build()
    stage = torch.nn.Sequential(*modules[layers[0] : layers[1] + 1])
    with saved_bytes(list(stage.parameters())) as nbytes:
        out = stage(x)
        if y is not None:
            F.cross_entropy(out, y, reduction="sum")
    return nbytes[0]


def test_1f1b_holds_k_p_micro_batches_per_stage():
    m_count, micro = 8, 2
    in_flight = default_in_flight(3)  # (5, 3, 1)
    stages = ((0, 1), (2, 3), (4, 6))
    plan = Plan("hand", tuple(StagePlan(layers, (s,), (micro,), k) for s, (layers, k) in
                              enumerate(zip(stages, in_flight))), micro, m_count)
    pool = HomePool("home", (host_speed("tx2-maxn"), host_speed("nano-10w"), host_speed("rpi4")))
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 8, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    with HomePipeline(SMALL_CNN, pool, plan, emulate="sleep", timeout_s=60) as home:
        result = home.train(None, x, y, 1, lr=0.1)
    assert result.peak_resident == tuple(in_flight)
    model, modules = SMALL_CNN.build()
    h0 = torch.nn.Sequential(*modules[:2])(x[:micro]).detach().requires_grad_()
    h1 = torch.nn.Sequential(*modules[2:4])(h0).detach().requires_grad_()
    per_micro_batch = (
        micro_batch_bytes(SMALL_CNN, stages[0], x[:micro], None),
        micro_batch_bytes(SMALL_CNN, stages[1], h0, None),
        micro_batch_bytes(SMALL_CNN, stages[2], h1, y[:micro]),
    )
    assert all(b > 0 for b in per_micro_batch)
    assert result.peak_activation_bytes == tuple(k * b for k, b in zip(in_flight, per_micro_batch))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_4gb_device_runs_out_of_memory_under_gpipe_but_not_1f1b(schedule):
    """Eco-FL Table 2's shape: a TX2 then a 4 GB Nano; micro-batch 8, M = 8."""
    pool = HomePool("home", (host_speed("tx2-maxn"), host_speed("nano-10w", memory_bytes=4 * GB)))
    plan = Plan("hand", (StagePlan((0, 0), (0,), (8,), 3), StagePlan((1, 4), (1,), (8,), 1)), 8, 8, schedule)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, 16, 16, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    with HomePipeline(WIDE_MAPS, pool, plan, emulate="sleep", timeout_s=90) as home:
        pids = list(home.worker_pids.values())
        if schedule == "gpipe":
            with pytest.raises(EmulatedOOM,
                               match=r"device 1 \(nano-10w\) \(stage 1, gpipe\): 8 resident micro-batches"):
                home.train(None, x, y, 1, lr=0.1)
        else:
            result = home.train(None, x, y, 1, lr=0.1)
            assert result.peak_resident == (3, 1)
            assert 512 * 2**20 < result.peak_activation_bytes[1] < 4 * GB / 7
            assert result.peak_memory_bytes[1] < 4 * GB
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
