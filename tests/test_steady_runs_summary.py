"""benchmarks/steady_runs.py's summary: fault tolerance's cost against the plain runs either side, raw and per
CPU-second of the busiest device's stage thread, on made-up runs (nothing is trained here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.steady_runs import (  # noqa: E402
    plain_busiest_stage, render, round_per_stage_cpu, standard_error, summary)


def run(round_s: float, stage_cpu_s: float, fault_tolerance: bool) -> dict:
    """A run of a two-stage plan whose second device is predicted busiest; its stage thread spent
    ``stage_cpu_s`` a round, the first device's a fixed 0.1 s."""
    return {"fault_tolerance": fault_tolerance, "inject": None, "sync_round_s": round_s, "mean_round_s": round_s,
            "steady_mean_round_s": round_s, "predicted_sync_round_s": 5.0, "error": round_s / 5.0 - 1,
            "predicted_busy_fraction": [0.5, 0.9], "cpu_s_per_round": [0.11, stage_cpu_s + 0.01],
            "cpu_s_per_round_by_job": [{"MainThread": 0.1}, {"MainThread": stage_cpu_s}],
            "host_reference_s": 0.1, "load_before": 1.0}


def test_a_slower_host_moves_the_raw_cost_and_not_the_cost_per_stage_cpu_second():
    """Plain runs at 5 s on 1 CPU-s and, on a host a fifth slower, 6 s on 1.2 CPU-s; a fault-tolerant run
    between them at 5.5 s on 1.0 CPU-s costs 0% raw (against their 5.5 s mean) and +10% per CPU-second."""
    runs = [run(5.0, 1.0, False), run(5.0, 1.0, False), run(5.5, 1.0, True), run(6.0, 1.2, False)]
    assert plain_busiest_stage(runs) == 1
    assert round_per_stage_cpu(runs[3], 1) == pytest.approx(5.0)  # the busiest device's stage thread
    figures = summary(runs, pairs=1)
    assert figures["fault_tolerance_costs"] == pytest.approx([0.0])
    assert figures["fault_tolerance_per_stage_cpu_costs"] == pytest.approx([0.1])
    assert figures["plain_spread"] == pytest.approx(0.2)
    assert figures["plain_spread_per_stage_cpu"] == pytest.approx(0.0)  # the same 5 s a round per CPU-second
    table = render({"command": "c", "runs_of": "r", "machine": "m", "measured_at": "t", "runs": runs,
                    "kills": [], **figures})
    assert "per CPU-second of the busiest device's stage thread: +10.0% (mean +10.0%)" in table
    assert "factored out) within 0.0%" in table


def test_every_run_of_the_plan_is_gauged_on_the_device_the_plain_runs_keep_busiest():
    """A fault-tolerant run's own prediction (its copies' time added) names the first device busiest; its
    figure still divides by the second device's stage thread, as the plain runs' does."""
    runs = [run(5.0, 1.0, False), run(5.0, 1.0, False), run(5.5, 1.0, True), run(5.0, 1.0, False)]
    runs[2]["predicted_busy_fraction"] = [0.95, 0.9]
    figures = summary(runs, pairs=1)
    assert figures["fault_tolerance_per_stage_cpu_costs"] == pytest.approx([0.1])  # not 5.5 / 0.1 s
    table = render({"command": "c", "runs_of": "r", "machine": "m", "measured_at": "t", "runs": runs,
                    "kills": [], **figures})
    assert "| 5.50 | 0.100 | - | 1.0 |" in table  # its row: 5.5 s a round over 1.0 CPU-s (no host probe)


