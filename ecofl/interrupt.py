"""SIGTERM as Ctrl-C: a command stopped by ``kill``, systemd or a job's timeout unwinds as one stopped by Ctrl-C.

Python's default SIGTERM ends the process at once, so no ``finally`` runs:
the worker processes a home pipeline started and the network namespaces a
shaped run built would outlive it. Inside :func:`sigterm_as_interrupt`
SIGTERM raises :class:`KeyboardInterrupt` in the main thread instead, and the
``with`` blocks that own them stop and delete them.
"""

from __future__ import annotations

import os
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


def end_at(*signums: int) -> None:
    """From now on, ``signums`` end this program at once with :data:`INTERRUPTED_EXIT`: for where nothing is left
    to clean up (the interpreter's exit, after every ``with`` block has), so that a signal there does not turn the
    exit status into "killed by the signal"."""
    for signum in signums:
        signal.signal(signum, lambda *_: os._exit(INTERRUPTED_EXIT))


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends: for a clean-up that a second signal must not cut short.

    Inside, both signals are only remembered; the first one is raised again as the block ends, to the handler
    that was in place before. (Blocking them with a signal mask would not do: the kernel hands a signal
    blocked in the main thread to any other thread, and Python still runs its handler in the main thread.)
    Handlers belong to the main thread: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def remember(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, remember) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if received:
            signal.raise_signal(received[0])
