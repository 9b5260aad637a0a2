"""A copy's work on a thread of its own while a sync-round computes (:mod:`.replica`, :mod:`.global_copy`): it
can be stopped at its next check, notes what went wrong for the worker's thread, and measures its own CPU time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ecofl.net.links import AbortCheck


class CopyStopped(Exception):
    """The copy was told to stop (the round was interrupted)."""


#: How often a copy thread that :meth:`CopyThread.stop` wakes checks whether it was stopped (and its deadline).
WOKEN_POLL_S = 1.0


class CopyThread:
    """Runs ``work(stopped)`` once on a thread named ``name``; ``stopped()`` raises :class:`CopyStopped` once
    :meth:`stop` was called. An error is kept for :meth:`join` to raise on the worker's thread.

    ``wake`` wakes whatever the work waits in, so that it checks ``stopped`` at once: such a work can wait
    with a long poll (:data:`WOKEN_POLL_S`). A replica's receiver waits for pieces the whole sync-round, and
    polling every 20 ms cost a confined Nano 0.012-0.014 CPU-s a round, 0.12-0.14 s of its 0.1 cores
    (``benchmarks/steady_runs.py``, 2026-12-01 22:33)."""

    def __init__(self, name: str, work: Callable[[Callable[[], None]], None],
                 wake: Callable[[], None] = lambda: None):
        self.work, self._wake = work, wake
        self.error: BaseException | None = None
        self.cpu_s = 0.0  # the thread's CPU time, measured by itself when it ends
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def stopped(self) -> None:
        if self._stop.is_set():
            raise CopyStopped()

    def _run(self) -> None:
        try:
            self.work(self.stopped)
        except CopyStopped:
            pass
        except BaseException as error:  # noqa: BLE001 - re-raised by join() on the worker's thread
            self.error = error
        finally:
            self.cpu_s = time.thread_time()

    def ended_cpu_s(self) -> dict[str, float]:
        """The thread's CPU seconds once it has ended (:meth:`.ThreadClock.by_job`'s ``finished``)."""
        return {} if self._thread.is_alive() else {self._thread.name: self.cpu_s}

    def join(self, abort: AbortCheck) -> None:
        """Wait until the work is done, checking ``abort``; re-raise what went wrong."""
        while self._thread.is_alive():
            abort()
            self._thread.join(0.02)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop the work (woken to check at once) and wait for the thread."""
        self._stop.set()
        self._wake()
        self._thread.join()
