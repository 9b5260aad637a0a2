"""Everything the event loop has learnt and done, as one record a checkpoint saves and restores.

:class:`LoopState` is the loop's memory apart from its settings, its clock
and the model weights: the queried latencies and label histograms, the
grouping and RT, counters, the metric rows, the evaluation record and the
sampling generator. :meth:`LoopState.to_json` and :meth:`LoopState.from_json`
walk the dataclass's fields, so a new field is checkpointed by declaring
it (and, if JSON cannot hold it as it is, giving it a codec in ``_CODECS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import numpy as np

from ecofl.fl.grouping import Grouping
from ecofl.fl.transport import HomeReport


@dataclass
class LoopState:
    """The event loop's state (Eco-FL §5): what it knows of the homes, what it has applied, what it measured."""

    rng: np.random.Generator  # samples idle groups and their homes
    version: int = 0  # global model version: updates applied so far
    rt: float | None = None  # Eco-FL's latency threshold RT (seconds)
    grouping: Grouping | None = None
    latencies: dict[int, float] = field(default_factory=dict)  # home -> latest response latency L_n
    hists: dict[int, np.ndarray] = field(default_factory=dict)  # home -> label histogram pi_n
    num_samples: dict[int, int] = field(default_factory=dict)
    group_rounds: list[int] = field(default_factory=list)  # rounds sent per group
    updates_per_group: list[int] = field(default_factory=list)  # updates applied per group
    dispatched: int = 0  # rounds sent in all
    busy_until: dict[int, float] = field(default_factory=dict)  # home -> clock time its task ends (inf: not known)
    totals: dict[str, int] = field(default_factory=lambda: {"rejected": 0, "failed": 0, "stragglers": 0})
    empty_rounds: int = 0  # group rounds in a row without a valid update
    rows: list[dict] = field(default_factory=list)  # one metrics row per applied update
    last_eval: tuple[float | None, float | None] = (None, None)  # (loss, accuracy) of the latest evaluation
    best_accuracy: float | None = None
    target_reached: dict | None = None  # {"virtual_time", "update"} when the target accuracy was first reached
    wall_offset: float = 0.0  # wall seconds spent before the latest resume
    home_failures: dict = field(default_factory=dict)  # ecofl.fl.home_failures.HomeFailures.to_json() at a checkpoint

    def start_grouping(self, grouping: Grouping) -> None:
        """The first grouping (§5.2): every group has sent and applied nothing yet."""
        self.grouping = grouping
        self.group_rounds = [0] * len(grouping.groups)
        self.updates_per_group = [0] * len(grouping.groups)

    def record_reports(self, reports: Sequence[HomeReport]) -> None:
        """What the homes answered a query (§5.2 "Profiling"): latency, label histogram, samples."""
        for report in sorted(reports, key=lambda r: r.home):
            self.latencies[report.home] = float(report.latency_s)
            self.hists[report.home] = np.asarray(report.label_histogram, dtype=float)
            self.num_samples[report.home] = int(report.num_samples)

    def to_json(self) -> dict:
        return {f.name: _codec(f.name)[0](getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> "LoopState":
        return cls(**{f.name: _codec(f.name)[1](data[f.name]) for f in fields(cls)})


def _generator(state: dict) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


_SAME = (lambda v: v, lambda v: v)
_CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "rng": (lambda rng: rng.bit_generator.state, _generator),
    "grouping": (lambda g: g.to_json() if g is not None else None,
                 lambda d: Grouping.from_json(d) if d is not None else None),
    "latencies": (lambda m: {str(h): v for h, v in m.items()}, lambda m: {int(h): float(v) for h, v in m.items()}),
    "hists": (lambda m: {str(h): v.tolist() for h, v in m.items()},
              lambda m: {int(h): np.asarray(v, dtype=float) for h, v in m.items()}),
    "num_samples": (lambda m: {str(h): v for h, v in m.items()}, lambda m: {int(h): int(v) for h, v in m.items()}),
    "busy_until": (lambda m: {str(h): v for h, v in m.items()}, lambda m: {int(h): float(v) for h, v in m.items()}),
    "last_eval": (list, tuple),
}


def _codec(name: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    return _CODECS.get(name, _SAME)
