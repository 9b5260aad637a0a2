"""Replication off the critical path: a stage's replica travels while the stage computes.

Asteroid §3.4 backs every single-device stage up on a device of the next
stage (:mod:`ecofl.pipeline.replication` says who backs up whom). Sent between
sync-rounds, the copy holds the whole home up: on a slow link it took about a
second of every round. Here the replica of version ``r`` (the committed state
sync-round ``r`` starts from, which the worker holds as a snapshot that
training never changes) travels *during* sync-round ``r``:

- as one stream of bytes (every tensor of the state in key order), cut
  into pieces of what the link carries in
  ``PIECE_S`` (:func:`piece_bytes`), posted in the background of the link to
  the backup (:meth:`ecofl.net.links.PeerLink.post`), so that an activation
  or gradient waits behind at most one piece. Every piece is a message
  sealed, sent, received and opened, and each costs CPU the bytes do not
  explain (a wake-up of every thread waiting on the link, the GIL handed
  round): a confined device pays it out of the quota it computes with. With
  64 KiB pieces each device of Eco-FL's confined testbed (MobileNetV2, 100
  Mbps links) spent 25-45% more CPU per sync-round; with a piece per tensor
  (a MobileNetV2 stage has some hundred, most of them a batch norm's few
  hundred bytes) 0.1-0.2 CPU-s more a sync-round at every stage, however few
  its bytes (one run each);
- paced by the same token bucket as the stage's own tensors to that device
  (one emulated link carries both);
- received by a thread at the backup, which keeps the replica the moment all
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

import threading
import time
from collections.abc import Callable

import torch

from ecofl.net.links import REPLICA_TAG, AbortCheck, Ticket
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.stage_state import State

#: A replica piece is what its link carries in this long: how long an activation may wait behind one.
PIECE_S = 0.05
MIN_PIECE_BYTES, MAX_PIECE_BYTES = 64 << 10, 4 << 20  # 4 MiB: an unpaced link's (a real network's) pieces


class ReplicaStopped(Exception):
    """The receiving thread was told to stop (the round was interrupted)."""


def piece_bytes(bucket: TokenBucket | None) -> int:
    """The bytes of one replica piece on a link paced by ``bucket`` (None: not paced here)."""
    if bucket is None:
        return MAX_PIECE_BYTES
    return int(min(MAX_PIECE_BYTES, max(MIN_PIECE_BYTES, bucket.rate * PIECE_S)))


def byte_views(state: State) -> list[torch.Tensor]:
    """Each tensor of ``state`` in key order as a flat view of its bytes (writing one writes the tensor)."""
    return [state[key].detach().view(-1).view(torch.uint8) for key in sorted(state)]


def byte_pieces(state: State, size_bytes: int) -> list[torch.Tensor]:
    """Every byte of ``state``'s tensors in key order, as flat ``uint8`` pieces of ``size_bytes`` (the last one
    shorter; one empty piece for a state without bytes). A piece within one tensor is a view of it; one across
    tensors (a batch norm's few bytes beside its neighbours) copies their parts."""
    result: list[torch.Tensor] = []
    parts: list[torch.Tensor] = []
    room = size_bytes
    for key in sorted(state):
        view, at = state[key].detach().reshape(-1).view(torch.uint8), 0
        while at < view.numel():
            n = min(room, view.numel() - at)
            parts.append(view[at:at + n])
            at, room = at + n, room - n
            if room == 0:
                result.append(parts[0] if len(parts) == 1 else torch.cat(parts))
                parts, room = [], size_bytes
    if parts or not result:
        result.append(torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8))
    return result


