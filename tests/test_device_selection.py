"""Where devices compute for real, a plan leaves out a device that costs it more than it gives (PipeEdge §III-B's
device selection over the runtime's cost model: ecofl.pipeline.runtime.prediction.selected_devices)."""

from __future__ import annotations

import dataclasses

import pytest

from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.replan import HYBRID_PLANNERS, full_replans
from ecofl.pipeline.runtime import prediction
from pipeline_kit import HOST, synthetic_profile

PROFILE = synthetic_profile(6)


def home(*speeds: float) -> HomePool:
    return HomePool("selection", tuple(dataclasses.replace(HOST, name=f"d{i}", speed=s) for i, s in enumerate(speeds)))


def used(plan) -> set[int]:
    return {device for stage in plan.stages for device in stage.devices}


def predicted(plan, pool: HomePool) -> float:
    return prediction.predict_sync_round(plan, PROFILE, pool, "cgroup").sync_round_s


@pytest.fixture(autouse=True)
def no_host_overheads(monkeypatch):
    """The runtime's work per operation and byte as zero: the choice is the plans', not this host's records."""
    monkeypatch.setattr(prediction, "runtime_overheads",
                        lambda emulation, cache_dir=None: {"operation_overhead_s": 0.0, "byte_overhead_s": 0.0})


def test_a_device_too_slow_for_one_layer_is_left_out_and_the_plan_is_faster_without_it():
    pool = home(1.0, 1.0, 0.01)  # device 2 would take 33x longer over one layer than the others over three
    # one device a stage (hybrid=False): a data-parallel group could instead give the slow device no samples
    plan, seconds = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", hybrid=False)
    every, every_s = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", margin=1.0, hybrid=False)
    assert used(plan) == {0, 1}
    assert used(every) == {0, 1, 2}
    assert seconds == pytest.approx(predicted(plan, pool))
    assert seconds < 0.95 * every_s


def test_the_portal_is_never_left_out_even_where_it_is_the_slowest():
    plan, _ = prediction.selected_devices("ecofl", PROFILE, home(0.01, 1.0, 1.0), 24, "cgroup")
    assert 0 in used(plan)


def test_devices_that_each_add_speed_are_all_kept():
    plan, _ = prediction.selected_devices("ecofl", PROFILE, home(1.0, 1.0, 1.0), 24, "cgroup")
    assert used(plan) == {0, 1, 2}


def test_a_gain_within_the_margin_leaves_no_device_out():
    pool = home(1.0, 1.0, 0.01)
    every, every_s = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", margin=1.0, hybrid=False)
    fewer, fewer_s = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", margin=0.0, hybrid=False)
    needed = 1 - fewer_s / every_s  # the gain leaving device 2 out brings
    kept, _ = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", margin=needed + 0.01,
                                          hybrid=False)
    assert used(kept) == {0, 1, 2}


def test_devices_that_sleep_to_the_cost_model_keep_the_planners_own_plan():
    from ecofl.pipeline.planners import make_plan

    pool = home(1.0, 1.0, 0.01)
    assert prediction.plan_as_run("ecofl", PROFILE, pool, 24, "sleep") == make_plan("ecofl", PROFILE, pool, 24)


def test_a_deployed_homes_machines_are_predicted_at_their_own_speeds_not_this_hosts():
    """``real`` (the home service's devices, each its own machine): slower devices, a longer sync-round. At host
    speed (``none``) the devices are this machine's processes whatever speeds their specs give."""
    from ecofl.pipeline.planners import make_plan

    fast, slow = home(1.0, 1.0), home(0.5, 0.5)
    plan = make_plan("ecofl", PROFILE, fast, 24)
    real = [prediction.predict_sync_round(plan, PROFILE, pool, "real").sync_round_s for pool in (fast, slow)]
    host = [prediction.predict_sync_round(plan, PROFILE, pool, "none").sync_round_s for pool in (fast, slow)]
    assert real[1] > 1.5 * real[0]
    assert host[1] == pytest.approx(host[0])


