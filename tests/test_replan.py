"""Re-planning, replication and layer migration as plain data (Asteroid §3.4, FTPipeHD §III-D to III-F)."""

from __future__ import annotations

import numpy as np
import pytest

from ecofl.devices import DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.pipeline.cost import Background, simulate
from ecofl.pipeline.first_touch import first_round_extra_s
from ecofl.pipeline.migration import (GLOBAL_COPY, PORTAL_DEVICE, bytes_moved, heavy_moves, layer_moves, layer_owners,
                                     migration_s)
from ecofl.pipeline.plan import Plan, StagePlan, plan_schedule
from ecofl.pipeline.planners import make_plan
from ecofl.pipeline.replan import (MAX_SHIFTED_PLANS, full_replan, full_replans, lightweight_replan,
                                  lightweight_replans, shifted_replans, with_speeds)
from ecofl.pipeline.runtime.prediction import predict_sync_round, quickest_to_finish
from ecofl.pipeline.replication import (backup_bytes, backup_targets, busiest_device, copy_bytes, restore_source,
                                       spared_devices, stage_state_bytes)
from ecofl.pipeline.schedule import validate
from pipeline_kit import random_profile

GB = 1 << 30


def pool_of(*speeds: float, memory: int = 4 * GB) -> HomePool:
    return HomePool("test", tuple(DeviceSpec(f"d{i}", s, memory, 12.5e6) for i, s in enumerate(speeds)))


def three_stage_plan(layers: int = 12) -> Plan:
    return Plan("ecofl", (
        StagePlan((0, 3), (0,), (4,), 5),
        StagePlan((4, 7), (1,), (4,), 3),
        StagePlan((8, layers - 1), (2,), (4,), 1),
    ), micro_batch=4, num_micro_batches=8)


def flops_share(plan: Plan, profile, stage: int) -> float:
    first, last = plan.stages[stage].layers
    return float(profile.flops[first : last + 1].sum() / profile.flops.sum())


def assert_runnable(plan: Plan) -> None:
    validate(plan_schedule(plan), plan.num_micro_batches, [s.in_flight for s in plan.stages])


def test_lightweight_replan_drops_a_lost_stage_and_cuts_by_capacity():
    profile = random_profile(np.random.default_rng(1), 12)
    pool = pool_of(1.0, 1.0, 2.0)
    new = lightweight_replan(three_stage_plan(), profile, pool, lost={1})
    assert [s.devices for s in new.stages] == [(0,), (2,)]
    assert new.num_layers == 12 and new.stages[0].layers[0] == 0
    assert flops_share(new, profile, 1) == pytest.approx(2 / 3, abs=0.12)  # capacity 2 of 3
    assert [s.in_flight for s in new.stages] == [3, 1]  # P_s = 2(S-s)-1 for two stages
    assert_runnable(new)


def test_lightweight_replans_keep_the_partition_at_every_micro_batch_size_the_plans_own_first():
    """The sizes move no state: the same cut points and devices, the mini-batch re-split (32 = 4 x 8 = 8 x 4 ...)."""
    profile = random_profile(np.random.default_rng(1), 12)
    pool = pool_of(1.0, 1.0, 2.0)
    plans = lightweight_replans(three_stage_plan(), profile, pool, lost={1})
    assert plans[0] == lightweight_replan(three_stage_plan(), profile, pool, lost={1})
    assert len(plans) > 1 and len({p.micro_batch for p in plans}) == len(plans)
    for plan in plans:
        assert [(s.layers, s.devices) for s in plan.stages] == [(s.layers, s.devices) for s in plans[0].stages]
        assert plan.batch_size == 32 and all(sum(s.shares) == plan.micro_batch for s in plan.stages)
        assert_runnable(plan)
    with pytest.raises(ValueError, match="does not divide"):
        lightweight_replan(three_stage_plan(), profile, pool, lost={1}, micro_batch=5)


def test_lightweight_replans_refuse_where_no_micro_batch_fits_the_memory():
    profile = random_profile(np.random.default_rng(1), 12)
    with pytest.raises(UserError, match="does not fit"):
        lightweight_replans(three_stage_plan(), profile, pool_of(1.0, 1.0, 2.0, memory=1024), lost={1})


