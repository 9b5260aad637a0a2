"""The server's evaluation of the global model on the test split, where the server has an accelerator.

Flower-free, so the in-process simulation (``benchmarks/sim_speed.py`` on a
machine without Flower) scores models exactly as the ServerApp does.
"""

from __future__ import annotations

import time

import torch

from ecofl.accelerator import resolve_device
from ecofl.data import CONFIG_OPTIONS, load_dataset
from ecofl.errors import UserError
from ecofl.models import build_model
from ecofl.train import evaluate
from ecofl.weights import Weights, get_weights, set_weights
from server.config import Experiment


class GlobalEvaluator:
    """Test loss and accuracy of global weights on the (seeded subset of the) test split.

    It runs on the server's accelerator where it has one: the device the
    setup names, resolved in this process (``auto`` and a ``cuda`` this
    process lacks both mean its accelerator if any, else the CPU).
    """

    def __init__(self, exp: Experiment) -> None:
        dataset = load_dataset(**exp.setup.dataset, options=CONFIG_OPTIONS)
        x, y = dataset.test.x, dataset.test.y
        samples = exp.server.eval_samples
        if samples is not None and samples < len(y):
            keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(exp.setup.seed))[:samples]
            x, y = x[keep], y[keep]
        options = exp.setup.model.get("options") or {}
        torch.manual_seed(exp.setup.seed)
        self.model = build_model(exp.setup.model["name"], dataset.input_shape, dataset.num_classes, **options)
        self.initial = get_weights(self.model)
        self.device = server_device(exp.setup.device)
        self.model.to(self.device)
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.seconds = 0.0  # wall seconds spent evaluating

    def initial_weights(self) -> Weights:
        """The seeded initial global model."""
        return [w.copy() for w in self.initial]

    def __call__(self, weights: Weights) -> tuple[float, float]:
        started = time.perf_counter()
        set_weights(self.model, weights)
        result = evaluate(self.model, self.x, self.y)
        self.seconds += time.perf_counter() - started
        return result.loss, result.accuracy


def server_device(spec: str) -> torch.device:
    """Where the server evaluates: ``spec`` resolved here, or this process's accelerator (else the CPU) where
    it lacks the one ``spec`` names (the homes' device is checked where they train)."""
    try:
        return resolve_device(spec, "simulation.device")
    except UserError:
        return resolve_device("auto")
