"""What the portal records of the faults of one training call: every event, when the pipeline resumed and
recovered after it, and the throughput before and after (:class:`~.faults.FaultEvent`)."""

from __future__ import annotations

import time

import numpy as np

from ecofl.pipeline.runtime.faults import FaultEvent


class FaultLog:
    """The events of one ``HomePipeline.train`` call and the sync-rounds completed around them."""

    def __init__(self) -> None:
        self.events: list[FaultEvent] = []
        self._waiting: list[FaultEvent] = []  # recovered, waiting for their first completed sync-round
        self._completed: list[tuple[float, float]] = []  # (end wall time, seconds) of every completed round

    def record(self, event: FaultEvent) -> FaultEvent:
        """An event that strikes now."""
        event.struck_at = time.time()
        self.events.append(event)
        return event

    def slow_down(self, device: int, r: int, found: float) -> FaultEvent:
        """The injected slow-down of ``device`` not yet adapted to, or a new one found at ``found`` in round ``r``."""
        event = next((e for e in reversed(self.events)
                      if e.kind == "slow" and e.device == device and e.detected_after_s is None), None)
        if event is None:
            event = FaultEvent("slow", device, r)
            event.struck_at = found
            self.events.append(event)
        return event

    def recovered(self, event: FaultEvent) -> None:
        """The pipeline has adapted to ``event``: it resumes with the next sync-round sent."""
        self._waiting.append(event)

    def round_sent(self) -> None:
        """A sync-round has started: the events recovered from have resumed."""
        now = time.time()
        for event in self._waiting:
            if event.resumed_after_s is None:
                event.resumed_after_s = now - event.struck_at

    def round_completed(self, seconds: float) -> None:
        """A sync-round of ``seconds`` has completed: the events recovered from are behind it."""
        now = time.time()
        self._completed.append((now, seconds))
        for event in self._waiting:
            event.recovered_after_s = now - event.struck_at
        self._waiting.clear()

    def finish(self, batch_size: int) -> list[FaultEvent]:
        """The events, with the throughput (samples/s) of the sync-rounds before each and after its recovery."""
        for event in self.events:
            at = event.struck_at
            if at is None:  # aimed at a phase the device never reached
                continue
            before = [s for end, s in self._completed if end <= at][-3:]
            after_start = at + (event.recovered_after_s or 0.0)
            after = [s for end, s in self._completed if end > after_start]
            event.throughput_before = batch_size / float(np.mean(before)) if before else None
            event.throughput_after = batch_size / float(np.mean(after)) if after else None
        return self.events