def test_lightweight_replan_gives_a_slowed_device_less_work():
    profile = random_profile(np.random.default_rng(2), 24)
    pool = pool_of(1.0, 1.0, 1.0)
    plan = lightweight_replan(three_stage_plan(24), profile, pool)
    slowed = lightweight_replan(plan, profile, pool, speeds={1: 0.25})
    assert flops_share(slowed, profile, 1) < flops_share(plan, profile, 1) / 2
    assert_runnable(slowed)
    slow_pool = with_speeds(pool, {1: 0.25})
    assert simulate(slowed, profile, slow_pool).sync_round_s < simulate(plan, profile, slow_pool).sync_round_s


def test_lightweight_replan_keeps_surviving_replicas_and_refuses_what_does_not_fit():
    profile = random_profile(np.random.default_rng(3), 8)
    pool = pool_of(1.0, 1.0, 1.0, 1.0)
    plan = Plan("hpp", (StagePlan((0, 3), (0, 1), (2, 2), 3), StagePlan((4, 7), (2, 3), (2, 2), 1)), 4, 4)
    new = lightweight_replan(plan, profile, pool, lost={3})
    assert new.stages[1].devices == (2,) and new.stages[1].shares == (4,)
    with pytest.raises(UserError, match="does not fit"):
        lightweight_replan(plan, profile, pool_of(1.0, 1.0, 1.0, 1.0, memory=1000), lost={3})
    with pytest.raises(UserError, match="every device"):
        lightweight_replan(plan, profile, pool, lost={0, 1, 2, 3})


def test_shifted_replans_move_each_cut_by_at_most_the_window_and_keep_every_stage_a_layer():
    profile = random_profile(np.random.default_rng(5), 12)
    plan = three_stage_plan()  # cuts before layers 4 and 8
    shifted = shifted_replans(plan, profile, pool_of(1.0, 1.0, 1.0), window=2)
    cuts = {tuple(s.layers[0] for s in p.stages[1:]) for p in shifted}
    assert cuts == {(a, b) for a in range(2, 7) for b in range(6, 11) if (a, b) != (4, 8) and a < b}
    assert len(shifted) == len(cuts)
    for p in shifted:
        assert [s.devices for s in p.stages] == [s.devices for s in plan.stages] and p.micro_batch == plan.micro_batch
        assert [s.layers[1] + 1 for s in p.stages[:-1]] == [s.layers[0] for s in p.stages[1:]]
        assert p.stages[-1].layers[1] == 11
        assert_runnable(p)
    # two stages on a two-layer model: the only other cut is none
    two = Plan("ecofl", (StagePlan((0, 0), (0,), (4,), 3), StagePlan((1, 1), (1,), (4,), 1)), 4, 8)
    assert shifted_replans(two, random_profile(np.random.default_rng(5), 2), pool_of(1.0, 1.0)) == []


def test_shifted_replans_narrow_their_window_to_stay_few():
    profile = random_profile(np.random.default_rng(6), 30)
    stages = tuple(StagePlan((5 * s, 5 * s + 4), (s,), (4,), 1) for s in range(6))
    shifted = shifted_replans(Plan("ecofl", stages, 4, 8), profile, pool_of(*[1.0] * 6), window=3)
    assert len(shifted) <= MAX_SHIFTED_PLANS  # 7^5 vectors at 3 layers; 3^5 - 1 at one
    assert max(abs(p.stages[s].layers[0] - 5 * s) for p in shifted for s in range(1, 6)) == 1


def test_migration_takes_the_slowest_pair_and_a_global_copy_restore_crosses_the_portals_link():
    profile = random_profile(np.random.default_rng(8), 12)
    pool = pool_of(1.0, 1.0, 1.0)  # 12.5 MB/s links
    plan = three_stage_plan()  # device 0: layers 0-3, device 1: 4-7, device 2: 8-11
    held = {layer: {0, 1, 2} for layer in range(12)}
    assert migration_s(plan, held, profile, pool) == 0.0
    layer_bytes = [stage_state_bytes(profile, (layer, layer)) for layer in range(12)]
    from_1 = dict(held) | {layer: {1} for layer in (8, 9)}  # device 2 fetches layers 8-9 from device 1
    assert migration_s(plan, from_1, profile, pool) == pytest.approx((layer_bytes[8] + layer_bytes[9]) / 12.5e6)
    lost = dict(held) | {5: set(), 10: set()}  # nobody holds layers 5 and 10: from the portal's global copy
    assert migration_s(plan, lost, profile, pool) == pytest.approx(max(layer_bytes[5], layer_bytes[10]) / 12.5e6)
    assert migration_s(plan, dict(held) | {2: set()}, profile, pool) == 0.0  # the portal's own layer


