"""One tensor link: a sealed connection to one peer worker, with a sender and a reader thread.

Asteroid's worker (Fig. 11) receives and dispatches asynchronously; a
:class:`PeerLink` is that for one peer. Its **sender** thread sends posted
tensors in FIFO order, each optionally paced by an emulated link's token
bucket (see below), and marks each post's :class:`Ticket` done when its
bytes are handed to the kernel. Its **reader** thread receives whatever the
peer sends as soon as it arrives and files it under its tag (the task pool); :meth:`PeerLink.take`
hands out a tag's tensors in the order they were sent. Tags say what a tensor
is: a micro-batch's activation or gradient (the micro-batch index), a
replica, a migrated layer, a step of an all-reduce.

A post is *foreground* (the pipeline's own tensors) or *background* (a
replica sent while the stage computes, :mod:`ecofl.pipeline.runtime.replica`):
the sender takes a background post only when no foreground one waits, and on
an emulated link a background piece being paced steps aside for a foreground
post that arrives meanwhile (the link keeps what it carried of the piece,
carries the foreground post, then the rest): an activation does not wait
behind a replica, as behind another flow's packets on a shared network,
where it waited behind a whole piece (50 ms of the link) before. A link the
kernel paces (no bucket) sends a background piece whole. Posts of one kind
leave in the order they were posted.

On an emulated link a foreground post is not held back by its sender: the
sender seals and writes it at once and stamps it with how much longer the
link would take to carry it (the token bucket's FIFO reservation, less the
moment it is written), and the receiver hands it out that much after it
read the stamp: the same moment on one host, the emulated link's time on
top of a real network's between two (no clock is shared). A confined
device's sender thread then wakes once per post, not once to sleep out the
link's time and again to write: each wake of a throttled cgroup's thread
may wait out a CFS period (40 ms on a device of 0.025 cores), and the
pipeline's hand-offs waited two or three of them (docs/pipeline.md,
"Hand-offs first"). Background pieces are still paced by their sender, so
that a foreground post can overtake the piece under way.

A tensor travels as a fixed header (how long to hold it, tag, dtype, shape)
and its raw bytes on the link's :class:`~ecofl.net.sealed.SealedSocket`;
nothing is unpickled.
The reader opens a tensor into new memory, or, for byte pieces under a tag a
receiver announced a buffer for (:meth:`PeerLink.receive_into`), straight
into that buffer's next bytes: a replica or a migrated stage is opened where
it will stay, not copied there from a piece.
Every wait checks an :data:`AbortCheck`, so the portal can interrupt a
sync-round that can no longer finish; closing the link ends both threads (a
peer that froze or died cannot hold a worker forever).
"""

from __future__ import annotations

import collections
import itertools
import math
import queue
import struct
import threading
import time
from collections.abc import Callable, Sequence

import torch

from ecofl.accelerator import host_array, host_copy
from ecofl.net.errors import ChannelClosed
from ecofl.net.framing import announced_bytes, recv_exactly
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import SealedSocket

#: Raises (e.g. :class:`RoundAborted`) when the portal asked to stop waiting; called while waiting.
AbortCheck = Callable[[], None]
#: How often a waiting thread checks for an abort (seconds).
POLL_S = 0.02


class RoundAborted(Exception):
    """The portal interrupted the sync-round (a device failed, the pipeline is re-planned)."""


class PeerLost(ConnectionError):
    """The link to a peer broke (the peer died, or its epoch was abandoned)."""


def never_aborted() -> None:
    """The :data:`AbortCheck` of a wait nobody interrupts."""


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool)
MAX_DIMS = 8
#: seconds the receiver holds it from reading this header (0: none), tag, dtype code, number of dimensions,
#: the dimensions (unused ones 0).
HEADER = struct.Struct(f"<dqBB{MAX_DIMS}q")
#: Tensors up to this size travel in one record with their header.
SMALL_BYTES = 64 << 10
#: Tags above every micro-batch index: a replica of a stage, a migrated layer, an all-reduce's chunks.
REPLICA_TAG = 1 << 20
MIGRATION_TAG = 1 << 21
ALLREDUCE_TAG = 1 << 22
CREDIT_TAG = 1 << 23  # a stream's back-pressure: the receiver has room for one more micro-batch
#: A queued send: the tensor, its tag, the bucket pacing it, its ticket.
Post = tuple[torch.Tensor, int, "TokenBucket | None", "Ticket"]
#: The sender's order: closing first, then foreground posts, then background ones.
CLOSING, FOREGROUND, BACKGROUND = 0, 1, 2


