"""SIGTERM as Ctrl-C: a command stopped by ``kill``, systemd or a job's timeout unwinds as one stopped by Ctrl-C.

Python's default SIGTERM ends the process at once, so no ``finally`` runs:
the worker processes a home pipeline started and the network namespaces a
shaped run built would outlive it. Inside :func:`sigterm_as_interrupt`
SIGTERM raises :class:`KeyboardInterrupt` in the main thread instead, and the
``with`` blocks that own them stop and delete them.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

#: Exit status of a command stopped this way or by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT = 130


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`KeyboardInterrupt`; the previous handler is restored after.

    Signal handlers belong to the main thread: elsewhere (a command run from
    a test's thread) this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends: for a clean-up that a second signal must not cut short
    (it is raised as the block ends). Only the main thread receives them; elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
