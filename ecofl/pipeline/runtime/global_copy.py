"""The portal's global copy off the critical path: each stage's committed state travels while a sync-round computes.

FTPipeHD §III-F keeps a copy of the whole model at the central node every
G sync-rounds, for a failure that takes a stage and its backups together.
Collected between rounds, the copy held the whole home up: a MobileNetV2
stage's weights and momentum on a 100 Mbps link take about 0.7 s, against a
sync-round of 4-5 s on Eco-FL's confined testbed. Here the copy of version
``r`` travels *during* sync-round ``r``, as replicas do (:mod:`.replica`):

- each stage's first device sends the state it committed at ``r`` (a copy
  training never changes) on its control channel, in pieces of what its
  link carries in a moment (:func:`.byte_stream.piece_bytes`), from a thread
  of its own (:class:`CopyUpload`), paced at its emulated link rate to the
  portal;
- the portal files the pieces as they come, between the round's replies
  (:class:`CopyAssembly`), and holds the copy as version ``r`` once the round
  is done: a failure in round ``r`` restores from the copy before it;
- a device's ``Done`` follows its last piece, so a round waits for the copy
  only where the link cannot carry it in the time the round computes.

The pieces go on the control channel, not the tensor links: on an emulated
link they are paced on a link of their own (the device's link to the portal),
so they never delay an activation; on links the kernel shapes they share the
device's link with its activations, at no lower priority.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import numpy as np

from ecofl.net.links import AbortCheck
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.byte_stream import piece_bytes
from ecofl.pipeline.runtime.control_messages import CopyPiece
from ecofl.pipeline.runtime.copy_thread import CopyThread
from ecofl.pipeline.runtime.errors import WorkerFailed

Arrays = dict[str, np.ndarray]


def copy_pieces(arrays: Arrays, size_bytes: int) -> list[Arrays]:
    """``arrays`` in key order, grouped into pieces of at most ``size_bytes`` (a larger array alone); one empty
    piece where there are none (the portal still hears that the stage's copy is complete)."""
    pieces: list[Arrays] = [{}]
    room = size_bytes
    for key in sorted(arrays):
        nbytes = arrays[key].nbytes
        if pieces[-1] and nbytes > room:
            pieces.append({})
            room = size_bytes
        pieces[-1][key] = arrays[key]
        room -= nbytes
    return pieces


class CopyUpload:
    """One worker's stage at ``version`` on its way to the portal: ``send(piece, arrays)`` on a thread of its own,
    each piece paced at ``link_bps`` first (None: not paced)."""

    def __init__(self, send: Callable[[CopyPiece, Arrays], None], version: int, arrays: Arrays,
                 link_bps: float | None):
        self.send, self.version = send, version
        self.bucket = TokenBucket(link_bps) if link_bps else None
        self.pieces = copy_pieces(arrays, piece_bytes(self.bucket))
        self.started = time.time()
        self.sent_after_s: float | None = None  # when the last piece was sent, from the start
        self._thread = CopyThread("global-copy", self._upload)

    def _upload(self, stopped: Callable[[], None]) -> None:
        for i, piece in enumerate(self.pieces):
            if self.bucket is not None:
                self.bucket.consume(sum(a.nbytes for a in piece.values()), stopped)
            stopped()
            self.send(CopyPiece(self.version, last=i == len(self.pieces) - 1), piece)
        self.sent_after_s = time.time() - self.started

    def ended_cpu_s(self) -> dict[str, float]:
        return self._thread.ended_cpu_s()

    def finish(self, abort: AbortCheck) -> None:
        """Wait until every piece is sent; re-raise what went wrong."""
        self._thread.join(abort)

    def stop(self) -> None:
        """Stop sending (an interrupted round): the portal drops a copy that is not complete."""
        self._thread.stop()


class CopyAssembly:
    """The portal's global copy of ``version`` as its pieces arrive from ``senders`` (device -> every key its stage
    sends: weights, and momentum buffers where the optimizer has them)."""

    def __init__(self, version: int, senders: dict[int, Collection[str]]):
        self.version = version
        self.expected = {device: set(keys) for device, keys in senders.items()}
        self.state: Arrays = {}
        self.complete: set[int] = set()

    @classmethod
    def refusing(cls) -> CopyAssembly:
        """No global copy under way: every piece is refused as one the portal did not ask for."""
        return cls(-1, {})

    def add(self, device: int, piece: CopyPiece, arrays: Arrays) -> None:
        """File one piece from ``device``; a piece nobody asked for, or of keys not its stage's, is its failure."""
        if piece.version != self.version or device not in self.expected or device in self.complete:
            raise WorkerFailed(f"device {device} sent a global-copy piece of version {piece.version} "
                               f"the portal did not ask for")
        unexpected = set(arrays) - self.expected[device]
        if unexpected:
            raise WorkerFailed(f"device {device} sent global-copy tensors not of its stage: {sorted(unexpected)[:3]}")
        self.state.update({k: np.array(v) for k, v in arrays.items()})
        if piece.last:
            missing = self.expected[device] - set(self.state)
            if missing:
                raise WorkerFailed(f"device {device}'s global copy lacks {len(missing)} tensors "
                                   f"({sorted(missing)[:3]})")
            self.complete.add(device)

    def result(self) -> Arrays:
        """The whole copy; RuntimeError if a sender's stage is not complete (its ``Done`` came before its last
        piece: a protocol error)."""
        missing = set(self.expected) - self.complete
        if missing:
            raise RuntimeError(f"the global copy of version {self.version} lacks the stages of devices "
                               f"{sorted(missing)}")
        return self.state
