"""A dispatch's homes trained together behind their ClientApps: the first message trains the batch, the others
take their own result, and anything that does not match trains alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from client.dispatch_batches import DispatchBatches, train_alone
from client.federation import federation
from ecofl.fl.dispatch_batch import DispatchBatch
from ecofl.fl.federation_setup import FederationSetup
from ecofl.train import TrainConfig
from ecofl.weights import get_weights

CONFIG = TrainConfig(epochs=2, batch_size=10, lr=0.05, momentum=0.5, mu=0.05)


def fed(batch_homes="on", model="cnn"):
    return federation(FederationSetup(num_homes=20, dataset={"name": "digits"}, model={"name": model, "options": {}},
                                      batch_homes=batch_homes).to_json())


def start(f) -> list[np.ndarray]:
    torch.manual_seed(0)
    return get_weights(f.new_model())


BATCH = DispatchBatch("test.0", (4, 1, 7), (40, 10, 70))


def config_of(home: int) -> TrainConfig:
    return replace(CONFIG, seed=BATCH.seed_of(home))


def assert_close(a, b, atol=1e-5):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def test_the_first_message_trains_the_batch_and_every_home_gets_what_it_would_get_alone():
    f, batches = fed(), DispatchBatches()
    weights = start(f)
    updates = {home: batches.train(f, home, weights, config_of(home), BATCH) for home in (1, 4, 7)}
    assert all(u.batched for u in updates.values())
    assert not batches._batches  # every result handed out: nothing kept
    for home, update in updates.items():
        expected = train_alone(f, home, weights, config_of(home))
        assert update.result.num_samples == expected.result.num_samples
        assert update.result.loss == pytest.approx(expected.result.loss, abs=1e-5)
        assert_close(update.weights, expected.weights)


def test_a_home_sent_other_weights_settings_or_seed_trains_alone():
    f, batches = fed(), DispatchBatches()
    weights = start(f)
    batches.train(f, 4, weights, config_of(4), BATCH)
    other = [w + 0.01 for w in weights]
    odd = batches.train(f, 1, other, config_of(1), BATCH)
    assert not odd.batched
    assert_close(odd.weights, train_alone(f, 1, other, config_of(1)).weights, atol=0)
    assert not batches.train(f, 7, weights, replace(config_of(7), lr=0.1), BATCH).batched
    assert not batches.train(f, 7, weights, replace(config_of(7), seed=5), BATCH).batched
    assert not batches.train(f, 9, weights, replace(CONFIG, seed=90), BATCH).batched  # not in the batch


def test_no_batch_when_off_without_a_batch_or_for_a_model_with_batch_norm():
    weights = start(fed())
    assert not DispatchBatches().train(fed("off"), 4, weights, config_of(4), BATCH).batched
    assert not DispatchBatches().train(fed(), 4, weights, config_of(4), None).batched
    resnet = fed(model="resnet18")
    assert not resnet.batches_homes
    assert not DispatchBatches().train(resnet, 4, start(resnet), config_of(4), BATCH).batched


def test_auto_batches_only_on_an_accelerator():
    assert fed("auto").batches_homes == (fed("auto").device.type == "cuda")


def test_the_oldest_batch_is_let_go_beyond_the_capacity_and_its_homes_then_train_alone():
    f, batches = fed(), DispatchBatches(capacity=1)
    weights = start(f)
    batches.train(f, 4, weights, config_of(4), BATCH)
    second = DispatchBatch("test.1", (2, 3), (20, 30))
    batches.train(f, 2, weights, replace(CONFIG, seed=20), second)
    assert list(batches._batches) == ["test.1"]
    assert not batches.train(f, 1, weights, config_of(1), BATCH).batched
