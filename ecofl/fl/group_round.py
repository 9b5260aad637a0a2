"""One group's round in flight, and which of its replies count (Eco-FL §5.1).

A group round samples up to k homes of one group and sends them the current
global model. The replies that arrive within its deadline and carry finite
weights of the global model's shapes (and a positive sample count) are
averaged into the group model; the rest are stragglers, failures or
rejected updates, counted in the metrics (failures and rejections by kind:
:mod:`ecofl.fl.home_failures`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ecofl.fl.aggregation import is_finite_and_shaped
from ecofl.fl.home_failures import TRAIN, HomeFailures
from ecofl.fl.transport import Route, TrainReply, TrainTask
from ecofl.weights import Weights


@dataclass
class GroupRound:
    """One group's round in flight: what was sent (enough to send it again) and what came back."""

    group: int
    round: int  # the group's round number
    dispatch: int  # index of the round among all rounds sent (seeds the homes' training)
    start: float  # clock time it was sent at
    version: int  # global version it started from
    homes: tuple[int, ...]
    deadline: float | None  # seconds after start; later replies are stragglers
    weights: Weights  # the global model it was sent
    replies: list[TrainReply] = field(default_factory=list)
    completion: float | None = None  # clock time it completed; None while a wall-clock round waits

    #: The fields that say what was sent (a checkpoint stores them; the weights go beside them).
    SENT = ("group", "round", "dispatch", "start", "version", "homes", "deadline")

    def info(self) -> dict:
        return {k: getattr(self, k) for k in self.SENT}

    @property
    def route(self) -> Route:
        return Route(group=self.group, round=self.round, dispatch=self.dispatch, version=self.version,
                     virtual_time=self.start)

    def task(self, home: int, train: dict, seed: int) -> TrainTask:
        """Home ``home``'s task: the round's model, ``train`` with a seed of its own (run seed, dispatch, home)."""
        task_seed = (seed * 1_000_003 + self.dispatch * 10_007 + home) % 2**31
        return TrainTask(home=home, weights=self.weights, train={**train, "seed": task_seed}, route=self.route)

    def arrived(self) -> list[TrainReply]:
        """Replies within the deadline (all of them without one)."""
        return [x for x in self.replies if self.deadline is None or x.latency_s <= self.deadline]


@dataclass(frozen=True)
class ScreenedReplies:
    """A completed round's replies sorted into what is averaged and what is counted."""

    valid: list[TrainReply]
    failed: int
    rejected: int
    stragglers: int


def screen_replies(r: GroupRound, reference: Weights, failures: HomeFailures) -> ScreenedReplies:
    """Keep the arrived replies without an error whose weights are finite, shaped like ``reference``,
    and trained on at least one sample; count the others in ``failures`` by kind."""
    arrived = r.arrived()
    valid, failed, rejected = [], 0, 0
    for reply in arrived:
        if reply.error is not None:
            failed += 1
            failures.record(f"{TRAIN}{reply.failure}", f"home {reply.home}", reply.error)
            continue
        reason = is_finite_and_shaped(reply.weights, reference)
        if reason is None and reply.num_samples <= 0:
            reason = f"{reply.num_samples} samples"
        if reason is not None:
            rejected += 1
            failures.record("update:rejected", f"home {reply.home}", reason)
            continue
        valid.append(reply)
    failures.trained += len(valid)
    return ScreenedReplies(valid, failed, rejected, stragglers=len(r.homes) - len(arrived))
