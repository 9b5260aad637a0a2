"""The terminal shows a repeated log message once; the run's log file keeps every one.

Hundreds of homes can fail the same way at once, and Flower logs each
failure with its traceback (an actor Ray killed during a query once gave
300 tracebacks and 3 MB on the terminal). :class:`OncePerMessage` sits on
the terminal's log handlers: a message whose first line, digits left out,
was shown before is counted instead of shown; the log file Hydra writes
(``<output dir>/<job>.log``) has them all, and the home failures are counted
by kind in ``summary.json`` (:mod:`ecofl.fl.home_failures`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

_DIGITS = re.compile(r"\d+")


class OncePerMessage(logging.Filter):
    """Lets the first record of each message through (its first line, digits ignored); counts the others."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        first_line = record.getMessage().split("\n", 1)[0]
        key = (record.name, _DIGITS.sub("#", first_line))
        if key in self.seen:
            self.hidden += 1
            return False
        self.seen.add(key)
        return True


@contextmanager
def once_per_message(log_file: str | None = None) -> Iterator[OncePerMessage]:
    """Filter repeated messages on every terminal handler of the root logger while the block runs; then say how
    many were hidden and where they are (``log_file``)."""
    terminals = [h for h in logging.getLogger().handlers
                 if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    once = OncePerMessage()
    for handler in terminals:
        handler.addFilter(once)
    try:
        yield once
    finally:
        for handler in terminals:
            handler.removeFilter(once)
        if once.hidden:
            where = f" (all in {log_file})" if log_file else ""
            logging.getLogger(__name__).warning("%d repeated log messages were not shown%s", once.hidden, where)
