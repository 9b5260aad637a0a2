"""Re-tuning a plan on the speeds the pipeline itself shows (FTPipeHD §III-D's re-partitioning, once, early).

The decision is plain data, checked here on made-up worker replies; then a
live pipeline (devices sleeping to the cost model) started on a lopsided
plan moves to the planner's balanced one after its second sync-round, and
its weights stay exactly one process's, momentum included, without fault
tolerance.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from ecofl.devices import DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.pipeline.cost import SyncRoundCost, simulate
from ecofl.pipeline.first_touch import switching_s
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.runtime import HomePipeline
from ecofl.pipeline.runtime.control_messages import Done
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.host_overhead import record_path
from ecofl.pipeline.runtime.pipeline_tuning import (
    TuningWindow, candidate_plans, decide, decided_plan, measured_pass_s, modelled_pass_s, pipeline_speeds,
)
from ecofl.pipeline.runtime.prediction import predict_sync_round
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.pipeline.schedule import PASSES
from pipeline_kit import PROFILE, WITHOUT_BATCH_NORM, assert_gone, assert_same, data, single_process

pytestmark = pytest.mark.timeout(240)

QUICK = dataclasses.replace(PROFILE, forward_s=PROFILE.forward_s / 4, backward_s=PROFILE.backward_s / 4)
HOSTS = HomePool("test", (DeviceSpec("host", 1.0, 1 << 30, 1e9),) * 3)
LOPSIDED = Plan("hand", (StagePlan((0, 0), (0,), (4,), 5), StagePlan((1, 1), (1,), (4,), 3),
                         StagePlan((2, 4), (2,), (4,), 1)), micro_batch=4, num_micro_batches=6)
HOLDERS = {layer: [stage.devices[0]] for stage in LOPSIDED.stages for layer in range(stage.layers[0],
                                                                                      stage.layers[1] + 1)}


def replies_as_modelled(plan: Plan, pool: HomePool, slower: dict[int, float],
                        cost: SyncRoundCost | None = None) -> dict[int, Done]:
    """The workers' replies of a round that ran as the cost model says (``cost``, by default the model without
    overheads), device d's passes ``slower[d]`` x longer."""
    events: dict[int, list] = {d: [] for stage in plan.stages for d in stage.devices}
    for event in (cost or simulate(plan, QUICK, pool)).timeline:
        if event.kind in PASSES:
            length = (event.end - event.start) * slower.get(event.device, 1.0)
            events[event.device].append((str(event.kind), event.micro_batch, event.start, event.start + length))
    return {d: Done(e, 0.0, 0, 0, 0, None, None, []) for d, e in events.items()}


def test_a_device_slower_in_the_pipeline_than_calibrated_gets_its_speed_divided_by_the_ratio():
    rounds = [replies_as_modelled(LOPSIDED, HOSTS, {2: 2.0})] * 2
    assert measured_pass_s(rounds)[2] == pytest.approx(2 * modelled_pass_s(simulate(LOPSIDED, QUICK, HOSTS))[2])
    decision = decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, HOSTS, Emulation.SLEEP, rounds, 1, HOLDERS,
                      {0, 1, 2}, rounds_left=10)
    assert decision.speeds[2] == pytest.approx(0.5) and decision.speeds[0] == pytest.approx(1.0)
    assert decision.planned_speeds == {0: 1.0, 1: 1.0, 2: 1.0}
    # at the speeds found, the last stage (layers 2-4 on the half-speed device) is the bottleneck: a re-plan
    # that takes layers off it is predicted faster, and the decision's plan is it
    assert decision.switched and decision.best_s < decision.current_s
    last = next(s for s in decision.plan.stages if 2 in s.devices)
    assert last.layers[1] - last.layers[0] < 2