def test_a_deployed_home_leaves_a_device_idle_as_a_confined_one_does_and_host_speed_does_not():
    pool = home(1.0, 1.0, 0.01)
    real = prediction.plan_as_run("ecofl", PROFILE, pool, 24, "real", hybrid=False)
    assert real == prediction.plan_as_run("ecofl", PROFILE, pool, 24, "cgroup", hybrid=False)
    assert used(real) == {0, 1}
    assert used(prediction.plan_as_run("ecofl", PROFILE, pool, 24, "none")) == {0, 1, 2}


def test_a_device_the_model_needs_for_its_memory_is_kept_however_slow():
    roomy, small = dataclasses.replace(HOST, memory_bytes=1 << 30), dataclasses.replace(HOST, memory_bytes=6 << 20)
    # six layers of 1 MB weights and optimizer state each: device 2 alone cannot hold the four its partner cannot
    pool = HomePool("memory", (dataclasses.replace(small, name="portal"), dataclasses.replace(small, name="d1"),
                               dataclasses.replace(roomy, name="slow", speed=0.01)))
    plan, _ = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup")
    assert 2 in used(plan)


def test_where_layers_are_fewer_than_devices_hybrid_stages_put_every_device_to_work():
    """Two layers on four devices: Eco-FL's planner gives each stage one device and has no plan; the hybrid plans
    (Asteroid's data-parallel stage groups, HPP §3.3, and plain data parallelism, the one-stage point of its
    space) put every device to work, at about half the sync-round of two devices alone."""
    profile = synthetic_profile(2, weight=1e4)
    pool = home(1.0, 1.0, 1.0, 1.0)
    plan, seconds = prediction.selected_devices("ecofl", profile, pool, 24, "cgroup")
    with pytest.raises(UserError):
        prediction.selected_devices("ecofl", profile, pool, 24, "cgroup", hybrid=False)
    _, two_s = prediction.selected_devices("ecofl", profile, home(1.0, 1.0), 24, "cgroup", hybrid=False)
    assert plan.planner in HYBRID_PLANNERS["ecofl"] and used(plan) == {0, 1, 2, 3}
    assert seconds == pytest.approx(prediction.predict_sync_round(plan, profile, pool, "cgroup").sync_round_s)
    assert seconds < 0.6 * two_s
    assert prediction.plan_as_run("ecofl", profile, pool, 24, "cgroup") == plan


def test_one_device_a_stage_is_kept_where_hybrid_stages_are_predicted_slower():
    """Heavy weights: a data-parallel group's AllReduce costs more than the balance it brings."""
    profile, pool = synthetic_profile(6, weight=5e7), home(1.0, 1.0, 1.0)
    plan, seconds = prediction.selected_devices("ecofl", profile, pool, 24, "cgroup")
    single = prediction.selected_devices("ecofl", profile, pool, 24, "cgroup", hybrid=False)
    hybrid = [p for p in full_replans("ecofl", profile, pool, (0, 1, 2), 24, hybrid=True) if p.planner == "hpp"]
    hybrid_s = [prediction.predict_sync_round(p, profile, pool, "cgroup").sync_round_s for p in hybrid]
    assert (plan, seconds) == single and plan.planner == "ecofl"
    assert all(len(stage.devices) == 1 for stage in plan.stages)
    assert hybrid and min(hybrid_s) > seconds * (1 - prediction.HYBRID_MARGIN)


def test_identical_devices_whose_hand_offs_outweigh_their_weights_train_data_parallel():
    """Plain data parallelism is the one-stage point of Asteroid's hybrid space, weighed beside its plans: wide
    activations and light weights make every pipeline's hand-offs cost more than one all-reduce; heavy weights
    (the test above) the reverse."""
    profile, pool = synthetic_profile(6, activation=2e6, weight=1e3), home(1.0, 1.0, 1.0, 1.0)
    plan, seconds = prediction.selected_devices("ecofl", profile, pool, 24, "cgroup")
    pipelined = [prediction.selected_devices("ecofl", profile, pool, 24, "cgroup", hybrid=False)[1]]
    pipelined += [predicted_s for hpp in full_replans("ecofl", profile, pool, range(4), 24, hybrid=True)
                  if hpp.planner == "hpp" and len(hpp.stages) > 1
                  for predicted_s in [prediction.predict_sync_round(hpp, profile, pool, "cgroup").sync_round_s]]
    # one stage on every device: plain data parallelism, whether as DP's one call or HPP's one-stage plan of a
    # few micro-batches a round
    assert plan.planner in HYBRID_PLANNERS["ecofl"] and len(plan.stages) == 1 and used(plan) == {0, 1, 2, 3}
    assert seconds < min(pipelined) * (1 - prediction.HYBRID_MARGIN)
    assert prediction.plan_as_run("ecofl", profile, pool, 24, "cgroup") == plan


