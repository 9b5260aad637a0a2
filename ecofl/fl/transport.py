"""What the server's event loop exchanges with homes, independent of Flower.

The event loop (``ecofl.fl.loop``) talks to homes only through a
:class:`Transport`: the Flower ServerApp implements it over ``Grid``
push/pull messages, tests implement it in-process. Replies may come back in
any order and may be missing (a straggler or a dead home); the loop orders
what it applies by virtual completion time, so results do not depend on the
order a transport returns them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

Weights = list[np.ndarray]


@dataclass(frozen=True)
class HomeReport:
    """A home's answer to the profiling query (Eco-FL §5.2 "Profiling")."""

    home: int  # partition id of the home
    latency_s: float  # response latency of one training round L_n
    label_histogram: np.ndarray  # samples per class pi_n (counts)
    num_samples: int


@dataclass(frozen=True)
class TrainTask:
    """Train ``home`` from ``weights`` (the current global model) with ``config``."""

    home: int
    weights: Weights
    config: dict = field(default_factory=dict)  # epochs, batch_size, lr, mu, seed, round, ...


@dataclass(frozen=True)
class TrainReply:
    """A home's trained weights, or the error it reported instead."""

    home: int
    weights: Weights | None
    num_samples: int
    loss: float
    latency_s: float
    error: str | None = None


class Transport(Protocol):
    """How the event loop reaches homes."""

    def query(self, homes: Sequence[int], config: dict) -> list[HomeReport]:
        """Profile ``homes``; homes that do not answer are left out of the result."""
        ...

    def train(self, tasks: Sequence[TrainTask], timeout_s: float | None = None) -> list[TrainReply]:
        """Run ``tasks`` concurrently; replies in any order, missing ones timed out."""
        ...