def test_confined_speeds_count_the_runtimes_overhead_once(tmp_path):
    """A confined device that computed exactly what the cost model predicts for it, the runtime's per-operation
    overhead included, keeps its speed; one twice as slow gets half. Set against its layers alone (the slow-down
    re-estimate did so before), the overhead it computed would read as slowness: here each operation's overhead
    is as long as the mean layer's, and device 0 (one short layer) would have come out at about two thirds
    of its speed."""
    overhead_s = float(QUICK.forward_s.mean())
    record_path(str(tmp_path)).write_text(json.dumps({"operation_overhead_s": overhead_s, "byte_overhead_s": 0.0}))
    modelled = predict_sync_round(LOPSIDED, QUICK, HOSTS, Emulation.CGROUP, cache_dir=str(tmp_path))
    replies = replies_as_modelled(LOPSIDED, HOSTS, {2: 2.0}, modelled)
    speeds = pipeline_speeds(LOPSIDED, QUICK, HOSTS, Emulation.CGROUP, measured_pass_s([replies]), str(tmp_path))
    assert speeds == pytest.approx({0: 1.0, 1: 1.0, 2: 0.5})
    layers_only = modelled_pass_s(simulate(LOPSIDED, QUICK, HOSTS))
    assert layers_only[0] < 0.75 * measured_pass_s([replies])[0]  # what the layers-only reference would misread


def test_a_confined_device_is_learned_no_faster_than_calibrated(tmp_path):
    """Devices 2 (one sample of four beside device 1) and 0 (a stage of its own) read three times their speed,
    as a confined device's short passes do on quota refilled while it waited: a re-plan's speeds keep their
    calibrated ones (a slower reading still counts: device 1 at half); at host speed, and where the reading
    itself is asked for (no ``calibrated``), it is taken as it is."""
    record_path(str(tmp_path)).write_text(json.dumps({"operation_overhead_s": 0.0, "byte_overhead_s": 0.0}))
    hybrid = Plan("hand", (StagePlan((0, 1), (0,), (4,), 3), StagePlan((2, 4), (1, 2), (3, 1), 1)),
                  micro_batch=4, num_micro_batches=6)
    for mode, calibrated, fast in ((Emulation.CGROUP, HOSTS, 1.0), (Emulation.CGROUP, None, 3.0),
                                   (Emulation.NONE, HOSTS, 3.0)):
        modelled = predict_sync_round(hybrid, QUICK, HOSTS, mode, cache_dir=str(tmp_path))
        replies = replies_as_modelled(hybrid, HOSTS, {0: 1 / 3, 1: 2.0, 2: 1 / 3}, modelled)
        speeds = pipeline_speeds(hybrid, QUICK, HOSTS, mode, measured_pass_s([replies]), str(tmp_path), calibrated)
        assert speeds == pytest.approx({0: fast, 1: 0.5, 2: fast}), (mode, calibrated)
    # held to the calibration, not to the speeds of the plan it runs: a device re-planned slower may read back up
    slowed = HomePool("slowed", (DeviceSpec("host", 0.25, 1 << 30, 1e9),) * 3)
    modelled = predict_sync_round(hybrid, QUICK, slowed, Emulation.CGROUP, cache_dir=str(tmp_path))
    replies = replies_as_modelled(hybrid, slowed, {0: 1 / 3}, modelled)
    speeds = pipeline_speeds(hybrid, QUICK, slowed, Emulation.CGROUP, measured_pass_s([replies]), str(tmp_path),
                             HOSTS)
    assert speeds[0] == pytest.approx(0.75) and speeds[1] == pytest.approx(0.25)


def test_the_plan_is_kept_when_the_gain_is_within_the_margin_or_does_not_pay_for_the_migration():
    rounds = [replies_as_modelled(LOPSIDED, HOSTS, {})]
    close = decide(Tuning(planner="ecofl", margin=0.9), LOPSIDED, QUICK, HOSTS, Emulation.SLEEP, rounds, 1,
                   HOLDERS, {0, 1, 2}, rounds_left=10)
    assert not close.switched and close.plan is LOPSIDED and close.best_s < close.current_s
    slow_links = HomePool("slow links", (DeviceSpec("host", 1.0, 1 << 30, 1e3),) * 3)
    costly = decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, slow_links, Emulation.SLEEP,
                    [replies_as_modelled(LOPSIDED, slow_links, {})], 1, HOLDERS, {0, 1, 2}, rounds_left=1)
    assert not costly.switched and costly.migration_s > costly.current_s - costly.best_s > 0
    assert not decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, HOSTS, Emulation.SLEEP, rounds, 1, HOLDERS,
                      {0, 1, 2}, rounds_left=0).switched


