"""benchmarks/granularity.py: how near its schedule's bound the cost model puts a plan (no model trains)."""

from __future__ import annotations

import pytest

from benchmarks.granularity import markdown, plan_row
from ecofl.pipeline.planners import make_plan
from tests.pipeline_kit import pool, synthetic_profile


def row_for(layers: int, devices: int = 3, batch: int = 24) -> dict:
    profile = synthetic_profile(layers)  # every layer costs the same, no bytes between stages, no optimizer step
    home = pool(devices)
    plan = make_plan("ecofl", profile, home, batch)
    return plan_row("synthetic", "block", profile, home, "ecofl", plan, batch, "sleep")


def test_a_balanced_plan_on_free_links_reaches_its_schedules_bound():
    row = row_for(12)  # three identical devices, four layers each
    assert row["stages"] == 3
    assert row["bound"] == pytest.approx(row["micro_batches"] / (row["micro_batches"] + 2))
    assert row["efficiency"] == pytest.approx(row["bound"], rel=1e-6)
    assert row["of_bound"] == pytest.approx(1.0, rel=1e-6)
    assert len(row["busy_fraction"]) == 3


def test_layers_that_do_not_split_evenly_hold_a_plan_under_the_bound():
    row = row_for(13)  # five layers on one device, four on each of the others
    # no plan outpaces its busiest stage: 5 of the 13 layers where an even share would be 13/3
    assert row["efficiency"] <= 13 / 3 / 5 + 1e-9
    assert row["of_bound"] == pytest.approx(row["efficiency"] / row["bound"])
    assert row["of_bound"] < 0.95
    assert min(row["busy_fraction"]) < max(row["busy_fraction"])


def test_the_table_shows_each_plan():
    results = {"command": "python benchmarks/granularity.py", "machine": "x86_64", "date": "today",
               "emulate": "sleep", "batch": 24, "rows": [row_for(12), row_for(13)]}
    table = markdown(results)
    assert table.count("| synthetic | test | ecofl | block: 12 |") == 1
    assert "| block: 13 |" in table
