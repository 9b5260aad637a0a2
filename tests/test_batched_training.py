"""Homes trained together (torch.func vmap) equal homes trained alone; what cannot be batched trains alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from ecofl.accelerator import resolve_device
from ecofl.batched_training import HomeJob, batching_obstacle, train_homes_together
from ecofl.data import load_dataset
from ecofl.fl.dispatch_batch import DispatchBatch, dispatch_batches
from ecofl.fl.transport import TrainTask
from ecofl.models import build_model
from ecofl.train import TrainConfig, train_local
from ecofl.weights import get_weights, set_weights

DIGITS = load_dataset(name="digits")
#: FedProx, momentum and weight decay: every term of a home's step.
CONFIG = TrainConfig(epochs=3, batch_size=10, lr=0.05, momentum=0.9, mu=0.05, weight_decay=1e-4)
#: Unequal homes: whole batches, a short last batch, a home smaller than one batch, and an empty one.
SIZES = (40, 27, 13, 7, 0)


def cnn() -> torch.nn.Module:
    return build_model("cnn", DIGITS.input_shape, DIGITS.num_classes)


def jobs(weights, sizes=SIZES, config=CONFIG) -> list[HomeJob]:
    out, start = [], 0
    for home, size in enumerate(sizes):
        x, y = DIGITS.train.x[start : start + size], DIGITS.train.y[start : start + size]
        out.append(HomeJob(x, y, replace(config, seed=100 + home), weights))
        start += size
    return out


#: Where the exactness test runs: the CPU everywhere, a GPU where there is one.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device on this machine"))]


def alone(job: HomeJob, device: str = "cpu"):
    model = cnn().to(device)
    set_weights(model, job.weights)
    result = train_local(model, job.x, job.y, job.config)
    return get_weights(model), result


@pytest.mark.parametrize("device", DEVICES)
def test_each_home_trained_together_equals_the_home_trained_alone(device):
    """FedAvg CNN, unequal homes, FedProx, momentum 0.9, weight decay: every home within 1e-5 (float32).

    Measured on this repository's 2-core CPU: at most 3e-8. (Over many more steps at a higher learning
    rate, SGD through ReLU and max-pool is chaotic: a 1e-7 change of the start grows to 1e-2 in
    one-at-a-time training too, so the comparison is made where rounding is not amplified.) On a GPU both
    paths run in full float32 (:func:`ecofl.accelerator.resolve_device` turns TF32 off), so the same bound holds.
    """
    device = resolve_device(device)
    torch.manual_seed(0)
    weights = get_weights(cnn())
    work = jobs(weights)
    together = train_homes_together(cnn, work, device)
    assert len(together) == len(work)
    worst = 0.0
    for job, trained in zip(work, together):
        expected, result = alone(job, device)
        assert trained.result.num_samples == result.num_samples == len(job.y)
        assert trained.result.steps == result.steps
        assert trained.result.loss == pytest.approx(result.loss, abs=1e-5)
        worst = max(worst, max(float(np.abs(got - want).max()) for got, want in zip(trained.weights, expected)))
    print(f"{device}: largest difference, together vs alone: {worst:.1e}")
    assert worst <= 1e-5
    empty = together[-1]
    assert empty.result.steps == 0 and all(np.array_equal(a, b) for a, b in zip(empty.weights, weights))


def test_homes_keep_their_own_start_seed_and_momentum():
    """Two homes with the same data but other starting weights and seeds train apart, as they would alone."""
    torch.manual_seed(1)
    first, second = get_weights(cnn()), get_weights(cnn())
    x, y = DIGITS.train.x[:30], DIGITS.train.y[:30]
    work = [HomeJob(x, y, replace(CONFIG, seed=1), first), HomeJob(x, y, replace(CONFIG, seed=2), second)]
    together = train_homes_together(cnn, work)
    for job, trained in zip(work, together):
        expected, _ = alone(job)
        for got, want in zip(trained.weights, expected):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert not np.allclose(together[0].weights[0], together[1].weights[0])


def test_homes_trained_together_need_the_same_settings_but_their_seeds():
    weights = get_weights(cnn())
    work = jobs(weights, sizes=(10, 10))
    work[1] = replace(work[1], config=replace(work[1].config, lr=0.1))
    with pytest.raises(ValueError, match="same settings"):
        train_homes_together(cnn, work)


@pytest.mark.parametrize("name, reason", [("mobilenet_v2", "batch-norm"), ("bert_small", "dropout")])
def test_a_model_with_batch_norm_or_dropout_is_not_batched(name, reason):
    shape, classes = (3, 32, 32), 10
    model = build_model(name, shape, classes)
    assert reason in batching_obstacle(model)
    job = HomeJob(torch.zeros(2, *shape), torch.zeros(2, dtype=torch.long), CONFIG, get_weights(model))
    with pytest.raises(ValueError, match=reason):
        train_homes_together(lambda: build_model(name, shape, classes), [job])
    assert batching_obstacle(cnn()) is None


def tasks(weights, homes, train=None, seeds=None):
    train = train or {"epochs": 1, "lr": 0.05}
    return [TrainTask(home=h, weights=weights, train={**train, "seed": (seeds or {}).get(h, 10 + h)}) for h in homes]


def test_a_dispatch_batches_homes_sent_one_model_with_one_settings():
    global_model, other_model = [np.zeros(3)], [np.zeros(3)]
    work = tasks(global_model, [3, 1, 2]) + tasks(other_model, [4, 5]) + tasks(global_model, [6], {"lr": 0.1})
    batches = dispatch_batches(work, "run.0")
    assert batches[3] == batches[1] == batches[2] == DispatchBatch("run.0.0", (3, 1, 2), (13, 11, 12))
    assert batches[4] == batches[5] == DispatchBatch("run.0.1", (4, 5), (14, 15))
    assert 6 not in batches  # alone with its settings: it trains on its own
    assert batches[2].seed_of(2) == 12


def test_a_home_sent_twice_in_one_dispatch_is_batched_once():
    model = [np.zeros(3)]
    batches = dispatch_batches(tasks(model, [1, 2]) + tasks(model, [1], seeds={1: 99}), "r")
    assert batches[1].homes == (1, 2) and batches[1].seed_of(1) == 11
