"""The cost model re-learned in the pipeline (benchmarks/home_runs.py), and how confined.py shows it beside the
up-front prediction."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.confined import again_cell, again_summary, bracketed, markdown, own_speed_cell  # noqa: E402
from benchmarks.home_runs import in_pipeline_prediction  # noqa: E402
from ecofl.pipeline.replan import with_speeds  # noqa: E402
from ecofl.pipeline.round_breakdown import round_breakdown  # noqa: E402
from ecofl.pipeline.runtime import HomePipeline  # noqa: E402
from ecofl.pipeline.runtime.prediction import predict_sync_round  # noqa: E402
from pipeline_kit import PROFILE, THREE_STAGES, WITHOUT_BATCH_NORM, data, pool  # noqa: E402


def test_devices_that_run_as_modelled_are_re_learned_at_their_speeds_and_mapping_is_not_slowness():
    """Devices sleeping to the cost model run as modelled: re-learned from their second round, each keeps its
    speed (scheduling adds a little) and the plan's prediction with it. Told that device 1 mapped memory anew in
    that round worth a fifth of its passes (at 1 ns a byte), the re-learned model takes that off: device 1 comes
    out a quarter faster, the others as they were."""
    x, y = data()
    hosts = pool(3)
    with HomePipeline(WITHOUT_BATCH_NORM, hosts, THREE_STAGES, profile=PROFILE, emulate="sleep", timeout_s=120) as home:
        warm = home.train(None, x, y, 2, lr=0.1)
    relearned = in_pipeline_prediction(warm, THREE_STAGES, PROFILE, hosts, "sleep", None)
    for device, speed in relearned["speeds"].items():
        assert 0.5 < speed / hosts.devices[int(device)].speed <= 1.05
    predicted = predict_sync_round(THREE_STAGES, PROFILE, hosts, "sleep").sync_round_s
    assert predicted * 0.95 <= relearned["predicted_sync_round_s"] < 2 * predicted
    passes = round_breakdown(warm.timeline, 2)[1].compute_s
    touched = {**warm.first_touched_by_device[-1], 1: int(0.2 * passes / 1e-9)}  # a fifth of its passes
    told = dataclasses.replace(warm, first_touched_by_device=(*warm.first_touched_by_device[:-1], touched))
    faster = in_pipeline_prediction(told, THREE_STAGES, PROFILE, with_speeds(hosts, {}, {1: 1e-9}), "sleep", None)
    assert faster["speeds"]["1"] == pytest.approx(relearned["speeds"]["1"] / 0.8, rel=1e-3)
    assert faster["speeds"]["0"] == relearned["speeds"]["0"]


def test_confined_tables_show_the_re_learned_prediction_where_it_was_measured():
    results = json.loads((ROOT / "benchmarks" / "results" / "confined.json").read_text())
    worst = max(row["confined"]["in_pipeline"]["planner_error"] for row in results["rows"])
    table = markdown(results)
    assert "re-learned (error)" in table and f"re-learned in the pipeline {100 * worst:.1f}%" in table
    for row in results["rows"]:
        relearned = row["confined"]["in_pipeline"]
        assert f"{relearned['predicted_sync_round_s']:.3f} ({100 * relearned['planner_error']:.1f}%)" in table
    for row in results["rows"]:
        del row["confined"]["in_pipeline"]
    assert "re-learned in the pipeline not measured" in markdown(results)


def test_a_miss_between_the_calibrations_before_and_after_the_run_is_marked_as_the_devices_drift():
    """A row measured at 5.5 s, predicted at 4.8 s on the first calibration: timed again after the run at 5.6 s,
    the run lies between the two (``*``, counted in the summary); timed again at 4.9 s, it lies outside both. A
    row without the second calibration shows ``-``."""
    results = json.loads((ROOT / "benchmarks" / "results" / "confined.json").read_text())
    row = results["rows"][0]
    row.pop("host_probe", None)  # what the summary adds for it: tests/test_host_probe.py
    row["confined"].update(sync_round_s=5.5, predicted_sync_round_s=4.8, planner_error=0.7 / 5.5)
    device = next(iter(row["measured_speeds"]))
    row["calibrated_after_run"] = {"speeds": {}, "speed_change": {device: -0.12},
                                   "predicted_sync_round_s": 5.6, "planner_error": 0.1 / 5.5}
    assert bracketed(row) and again_cell(row) == "5.600 (1.8%) *"
    assert again_summary([row]) == ("1 of 1 rows over 10%, 1 of them between the predictions on the speeds "
                                    "calibrated before and after the run")
    assert own_speed_cell(row, int(device)).endswith("(after: -12%)")
    row["calibrated_after_run"].update(predicted_sync_round_s=4.9, planner_error=0.6 / 5.5)
    assert not bracketed(row) and not again_cell(row).endswith("*")
    assert again_summary([row]).endswith("0 of them between the predictions on the speeds calibrated before and "
                                         "after the run")
    table = markdown({**results, "rows": [row]})
    assert "5.600" not in table and "| 4.900 (10.9%) |" in table
    del row["calibrated_after_run"]
    assert again_cell(row) == "-" and "devices not timed again after the run" in markdown({**results, "rows": [row]})
