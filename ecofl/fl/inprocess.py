"""A :class:`~ecofl.fl.transport.Transport` that trains every home in this process (tests, benchmarks).

Each home is a partition of one dataset; ``train`` builds the model, loads
the task's weights, runs :func:`ecofl.train.train_local` with the task's
settings (FedProx ``mu`` included) and reports the latency the home's latency
model gives at the task's ``virtual_time``, exactly what a simulated Flower
ClientApp does, minus Flower. For the wall clock, ``submit`` and ``collect``
emulate that latency in real time: a task's reply is due its latency after it
was submitted, and ``collect`` trains and returns the tasks that are due.

For tests: ``shuffle_replies_seed`` returns replies in a random order (the
loop must not care), ``nan_homes`` answer with NaN weights, ``failing_homes``
with an error, ``silent_homes`` not at all (both sets may be changed between
calls).
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Callable, Collection, Sequence

import numpy as np
import torch

from ecofl.fl.latency import LatencyModel
from ecofl.fl.transport import HomeReport, TrainReply, TrainTask
from ecofl.train import TrainConfig, train_local
from ecofl.weights import get_weights, set_weights

TRAIN_KEYS = {f.name for f in fields(TrainConfig)}


class InProcessTransport:
    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        dataset_x: torch.Tensor,
        dataset_y: torch.Tensor,
        parts: Sequence[np.ndarray],
        latency_model: LatencyModel,
        shuffle_replies_seed: int | None = None,
        num_classes: int | None = None,
        nan_homes: Collection[int] = (),
        failing_homes: Collection[int] = (),
        silent_homes: Collection[int] = (),
        reply_timeout_s: float = 60.0,
    ):
        self.model_fn = model_fn
        self.x = dataset_x
        self.y = dataset_y
        self.parts = [torch.as_tensor(np.asarray(p), dtype=torch.long) for p in parts]
        self.latency_model = latency_model
        self.num_classes = num_classes or int(dataset_y.max()) + 1
        self.shuffle = np.random.default_rng(shuffle_replies_seed) if shuffle_replies_seed is not None else None
        self.nan_homes = set(nan_homes)
        self.failing_homes = set(failing_homes)
        self.silent_homes = set(silent_homes)
        self.reply_timeout_s = reply_timeout_s
        self.tasks_run = 0
        self._due: list[tuple[float, int, TrainTask]] = []  # (monotonic due time, submit order, task)
        self._submitted = 0

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        t = virtual_time
        reports = [
            HomeReport(
                home=h,
                latency_s=self.latency_model.latency(h, t),
                label_histogram=np.bincount(self.y[self.parts[h]].numpy(), minlength=self.num_classes),
                num_samples=len(self.parts[h]),
            )
            for h in homes
            if h not in self.silent_homes
        ]
        return self._ordered(reports)

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        replies = [self._train_one(task) for task in tasks if task.home not in self.silent_homes]
        return self._ordered(replies)

    def submit(self, tasks: Sequence[TrainTask]) -> None:
        now = time.monotonic()
        for task in tasks:
            silent = task.home in self.silent_homes
            delay = self.reply_timeout_s if silent else self.latency_model.latency(task.home, task.route.virtual_time)
            self._due.append((now + delay, self._submitted, task))
            self._submitted += 1
        self._due.sort(key=lambda item: item[:2])

    def collect(self, wait_s: float | None) -> list[tuple[TrainTask, TrainReply]]:
        if not self._due:
            return []
        first_due = self._due[0][0]
        limit = self.reply_timeout_s if wait_s is None else wait_s
        time.sleep(max(0.0, min(first_due - time.monotonic(), limit)))
        now = time.monotonic()
        due = [task for at, _, task in self._due if at <= now]
        self._due = [item for item in self._due if item[0] > now]
        return [(task, self._late(task) if task.home in self.silent_homes else self._train_one(task)) for task in due]

    def _late(self, task: TrainTask) -> TrainReply:
        return TrainReply(task.home, None, 0, float("nan"), float("nan"),
                          error=f"no reply within {self.reply_timeout_s:g} s")

    def _train_one(self, task: TrainTask) -> TrainReply:
        latency = self.latency_model.latency(task.home, task.route.virtual_time)
        part = self.parts[task.home]
        if task.home in self.failing_homes:
            return TrainReply(task.home, None, len(part), float("nan"), latency, error="injected failure")
        model = self.model_fn()
        set_weights(model, task.weights)
        config = TrainConfig(**{k: v for k, v in task.train.items() if k in TRAIN_KEYS})
        result = train_local(model, self.x[part], self.y[part], config)
        self.tasks_run += 1
        weights = get_weights(model)
        if task.home in self.nan_homes:
            weights = [np.full_like(w, np.nan) if np.issubdtype(w.dtype, np.floating) else w for w in weights]
        return TrainReply(task.home, weights, result.num_samples, result.loss, latency)

    def _ordered(self, items: list) -> list:
        if self.shuffle is not None:
            return [items[i] for i in self.shuffle.permutation(len(items))]
        return items