def test_a_recovery_moves_less_with_few_rounds_left_and_trains_faster_with_many():
    """Two candidates after device 1 of three is lost: the one whose layers stay where the survivors hold them
    (nothing crosses a link) but puts most of the work on the slow device, and the balanced one, which moves
    layers over a slow link. One round left: moving nothing finishes first; a hundred: the balanced one."""
    profile = random_profile(np.random.default_rng(7), 12)
    pool = HomePool("test", (DeviceSpec("fast", 2.0, 4 * GB, 1e5), DeviceSpec("gone", 1.0, 4 * GB, 1e5),
                             DeviceSpec("slow", 0.5, 4 * GB, 1e5)))
    holders = {layer: {0} for layer in range(0, 4)} | {layer: {2} for layer in range(4, 12)}
    stay = Plan("ecofl", (StagePlan((0, 3), (0,), (4,), 3), StagePlan((4, 11), (2,), (4,), 1)), 4, 8)
    balanced = Plan("ecofl", (StagePlan((0, 9), (0,), (4,), 3), StagePlan((10, 11), (2,), (4,), 1)), 4, 8)
    rounds = {p: predict_sync_round(p, profile, pool, "sleep").sync_round_s for p in (stay, balanced)}
    assert rounds[balanced] < rounds[stay]
    plan, seconds = quickest_to_finish([balanced, stay], stay, holders, 1, profile, pool, "sleep")
    assert plan == stay and seconds == pytest.approx(rounds[stay])
    plan, seconds = quickest_to_finish([stay, balanced], stay, holders, 100, profile, pool, "sleep")
    assert plan == balanced and seconds > 100 * rounds[balanced]  # its moves are in the time too


def test_a_recovery_weighs_the_memory_a_plan_maps_for_the_first_time():
    """Both devices hold every layer (nothing moves). The balanced plan gives the fast device layers 0-9, whose
    gradients, momentum and stashes its process has never mapped; where mapping a byte is slow, the plan it
    ran before finishes one round first, and a hundred rounds still pay for the balanced one."""
    profile = random_profile(np.random.default_rng(7), 12)
    pool = HomePool("test", (DeviceSpec("fast", 2.0, 4 * GB, 1e5, first_touch_s_per_byte=1e-5),
                             DeviceSpec("gone", 1.0, 4 * GB, 1e5),
                             DeviceSpec("slow", 0.5, 4 * GB, 1e5, first_touch_s_per_byte=1e-5)))
    holders = {layer: {0, 2} for layer in range(12)}
    stay = Plan("ecofl", (StagePlan((0, 3), (0,), (4,), 3), StagePlan((4, 11), (2,), (4,), 1)), 4, 8)
    balanced = Plan("ecofl", (StagePlan((0, 9), (0,), (4,), 3), StagePlan((10, 11), (2,), (4,), 1)), 4, 8)
    rounds = {p: predict_sync_round(p, profile, pool, "sleep").sync_round_s for p in (stay, balanced)}
    mapping_s = first_round_extra_s(balanced, profile, pool, before=stay)
    assert rounds[stay] - rounds[balanced] < mapping_s < 100 * (rounds[stay] - rounds[balanced])
    plan, seconds = quickest_to_finish([balanced, stay], stay, holders, 1, profile, pool, "sleep")
    assert plan == stay and seconds == pytest.approx(rounds[stay])
    plan, seconds = quickest_to_finish([stay, balanced], stay, holders, 100, profile, pool, "sleep")
    assert plan == balanced and seconds == pytest.approx(100 * rounds[balanced] + mapping_s)
    unmeasured = with_speeds(pool, {}, {0: None, 2: None})  # nothing known of mapping: the faster plan
    assert quickest_to_finish([stay, balanced], stay, holders, 1, profile, unmeasured, "sleep")[0] == balanced


def test_full_replan_plans_the_survivors_in_original_indices():
    profile = random_profile(np.random.default_rng(4), 10)
    pool = pool_of(1.0, 0.5, 2.0, 1.0)
    plan = full_replan("ecofl", profile, pool, alive={0, 2, 3}, batch_size=8)
    used = {d for s in plan.stages for d in s.devices}
    assert used <= {0, 2, 3} and plan.batch_size == 8
    assert_runnable(plan)
    direct = make_plan("ecofl", profile, HomePool("x", tuple(pool.devices[d] for d in (0, 2, 3))), 8)
    assert [s.layers for s in plan.stages] == [s.layers for s in direct.stages]


