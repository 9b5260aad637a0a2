"""The host probe beside a benchmark's work (benchmarks/host_probe.py) and how confined.py shows what it read."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.confined import again_summary, host_cell, markdown  # noqa: E402
from benchmarks.host_probe import HostProbe, relative_speed, summarize  # noqa: E402

START_WAIT_S = 120  # the probe imports torch before its first sample: generous on a loaded machine


def test_the_probe_times_its_work_while_the_block_runs_and_is_gone_after_it():
    with HostProbe(interval_s=0.05) as probe:
        deadline = time.monotonic() + START_WAIT_S
        while len(probe.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert probe._process is not None and probe._process.poll() is not None
    assert len(probe.samples) >= 3 and all(0 < sample < 10 for sample in probe.samples)
    summary = probe.summary()
    assert summary["samples"] == len(probe.samples)
    assert summary["quartiles_s"][0] <= summary["median_s"] <= summary["quartiles_s"][1]
    assert probe.taken_at == sorted(probe.taken_at) and probe.taken_at[-1] <= time.monotonic()
    assert probe.summary(since=probe.taken_at[-2])["samples"] == 2
    assert probe.summary(since=probe.taken_at[-1] + 1)["samples"] == 0


def test_the_probe_is_stopped_when_the_block_it_brackets_fails():
    with pytest.raises(KeyboardInterrupt):
        with HostProbe() as probe:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the work it brackets
    assert probe._process is not None and probe._process.poll() is not None


def test_a_summary_gives_the_median_and_quartiles_and_none_under_two_samples():
    assert summarize([0.004, 0.001, 0.002, 0.003, 0.005]) == {
        "median_s": 0.003, "quartiles_s": [pytest.approx(0.0015), pytest.approx(0.0045)], "samples": 5}
    assert summarize([0.002]) == {"median_s": None, "quartiles_s": None, "samples": 1}


def test_the_host_is_slower_by_how_much_longer_the_same_work_took():
    assert relative_speed({"median_s": 0.0033}, {"median_s": 0.003}) == pytest.approx(0.1)
    assert relative_speed({"median_s": 0.0027}, {"median_s": 0.003}) == pytest.approx(-0.1)
    assert relative_speed({"median_s": None}, {"median_s": 0.003}) is None
    assert relative_speed(None, {"median_s": 0.003}) is None


def test_confined_rows_show_the_host_in_the_run_against_its_calibration_and_misses_name_it():
    """A row whose probe's work took 20% longer in the run than in calibration (and 5% longer in the timing after)
    shows ``+20% (after: +5%)``; a missed row's summary names it; a row without the probe shows ``-``."""
    results = json.loads((ROOT / "benchmarks" / "results" / "confined.json").read_text())
    row = results["rows"][0]
    row["host_probe"] = {"calibration": {"median_s": 0.002}, "run": {"median_s": 0.0024},
                         "calibration_after_run": {"median_s": 0.0021}}
    assert host_cell(row) == "+20% (after: +5%)"
    row["confined"].update(sync_round_s=5.5, predicted_sync_round_s=4.8, planner_error=0.7 / 5.5)
    row["calibrated_after_run"] = {"speeds": {}, "speed_change": {}, "predicted_sync_round_s": 4.9,
                                   "planner_error": 0.6 / 5.5}
    assert again_summary([row]).endswith("the host probe during those runs against their calibrations: "
                                         "+20% (after: +5%)")
    assert "| +20% (after: +5%) |" in markdown({**results, "rows": [row]})
    row["host_probe"]["calibration_after_run"] = {"median_s": None}
    assert host_cell(row) == "+20%"
    del row["host_probe"]
    assert host_cell(row) == "-"