class ByteSink:
    """Flat byte views filled in order from pieces of any size (a piece may span several views)."""

    def __init__(self, views: list[torch.Tensor]):
        self.views = [view for view in views if view.numel()]
        self.total = sum(view.numel() for view in self.views)
        self.filled = 0
        self._view = self._offset = 0  # where the next byte goes

    def write(self, piece: torch.Tensor) -> None:
        """Copy ``piece`` (flat ``uint8``, at most the bytes left) into the views, where the last one ended."""
        at = 0
        with torch.no_grad():
            while at < piece.numel():
                view = self.views[self._view]
                n = min(view.numel() - self._offset, piece.numel() - at)
                view[self._offset:self._offset + n].copy_(piece[at:at + n])
                at, self._offset = at + n, self._offset + n
                if self._offset == view.numel():
                    self._view, self._offset = self._view + 1, 0
        self.filled += piece.numel()


class ReplicaExchange:
    """One worker's replicas of one sync-round: the one it sends to its backup, the ones it keeps for others.

    ``sends``: (rank, state) to post, each state's bytes in key order, paced
    by ``buckets[rank]`` in pieces sized for it; ``receives``: (rank, buffers)
    to fill in key order, from pieces of any size the sender chose.
    ``keep(buffers)`` is called on the receiving thread as soon as one
    replica is complete.
    """

    def __init__(self, mesh: EpochMesh, sends: list[tuple[int, State]], receives: list[tuple[int, State]],
                 buckets: dict[int, TokenBucket | None], keep: Callable[[State], None]):
        self.mesh, self.receives, self.keep = mesh, receives, keep
        self.started = time.time()
        self.complete_after_s: float | None = None  # when the last replica kept here was complete
        self.receiver_cpu_s = 0.0  # the receiving thread's CPU time, measured by itself when it ends
        self.error: BaseException | None = None
        self.tickets: list[Ticket] = [
            mesh.send(rank, piece, REPLICA_TAG, buckets.get(rank), background=True)
            for rank, state in sends for piece in byte_pieces(state, piece_bytes(buckets.get(rank)))
        ]
        self._stop = threading.Event()
        self._receiver = threading.Thread(target=self._receive, daemon=True, name="replica-receiver")
        self._receiver.start()

    @property
    def received_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for _, buffers in self.receives for b in buffers.values())

    def _stopped(self) -> None:
        if self._stop.is_set():
            raise ReplicaStopped()

    def _receive(self) -> None:
        try:
            for rank, buffers in self.receives:
                self._fill(rank, ByteSink(byte_views(buffers)))
                self.keep(buffers)
                self.complete_after_s = time.time() - self.started
        except ReplicaStopped:
            pass
        except BaseException as error:  # noqa: BLE001 - re-raised by finish() on the worker's thread
            self.error = error
        finally:
            self.receiver_cpu_s = time.thread_time()

    def ended_cpu_s(self) -> dict[str, float]:
        """The CPU seconds of this exchange's threads that have ended (:meth:`.ThreadClock.by_job`'s
        ``finished``)."""
        return {} if self._receiver.is_alive() else {self._receiver.name: self.receiver_cpu_s}

    def _fill(self, rank: int, sink: ByteSink) -> None:
        """Fill ``sink`` from the pieces ``rank`` sends (a state without bytes travels as one empty piece)."""
        while True:
            piece = self.mesh.recv(rank, REPLICA_TAG, abort=self._stopped)
            left = sink.total - sink.filled
            fits = 0 < piece.numel() <= left or left == 0 == piece.numel()
            if piece.dim() != 1 or piece.dtype != torch.uint8 or not fits:
                raise ValueError(f"rank {rank} sent a {piece.dtype} {tuple(piece.shape)} replica piece: "
                                 f"{left} bytes were left to fill")
            sink.write(piece)
            if sink.filled == sink.total:
                return

    def finish(self, abort: AbortCheck) -> None:
        """Wait until every replica is sent and every one for me is kept; re-raise what went wrong."""
        for ticket in self.tickets:
            ticket.wait(self.mesh.timeout_s, abort, "sending a replica")
        while self._receiver.is_alive():
            abort()
            self._receiver.join(0.02)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop receiving (an interrupted round): a replica not complete is not kept."""
        self._stop.set()
        self._receiver.join()
