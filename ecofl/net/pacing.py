"""Pacing a link: a token bucket that lets a sender's bytes out no faster than the link's rate.

Every emulated link is paced this way, and only this way: a device's tensor
links (:mod:`.links`), layer migrations and state uploads, and a stream's
input and result links. A bucket without burst is a FIFO channel: back-to-back
transfers of n bytes take n / rate each, as in the cost model. Links the
kernel shapes (:mod:`.netns`) need none.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

#: A link's burst: what it carries in this long, at most ``MAX_BURST_BYTES`` (a slow link gets a small burst,
#: so that a whole stream of small tensors cannot slip through in the first burst).
BURST_S = 0.01
MAX_BURST_BYTES = 64 * 1024
ABORT_POLL_S = 0.02  # how often a paced wait checks its abort


class TokenBucket:
    """Paces a link at ``rate_bps`` bytes/s with bursts of at most ``burst_bytes``.

    :meth:`consume` blocks the sender until the link could have carried the
    bytes: back-to-back transfers of n bytes take n / rate each, like the cost
    model's FIFO channel. The default burst is ``BURST_S`` of the link's rate,
    at most ``MAX_BURST_BYTES``.
    """

    def __init__(self, rate_bps: float, burst_bytes: int | None = None):
        if not rate_bps > 0:
            raise ValueError(f"link rate must be positive, got {rate_bps}")
        self.rate = rate_bps
        self.burst = burst_bytes if burst_bytes is not None else int(min(MAX_BURST_BYTES, rate_bps * BURST_S))
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> float:
        """Take the link for ``nbytes`` more now: the ``time.monotonic()`` at which it will have carried them."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate) - nbytes
            self._stamp = now
            return now - self._tokens / self.rate

    def refund(self, nbytes: int) -> None:
        """Give back ``nbytes`` reserved and not carried (a transfer that stepped aside sends them later)."""
        with self._lock:
            self._tokens += nbytes

    def consume(self, nbytes: int, abort: Callable[[], None] | None = None) -> None:
        """Block until the link could have carried ``nbytes`` more; ``abort`` is checked while waiting."""
        until = self.reserve(nbytes)
        while (left := until - time.monotonic()) > 0:
            if abort is not None:
                abort()
            time.sleep(min(left, ABORT_POLL_S) if abort is not None else left)
