"""Replication off the critical path: a stage's replica travels while the stage computes.

Asteroid §3.4 backs every single-device stage up on a device of the next
stage; here on a device of each neighbouring stage
(:mod:`ecofl.pipeline.replication` says who backs up whom). Sent between
sync-rounds, the copy holds the whole home up: on a slow link it took about a
second of every round. Here the replica of version ``r`` (the committed state
sync-round ``r`` starts from, which the worker holds as a snapshot that
training never changes) travels *during* sync-round ``r``:

- as one stream of bytes (every tensor of the state in stream order) in
  pieces of what the link carries in a moment (:mod:`.byte_stream`), posted
  in the background of the link to each backup
  (:meth:`ecofl.net.links.PeerLink.post`): on an emulated link a piece
  being paced steps aside for an activation or gradient. With a message per tensor each stage of
  Eco-FL's confined testbed (MobileNetV2, 100 Mbps links) spent 0.1-0.2
  CPU-s more a sync-round, however few its bytes; with 64 KiB pieces each
  device spent 25-45% more CPU per sync-round (one run each);
- paced by the same token bucket as the stage's own tensors to that device
  (one emulated link carries both);
- received by a thread at each backup, which keeps the replica the moment all
  of it has arrived: a failure later in the round restores from version ``r``.

The price of taking it off the critical path: until a replica is complete,
the backup still keeps the previous one (the portal's ``keep``), so a failure
early in the round replays one sync-round more, and the backup holds two
replicas during the round (:func:`ecofl.pipeline.replication.backup_bytes`).
A round waits for its replicas only where the link cannot carry them in the
time the round computes. Off the critical path is not free where the CPU is
the bottleneck: a confined device seals, copies and opens its replicas out of
the quota it computes with (``benchmarks/steady_runs.py`` measures the cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ecofl.net.links import REPLICA_TAG, AbortCheck, Ticket
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.byte_stream import in_stream_order, opened_in_place, receive_stream, send_stream
from ecofl.pipeline.runtime.copy_thread import CopyThread
from ecofl.pipeline.runtime.stage_state import State


#: How often the receiving thread checks, unwoken, whether it was stopped (:meth:`ReplicaExchange.stop` wakes it);
#: every check is a wake-up, which costs a confined device CPU (``benchmarks/copy_path.py``).
STOP_CHECK_S = 1.0


class ReplicaExchange:
    """One worker's replicas of one sync-round: the ones it sends to its backups, the ones it keeps for others.

    ``sends``: (rank, state) to post, each state's bytes in stream order, paced
    by ``buckets[rank]`` in pieces sized for it; ``receives``: (rank, buffers)
    to fill in stream order, from pieces of any size the sender chose.
    ``keep(buffers)`` is called on the receiving thread as soon as one
    replica is complete.
    """

    def __init__(self, mesh: EpochMesh, sends: list[tuple[int, State]], receives: list[tuple[int, State]],
                 buckets: dict[int, TokenBucket | None], keep: Callable[[State], None]):
        self.mesh, self.receives, self.keep = mesh, receives, keep
        self.started = time.time()
        self.complete_after_s: float | None = None  # when the last replica kept here was complete
        self.tickets: list[Ticket] = [
            ticket for rank, state in sends
            for ticket in send_stream(mesh, rank, in_stream_order(state), REPLICA_TAG, buckets.get(rank),
                                      background=True)
        ]
        self._receiver = CopyThread("replica-receiver", self._receive)

    @property
    def received_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for _, buffers in self.receives for b in buffers.values())

    def _receive(self, stopped: Callable[[], None]) -> None:
        with opened_in_place(self.mesh, [(rank, in_stream_order(buffers)) for rank, buffers in self.receives],
                             REPLICA_TAG):
            for rank, buffers in self.receives:
                receive_stream(self.mesh, rank, REPLICA_TAG, in_stream_order(buffers), "replica", stopped,
                               poll_s=STOP_CHECK_S)
                self.keep(buffers)
                self.complete_after_s = time.time() - self.started

    def ended_cpu_s(self) -> dict[str, float]:
        """The receiving thread's CPU seconds once it has ended (:meth:`.ThreadClock.by_job`'s ``finished``)."""
        return self._receiver.ended_cpu_s()

    def finish(self, abort: AbortCheck) -> None:
        """Wait until every replica is sent and every one for me is kept; re-raise what went wrong."""
        for ticket in self.tickets:
            ticket.wait(self.mesh.timeout_s, abort, "sending a replica")
        self._receiver.join(abort)

    def stop(self) -> None:
        """Stop receiving (an interrupted round): a replica not complete is not kept."""
        self._receiver.stop(wake=lambda: [self.mesh.wake(rank) for rank, _ in self.receives])