def test_full_replans_weigh_hybrid_plans_beside_the_planners_own_only_when_asked():
    profile = random_profile(np.random.default_rng(4), 10)
    pool = pool_of(1.0, 0.5, 2.0, 1.0)
    own = full_replans("ecofl", profile, pool, alive={0, 2, 3}, batch_size=8)
    both = full_replans("ecofl", profile, pool, alive={0, 2, 3}, batch_size=8, hybrid=True)
    assert {plan.planner for plan in own} == {"ecofl"}
    assert both[:len(own)] == own and {plan.planner for plan in both[len(own):]} == {"hpp", "dp"}
    assert all({d for s in plan.stages for d in s.devices} <= {0, 2, 3} for plan in both)
    ruled = full_replans("ecofl", profile, pool, alive={0, 2, 3}, batch_size=8, hybrid=True,
                         micro_batch_rule="largest")
    assert {plan.planner for plan in ruled} == {"ecofl"}  # options are the planner's own: no hybrid plan
    assert full_replans("hpp", profile, pool, alive={0, 2, 3}, batch_size=8, hybrid=True) == \
        full_replans("hpp", profile, pool, alive={0, 2, 3}, batch_size=8)


def test_topology_driven_backups():
    single = three_stage_plan()
    # each neighbouring stage's device, the next stage's first; the first and the last stage have one neighbour
    assert backup_targets(single) == {0: (1,), 1: (2, 0), 2: (1,)}
    hybrid = Plan("hpp", (StagePlan((0, 3), (0,), (4,), 3), StagePlan((4, 7), (1, 2), (2, 2), 1)), 4, 4)
    assert backup_targets(hybrid, {1: GB, 2: 2 * GB}) == {0: (2,)}  # a replicated stage backs up to no one
    profile = random_profile(np.random.default_rng(5), 12)
    assert backup_bytes(hybrid, profile, {1: GB, 2: 2 * GB}) == {2: 2 * stage_state_bytes(profile, (0, 3))}
    stage_bytes = [stage_state_bytes(profile, stage.layers) for stage in single.stages]
    assert backup_bytes(single, profile) == {0: 2 * stage_bytes[1], 1: 2 * (stage_bytes[0] + stage_bytes[2]),
                                             2: 2 * stage_bytes[1]}
    assert restore_source(hybrid, 1, {1}, {}) == 2  # a surviving peer
    assert restore_source(single, 1, {1}, backup_targets(single)) == 2  # its first backup
    assert restore_source(single, 1, {1, 2}, backup_targets(single)) == 0  # its other backup
    assert restore_source(single, 1, {0, 1, 2}, backup_targets(single)) is None  # all lost: the global copy


def test_backups_spare_the_busiest_device_where_a_stage_has_another_neighbour():
    single = three_stage_plan()
    assert backup_targets(single, spared={0}) == {0: (1,), 1: (2,), 2: (1,)}  # the middle stage: its next only
    assert backup_targets(single, spared={2}) == {0: (1,), 1: (0,), 2: (1,)}  # its previous only
    assert backup_targets(single, spared={1}) == backup_targets(single)  # an end stage keeps its one neighbour
    hybrid = Plan("hpp", (StagePlan((0, 3), (0,), (4,), 3), StagePlan((4, 7), (1, 2), (2, 2), 1)), 4, 4)
    memory = {1: GB, 2: 2 * GB}
    assert backup_targets(hybrid, memory, spared={2}) == {0: (1,)}  # another device of the neighbouring stage
    profile = random_profile(np.random.default_rng(5), 12)
    a, b, c = (stage_state_bytes(profile, stage.layers) for stage in single.stages)
    # spared device 0 no longer opens stage 1's replica, and stage 1 sends it once
    assert copy_bytes(single, profile, 1, 0, spared={0}) == pytest.approx({0: a, 1: b + a + c, 2: c + b})
    slow_middle = HomePool("slow-middle", tuple(DeviceSpec(f"d{i}", speed, 4 * GB, 1e9)
                                                for i, speed in enumerate((0.1, 0.01, 0.1))))
    assert busiest_device(single, profile, slow_middle) == 1
    assert spared_devices("spare-busiest", single, profile, slow_middle) == (1,)
    assert spared_devices("both-neighbours", single, profile, slow_middle) == ()
    assert spared_devices("spare-busiest", single, None, slow_middle) == ()  # no profile: nothing tells the busiest
    with pytest.raises(ValueError, match="both-neighbours"):
        spared_devices("nowhere", single, profile, slow_middle)


