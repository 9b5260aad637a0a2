"""The homes of one dispatch trained together behind their ClientApps; each home stays one node and one message.

The server names, in each home's train message, the homes and seeds of the
dispatch batch it belongs to (:mod:`ecofl.fl.dispatch_batch`). The first
message of a batch that reaches this process trains every home of the batch
at once (:func:`ecofl.batched_training.train_homes_together`, on the
process's device) from that message's weights and settings, and keeps the
other homes' results; each later message of the batch takes its own result
after checking that it was sent the same weights, settings and seed. Anything
else trains alone, so a home never gets another home's answer: a message
without a batch, a home the batch does not hold, a batch this process has
already handed out or let go, a model that cannot be batched exactly.

Every home's data is in every process (:class:`client.federation.Federation`),
so the first message is enough. One process should serve a whole batch:
with several Ray actors each trains the batches whose first message it
gets, and a batch split over two actors is trained twice (the same result,
twice the work). ``simulations.run`` therefore runs one actor per
accelerator when homes are batched.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from client.federation import Federation
from ecofl.batched_training import HomeJob, HomeTrained, train_homes_together
from ecofl.fl.dispatch_batch import DispatchBatch
from ecofl.fl.federation_setup import PipelineHomeSettings
from ecofl.train import TrainConfig, TrainResult, train_local
from ecofl.weights import Weights, get_weights, set_weights

#: Batches kept in a process at most; the oldest is let go first (its homes then train alone). More than the
#: dispatches a run keeps in flight (one per group with a round out; loop.max_concurrent homes at most), whose
#: messages may reach a process interleaved now that the rounds in flight train side by side.
CAPACITY = 32
#: Ids of batches trained here that are remembered (so a late home of one trains alone, not the batch again).
REMEMBERED = 4096


@dataclass(frozen=True)
class HomeUpdate:
    """What one home's training gave, and how: with its dispatch (``batched``) or alone; the wall seconds it
    took (a batch's seconds are shared equally by its homes)."""

    weights: Weights
    result: TrainResult
    batched: bool
    seconds: float


@dataclass
class _Batch:
    weights: Weights  # the model the batch was trained from
    settings: TrainConfig  # its settings, seed 0
    seeds: dict[int, int]  # each home's seed in the batch
    results: dict[int, HomeTrained]  # homes not yet handed out
    seconds_each: float

    def take(self, home: int, weights: Weights, config: TrainConfig) -> HomeTrained | None:
        """Home ``home``'s result when it was trained from what it was sent; else None."""
        if home not in self.results or self.seeds[home] != config.seed or replace(config, seed=0) != self.settings:
            return None
        if len(weights) != len(self.weights) or not all(np.array_equal(a, b) for a, b in zip(weights, self.weights)):
            return None
        return self.results.pop(home)


class DispatchBatches:
    """This process's dispatch batches (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._batches: OrderedDict[str, _Batch] = OrderedDict()
        self._trained: OrderedDict[str, None] = OrderedDict()  # ids of batches trained here, newest last
        self._lock = threading.Lock()

    def train(
        self, fed: Federation, home: int, weights: Weights, config: TrainConfig, batch: DispatchBatch | None
    ) -> HomeUpdate:
        """Home ``home``'s update from ``weights``: its batch's result where it has one, else trained alone."""
        if batch is None or not fed.batches_homes or home not in batch.homes or batch.seed_of(home) != config.seed:
            return train_alone(fed, home, weights, config)
        with self._lock:
            if batch.id not in self._trained:
                self._train_batch(fed, batch, weights, config)
            entry = self._batches.get(batch.id)
            taken = None if entry is None else entry.take(home, weights, config)
            if entry is not None and not entry.results:
                del self._batches[batch.id]
        if taken is None:
            return train_alone(fed, home, weights, config)
        return HomeUpdate(taken.weights, taken.result, batched=True, seconds=entry.seconds_each)

    def _train_batch(self, fed: Federation, batch: DispatchBatch, weights: Weights, config: TrainConfig) -> None:
        pipeline = PipelineHomeSettings.from_dict(fed.setup.pipeline_home)
        homes = [h for h in batch.homes if not pipeline.selects(h)]  # pipeline homes train through their devices
        jobs = []
        for home in homes:
            data = fed.home(home)
            jobs.append(HomeJob(data.x, data.y, replace(config, seed=batch.seed_of(home)), weights))
        started = time.perf_counter()
        trained = train_homes_together(fed.new_model, jobs, fed.device)
        seconds = time.perf_counter() - started
        self._batches[batch.id] = _Batch(
            weights=weights, settings=replace(config, seed=0), seeds=dict(zip(batch.homes, batch.seeds)),
            results=dict(zip(homes, trained)), seconds_each=seconds / max(len(homes), 1),
        )
        self._trained[batch.id] = None
        while len(self._batches) > self.capacity:
            self._batches.popitem(last=False)
        while len(self._trained) > REMEMBERED:
            self._trained.popitem(last=False)


def train_alone(fed: Federation, home: int, weights: Weights, config: TrainConfig) -> HomeUpdate:
    """Home ``home`` trained by itself from ``weights`` on the process's device (:func:`ecofl.train.train_local`)."""
    model = fed.new_model()
    set_weights(model, weights)
    model.to(fed.device)
    data = fed.home(home)
    started = time.perf_counter()
    result = train_local(model, data.x, data.y, config)
    trained = get_weights(model)  # copied to the host: the clock stops after the device's work is done
    return HomeUpdate(trained, result, batched=False, seconds=time.perf_counter() - started)
