"""Round breakdowns read from hand-built timelines (no model runs)."""

import pytest

from ecofl.pipeline.round_breakdown import round_breakdown
from ecofl.pipeline.schedule import ActionKind
from ecofl.pipeline.timeline import TimelineEvent

F, B, SEND = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.SEND


def two_stages(offset: float = 0.0) -> list[TimelineEvent]:
    """Two micro-batches over two stages, 1F1B: device 5 runs stage 0, device 7 stage 1 (times in seconds)."""
    return [
        TimelineEvent(5, 0, F, 0, offset + 0.0, offset + 1.0),
        TimelineEvent(5, 0, F, 1, offset + 1.0, offset + 2.0),
        TimelineEvent(5, 0, SEND, 0, offset + 1.0, offset + 1.1),  # not compute: ignored
        TimelineEvent(7, 1, F, 0, offset + 1.5, offset + 2.5),  # its activation was ready at 1.0: waited 0.5
        TimelineEvent(7, 1, B, 0, offset + 2.5, offset + 3.5),  # its own loss: no hand-off
        TimelineEvent(7, 1, F, 1, offset + 3.5, offset + 4.5),  # ready at 2.0, the device busy until 3.5: no wait
        TimelineEvent(5, 0, B, 0, offset + 3.75, offset + 4.75),  # gradient ready at 3.5: waited 0.25
        TimelineEvent(7, 1, B, 1, offset + 4.5, offset + 5.5),
        TimelineEvent(5, 0, B, 1, offset + 6.0, offset + 7.0),  # ready at 5.5, free since 4.75: waited 0.5
    ]


def test_compute_idle_and_the_hand_offs_each_device_waited_for():
    breakdown = round_breakdown(two_stages())
    first, last = breakdown[5], breakdown[7]
    assert (first.stage, last.stage) == (0, 1)
    assert first.compute_s == pytest.approx(4.0) and first.idle_s == pytest.approx(3.0)
    assert first.handoff_waits_s == pytest.approx((0.25, 0.5))
    assert last.compute_s == pytest.approx(4.0) and last.idle_s == pytest.approx(0.0)
    assert last.handoff_waits_s == pytest.approx((0.5,))


def test_a_later_round_of_a_measured_timeline():
    """Three rounds of the same plan: each device's operations split by count; the chosen one is read."""
    timeline = two_stages(0.0) + two_stages(10.0) + two_stages(20.0)
    timeline[-1] = timeline[-1]._replace(start=29.0, end=30.0)  # the last round's last backward waited longer
    assert round_breakdown(timeline, rounds=3, index=1) == round_breakdown(two_stages())
    assert round_breakdown(timeline, rounds=3)[5].handoff_waits_s == pytest.approx((0.25, 3.5))


def test_a_timeline_that_is_not_whole_rounds_is_refused():
    with pytest.raises(ValueError, match="not 2 rounds"):
        round_breakdown(two_stages()[:-1], rounds=2)
