"""The multi-process home pipeline computes what one process computes (torchgpipe's transparency test).

Each test runs a real pipeline (one worker process per device, sealed tensor
links between them) for several sync-rounds and compares every entry of the state dict,
batch-norm statistics included, with single-process gradient accumulation over
the same micro-batches (:func:`ecofl.train.accumulate_gradients`).
"""

from __future__ import annotations

import numpy as np
import pytest

from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import HomePipeline
from pipeline_kit import WITHOUT_BATCH_NORM, WITH_BATCH_NORM, assert_gone, assert_same, data, pool, single_process

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_three_stage_pipeline_equals_gradient_accumulation(schedule):
    plan = Plan(
        "hand",
        (StagePlan((0, 2), (0,), (4,), 5), StagePlan((3, 5), (1,), (4,), 3), StagePlan((6, 6), (2,), (4,), 1)),
        micro_batch=4,
        num_micro_batches=6,
        schedule=schedule,
    )
    x, y = data()
    with HomePipeline(WITH_BATCH_NORM, pool(3), plan, emulate="none", timeout_s=60) as home:
        pids = list(home.worker_pids.values())
        start = home.weights
        first = home.train(None, x, y, 3, lr=0.1, momentum=0.9, mu=0.01)
        second = home.train(first.weights, x, y, 2, lr=0.1)
    assert_gone(pids)
    expected = single_process(WITH_BATCH_NORM, start, x, y, plan, 3, lr=0.1, momentum=0.9, mu=0.01)
    assert_same(expected, first.weights)
    # the second call starts again at sample 0, with a fresh optimizer
    assert_same(single_process(WITH_BATCH_NORM, expected, x, y, plan, 2, lr=0.1), second.weights)
    resident = (5, 3, 1) if schedule == "1f1b" else (6, 6, 6)  # K_s vs M forward tasks held
    assert first.peak_resident == resident
    assert len(first.sync_round_s) == 3 and all(t > 0 for t in first.sync_round_s)
    assert first.loss > 0



def test_hybrid_plan_with_replicated_stage_equals_gradient_accumulation():
    """Stage 0 replicated over two devices with uneven shares (Asteroid Fig. 10), then one device."""
    plan = Plan(
        "hand",
        (StagePlan((0, 1), (0, 1), (5, 3), 3), StagePlan((2, 4), (2,), (8,), 1)),
        micro_batch=8,
        num_micro_batches=3,
    )
    x, y = data()
    with HomePipeline(WITHOUT_BATCH_NORM, pool(3), plan, emulate="none", timeout_s=60) as home:
        pids = list(home.worker_pids.values())
        start = home.weights
        with pytest.raises(ValueError, match="expected 6 weight arrays, got 1"):
            home.train([np.zeros(3)], x, y, 1, lr=0.05)  # refused before any worker is touched
        result = home.train(None, x, y, 4, lr=0.05, momentum=0.5)
    assert_gone(pids)
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, plan, 4, lr=0.05, momentum=0.5), result.weights)
