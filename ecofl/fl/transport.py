"""What the server's event loop exchanges with homes, independent of Flower.

The event loop (``ecofl.fl.loop``) talks to homes only through a
:class:`Transport`: the Flower ServerApp implements it over ``Grid``
push/pull messages, tests implement it in-process. Replies may come back in
any order and may be missing (a straggler or a dead home). A transport that
can be stopped while it waits raises :class:`RunStopped`; the loop then
writes what it has and ends.

Two ways to train: on the virtual clock the loop calls :meth:`Transport.train`
and orders what it applies by the virtual completion times the replies
report, so results do not depend on the order a transport returns them in;
on the wall clock it calls :meth:`Transport.submit` and then
:meth:`Transport.collect` replies as they arrive, applying each group round
the moment its last home answers. A transport whose ``trains_in_background``
is true (a real one; not an emulation that waits out each latency) is also
used that way on the virtual clock when the loop foresees the completions
(``ecofl.fl.foreseen_rounds``), so the rounds in flight train side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ecofl.weights import Weights


@dataclass(frozen=True)
class HomeReport:
    """A home's answer to the profiling query (Eco-FL §5.2 "Profiling")."""

    home: int  # partition id of the home
    latency_s: float  # response latency of one training round L_n
    label_histogram: np.ndarray  # samples per class pi_n (counts)
    num_samples: int


@dataclass(frozen=True)
class Route:
    """Where a task belongs: the group round that sent it (the server's bookkeeping, not training settings).

    Only ``virtual_time`` travels to the home (its latency on the virtual
    clock depends on when the round was sent); the rest stays with the task
    on the server, which files each reply with its round.
    """

    group: int = 0
    round: int = 0  # the group's round number
    dispatch: int = 0  # index of the round among all rounds sent
    version: int = 0  # global model version the round started from
    virtual_time: float = 0.0  # clock time the round was sent at


@dataclass(frozen=True)
class TrainTask:
    """Train ``home`` from ``weights`` (the current global model) with hyper-parameters ``train``."""

    home: int
    weights: Weights
    train: dict = field(default_factory=dict)  # ecofl.train.TrainConfig fields: epochs, batch_size, lr, mu, seed
    route: Route = Route()


#: ``TrainReply.failure`` of a task the transport gave up waiting for (its reply timeout passed).
TIMEOUT = "timeout"


@dataclass(frozen=True)
class TrainReply:
    """A home's trained weights, or the error it reported instead."""

    home: int
    weights: Weights | None
    num_samples: int
    loss: float
    latency_s: float
    error: str | None = None
    failure: str = "error"  # with an error: its kind (timeout, crashed, pipeline_failed, ...; ecofl.fl.home_failures)


class RunStopped(Exception):
    """The run was asked to stop (Ctrl-C) while the transport waited for homes."""


class Transport(Protocol):
    """How the event loop reaches homes."""

    #: Whether :meth:`submit` returns while the homes train (a transport without the attribute: no).
    trains_in_background: bool

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        """Profile ``homes`` at ``virtual_time``; homes that do not answer are left out of the result."""
        ...

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        """Run ``tasks`` concurrently and wait for them; replies in any order, missing ones timed out."""
        ...

    def submit(self, tasks: Sequence[TrainTask], batched: bool = False) -> None:
        """Send ``tasks`` and return at once; their replies come from :meth:`collect`. ``batched``: the tasks
        are one dispatch, which may train together (as :meth:`train`'s; ``ecofl.fl.dispatch_batch``)."""
        ...

    def collect(self, wait_s: float | None) -> list[tuple[TrainTask, TrainReply]]:
        """Replies that arrived for submitted tasks, each with its task.

        Waits at most ``wait_s`` seconds (None: the transport's own reply
        timeout) for the first one. A task left unanswered past the reply
        timeout comes back once, as a reply with an error.
        """
        ...