def test_the_mean_cost_carries_its_standard_error_over_the_runs():
    """Two fault-tolerant runs costing 0% and +10% against the plain runs either side: mean +5.0%, and its
    standard error 5.0% (their standard deviation, 7.07%, over the square root of two); one run has none."""
    runs = [run(5.0, 1.0, False), run(5.0, 1.0, False), run(5.0, 1.0, True), run(5.0, 1.0, False),
            run(5.5, 1.0, True), run(5.0, 1.0, False)]
    figures = summary(runs, pairs=2)
    assert figures["fault_tolerance_costs"] == pytest.approx([0.0, 0.1])
    table = render({"command": "c", "runs_of": "r", "machine": "m", "measured_at": "t", "runs": runs,
                    "kills": [], **figures})
    assert "each run's mean of all rounds against the plain runs' either side: +0.0%, +10.0% (mean +5.0%, standard " \
           "error 5.0%)" in table
    assert standard_error([0.1]) is None


def test_the_devices_timed_alone_after_each_plain_run_give_a_spread_of_their_own():
    """Plain runs at 5 and 6 s (20% apart) whose devices, timed alone right after each, predict 5.0 and 5.1 s:
    the devices moved 2%, the runs 20%. Where a plain run was not timed, no such spread is claimed."""
    runs = [run(5.0, 1.0, False), run(5.0, 1.0, False), run(5.5, 1.0, True), run(6.0, 1.2, False)]
    for plain, predicted in zip((runs[0], runs[1], runs[3]), (4.9, 5.0, 5.1)):
        plain["timed_after"] = {"speeds": [0.1, 0.1], "predicted_sync_round_s": predicted}
    figures = summary(runs, pairs=1)
    assert figures["plain_spread"] == pytest.approx(0.2)
    assert figures["plain_spread_timed_after"] == pytest.approx(0.02)  # runs 2 and 4: 5.1 / 5.0
    table = render({"command": "c", "runs_of": "r", "machine": "m", "measured_at": "t", "runs": runs,
                    "kills": [], **figures})
    assert "alone right after each, within 2.0%." in table
    assert "| 5.10 (+2.0%) |" in table and "| 1.0 | - |" in table  # the fault-tolerant run is not timed
    del runs[3]["timed_after"]
    assert "plain_spread_timed_after" not in summary(runs, pairs=1)


def test_the_host_probe_during_each_run_gives_the_plain_runs_spread_and_each_pair_the_host_it_met():
    """The probe's work took 2.0 and 2.1 ms during the plain runs around a fault-tolerant run during which it took
    2.4 ms: that run met a host 17% slower than its neighbours; the table shows each run's probe. The plain runs
    on a host 5% and 10% slower than the first took 5% and 10% longer: correlation +1. Where a run was not probed,
    no such figure is claimed; with fewer than three plain runs, no correlation."""
    runs = [run(5.0, 1.0, False), run(5.0, 1.0, False), run(6.0, 1.2, True), run(5.25, 1.0, False),
            run(5.0, 1.0, True), run(5.5, 1.0, False)]
    for each, median_s in zip(runs, (0.0021, 0.002, 0.0024, 0.0021, 0.002, 0.0022)):
        each["host_probe"] = {"median_s": median_s, "quartiles_s": [median_s, median_s], "samples": 80}
    figures = summary(runs, pairs=2)
    assert figures["plain_spread_host_probe"] == pytest.approx(0.1)  # runs 2, 4 and 6 (run 1 calibrates)
    assert figures["plain_host_probe_correlation"] == pytest.approx(1.0)
    assert figures["fault_tolerance_host_probe"] == pytest.approx([0.0024 / 0.00205 - 1, 0.002 / 0.00215 - 1])
    table = render({"command": "c", "runs_of": "r", "machine": "m", "measured_at": "t", "runs": runs,
                    "kills": [], **figures})
    assert "| 0.100 | 2.40 | 1.0 |" in table
    assert "within 10.0% of each other, its correlation with their sync-rounds +1.00" in table
    assert "during each fault-tolerant run's against the plain runs' either side: +17.1%, -7.0% (mean +5.0%" in table
    assert "plain_host_probe_correlation" not in summary(runs[:4], pairs=1)
    del runs[2]["host_probe"]
    assert "fault_tolerance_host_probe" not in summary(runs, pairs=2)
