"""Many homes' local training as one vectorised computation, each home exactly as it would train alone.

A dispatch of the server's event loop sends the same global model to k
homes (a group round's sample; FedAvg's 20). Trained one after another, each
home runs a few dozen small steps that leave an accelerator mostly idle.
:func:`train_homes_together` stacks the homes' parameters along a new first
dimension and takes every home's step at once with ``torch.func``
(``functional_call`` + ``grad_and_value`` + ``vmap``), the way FedJAX maps a
round's clients over the accelerator (``for_each_client``).

Each home keeps everything of its own: its parameters, its data and the
order its seeded generator draws (the same ``torch.randperm`` calls as
:func:`ecofl.train.train_local`), its FedProx reference (Eco-FL §5.1:
gradient + mu (w - w_ref)) and its SGD momentum buffer. A home with fewer
samples takes fewer or smaller steps: its mini-batch is padded and masked,
and once its own steps are done its parameters and momentum stop changing.
The result equals one-at-a-time training up to float rounding
(``tests/test_batched_training.py``: 1e-5 for the FedAvg CNN with unequal
homes, FedProx and momentum).

A model whose training step is not a pure function of its parameters and
its mini-batch cannot be batched exactly: batch-norm's running statistics
(buffers updated in the forward pass) and dropout's random masks.
:func:`batching_obstacle` names the reason; callers then train one home at a
time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from ecofl.accelerator import host_array
from ecofl.train import TrainResult
from ecofl.train_config import TrainConfig
from ecofl.weights import Weights

#: Module types that draw random numbers in training mode.
RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class HomeJob:
    """One home's share of a batched dispatch: its data, its settings (seed included) and its starting weights."""

    x: torch.Tensor
    y: torch.Tensor
    config: TrainConfig
    weights: Weights  # the model's state in ``state_dict`` order (the global model it was sent)


@dataclass(frozen=True)
class HomeTrained:
    weights: Weights
    result: TrainResult


def batching_obstacle(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained batched exactly, or None when it can."""
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        return f"it has buffers updated while training (e.g. {buffers[0]}: batch-norm running statistics)"
    random = [name for name, m in model.named_modules() if isinstance(m, RANDOM_MODULES) and m.p > 0]
    if random:
        return f"it draws random numbers while training ({random[0]}: dropout)"
    return None


def _shared_settings(configs: Sequence[TrainConfig]) -> TrainConfig:
    """The settings every home shares (all but the seed); a ValueError when they differ."""
    first = replace(configs[0], seed=0)
    for config in configs[1:]:
        if replace(config, seed=0) != first:
            raise ValueError(f"homes trained together need the same settings but their seeds: {first} vs {config}")
    return first


def _step_indices(
    jobs: Sequence[HomeJob], batch_size: int, epochs: int
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Each home's mini-batches as indices into the homes' concatenated samples.

    Returns ``index[h, t, i]`` (padded with 0), ``mask[h, t, i]`` (1 for a real
    sample) and each home's step count. Home h's order is drawn exactly as
    :func:`ecofl.train.train_local` draws it: one generator seeded with the
    home's seed, one ``randperm`` per epoch.
    """
    offsets = [0]
    for job in jobs:
        offsets.append(offsets[-1] + len(job.y))
    steps = [epochs * math.ceil(len(job.y) / batch_size) for job in jobs]
    index = torch.zeros(len(jobs), max(steps, default=0), batch_size, dtype=torch.long)
    mask = torch.zeros(index.shape)
    for h, job in enumerate(jobs):
        generator = torch.Generator().manual_seed(job.config.seed)
        t = 0
        for _ in range(epochs):
            order = torch.randperm(len(job.y), generator=generator) + offsets[h]
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                index[h, t, : len(batch)] = batch
                mask[h, t, : len(batch)] = 1.0
                t += 1
    return index, mask, steps


def train_homes_together(
    model_fn: Callable[[], nn.Module], jobs: Sequence[HomeJob], device: torch.device | str = "cpu"
) -> list[HomeTrained]:
    """Train every home of ``jobs`` on ``device`` as one vectorised computation; results in ``jobs``' order.

    Each home's result (weights, mean loss, samples, steps) is what
    :func:`ecofl.train.train_local` gives for it alone: the mini-batch mean
    cross-entropy, plus FedProx's mu (w - w_ref) with the received weights as
    reference, then SGD with the settings' momentum and weight decay (the
    operations of ``torch.optim.SGD``, in its order). ``micro_batches`` splits
    a mini-batch without changing its gradient, so it is not needed here.
    Raises ValueError for a model :func:`batching_obstacle` rejects or for
    homes whose settings differ in more than their seed.
    """
    if not jobs:
        return []
    model = model_fn()
    obstacle = batching_obstacle(model)
    if obstacle is not None:
        raise ValueError(f"cannot train homes together: {obstacle}")
    config = _shared_settings([job.config for job in jobs])
    for job in jobs:
        if len(job.x) != len(job.y):
            raise ValueError(f"{len(job.x)} inputs but {len(job.y)} labels")
    device = torch.device(device)
    model = model.to(device).train()
    names = [name for name, _ in model.named_parameters()]
    if len(jobs[0].weights) != len(names):
        raise ValueError(f"expected {len(names)} arrays (the model's parameters), got {len(jobs[0].weights)}")
    params = {
        name: torch.stack([torch.as_tensor(job.weights[i], dtype=torch.float32) for job in jobs]).to(device)
        for i, name in enumerate(names)
    }
    reference = {name: p.clone() for name, p in params.items()}
    momentum: dict[str, torch.Tensor] = {}
    x = torch.cat([job.x for job in jobs]).to(device)
    y = torch.cat([job.y for job in jobs]).to(device)
    index, mask, steps = _step_indices(jobs, config.batch_size, config.epochs)
    index, mask = index.to(device), mask.to(device)
    counts = mask.sum(dim=2)  # samples in each home's step t (0 once its steps are done)
    total_loss = torch.zeros(len(jobs), dtype=torch.float64, device=device)

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, mb: torch.Tensor, n: torch.Tensor):
        logits = functional_call(model, p, (xb,))
        return (F.cross_entropy(logits, yb, reduction="none") * mb).sum() / n.clamp(min=1.0)

    step = vmap(grad_and_value(loss))
    for t in range(index.shape[1]):
        rows = index[:, t]
        grads, losses = step(params, x[rows], y[rows], mask[:, t], counts[:, t])
        active = counts[:, t] > 0
        total_loss += (losses * counts[:, t]).double()
        for name, p in params.items():
            g = grads[name]
            if config.mu > 0:  # ecofl.train.add_proximal_gradient
                g = g.add(p, alpha=config.mu).add(reference[name], alpha=-config.mu)
            if config.weight_decay != 0:
                g = g.add(p, alpha=config.weight_decay)
            if config.momentum != 0:
                buf = momentum.get(name)
                buf = g.clone() if buf is None else torch.where(_along(active, g), buf.mul(config.momentum).add(g), buf)
                momentum[name] = buf
                g = buf
            params[name] = torch.where(_along(active, p), p.add(g, alpha=-config.lr), p)
    losses = total_loss.cpu().tolist()
    out = []
    for h, job in enumerate(jobs):
        weights = [host_array(params[name][h]).copy() for name in names]
        seen = len(job.y) * config.epochs
        result = TrainResult(loss=losses[h] / max(seen, 1), num_samples=len(job.y), steps=steps[h])
        out.append(HomeTrained(weights, result))
    return out


def _along(active: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``active`` (one flag per home) shaped to broadcast over a stacked tensor ``like``."""
    return active.view(-1, *([1] * (like.dim() - 1)))