def test_a_hybrid_plan_that_beats_each_single_removal_does_not_stop_the_selection_short(monkeypatch):
    """Removal is greedy: where a hybrid plan on every device beats each set of one device fewer, the selection
    that weighs hybrid plans stops there, while the planner's own goes on to a set of two fewer that is faster
    than both; the two are selected apart and the faster kept (the hybrid one only beyond the margin)."""
    own_s = {(0, 1, 2, 3): 1.0, (0, 1, 2): 0.9, (0, 1, 3): 0.95, (0, 2, 3): 0.95, (0, 1): 0.5, (0, 2): 0.8}
    hybrid_s = {(0, 1, 2, 3): 0.7}

    def plans(planner, profile, pool, devices, batch_size, hybrid=False, **options):
        devices = tuple(devices)
        stage = StagePlan((0, 5), devices, (1,) * len(devices), 1)
        return [Plan(name, (stage,), len(devices), 1) for name in ("ecofl", "hpp")[:1 + hybrid]]

    def fastest(candidates, profile, pool, emulation, cache_dir=None):
        timed = [(plan, (hybrid_s if plan.planner == "hpp" else own_s).get(used_devices, 9.0))
                 for plan in candidates for used_devices in [tuple(sorted(used(plan)))]]
        return min(timed, key=lambda pair: pair[1])

    monkeypatch.setattr(prediction, "full_replans", plans)
    monkeypatch.setattr(prediction, "fastest_plan", fastest)
    plan, seconds = prediction.selected_devices("ecofl", PROFILE, home(1.0, 1.0, 1.0, 1.0), 24, "cgroup")
    assert (plan.planner, used(plan), seconds) == ("ecofl", {0, 1}, 0.5)
    hybrid_s[(0, 1, 2, 3)] = 0.45
    plan, seconds = prediction.selected_devices("ecofl", PROFILE, home(1.0, 1.0, 1.0, 1.0), 24, "cgroup")
    assert (plan.planner, used(plan), seconds) == ("hpp", {0, 1, 2, 3}, 0.45)


def test_a_hybrid_plan_replaces_the_planners_own_only_beyond_the_margin(monkeypatch):
    pool = home(1.0, 1.0, 1.0)  # light weights: a data-parallel stage is predicted faster than the margin asks
    hybrid, hybrid_s = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup")
    own, own_s = prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup", hybrid=False)
    gain = 1 - hybrid_s / own_s
    assert hybrid.planner in HYBRID_PLANNERS["ecofl"] and own.planner == "ecofl" and gain > prediction.HYBRID_MARGIN
    monkeypatch.setattr(prediction, "HYBRID_MARGIN", gain + 0.01)
    assert prediction.selected_devices("ecofl", PROFILE, pool, 24, "cgroup") == (own, own_s)


def test_the_cli_plans_a_schedule_of_one_device_a_stage_without_hybrid_stages():
    """``ecofl home train --schedule async-1f1b`` (FTPipeHD runs one device a stage) on a home where a hybrid plan
    would be chosen (the test above) gets the planner's own plan, in that schedule; 1F1B-Sync the hybrid one."""
    import argparse

    from ecofl.cli.home_train import _plan

    pool = home(1.0, 1.0, 1.0)
    args = argparse.Namespace(planner="ecofl", batch=24, micro_batch=None, cache_dir=None, schedule="async-1f1b")
    plan = _plan(args, PROFILE, pool, "cgroup")
    assert plan.planner == "ecofl" and str(plan.schedule) == "async-1f1b"
    assert all(len(stage.devices) == 1 for stage in plan.stages)
    synchronous = _plan(argparse.Namespace(**{**vars(args), "schedule": None}), PROFILE, pool, "cgroup")
    assert max(len(stage.devices) for stage in synchronous.stages) > 1