def test_the_plan_is_kept_when_the_memory_its_first_round_maps_costs_more_than_it_saves():
    """The same re-tune as above at the plan's own micro-batch, on devices that map a byte anew in 1 us (some
    200 times a real device's, so that the toy stages' few MB weigh as much as the toy rounds' seconds): the
    re-plan's first round maps about 7 s, which ten rounds left repay and four do not."""
    rounds = [replies_as_modelled(LOPSIDED, HOSTS, {2: 2.0})] * 2
    slow_to_map = with_speeds(HOSTS, {}, dict.fromkeys(range(3), 1e-6))
    for rounds_left, pays in ((10, True), (4, False)):
        decision = decide(Tuning(planner="ecofl", micro_batch=LOPSIDED.micro_batch), LOPSIDED, QUICK, slow_to_map,
                          Emulation.SLEEP, rounds, 1, HOLDERS, {0, 1, 2}, rounds_left=rounds_left)
        saved = rounds_left * (decision.current_s - decision.best_s)
        assert decision.first_round_s > decision.migration_s and decision.first_round_s > 0
        assert decision.switched is pays
        assert (saved > decision.migration_s + decision.first_round_s) is pays
        assert decision.migration_s < saved  # the layer moves alone would not have kept the plan
    assert decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, HOSTS, Emulation.SLEEP, rounds, 1, HOLDERS, {0, 1, 2},
                  rounds_left=4).first_round_s == 0  # nothing measured: nothing counted


def test_a_re_tune_takes_the_plan_that_finishes_the_rounds_left_first_not_the_fastest():
    """Every micro-batch size weighed, on the devices of the test above: the fastest re-plan maps some 19 s anew
    in its first round; ten rounds left finish first on a slightly slower one that maps less, and four on one
    that maps nothing, as a recovery chooses (:func:`~ecofl.pipeline.runtime.prediction.quickest_to_finish`)."""
    rounds = [replies_as_modelled(LOPSIDED, HOSTS, {2: 2.0})] * 2
    slow_to_map = with_speeds(HOSTS, {}, dict.fromkeys(range(3), 1e-6))
    for rounds_left in (10, 4):
        decision = decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, slow_to_map, Emulation.SLEEP, rounds, 1,
                          HOLDERS, {0, 1, 2}, rounds_left=rounds_left)
        tuned = with_speeds(slow_to_map, decision.speeds)
        candidates = [c for c in candidate_plans(Tuning(planner="ecofl"), LOPSIDED, QUICK, tuned, {0, 1, 2})
                      if c != LOPSIDED]

        def finish_s(plan: Plan) -> float:
            return (switching_s(plan, LOPSIDED, HOLDERS, QUICK, tuned)
                    + rounds_left * predict_sync_round(plan, QUICK, tuned, Emulation.SLEEP).sync_round_s)

        fastest = min(candidates, key=lambda c: predict_sync_round(c, QUICK, tuned, Emulation.SLEEP).sync_round_s)
        assert decision.switched and finish_s(decision.plan) == pytest.approx(min(map(finish_s, candidates)))
        assert finish_s(decision.plan) < finish_s(fastest)
        assert finish_s(decision.plan) < rounds_left * decision.current_s


def test_tuning_settings_are_checked():
    for bad in ({"after_rounds": 1}, {"every_rounds": 1}, {"every_rounds": -2}, {"margin": -0.1}, {"margin": 1.0}):
        with pytest.raises(UserError):
            Tuning(**bad)
    with pytest.raises(UserError, match="planner"):  # a hand-made plan names no planner to re-plan with
        HomePipeline(WITHOUT_BATCH_NORM, HOSTS, LOPSIDED, profile=QUICK, emulate="sleep", tuning=Tuning())


