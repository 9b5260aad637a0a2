"""Local training and evaluation of one home's model, in one process.

``train_local`` is what a home computes in a round: ``epochs`` passes over its
data in mini-batches of ``batch_size``, each mini-batch optionally split into
``micro_batches`` whose gradients are accumulated before the one optimizer
step, exactly what a synchronous pipeline's sync-round computes (Eco-FL §4.1:
the weights update once at the pipeline flush). With ``mu > 0`` the loss is
FedProx's h_c(w) = F_c(w) + mu/2 ||w - w_ref||^2 (Eco-FL §5.1, Li et al.),
whose gradient is grad F_c(w) + mu (w - w_ref).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ecofl.train_config import TrainConfig


@dataclass(frozen=True)
class TrainResult:
    loss: float  # mean training loss (without the proximal term) over all samples seen
    num_samples: int  # size of the local dataset |D_c|
    steps: int  # optimizer steps taken


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    num_samples: int


def add_proximal_gradient(params: list[torch.Tensor], reference: list[torch.Tensor], mu: float) -> None:
    """Add the gradient of FedProx's mu/2 ||w - w_ref||^2, mu (w - w_ref), to each ``p.grad`` in place.

    The closed form of the term's gradient (FedProx, Li et al.; Eco-FL §5.1): the
    same update as back-propagating the term, without building its graph over
    every parameter, which cost as much as the model's own backward pass for
    the FedAvg CNN.
    """
    if len(params) != len(reference):
        raise ValueError(f"reference has {len(reference)} tensors, model {len(params)} parameters")
    with torch.no_grad():
        for p, r in zip(params, reference):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.add_(p, alpha=mu).add_(r, alpha=-mu)  # no temporary the size of p


def train_local(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    reference: list[torch.Tensor] | None = None,
) -> TrainResult:
    """Train ``model`` in place on (x, y); ``reference`` defaults to the starting weights.

    Training runs where the model's parameters are (the CPU or an
    accelerator); ``x`` and ``y`` are moved there once. The shuffling order
    comes from a CPU generator seeded with ``config.seed``, so a home draws
    the same mini-batches on every device.
    """
    if len(x) != len(y):
        raise ValueError(f"{len(x)} inputs but {len(y)} labels")
    device = _device_of(model)
    x, y = x.to(device), y.to(device)
    if reference is None:
        reference = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync a step
    seen, steps = 0, 0
    for _ in range(config.epochs):
        order = torch.randperm(len(x), generator=generator).to(device)
        for start in range(0, len(x), config.batch_size):
            batch = order[start : start + config.batch_size]
            total_loss += accumulate_gradients(model, x[batch], y[batch], config.micro_batches) * len(batch)
            seen += len(batch)
            if config.mu > 0:
                add_proximal_gradient(params, reference, config.mu)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    return TrainResult(loss=total_loss.item() / max(seen, 1), num_samples=len(x), steps=steps)


def accumulate_gradients(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batches: int
) -> torch.Tensor:
    """Backward of the mini-batch mean loss as ``micro_batches`` accumulated micro-batch backwards.

    Each micro-batch's summed loss is divided by the mini-batch size, so the
    accumulated gradient equals the full mini-batch's (for models without
    batch-norm; with batch-norm the statistics are per micro-batch, as in a
    pipeline). Returns the mean loss of the mini-batch, a float64 scalar on the model's device (read it with
    ``.item()``; reading it every step would wait for an accelerator every step).
    """
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for x_micro, y_micro in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        loss = F.cross_entropy(model(x_micro), y_micro, reduction="sum") / len(x)
        loss.backward()
        total += loss.detach().double()
    return total


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on (x, y), computed where the model's parameters are."""
    model.eval()
    device = _device_of(model)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size].to(device))
        target = y[start : start + batch_size].to(device)
        loss += F.cross_entropy(logits, target, reduction="sum").double()
        correct += (logits.argmax(dim=1) == target).sum()
    n = max(len(x), 1)
    return EvalResult(loss=loss.item() / n, accuracy=correct.item() / n, num_samples=len(x))


def _device_of(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s parameters live (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device