def test_copy_bytes_count_what_each_device_seals_or_opens_for_fault_tolerance_a_sync_round():
    single = three_stage_plan()
    profile = random_profile(np.random.default_rng(5), 12)
    a, b, c = (stage_state_bytes(profile, stage.layers) for stage in single.stages)
    # stage 1 backs up on both neighbours (sends twice) and keeps the replicas of stages 0 and 2
    assert copy_bytes(single, profile, 1, 0) == pytest.approx({0: a + b, 1: 2 * b + a + c, 2: c + b})
    every_2 = copy_bytes(single, profile, 2, 0)
    assert every_2 == pytest.approx({d: v / 2 for d, v in copy_bytes(single, profile, 1, 0).items()})
    # the global copy every 5: each stage's first device sends its stage's state to the portal
    assert copy_bytes(single, profile, 0, 5) == pytest.approx({0: a / 5, 1: b / 5, 2: c / 5})
    hybrid = Plan("hpp", (StagePlan((0, 3), (0,), (4,), 3), StagePlan((4, 7), (1, 2), (2, 2), 1)), 4, 4)
    whole = stage_state_bytes(profile, (0, 3))
    assert copy_bytes(hybrid, profile, 1, 0, {1: GB, 2: 2 * GB}) == pytest.approx({0: whole, 2: whole})
    assert copy_bytes(single, profile, 0, 0) == {}


def test_a_prediction_charges_fault_tolerances_copies_where_devices_compute_for_real(monkeypatch):
    from ecofl.pipeline.runtime import prediction

    per_byte = 1e-8  # this host's seconds a byte over a paced link (measured once per host; fixed here)
    asked = []
    monkeypatch.setattr(prediction, "host_copy_byte_s",
                        lambda paced, cache_dir=None: asked.append(paced) or (per_byte if paced else per_byte / 2))
    monkeypatch.setattr(prediction, "runtime_overheads", lambda emulation, cache_dir=None: {})
    single = three_stage_plan()
    profile = random_profile(np.random.default_rng(5), 12)
    pool = HomePool("x", tuple(DeviceSpec(f"d{i}", 0.1, 4 * GB, 1e9) for i in range(3)))
    copies = copy_bytes(single, profile, 1, 5)
    tolerant = predict_sync_round(single, profile, pool, "cgroup", copy_bytes=copies)
    charged = {d: Background(carried, per_byte * carried / 0.1) for d, carried in copies.items()}  # at its speed
    assert tolerant.sync_round_s == pytest.approx(simulate(single, profile, pool, background=charged).sync_round_s)
    for emulation in ("cgroup", "none"):
        plain = predict_sync_round(single, profile, pool, emulation).sync_round_s
        assert predict_sync_round(single, profile, pool, emulation, copy_bytes=copies).sync_round_s > plain
    assert asked == [True, True, False]  # emulated devices' links are paced; at host speed they are not
    sleeping = [predict_sync_round(single, profile, pool, "sleep", copy_bytes=c).sync_round_s for c in (None, copies)]
    assert sleeping[0] == sleeping[1]  # a sleeping device's copies run outside the time it sleeps


def test_only_layers_that_change_owner_move():
    profile = random_profile(np.random.default_rng(6), 12)
    old = three_stage_plan()
    new = Plan("ecofl", (StagePlan((0, 5), (0,), (4,), 3), StagePlan((6, 11), (2,), (4,), 1)), 4, 8)
    # Backed up on both neighbours, the lost middle stage's layers are restored where they go: nothing travels
    moves = layer_moves(old, new, profile, lost={1}, backups=backup_targets(old))
    by_layer = {m.layer: m for m in moves}
    assert set(by_layer) == {4, 5, 6, 7}  # device 1's layers; devices 0 and 2 keep theirs
    assert by_layer[4].source == by_layer[4].target == 0 and by_layer[6].source == by_layer[6].target == 2
    assert bytes_moved(moves) == 0
    # Backed up on the next stage only (Asteroid's), the layers going to device 0 come from device 2
    next_only = {0: (1,), 1: (2,), 2: (1,)}
    moves = layer_moves(old, new, profile, lost={1}, backups=next_only)
    by_layer = {m.layer: m for m in moves}
    assert by_layer[4].source == 2 and by_layer[4].target == 0  # from device 1's backup (device 2)
    assert by_layer[6].source == by_layer[6].target == 2  # restored locally from the backup it holds
    assert bytes_moved(moves) == stage_state_bytes(profile, (4, 4)) + stage_state_bytes(profile, (5, 5))
    both = layer_moves(old, new, profile, lost={1, 2}, backups=next_only)
    assert {m.source for m in both if m.layer in (4, 5, 6, 7)} == {GLOBAL_COPY}


