"""Workers in network namespaces joined by veth links shaped with ``tc tbf`` (root only; skips otherwise)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import torch

from ecofl.devices import DeviceSpec, HomePool
from ecofl.net.netns import HomeNetwork, unavailable_reason
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import HomePipeline, LayerList
from ecofl.train import accumulate_gradients
from ecofl.weights import get_weights, set_weights

REASON = unavailable_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=str(REASON)), pytest.mark.timeout(180)]

WIDE = LayerList((
    ("Linear", {"in_features": 64, "out_features": 8192}),  # 32 KiB of activations per sample at the cut
    ("ReLU", {}),
    ("Linear", {"in_features": 8192, "out_features": 5}),
))


def test_pipeline_over_shaped_links_is_paced_by_the_kernel_and_still_exact():
    rate = 1e6  # bytes/s on every device's link (8 Mbit/s)
    pool = HomePool("netns", tuple(DeviceSpec(f"dev{i}", 1.0, 1 << 30, rate) for i in range(2)))
    plan = Plan("hand", (StagePlan((0, 1), (0,), (8,), 3), StagePlan((2, 2), (1,), (8,), 1)), 8, 4)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 64, generator=generator), torch.randint(0, 5, (32,), generator=generator)
    with HomeNetwork(pool, [0, 1]) as network:
        namespaces = [network.namespace(0), network.namespace(1), network.hub]
        with HomePipeline(WIDE, pool, plan, emulate="sleep", network=network, timeout_s=60) as home:
            pids = list(home.worker_pids.values())
            start = home.weights
            result = home.train(None, x, y, 1, lr=0.1)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in namespaces)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # 4 micro-batches x 8 samples x 32 KiB each way: about 1 MiB at 1 MB/s
    assert result.sync_round_s[0] > 0.8
    model, _ = WIDE.build()
    set_weights(model, start)
    accumulate_gradients(model, x, y, 4)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    for expected, actual in zip(get_weights(model), result.weights):
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
