"""Local training: FedProx gradient, micro-batch accumulation, evaluation, weights round trip."""

import numpy as np
import pytest
import torch
from torch import nn

from ecofl.errors import UserError
from ecofl.train import TrainConfig, accumulate_gradients, add_proximal_gradient, evaluate, train_local
from ecofl.weights import get_weights, set_weights
from pipeline_kit import proximal_term


def small_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def data(n: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_fedprox_gradient_is_grad_f_plus_mu_times_distance():
    x, y = data()
    model = small_mlp()
    reference = [p.detach().clone() + 0.3 * torch.randn_like(p) for p in model.parameters()]
    mu = 0.7

    accumulate_gradients(model, x, y, micro_batches=1)
    grad_f = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    accumulate_gradients(model, x, y, micro_batches=1)
    add_proximal_gradient(list(model.parameters()), reference, mu)
    closed_form = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    accumulate_gradients(model, x, y, micro_batches=1)
    proximal_term(model, reference, mu).backward()
    for p, g, r, c in zip(model.parameters(), grad_f, reference, closed_form):
        torch.testing.assert_close(p.grad, g + mu * (p.detach() - r), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c, p.grad, atol=1e-6, rtol=1e-5)


def test_proximal_gradient_fills_a_parameter_without_gradient_and_checks_lengths():
    model = small_mlp()
    reference = [p.detach().clone() - 1.0 for p in model.parameters()]
    add_proximal_gradient(list(model.parameters()), reference, 0.5)
    for p in model.parameters():
        torch.testing.assert_close(p.grad, torch.full_like(p, 0.5))
    with pytest.raises(ValueError, match="reference has 1 tensors"):
        add_proximal_gradient(list(model.parameters()), reference[:1], 0.5)


@pytest.mark.parametrize("micro_batches", [2, 3, 4])
def test_accumulation_over_equal_micro_batches_equals_one_full_batch_step(micro_batches):
    x, y = data(n=24)
    full, accumulated = small_mlp(), small_mlp()
    config = TrainConfig(epochs=2, batch_size=12, lr=0.1, momentum=0.9, seed=3)
    train_local(full, x, y, config)
    train_local(accumulated, x, y, TrainConfig(**{**config.__dict__, "micro_batches": micro_batches}))
    for a, b in zip(full.parameters(), accumulated.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_accumulation_differs_from_a_single_micro_batch_when_batches_differ():
    """Guard against the accumulation test passing vacuously (e.g. lr ignored)."""
    x, y = data(n=24)
    a, b = small_mlp(), small_mlp()
    train_local(a, x, y, TrainConfig(epochs=1, batch_size=12, lr=0.1))
    train_local(b, x, y, TrainConfig(epochs=1, batch_size=6, lr=0.1))
    assert any(not torch.allclose(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_proximal_term_pulls_towards_reference():
    x, y = data()
    plain, prox = small_mlp(), small_mlp()
    reference = [p.detach().clone() for p in plain.parameters()]
    train_local(plain, x, y, TrainConfig(epochs=5, batch_size=8, lr=0.2))
    train_local(prox, x, y, TrainConfig(epochs=5, batch_size=8, lr=0.2, mu=5.0), reference)
    distance = lambda m: sum(((p - r) ** 2).sum().item() for p, r in zip(m.parameters(), reference))
    assert distance(prox) < distance(plain)


def test_training_lowers_loss_and_evaluate_reports_accuracy():
    x, y = data(n=60)
    model = small_mlp()
    before = evaluate(model, x, y)
    result = train_local(model, x, y, TrainConfig(epochs=30, batch_size=10, lr=0.2))
    after = evaluate(model, x, y)
    assert result.num_samples == 60 and result.steps == 30 * 6
    assert after.loss < before.loss and 0.0 <= after.accuracy <= 1.0
    assert after.accuracy > before.accuracy


def test_weights_round_trip_and_shape_errors():
    a, b = small_mlp(0), small_mlp(1)
    set_weights(b, get_weights(a))
    for p, q in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(p, q)
    bad = get_weights(a)
    bad[0] = np.zeros((2, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="expected shape"):
        set_weights(b, bad)


def test_invalid_config_is_a_user_error():
    with pytest.raises(UserError):
        TrainConfig(lr=0.0)
