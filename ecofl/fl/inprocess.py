"""A :class:`~ecofl.fl.transport.Transport` that trains every home in this process (tests, benchmarks).

Each home is a partition of one dataset; ``train`` builds the model, loads
the task's weights, runs :func:`ecofl.train.train_local` with the task's
settings (FedProx ``mu`` included) and reports the latency the home's latency
model gives at the task's ``virtual_time``, exactly what a simulated Flower
ClientApp does, minus Flower. For the wall clock, ``submit`` and ``collect``
emulate that latency in real time: a task's reply is due its latency after it
was submitted, and ``collect`` trains and returns the tasks that are due.

Homes train on ``device``; with ``batch_homes`` the homes of one ``train``
call that share a model and settings (:mod:`ecofl.fl.dispatch_batch`) train
as one computation (:mod:`ecofl.batched_training`), as a simulated dispatch
does behind its ClientApps (``client/dispatch_batches.py``); a model that
cannot be batched exactly trains one home at a time. The wall clock's
``collect`` always trains homes one at a time.

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

from ecofl.accelerator import device_label, host_array
from ecofl.allocator import keep_freed_memory
from ecofl.batched_training import HomeJob, HomeTrained, batching_obstacle, train_homes_together
from ecofl.fl.dispatch_batch import dispatch_batches
from ecofl.fl.latency import LatencyModel
from ecofl.fl.transport import TIMEOUT, HomeReport, TrainReply, TrainTask
from ecofl.train import TrainConfig, train_local
from ecofl.weights import get_weights, set_weights

TRAIN_KEYS = {f.name for f in fields(TrainConfig)}


class InProcessTransport:
    #: ``submit`` emulates each latency in real time: the virtual clock's loop calls ``train`` instead.
    trains_in_background = False

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
        device: torch.device | str = "cpu",
        batch_homes: bool = False,
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
        self.device = torch.device(device)
        keep_freed_memory()  # homes train in this process, as in a simulated ClientApp's (ecofl.allocator)
        self.batch_homes = batch_homes and batching_obstacle(model_fn()) is None
        self.tasks_run = 0
        self.batched_run = 0  # of tasks_run, trained with their dispatch batch
        self._due: list[tuple[float, int, TrainTask]] = []  # (monotonic due time, submit order, task)
        self._submitted = 0

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        t = virtual_time
        reports = [
            HomeReport(
                home=h,
                latency_s=self.latency_model.latency(h, t),
                label_histogram=np.bincount(host_array(self.y[self.parts[h]]), minlength=self.num_classes),
                num_samples=len(self.parts[h]),
            )
            for h in homes
            if h not in self.silent_homes
        ]
        return self._ordered(reports)

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        tasks = [task for task in tasks if task.home not in self.silent_homes]
        trained = self._train_batches(tasks) if self.batch_homes else {}
        replies = [self._train_one(task, trained.get(id(task))) for task in tasks]
        return self._ordered(replies)

    def placement(self) -> dict:
        """Where the homes trained, for summary.json (see ``server.transport_times.TransportTimes.placement``)."""
        return {"device": device_label(self.device), "batch_homes": self.batched_run > 0}

    def _train_batches(self, tasks: Sequence[TrainTask]) -> dict[int, HomeTrained]:
        """The trained weights of every task that trains with its dispatch batch, by ``id(task)``."""
        batches = dispatch_batches([t for t in tasks if t.home not in self.failing_homes], "inprocess")
        members: dict[str, list[TrainTask]] = {}
        for task in tasks:
            batch = batches.get(task.home)
            if batch is not None and task.train.get("seed", 0) == batch.seed_of(task.home):
                members.setdefault(batch.id, []).append(task)
        out: dict[int, HomeTrained] = {}
        for batch_tasks in members.values():
            jobs = [HomeJob(self.x[self.parts[t.home]], self.y[self.parts[t.home]], _config(t), t.weights)
                    for t in batch_tasks]
            out.update(zip(map(id, batch_tasks), train_homes_together(self.model_fn, jobs, self.device)))
        return out

    def submit(self, tasks: Sequence[TrainTask], batched: bool = False) -> None:
        """Each task's reply is due its latency from now (``batched`` aside: the emulation trains homes alone)."""
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
                          error=f"no reply within {self.reply_timeout_s:g} s", failure=TIMEOUT)

    def _train_one(self, task: TrainTask, batched: HomeTrained | None = None) -> TrainReply:
        """Task ``task``'s reply: its batch's result ``batched`` where it has one, else trained here alone."""
        latency = self.latency_model.latency(task.home, task.route.virtual_time)
        part = self.parts[task.home]
        if task.home in self.failing_homes:
            return TrainReply(task.home, None, len(part), float("nan"), latency, error="injected failure",
                              failure="injected")
        if batched is None:
            model = self.model_fn()
            set_weights(model, task.weights)
            result = train_local(model.to(self.device), self.x[part], self.y[part], _config(task))
            weights = get_weights(model)
        else:
            result, weights = batched.result, batched.weights
            self.batched_run += 1
        self.tasks_run += 1
        if task.home in self.nan_homes:
            weights = [np.full_like(w, np.nan) if np.issubdtype(w.dtype, np.floating) else w for w in weights]
        return TrainReply(task.home, weights, result.num_samples, result.loss, latency)

    def _ordered(self, items: list) -> list:
        if self.shuffle is not None:
            return [items[i] for i in self.shuffle.permutation(len(items))]
        return items


def _config(task: TrainTask) -> TrainConfig:
    """The task's :class:`TrainConfig` (its training settings; routing and other keys left out)."""
    return TrainConfig(**{k: v for k, v in task.train.items() if k in TRAIN_KEYS})