class Ticket:
    """A posted send: done once its bytes are handed to the kernel (or it failed); when it ran."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.start = self.end = 0.0  # time.time() when the sender took it up / finished it
        self._then: list[Callable[["Ticket"], None]] = []
        self._lock = threading.Lock()

    def then(self, callback: Callable[["Ticket"], None]) -> None:
        """Call ``callback(ticket)`` once the send is done or failed (at once if it is already), on the thread
        that finishes it."""
        with self._lock:
            if not self.done.is_set():
                self._then.append(callback)
                return
        callback(self)

    def finish(self) -> None:
        """Mark the send done (its ``error`` set if it failed) and run the callbacks."""
        with self._lock:
            self.done.set()
            callbacks, self._then = self._then, []
        for callback in callbacks:
            callback(self)

    def wait(self, timeout_s: float, abort: AbortCheck = never_aborted, what: str = "a send") -> None:
        """Block until done; re-raise its error; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.done.wait(POLL_S):
            abort()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not complete within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error


class PeerLink:
    """The sealed connection to peer ``peer`` (a rank of the current epoch) and its two threads."""

    def __init__(self, channel: SealedSocket, peer: int):
        self.channel, self.peer = channel, peer
        #: (priority, post number, post or None to stop); the post number keeps posts of one priority in order.
        self._outbox: queue.PriorityQueue[tuple[int, int, Post | None]] = queue.PriorityQueue()
        self._posted = itertools.count()
        #: tag -> (tensor, when it may be handed out: ``time.monotonic()``) in the order they arrived
        self._inbox: dict[int, collections.deque[tuple[torch.Tensor, float]]] = collections.defaultdict(
            collections.deque)
        self._arrived = threading.Condition()
        #: tag -> the buffers announced for its pieces, as [buffer, bytes filled], the one being filled first
        self._buffers: dict[int, collections.deque[list]] = collections.defaultdict(collections.deque)
        self._opening: int | None = None  # the tag of the tensor the reader is opening (not in the inbox yet)
        self.error: PeerLost | None = None
        self._closed = False
        self._foreground = threading.Event()  # a foreground post was made (a background piece steps aside)
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name=f"send-to-{peer}")
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name=f"recv-from-{peer}")
        self._sender.start()
        self._reader.start()

    # -- sending -------------------------------------------------------------------------

    def post(self, tensor: torch.Tensor, tag: int, bucket: TokenBucket | None = None,
             background: bool = False) -> Ticket:
        """Queue ``tensor`` for the peer under ``tag`` (paced by ``bucket``; ``background``: only while no
        foreground post waits); the returned ticket says when it left.

        The tensor must not change until then (pass a copy if it will).
        """
        if tensor.dtype not in DTYPES or tensor.dim() > MAX_DIMS:
            raise ValueError(f"cannot send a {tensor.dtype} tensor of {tensor.dim()} dimensions")
        ticket = Ticket()
        if self.error is not None:
            ticket.error = self.error
            ticket.finish()
        else:
            item = (host_copy(tensor.detach()), tag, bucket, ticket)
            self._outbox.put((BACKGROUND if background else FOREGROUND, next(self._posted), item))
            if not background:
                self._foreground.set()  # wakes a background piece being paced
            if self._closed:  # closed since the check above: the sender may be gone, fail what it left
                self._fail_queued()
        return ticket

    def _send_loop(self) -> None:
        while (entry := self._outbox.get())[2] is not None:
            self._send(entry)
        self._fail_queued()

    def _fail_queued(self) -> None:
        """Fail every post still queued (the link is closed); a close still queued stays for the sender."""
        closing = False
        while True:
            try:
                _, _, post = self._outbox.get_nowait()
            except queue.Empty:
                break
            if post is None:
                closing = True
            else:
                post[3].error = self.error
                post[3].finish()
        if closing:
            self._outbox.put((CLOSING, next(self._posted), None))

    def _send(self, entry: tuple[int, int, Post]) -> None:
        priority, _, (tensor, tag, bucket, ticket) = entry
        ticket.start, due = time.time(), 0.0
        try:
            if self.error is not None:
                raise self.error
            payload = host_array(tensor.contiguous().reshape(-1).view(torch.uint8))
            if bucket is not None and priority == BACKGROUND:
                self._pace_yielding(payload.nbytes, bucket)
            elif bucket is not None:
                due = bucket.reserve(payload.nbytes)  # when the emulated link has carried it
            dims = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
            hold = max(0.0, due - time.monotonic())  # the receiver holds it this long
            header = HEADER.pack(hold, tag, DTYPES.index(tensor.dtype), tensor.dim(), *dims)
            if payload.nbytes <= SMALL_BYTES:
                self.channel.sendall(header + payload.tobytes())
            else:
                self.channel.sendall(header)
                self.channel.sendall(memoryview(payload))
        except (OSError, ChannelClosed) as error:
            self._fail(f"sending to rank {self.peer}: {error}")
            ticket.error = self.error
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the ticket
            ticket.error = error
        ticket.end = time.time() + max(0.0, due - time.monotonic())  # an emulated link's: when it has carried it
        ticket.finish()

    def _pace_yielding(self, nbytes: int, bucket: TokenBucket) -> None:
        """Pace a background post, stepping aside for every foreground post that arrives meanwhile: the link
        keeps what it carried of the piece, sends the foreground post (paced) and then the rest of the piece.
        The sender sleeps until the piece is carried or a foreground post wakes it (no polling)."""
        while nbytes > 0:
            until = bucket.reserve(nbytes)
            if not self._foreground.wait(max(0.0, until - time.monotonic())):
                return
            began = until - nbytes / bucket.rate  # when the link began carrying the rest of the piece
            carried = min(nbytes, max(0, int((time.monotonic() - began) * bucket.rate)))
            bucket.refund(nbytes - carried)
            nbytes -= carried
            self._foreground.clear()
            while (entry := self._next_foreground()) is not None:
                self._send(entry)
            if self.error is not None:
                raise self.error

    def _next_foreground(self) -> tuple[int, int, Post] | None:
        """The first foreground post waiting, taken from the outbox (None: none waits)."""
        try:
            entry = self._outbox.get_nowait()
        except queue.Empty:
            return None
        if entry[0] == FOREGROUND:
            return entry
        self._outbox.put(entry)  # a background post or the close keeps its place
        return None

    # -- receiving -----------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            while True:
                header = recv_exactly(self.channel, HEADER.size)
                hold, tag, code, ndim, *dims = HEADER.unpack(header)
                if code >= len(DTYPES) or ndim > MAX_DIMS or not 0 <= hold < math.inf:
                    raise ChannelClosed(f"rank {self.peer} sent a malformed tensor header")
                due = time.monotonic() + hold  # when it may be handed out
                dtype, shape = DTYPES[code], tuple(dims[:ndim])
                nbytes = announced_bytes(shape, torch.empty((), dtype=dtype).element_size())
                room, completed = self._room_for(tag, nbytes, dtype == torch.uint8 and ndim == 1, due)
                raw = room if room is not None else torch.empty(nbytes, dtype=torch.uint8)
                if raw.numel():
                    recv_exactly(self.channel, raw.numel(), host_array(raw))
                arrived = raw.view(dtype).reshape(shape) if room is None else completed
                with self._arrived:
                    self._opening = None
                    if arrived is not None:  # a piece opened into an announced buffer arrives with its last one
                        self._inbox[tag].append((arrived, due))
                        self._arrived.notify_all()
        except (OSError, ChannelClosed, ValueError, RuntimeError) as error:  # RuntimeError: no memory for it
            self._fail(f"receiving from rank {self.peer}: {error}")

    def receive_into(self, tag: int, buffers: Sequence[torch.Tensor]) -> bool:
        """Open the byte pieces the peer sends under ``tag`` into flat ``uint8`` ``buffers``, each where the last
        one ended, one buffer after the other; :meth:`take` hands each buffer out whole once full: one wake-up,
        not one a piece. A piece that does not fit the room left goes to new memory, as a piece under any other
        tag, handed out after the part of the buffer filled so far.

        Refused (False) while a piece under ``tag`` has arrived and not been taken, or is being opened: the
        buffers would take the stream's bytes from the wrong place, so the caller copies this stream in."""
        with self._arrived:
            if self._inbox[tag] or self._opening == tag:
                return False
            self._buffers[tag].extend([buffer, 0] for buffer in buffers)
            return True

    def forget(self, tag: int, buffer: torch.Tensor) -> None:
        """Stop opening pieces into ``buffer`` (a receive that ended early); pieces already opened stay."""
        with self._arrived:
            self._buffers[tag] = collections.deque(b for b in self._buffers[tag] if b[0] is not buffer)

    def _room_for(self, tag: int, nbytes: int, is_bytes: bool, due: float
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Where the reader opens a tensor of ``nbytes`` under ``tag``: the next bytes of the first buffer
        announced under it (a byte piece), and that buffer if they fill it (no longer announced then). (None,
        None): new memory, where none is announced, the piece is not bytes or the buffer has too little room
        (the part of it filled so far is handed out from ``due``, the new piece's time, and it is no longer
        announced)."""
        with self._arrived:
            self._opening = tag
            if not is_bytes or not nbytes or not (waiting := self._buffers.get(tag)):
                return None, None
            buffer, filled = waiting[0]
            if filled + nbytes > buffer.numel():
                waiting.popleft()
                if filled:
                    self._inbox[tag].append((buffer[:filled], due))
                return None, None
            waiting[0][1] = filled + nbytes
            if filled + nbytes == buffer.numel():
                waiting.popleft()
                return buffer[filled:], buffer
            return buffer[filled:filled + nbytes], None

    def take(self, tag: int, timeout_s: float, abort: AbortCheck = never_aborted, poll_s: float = POLL_S
             ) -> torch.Tensor:
        """The next tensor the peer sent under ``tag``, once its emulated link has carried it; PeerLost if the
        link broke before it arrived, TimeoutError after ``timeout_s``. ``abort`` is checked every ``poll_s``
        while nothing arrives, and at every :meth:`wake` (each check wakes the thread, about 0.05-0.1 ms of CPU
        on this project's 2-core host: a wait whose aborts wake it polls seldom)."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                waiting = self._inbox[tag]
                hold = waiting[0][1] - time.monotonic() if waiting else poll_s
                if hold <= 0:
                    return waiting.popleft()[0]
                if not waiting and self.error is not None:
                    raise self.error
                self._arrived.wait(min(hold, poll_s))
                if not self._ready(tag):
                    abort()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing arrived from rank {self.peer} within {timeout_s:.0f} s")

    def _ready(self, tag: int) -> bool:
        """Whether a tensor under ``tag`` may be handed out now (caller holds ``_arrived``)."""
        waiting = self._inbox[tag]
        return bool(waiting) and waiting[0][1] <= time.monotonic()

    def wake(self) -> None:
        """Have every :meth:`take` waiting on this link check its abort now."""
        with self._arrived:
            self._arrived.notify_all()

    # -- lifetime ------------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        with self._arrived:
            if self.error is None:
                self.error = PeerLost(why if not self._closed else f"the link to rank {self.peer} was closed")
            self._arrived.notify_all()

    def close(self) -> None:
        """Close the connection; both threads end (a post not yet sent fails with PeerLost)."""
        self._closed = True
        self._fail(f"the link to rank {self.peer} was closed")
        self._foreground.set()  # a background piece being paced stops at once
        try:
            self.channel.shutdown(2)  # socket.SHUT_RDWR: unblocks a thread in send or receive
        except OSError:
            pass
        self.channel.close()
        self._outbox.put((CLOSING, next(self._posted), None))
