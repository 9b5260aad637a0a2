"""Point-to-point tensors between workers over torch.distributed (gloo).

A tensor travels as a fixed-size int64 header (dtype, micro-batch, shape)
and its payload, both with ``dist.send`` / ``dist.recv`` (``batch_isend_irecv``
is unstable on gloo). Asteroid's worker (Fig. 11) receives and dispatches
asynchronously: a :class:`Receiver` thread per peer posts the receives of a
sync-round in order and queues what arrives (the task pool), a
:class:`Dispatcher` thread per peer sends in FIFO order, paced by the
emulated link. Messages between two workers flow one way per direction in
micro-batch order, so the schedule's deadlock freedom
(:func:`ecofl.pipeline.schedule.validate`) carries over.
"""

from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from ecofl.pipeline.runtime.emulation import TokenBucket

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
_MAX_DIMS = 8
_HEADER = 3 + _MAX_DIMS  # dtype code, micro-batch, ndim, dims


def send_tensor(tensor: torch.Tensor, dst: int, micro_batch: int) -> None:
    """Send ``tensor`` (tagged with its micro-batch) to rank ``dst``; blocks until handed to gloo."""
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"cannot send a tensor of {tensor.dim()} dimensions")
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = _DTYPES.index(tensor.dtype)
    header[1] = micro_batch
    header[2] = tensor.dim()
    header[3 : 3 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    dist.send(header, dst, tag=micro_batch)
    dist.send(tensor.detach().contiguous(), dst, tag=micro_batch)


def recv_tensor(src: int, micro_batch: int) -> torch.Tensor:
    """Receive the tensor of ``micro_batch`` that rank ``src`` sent with :func:`send_tensor`."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    dist.recv(header, src, tag=micro_batch)
    if int(header[1]) != micro_batch:
        raise RuntimeError(f"expected micro-batch {micro_batch} from rank {src}, got {int(header[1])}")
    shape = tuple(int(d) for d in header[3 : 3 + int(header[2])])
    tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])])
    dist.recv(tensor, src, tag=micro_batch)
    return tensor


class Receiver:
    """Receives the tensors of the given micro-batches from one peer, in order, on its own thread."""

    def __init__(self, src: int, micro_batches: list[int]):
        self.src = src
        self._queue: queue.Queue[torch.Tensor | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(micro_batches,), daemon=True,
                                        name=f"recv-from-{src}")
        self._thread.start()

    def _run(self, micro_batches: list[int]) -> None:
        try:
            for m in micro_batches:
                self._queue.put(recv_tensor(self.src, m))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            self._queue.put(error)

    def get(self, timeout_s: float) -> torch.Tensor:
        """The next tensor; re-raises the thread's error; TimeoutError after ``timeout_s``."""
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"nothing arrived from rank {self.src} within {timeout_s:.0f} s") from None
        if isinstance(item, BaseException):
            raise item
        return item


class Dispatcher:
    """Sends tensors to one peer in FIFO order on its own thread, paced by an optional link rate."""

    def __init__(self, dst: int, rate_bps: float | None):
        self.dst = dst
        self._bucket = TokenBucket(rate_bps) if rate_bps else None
        self._queue: queue.Queue[tuple[torch.Tensor, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        self._events: list[tuple[str, int, float, float]] = []
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"send-to-{dst}")
        self._thread.start()

    def put(self, tensor: torch.Tensor, micro_batch: int) -> None:
        self.raise_error()
        with self._lock:
            self._pending += 1
            self._idle.clear()
        self._queue.put((tensor.detach(), micro_batch))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            tensor, micro_batch = item
            try:
                if self._error is None:
                    start = time.time()
                    if self._bucket is not None:
                        self._bucket.consume(tensor.numel() * tensor.element_size())
                    send_tensor(tensor, self.dst, micro_batch)
                    with self._lock:
                        self._events.append(("send", micro_batch, start, time.time()))
            except BaseException as error:  # noqa: BLE001 - re-raised by the owner
                self._error = error
            with self._lock:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.set()

    def drain(self, timeout_s: float) -> None:
        """Wait until everything queued has been sent; re-raise a send error."""
        if not self._idle.wait(timeout_s):
            raise TimeoutError(f"sending to rank {self.dst} did not finish within {timeout_s:.0f} s")
        self.raise_error()

    def take_events(self) -> list[tuple[str, int, float, float]]:
        """The sends done since the last call: ("send", micro-batch, start, end)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
