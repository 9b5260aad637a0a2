"""The training tasks a transport submitted and has not yet handed back: queued, pushed or undeliverable.

``GridTransport.submit`` queues a dispatch's tasks; at most ``window`` of
them are pushed and unanswered at a time, and the rest go out as replies
come in. A pushed task's reply timeout runs from its push (queueing in the
simulation engine included). A task that could not be delivered, or whose
timeout passed, comes back once as an error reply, so whoever waits on it
never waits forever. Plain bookkeeping: the transport does the pushing and
pulling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flwr.app import Message

from ecofl.fl.dispatch_batch import DispatchBatch
from ecofl.fl.transport import TIMEOUT, TrainReply, TrainTask


class SubmittedTasks:
    """Tasks queued for room in the window, pushed (by message id, with their push time), or undeliverable."""

    def __init__(self, window: int, reply_timeout_s: float) -> None:
        self.window = window
        self.reply_timeout_s = reply_timeout_s
        self.queued: list[tuple[TrainTask, DispatchBatch | None]] = []
        self.pushed: dict[str, tuple[TrainTask, float]] = {}  # message id -> (task, monotonic push time)
        self.undelivered: list[tuple[TrainTask, TrainReply]] = []  # error replies not yet handed back

    def __bool__(self) -> bool:
        return bool(self.queued or self.pushed or self.undelivered)

    def queue(self, tasks: Sequence[TrainTask], batches: dict[int, DispatchBatch]) -> None:
        self.queued += [(task, batches.get(task.home)) for task in tasks]

    def next_to_push(self) -> list[tuple[TrainTask, DispatchBatch | None]]:
        """The queued tasks the window has room for now (taken off the queue)."""
        room = max(0, self.window - len(self.pushed))
        chunk, self.queued = self.queued[:room], self.queued[room:]
        return chunk

    def record_push(self, tasks: Sequence[TrainTask], messages: Sequence[tuple[TrainTask, Message]],
                    pushed_ids: set[str], now: float) -> None:
        """Which of ``tasks`` went out (their ``messages`` whose ids were pushed); the others are undelivered."""
        delivered = set()
        for task, message in messages:
            if message.metadata.message_id in pushed_ids:
                self.pushed[message.metadata.message_id] = (task, now)
                delivered.add(id(task))
        self.undelivered += [
            (task, TrainReply(task.home, None, 0, math.nan, math.nan, error="not delivered: home not connected",
                              failure="not_delivered"))
            for task in tasks if id(task) not in delivered
        ]

    def take_undelivered(self) -> list[tuple[TrainTask, TrainReply]]:
        out, self.undelivered = self.undelivered, []
        return out

    def answered(self, message_id: str) -> TrainTask | None:
        """The task a reply to ``message_id`` answers (no longer outstanding); None for no such task."""
        entry = self.pushed.pop(message_id, None)
        return None if entry is None else entry[0]

    def timed_out(self, now: float) -> list[tuple[TrainTask, TrainReply]]:
        """The pushed tasks whose reply timeout has passed by ``now``, each once, as an error reply."""
        out = []
        for message_id, (task, pushed_at) in list(self.pushed.items()):
            if now - pushed_at > self.reply_timeout_s:
                del self.pushed[message_id]
                out.append((task, TrainReply(task.home, None, 0, math.nan, math.nan,
                                             error=f"no reply within {self.reply_timeout_s:g} s", failure=TIMEOUT)))
        return out