def test_a_lost_last_stage_is_restored_where_a_lightweight_re_plan_puts_its_layers():
    """Its backup is the stage before it, which takes its layers: nothing of it travels (Asteroid's backup on the
    first stage sent all of it there)."""
    profile = random_profile(np.random.default_rng(8), 12)
    old = three_stage_plan()
    new = lightweight_replan(old, profile, pool_of(1.0, 1.0, 1.0), lost={2})
    moves = layer_moves(old, new, profile, lost={2}, backups=backup_targets(old))
    lost_layers = set(range(old.stages[2].layers[0], old.stages[2].layers[1] + 1))
    assert lost_layers <= set(layer_owners(new)) and all(layer_owners(new)[layer] == (1,) for layer in lost_layers)
    assert all(m.source == m.target == 1 for m in moves if m.layer in lost_layers)


def test_heavy_rescheduling_moves_every_layer_through_the_portal():
    profile = random_profile(np.random.default_rng(7), 12)
    old = three_stage_plan()
    new = lightweight_replan(old, profile, pool_of(1.0, 1.0, 1.0), lost={1})
    heavy = heavy_moves(old, new, profile, lost={1}, backups=backup_targets(old))
    assert {m.target for m in heavy[:12]} == {PORTAL_DEVICE}
    assert sorted(m.layer for m in heavy[12:]) == sorted(layer_owners(new))
    light = layer_moves(old, new, profile, lost={1}, backups=backup_targets(old))
    assert bytes_moved(heavy) > bytes_moved(light)


def test_the_cli_predicts_a_fault_tolerant_run_with_its_copies(monkeypatch):
    import argparse

    from ecofl.cli import home_train
    from ecofl.pipeline.runtime import prediction
    from ecofl.pipeline.runtime.faults import FaultTolerance

    monkeypatch.setattr(prediction, "host_copy_byte_s", lambda paced, cache_dir=None: 1e-8)
    monkeypatch.setattr(prediction, "runtime_overheads", lambda emulation, cache_dir=None: {})
    single, profile = three_stage_plan(), random_profile(np.random.default_rng(5), 12)
    pool = HomePool("x", tuple(DeviceSpec(f"d{i}", 0.1, (4 + i) * GB, 1e9) for i in range(3)))
    args = argparse.Namespace(rounds=3, cache_dir=None)
    tolerance = FaultTolerance(replicate_every=2, global_copy_every=3)
    memory = {d: spec.memory_bytes for d, spec in enumerate(pool.devices)}
    busiest = busiest_device(single, profile, pool)
    copies = copy_bytes(single, profile, 2, 3, memory, (busiest,))  # the runtime's backups spare the busiest
    assert copies != copy_bytes(single, profile, 2, 3, memory)  # and the prediction charges them as placed
    expected = predict_sync_round(single, profile, pool, "cgroup", 3, copy_bytes=copies)
    assert home_train._predict(single, profile, pool, "cgroup", args, tolerance) == expected
    both = FaultTolerance(replicate_every=2, global_copy_every=3, backups="both-neighbours")
    assert home_train._predict(single, profile, pool, "cgroup", args, both) == predict_sync_round(
        single, profile, pool, "cgroup", 3, copy_bytes=copy_bytes(single, profile, 2, 3, memory))
    assert home_train._predict(single, profile, pool, "cgroup", args, None) == predict_sync_round(
        single, profile, pool, "cgroup", 3)


def test_a_re_learned_speed_keeps_a_confined_devices_cores_in_proportion():
    """A load spike that halves a confined device's passes halves the CPU its ring's messages run on: its cores
    follow a new speed unless given; a device without cores, or one not re-learned, keeps what it had."""
    pi = DeviceSpec("pi", 0.014, 1 << 30, 1e7, cores=0.025)
    pool = HomePool("p", (pi, DeviceSpec("phone", 0.07, 1 << 30, 1e7)))
    slowed = with_speeds(pool, {0: 0.007, 1: 0.035})
    assert [d.cores for d in slowed.devices] == [pytest.approx(0.0125), None]
    assert [d.speed for d in slowed.devices] == [0.007, 0.035]
    assert with_speeds(pool, {0: 0.007}, cores={0: 0.02}).devices[0].cores == 0.02  # given: taken as it is
    assert with_speeds(pool, {1: 0.035}).devices[0].cores == 0.025
