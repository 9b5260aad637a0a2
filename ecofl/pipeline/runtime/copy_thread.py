"""A copy's work on a thread of its own while a sync-round computes (:mod:`.replica`, :mod:`.global_copy`): it
can be stopped at its next check, notes what went wrong for the worker's thread, and measures its own CPU time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ecofl.net.links import AbortCheck


class CopyStopped(Exception):
    """The copy was told to stop (the round was interrupted)."""


class CopyThread:
    """Runs ``work(stopped)`` once on a thread named ``name``; ``stopped()`` raises :class:`CopyStopped` once
    :meth:`stop` was called. An error is kept for :meth:`join` to raise on the worker's thread."""

    def __init__(self, name: str, work: Callable[[Callable[[], None]], None]):
        self.work = work
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

    def stop(self, wake: Callable[[], None] = lambda: None) -> None:
        """Stop the work at its next check (``wake``: make a waiting work check now) and wait for the thread."""
        self._stop.set()
        wake()
        self._thread.join()
