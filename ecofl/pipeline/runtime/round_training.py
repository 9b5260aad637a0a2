"""One federated round of a home's local training, computed by its pipeline (the same update as ``train_local``).

A synchronous pipeline's sync-round is one local step: the same update as
gradient accumulation over the mini-batch (docs/architecture.md). To give
:func:`ecofl.train.train_local`'s result for a training task:

* epoch e uses ``torch.randperm(n)`` of a generator seeded with the train
  config's ``seed`` (the e-th draw), cut into mini-batches of ``batch_size``;
* the pipeline for ``batch_size`` runs one sync-round per mini-batch;
* a last partial mini-batch of ``r = n mod batch_size`` samples runs on a
  second pipeline planned for ``r`` (a pipeline's mini-batch size is fixed).
  Each pipeline's ``train`` call starts a fresh SGD optimizer, so switching
  pipelines between steps is exact without momentum and is refused with
  momentum rather than silently differing. Without a partial batch (or with
  ``n < batch_size``) every epoch runs in one call and momentum is kept.

Where the pipelines come from is the caller's: the Flower client starts
local emulated devices (``client/pipeline_training.py``), a home service
asks the device daemons present to join (:mod:`ecofl.deploy.home_service`).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import torch

from ecofl.errors import UserError
from ecofl.pipeline.runtime.portal import HomePipeline
from ecofl.pipeline.runtime.prediction import predict_sync_round
from ecofl.train import TrainConfig
from ecofl.weights import Weights

#: ``open_pipeline(mini_batch_size)``: a not yet entered HomePipeline planned for that mini-batch.
OpenPipeline = Callable[[int], HomePipeline]


@dataclass(frozen=True)
class PipelineTraining:
    """One round of a home's training through the runtime, and what it measured."""

    weights: Weights
    loss: float
    num_samples: int
    steps: int
    pool: str
    start_s: float  # starting and joining the workers
    train_s: float  # from the first weights sent to the last weights collected
    sync_round_s: list[float] = field(default_factory=list)
    micro_batches: int = 1  # of the main plan
    recoveries: int = 0  # devices lost, slowed or joined and recovered from (fault tolerance)
    failures: int = 0  # of which devices lost (killed, frozen or found failed) and recovered from
    predicted_sync_round_s: float | None = None  # the main plan's, predicted as the CLI does (.prediction)

    def metrics(self) -> dict[str, float | int]:
        rounds = self.sync_round_s
        metrics = {
            "pipeline_train_s": self.train_s,
            "pipeline_start_s": self.start_s,
            "pipeline_sync_rounds": len(rounds),
            "pipeline_sync_round_mean_s": sum(rounds) / len(rounds) if rounds else 0.0,
            "pipeline_micro_batches": self.micro_batches,
            "pipeline_recoveries": self.recoveries,
            "pipeline_failures_recovered": self.failures,
        }
        if self.predicted_sync_round_s is not None:
            metrics["pipeline_predicted_sync_round_s"] = self.predicted_sync_round_s
        return metrics


def train_round(open_pipeline: OpenPipeline, weights: Weights, x: torch.Tensor, y: torch.Tensor,
                config: TrainConfig, pool_name: str,
                progress: Callable[[int, float], None] | None = None) -> PipelineTraining:
    """``train_local(model, x, y, config)`` from ``weights``, computed by the pipelines ``open_pipeline`` gives;
    ``progress(r, seconds)`` after each sync-round (:meth:`HomePipeline.train`)."""
    n, batch = len(x), config.batch_size
    full, rest = divmod(n, batch)
    if config.epochs == 0 or n == 0:
        return PipelineTraining(list(weights), 0.0, n, 0, pool_name, 0.0, 0.0)
    if full and rest and config.momentum > 0:
        raise UserError(
            f"pipeline mode keeps train_local's update only without momentum when the {n} samples are not a "
            f"multiple of batch_size {batch} (the partial batch runs on its own pipeline, with a fresh optimizer)"
        )
    generator = torch.Generator().manual_seed(config.seed)
    orders = [torch.randperm(n, generator=generator) for _ in range(config.epochs)]
    if rest == 0 or full == 0:  # every mini-batch has the same size: one call for all epochs
        size, rounds = (batch, config.epochs * full) if rest == 0 else (n, config.epochs)
        segments = [(size, torch.cat(orders), rounds)]
    else:
        segments = [seg for order in orders
                    for seg in ((batch, order[: full * batch], full), (rest, order[full * batch:], 1))]

    loss_sum, seen, round_s, recoveries, failures = 0.0, 0, [], 0, 0
    current = list(weights)
    with ExitStack() as stack:
        started = time.perf_counter()
        pipes = {size: stack.enter_context(open_pipeline(size)) for size in dict.fromkeys(s for s, _, _ in segments)}
        trained = time.perf_counter()
        for size, order, rounds in segments:
            result = pipes[size].train(
                current, x[order], y[order], rounds, lr=config.lr, momentum=config.momentum,
                weight_decay=config.weight_decay, mu=config.mu, reference=list(weights), progress=progress,
            )
            current = list(result.weights)
            loss_sum += result.loss * size * rounds
            seen += size * rounds
            round_s.extend(result.sync_round_s)
            recoveries += len(result.events)
            failures += sum(event["kind"] in ("kill", "freeze", "failure") for event in result.events)
        finished = time.perf_counter()
        main = pipes[segments[0][0]]
        predicted = None if main.profile is None else predict_sync_round(
            main.plan, main.profile, main.layout.pool, main.emulation, cache_dir=main.cache_dir).sync_round_s
    return PipelineTraining(
        weights=current, loss=loss_sum / seen, num_samples=n, steps=len(round_s), pool=pool_name,
        start_s=trained - started, train_s=finished - trained, sync_round_s=round_s,
        micro_batches=main.plan.num_micro_batches, recoveries=recoveries, failures=failures,
        predicted_sync_round_s=predicted,
    )
