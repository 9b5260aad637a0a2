"""Pipelined inference (PipeEdge) gives the predictions of one process, on plain and hybrid plans.

Real worker processes stream micro-batches forward through their stages
(evaluation mode, no autograd, back-pressure on every link); the logits must
equal a single-process forward of the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import HomePipeline
from ecofl.weights import get_weights
from pipeline_kit import WITH_BATCH_NORM, assert_gone, pool

pytestmark = pytest.mark.timeout(240)


def trained_looking_weights() -> list[np.ndarray]:
    """Weights with batch-norm running statistics away from their initial 0 / 1 (evaluation mode uses them)."""
    torch.manual_seed(1)
    model, _ = WITH_BATCH_NORM.build()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
    return get_weights(model)


def single_process_logits(weights, x: torch.Tensor) -> np.ndarray:
    model, _ = WITH_BATCH_NORM.build()
    for p, w in zip(model.state_dict().values(), weights):
        p.copy_(torch.from_numpy(w))
    model.eval()
    with torch.no_grad():
        return model(x).numpy()


PLAIN = Plan("hand", (StagePlan((0, 2), (0,), (4,), 1), StagePlan((3, 5), (1,), (4,), 2),
                      StagePlan((6, 6), (2,), (4,), 1)), micro_batch=4, num_micro_batches=8, schedule="stream")
HYBRID = Plan("hand", (StagePlan((0, 2), (0, 1), (3, 1), 2), StagePlan((3, 6), (2, 3), (1, 3), 1)),
              micro_batch=4, num_micro_batches=8, schedule="stream")
IDLE_DEVICE = Plan("hand", (StagePlan((0, 2), (0,), (4,), 2), StagePlan((3, 6), (1, 2), (4, 0), 1)),
                   micro_batch=4, num_micro_batches=8, schedule="stream")  # a planner may list a device with no share


@pytest.mark.parametrize("plan, devices", [(PLAIN, 3), (HYBRID, 4), (IDLE_DEVICE, 3)],
                         ids=["plain", "hybrid", "idle-device"])
def test_pipelined_inference_equals_one_process(plan, devices):
    weights = trained_looking_weights()
    x = torch.randn(37, 6, generator=torch.Generator().manual_seed(0))  # not a multiple of the micro-batch
    with HomePipeline(WITH_BATCH_NORM, pool(devices), plan, emulate="none") as home:
        result = home.infer(weights, x)
        again = home.infer(None, x[:5])  # a second stream on the same workers, the weights kept
    np.testing.assert_allclose(result.logits, single_process_logits(weights, x), atol=1e-5, rtol=0)
    np.testing.assert_allclose(again.logits, result.logits[:5], atol=1e-6, rtol=0)
    assert result.num_micro_batches == 10 and result.logits.shape == (37, 3)
    for s, stage in enumerate(plan.stages):  # back-pressure: nobody held more than its bound
        assert 1 <= result.peak_held[s] <= stage.in_flight
    assert result.throughput > 0 and result.latency_s > 0 and result.stream_s > 0
    assert_gone(home.worker_pids.values())


def test_a_training_plan_cannot_infer_and_an_inference_plan_cannot_train():
    training = Plan("hand", (StagePlan((0, 6), (0,), (4,), 1),), micro_batch=4, num_micro_batches=2)
    x = torch.randn(8, 6)
    with HomePipeline(WITH_BATCH_NORM, pool(1), training, emulate="none") as home:
        with pytest.raises(ValueError, match="objective='inference'"):
            home.infer(None, x)
    stream = Plan("hand", (StagePlan((0, 6), (0,), (4,), 1),), micro_batch=4, num_micro_batches=2, schedule="stream")
    with HomePipeline(WITH_BATCH_NORM, pool(1), stream, emulate="none") as home:
        with pytest.raises(ValueError, match="objective='training'"):
            home.train(None, x, torch.zeros(8, dtype=torch.long), 1, lr=0.1)