def test_a_re_tune_is_due_after_its_rounds_and_never_learns_from_a_plans_first():
    """FTPipeHD §III-D's schedule: the first re-tune after ``after_rounds`` of the plan, then every
    ``every_rounds`` on the rounds since; a new plan's first round (a new epoch) counts but is not learned from."""
    window = TuningWindow(Tuning(after_rounds=3, every_rounds=2))
    rounds = [{0: f"round {r}"} for r in range(9)]  # stand-ins for the workers' replies
    epochs = [0, 0, 0, 0, 0, 1, 1, 2, 2]  # a switch after round 4, a recovery before round 7
    due = {r: window.due(epoch, rounds[r]) for r, epoch in enumerate(epochs)}
    assert {r: found for r, found in due.items() if found is not None} == {
        2: rounds[1:3], 4: rounds[3:5], 6: rounds[6:7], 8: rounds[8:9]}
    assert window.retunes == 4
    once = TuningWindow(Tuning(after_rounds=2))
    assert [once.due(0, rounds[r]) for r in range(5)] == [None, rounds[1:2], None, None, None]


def test_a_lopsided_plan_is_re_tuned_after_its_second_round_and_training_stays_exact():
    """Re-tuned after round 1 (it switches) and, every 2 rounds, after round 3 (on round 3 alone: round 2 is the
    new plan's first); none after round 5, the last."""
    x, y = data()
    with HomePipeline(WITHOUT_BATCH_NORM, HOSTS, LOPSIDED, profile=QUICK, emulate="sleep", timeout_s=60,
                      tuning=Tuning(planner="ecofl", every_rounds=2)) as home:
        pids = list(home.worker_pids.values())
        start = home.weights
        result = home.train(None, x, y, 6, lr=0.1, momentum=0.9)
        final_plan = home.plan
    assert_gone(pids)
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, LOPSIDED, 6, lr=0.1, momentum=0.9), result.weights)
    tuning, again = result.tunings
    assert tuning["switched"] and tuning["after_round"] == 1 and again["after_round"] == 3
    assert final_plan == decided_plan(again, LOPSIDED.schedule) != LOPSIDED
    assert result.round_epochs == ((0, 0, 1, 1, 2, 2) if again["switched"] else (0, 0, 1, 1, 1, 1))
    assert tuning["best_sync_round_s"] < tuning["current_sync_round_s"]
    assert tuning["bytes_moved"] > 0 and tuning["seconds"] > 0


def test_an_asynchronous_pass_refuses_tuning():
    x, y = data()
    plan = dataclasses.replace(LOPSIDED, schedule="async-1f1b")
    with HomePipeline(WITHOUT_BATCH_NORM, HOSTS, plan, profile=QUICK, emulate="none", timeout_s=60,
                      tuning=Tuning(planner="ecofl")) as home:
        with pytest.raises(ValueError, match="re-tune"):
            home.train(None, x, y, 2, lr=0.1)


def test_counting_the_runtimes_work_per_operation_a_plan_of_fewer_larger_micro_batches_is_chosen(monkeypatch):
    """Up front as in the re-tune: of the planner's plans at each micro-batch size, the one predicted fastest with
    the runtime's overheads (here 50 ms an operation) runs; devices that sleep to the model keep the planner's."""
    from ecofl.pipeline.planners import make_plan
    from ecofl.pipeline.runtime import prediction
    from pipeline_kit import pool, synthetic_profile

    monkeypatch.setattr(prediction, "runtime_overheads",
                        lambda emulation, cache_dir=None: {"operation_overhead_s": 0.05, "byte_overhead_s": 0.0})
    profile, hosts = synthetic_profile(6), pool(3)
    default = make_plan("ecofl", profile, hosts, 24)
    chosen = prediction.plan_as_run("ecofl", profile, hosts, 24, "cgroup")
    assert chosen.micro_batch > default.micro_batch

    def predicted(plan: Plan) -> float:
        return prediction.predict_sync_round(plan, profile, hosts, "cgroup").sync_round_s

    assert predicted(chosen) < predicted(default)
    assert prediction.plan_as_run("ecofl", profile, hosts, 24, "sleep") == default
    assert prediction.plan_as_run("ecofl", profile, hosts, 24, "cgroup", micro_batch=1).micro_batch == 1


