"""A calibrating device times on past its minimum until it knows its mean step (ecofl.pipeline.runtime.device_timing).

The device's clock is faked: each step advances it by the seconds the test gives, so what is asserted is the
rule (how many steps, how long), not this machine's speed.
"""

from __future__ import annotations

import itertools
import math

import pytest

from ecofl.pipeline.runtime import device_timing
from ecofl.pipeline.runtime.device_timing import CHECK_EVERY_S, relative_error, timed_calls


class FakeClock:
    """perf_counter for device_timing: moves only when a step says how long it took."""

    def __init__(self, step_seconds):
        self.now = 0.0
        self.steps = iter(step_seconds)

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += next(self.steps)


@pytest.fixture
def clock(request, monkeypatch):
    fake = FakeClock(request.param)
    monkeypatch.setattr(device_timing.time, "perf_counter", fake)
    return fake


def test_steps_of_one_length_have_no_error_and_too_few_steps_have_no_known_error():
    assert relative_error([0.1] * 40) == 0.0
    assert relative_error([0.1] * 19) == math.inf  # ten batches of fewer than two steps


def test_a_speed_that_moves_over_the_calibration_leaves_its_mean_less_known_than_steps_that_only_jitter():
    jitter = [0.1, 0.12] * 50  # every batch has the same mean
    drift = [0.1] * 50 + [0.12] * 50  # the first half's batches are faster than the second's
    assert relative_error(jitter) == pytest.approx(0.0, abs=1e-12)
    assert relative_error(drift) > 0.03


@pytest.mark.parametrize("clock", [itertools.repeat(0.1)], indirect=True)
def test_a_steady_device_stops_once_it_has_steps_enough_to_know_its_mean(clock):
    mean_s, _, error = timed_calls(clock.step, min_seconds=1.0, precision=0.02, max_seconds=4.0)
    assert mean_s == pytest.approx(0.1)
    # 1 s gave 10 steps; the error needs 20 (two a batch), then it is 0 at the next check
    assert 2.0 <= clock.now <= 2.0 + CHECK_EVERY_S + 0.1 + 1e-9
    assert error == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("clock", [itertools.cycle([0.1] * 7 + [0.3] * 7)], indirect=True)
def test_a_device_whose_speed_moves_times_on_until_its_limit_and_says_how_well_it_knows_its_mean(clock):
    _, _, error = timed_calls(clock.step, min_seconds=1.0, precision=0.02, max_seconds=4.0)
    assert 4.0 <= clock.now < 4.0 + 0.3 + 1e-9  # stopped at the first step past its limit
    assert error > 0.02


@pytest.mark.parametrize("clock", [itertools.cycle([0.1] * 7 + [0.3] * 7)], indirect=True)
def test_without_a_precision_a_device_times_only_its_minimum(clock):
    timed_calls(clock.step, min_seconds=1.0)
    assert 1.0 <= clock.now < 1.0 + 0.3 + 1e-9


def test_checking_the_error_costs_no_step_its_time(monkeypatch):
    """The check runs between steps, each of which is timed alone: with a check as slow as a step, the mean step
    is still the step's, and the check runs every CHECK_EVERY_S of steps, not after every step."""
    clock = FakeClock(itertools.repeat(0.01))
    checked = []

    def slow_check(durations, batches=10):
        clock.now += 0.01  # the check takes as long as a step
        checked.append(len(durations))
        return math.inf

    monkeypatch.setattr(device_timing.time, "perf_counter", clock)
    monkeypatch.setattr(device_timing, "relative_error", slow_check)
    mean_s, _, _ = timed_calls(clock.step, min_seconds=0.5, precision=0.02, max_seconds=1.0)
    assert mean_s == pytest.approx(0.01)
    assert 1 < len(checked) <= 2 + (1.0 - 0.5) / CHECK_EVERY_S  # the checks past the minimum, and the last one
