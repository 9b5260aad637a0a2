"""Heartbeat bookkeeping with a fake clock: suspicion, probes, failures, the detection bound."""

from __future__ import annotations

import pytest

from ecofl.net.liveness import CLOSED, SILENT, Liveness, LivenessSettings

SETTINGS = LivenessSettings(period_s=0.1, suspect_after_s=0.5, probe_timeout_s=0.3)


def run_until_failure(live: Liveness, beating: set[int], start: float, step: float = 0.05):
    """Advance a fake clock; devices in ``beating`` beat every period; return the first failures."""
    now = start
    while now < start + 10:
        now = round(now + step, 6)
        if round(now / SETTINGS.period_s, 6) % 1 == 0:
            for d in beating:
                live.heard(d, now)
        live.to_probe(now)
        failures = live.check(now)
        if failures:
            return now, failures
    raise AssertionError("no failure detected")


def test_a_silent_device_is_probed_then_declared_failed_within_the_bound():
    live = Liveness([0, 1, 2], SETTINGS, now=0.0)
    now, failures = run_until_failure(live, beating={0, 2}, start=0.0)
    assert [f.device for f in failures] == [1] and failures[0].reason == SILENT
    assert now - failures[0].last_seen == pytest.approx(SETTINGS.detection_bound_s, abs=0.06)
    assert live.alive() == [0, 2]


def test_a_probe_answer_clears_suspicion():
    live = Liveness([0, 1], SETTINGS, now=0.0)
    assert live.to_probe(0.6) == [0, 1]
    assert live.to_probe(0.65) == []  # probed once
    live.heard(0, 0.7)
    live.heard(1, 0.7)
    assert live.check(1.0) == []
    assert live.alive() == [0, 1]


def test_a_closed_channel_fails_at_once_and_stays_failed():
    live = Liveness([0, 1], SETTINGS, now=0.0)
    live.heard(1, 0.2)
    live.closed(1, 0.25)
    assert live.failures[1].reason == CLOSED and live.failures[1].last_seen == 0.2
    live.heard(1, 0.3)  # a late heartbeat does not revive it
    assert live.alive() == [0]


def test_next_deadline_and_bad_settings():
    live = Liveness([0], SETTINGS, now=1.0)
    assert live.next_deadline(1.0) == pytest.approx(1.5)
    live.to_probe(1.5)
    assert live.next_deadline(1.5) == pytest.approx(1.8)
    with pytest.raises(ValueError):
        LivenessSettings(period_s=1.0, suspect_after_s=0.5)


def test_devices_that_join_and_leave_later_are_tracked_and_a_silent_one_is_suspected_until_it_beats():
    """The home service's daemons: they join and leave while it runs; silence leaves one out until it beats."""
    live = Liveness((), LivenessSettings(period_s=1.0, suspect_after_s=5.0, probe_timeout_s=5.0), now=0.0)
    live.join(1, now=10.0)
    live.join(2, now=11.0)
    live.heard(1, at=14.0)
    assert live.suspected(now=16.0) == {2}  # silent since 11
    live.heard(2, at=16.5)
    assert live.suspected(now=17.0) == set()
    live.closed(1, at=18.0)
    assert live.suspected(now=30.0) == {2} and live.alive() == [2]  # a failed device is not "suspected"
    live.leave(1)
    live.join(1, now=30.0)  # joined again: a fresh member, no failure on record
    assert live.alive() == [1, 2] and live.suspected(now=31.0) == {2}
    live.leave(2)
    assert live.alive() == [1] and live.suspected(now=40.0) == {1}