def test_a_re_tuned_pipeline_with_fault_tolerance_survives_a_later_kill_exactly():
    """The re-tune's new plan gets its backups like any re-plan's: a device killed after the move is restored
    from them, and the weights are still one process's."""
    from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
    from pipeline_kit import FAST_HEARTBEAT

    x, y = data()
    with HomePipeline(WITHOUT_BATCH_NORM, HOSTS, LOPSIDED, profile=QUICK, emulate="sleep", timeout_s=60,
                      fault_tolerance=FaultTolerance(heartbeat=FAST_HEARTBEAT), tuning=Tuning(planner="ecofl")) as home:
        start = home.weights
        result = home.train(None, x, y, 7, lr=0.1, momentum=0.9, inject=[Injection.parse("kill:2@5")])
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, LOPSIDED, 7, lr=0.1, momentum=0.9), result.weights)
    assert result.tunings[0]["switched"] and result.rounds_completed == 7
    [event] = result.events
    assert event["kind"] == "kill" and event["device"] == 2


def test_a_device_killed_in_the_middle_of_the_re_tunes_migration_is_recovered_exactly():
    """The kill strikes as device 1 moves layers into the re-tuned plan (phase ``migrate``), not at a round's start:
    the survivors recover from their copies and the weights are still one process's."""
    from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
    from pipeline_kit import FAST_HEARTBEAT

    x, y = data()
    with HomePipeline(WITHOUT_BATCH_NORM, HOSTS, LOPSIDED, profile=QUICK, emulate="sleep", timeout_s=60,
                      fault_tolerance=FaultTolerance(heartbeat=FAST_HEARTBEAT), tuning=Tuning(planner="ecofl")) as home:
        start = home.weights
        result = home.train(None, x, y, 6, lr=0.1, momentum=0.9, inject=[Injection.parse("kill:1@1:migrate")])
        final_plan = home.plan
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, LOPSIDED, 6, lr=0.1, momentum=0.9), result.weights)
    [event] = result.events
    assert (event["kind"], event["device"], event["phase"]) == ("kill", 1, "migrate")
    assert 1 not in {d for stage in final_plan.stages for d in stage.devices} and result.rounds_completed == 6


def test_memory_a_device_maps_anew_in_a_measured_round_is_not_read_as_slowness():
    """Device 2 mapped 10 MiB in the round at its calibrated 40 ns a byte: its passes, 0.42 s longer than
    modelled, give it its modelled speed back once the mapping is taken off; a device with no measurement of
    its own per-byte cost keeps its passes as they are."""
    mapped = 10 * 2**20
    pool = with_speeds(HOSTS, {}, {2: 4e-8})
    replies = replies_as_modelled(LOPSIDED, HOSTS, {})
    modelled = measured_pass_s([replies])
    slowed = {d: dataclasses.replace(r, events=[*r.events, ("F", 99, 0.0, mapped * 4e-8)] if d == 2
                                     else r.events, first_touched_bytes=mapped) for d, r in replies.items()}
    assert measured_pass_s([slowed])[2] == pytest.approx(modelled[2] + mapped * 4e-8)
    assert measured_pass_s([slowed], pool) == pytest.approx(modelled)
    assert decide(Tuning(planner="ecofl"), LOPSIDED, QUICK, pool, Emulation.SLEEP, [slowed], 1, HOLDERS, {0, 1, 2},
                  rounds_left=10).speeds[2] == pytest.approx(1.0)
