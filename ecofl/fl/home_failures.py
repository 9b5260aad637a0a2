"""Home failures counted by kind: one terminal line per kind, every failure in a log file, the counts in the outputs.

A federation of hundreds of homes can fail hundreds of times the same way
(Ray's memory monitor killing an actor during a query, a pipeline that does
not fit). Each failure is recorded under a kind that says where and how
(``query:silent``, ``train:crashed``, ``train:pipeline_failed``,
``update:rejected``, ...): the first of each kind is one warning line on the
terminal, every one is a line of ``home_failures.log`` in the run's output
directory, and ``summary.json`` and every metrics row carry the counts.

A run whose failed training tasks outnumber its successful ones measured
little of the strategy it ran: :func:`mostly_failed` says so, and
``simulations.run`` then exits with :data:`MOSTLY_FAILED_EXIT` (a run with
fewer failures exits 0: homes fail in federated learning, and the counts
say how often).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: The exit status of a simulation whose failed training tasks outnumber its successful ones.
MOSTLY_FAILED_EXIT = 3
#: Failure kinds of a training task (as opposed to a query or a rejected update).
TRAIN = "train:"


@dataclass
class FailureKind:
    count: int
    first: str  # who failed first, and its message


class HomeFailures:
    """The failures of one run's homes (module docstring); ``log_path`` receives one line per failure."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.kinds: dict[str, FailureKind] = {}
        self.trained = 0  # training tasks that came back with an update

    def to_json(self) -> dict:
        return {"kinds": self.report(), "trained": self.trained}

    def add(self, saved: dict) -> None:
        """Go on counting from ``saved`` (a checkpoint's :meth:`to_json`) as well."""
        for kind, entry in saved.get("kinds", {}).items():
            mine = self.kinds.setdefault(kind, FailureKind(0, entry["first"]))
            mine.count += entry["count"]
        self.trained += int(saved.get("trained", 0))

    def record(self, kind: str, who: str, message: str) -> None:
        """Count a failure of ``who`` (``"home 5"``, or a node before it is known as a home); the first of its
        kind is logged, every one goes to the log file."""
        line = f"{who}: {' '.join(message.split())}"
        entry = self.kinds.get(kind)
        if entry is None:
            self.kinds[kind] = FailureKind(1, line)
            where = f"; every one in {self.log_path}" if self.log_path else ""
            log.warning("home failure (%s): %s (further ones of this kind are counted%s)", kind, line, where)
        else:
            entry.count += 1
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as handle:
                handle.write(f"{kind}\t{line}\n")

    def counts(self) -> dict[str, int]:
        return {kind: entry.count for kind, entry in sorted(self.kinds.items())}

    def report(self) -> dict[str, dict]:
        """``summary.json``'s ``home_failures``: per kind, the count and the first failure."""
        return {kind: {"count": entry.count, "first": entry.first} for kind, entry in sorted(self.kinds.items())}

    def compact(self) -> str:
        """The counts as one metrics cell: ``kind=count;...`` (empty without failures)."""
        return ";".join(f"{kind}={count}" for kind, count in self.counts().items())

    def log_summary(self) -> None:
        """One warning line per kind at the end of a run with failures, and where every failure is listed."""
        for kind, entry in sorted(self.kinds.items()):
            log.warning("home failures (%s): %d, the first %s", kind, entry.count, entry.first)
        if self.kinds and self.log_path is not None:
            log.warning("every home failure is listed in %s", self.log_path)


def mostly_failed(summary: dict) -> bool:
    """Whether a run's failed training tasks outnumber the ones that brought an update (its ``summary.json``)."""
    failed = sum(entry["count"] for kind, entry in summary.get("home_failures", {}).items() if kind.startswith(TRAIN))
    return failed > summary.get("home_trainings", 0)
