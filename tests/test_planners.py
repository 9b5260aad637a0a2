"""Planners against brute force on small random instances, Algorithm 1, memory rules, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ecofl.devices import HomePool
from ecofl.pools import load_pool
from ecofl.errors import UserError
from ecofl.pipeline.memory_model import memory_per_stage, resident_forwards, stage_memory_bytes
from ecofl.pipeline.planners import PLANNERS, make_plan
from ecofl.pipeline.planners.allocation import RangeTimes, allocate, proportional
from ecofl.pipeline.planners.baselines import even_cuts
from ecofl.pipeline.planners.chain import categories, chain_bottleneck, chain_fits
from ecofl.pipeline.planners.ecofl import order_bottleneck, search_orders
from ecofl.pipeline.planners.hpp import HppModel, Stage, solve
from ecofl.pipeline.planners.memory import micro_batch_candidates
from ecofl.pipeline.planners.pipeedge import search_subsets
from ecofl.pipeline.planners.tables import OBJECTIVES, batch_prefix, stage_tables
from ecofl.pipeline.schedule import target_in_flight
from pipeline_kit import instances, random_pool, random_profile


def brute_chain(tables, pool, orders, strict) -> float:
    """min over the given device sequences and all partitions of the chain bottleneck."""
    best = np.inf
    for devices in orders:
        for inner in itertools.combinations(range(1, tables.num_layers), len(devices) - 1):
            cuts = [0, *inner, tables.num_layers]
            if chain_fits(tables, pool, list(devices), cuts, strict):
                best = min(best, chain_bottleneck(tables, pool, list(devices), cuts))
    return best


def same(a: float, b: float) -> bool:
    return (np.isinf(a) and np.isinf(b)) or bool(np.isclose(a, b))


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("strict", [True, False])
def test_eq1_dp_equals_brute_force_for_a_fixed_order(strict, objective):
    for rng, profile, pool in instances(1, 40):
        tables = stage_tables(profile, int(rng.choice([1, 2, 4])), objective)
        order = list(rng.permutation(len(pool)))
        value, cuts = order_bottleneck(tables, pool, order, strict)
        assert same(value, brute_chain(tables, pool, [order], strict))
        if np.isfinite(value):
            assert np.isclose(chain_bottleneck(tables, pool, order, cuts), value)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("strict", [True, False])
def test_ecofl_order_search_equals_brute_force_over_orders(strict, objective):
    finite = 0
    for rng, profile, pool in instances(2, 40):
        tables = stage_tables(profile, int(rng.choice([1, 2, 4])), objective)
        value, devices, cuts = search_orders(tables, pool, strict)
        assert same(value, brute_chain(tables, pool, itertools.permutations(range(len(pool))), strict))
        if np.isfinite(value):
            finite += 1
            assert sorted(devices) == list(range(len(pool)))
            assert chain_fits(tables, pool, devices, cuts, strict)
            assert np.isclose(chain_bottleneck(tables, pool, devices, cuts), value)
    assert finite >= 10  # the instances exercise both outcomes


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("strict", [True, False])
def test_pipeedge_equals_brute_force_over_subsets_and_orders(strict, objective):
    for rng, profile, pool in instances(3, 40):
        tables = stage_tables(profile, int(rng.choice([1, 2, 4])), objective)
        value, devices, cuts = search_subsets(tables, pool, strict)
        subsets = [p for k in range(1, len(pool) + 1) for p in itertools.permutations(range(len(pool)), k)]
        assert same(value, brute_chain(tables, pool, subsets, strict))
        if np.isfinite(value):
            assert len(set(devices)) == len(devices)
            assert chain_fits(tables, pool, devices, cuts, strict)
            assert np.isclose(chain_bottleneck(tables, pool, devices, cuts), value)


def test_categories_merge_identical_devices_only():
    pool = load_pool("asteroid-c")
    assert categories(pool) == [[0], [1, 2], [3, 4, 5]]
    custom = HomePool("custom", pool.devices, bandwidth_bps=np.full((6, 6), 1e6))
    assert categories(custom) == [[d] for d in range(6)]


def brute_hpp(model: HppModel) -> float:
    n_dev, n_layers = len(model.pool), model.profile.num_layers
    best = np.inf
    for p in range(1, min(n_dev, n_layers) + 1):
        for dev_cuts in itertools.combinations(range(1, n_dev), p - 1):
            d = [0, *dev_cuts, n_dev]
            for layer_cuts in itertools.combinations(range(1, n_layers), p - 1):
                c = [0, *layer_cuts, n_layers]
                best = min(best, model.latency([Stage(d[k], d[k + 1], c[k], c[k + 1]) for k in range(p)]))
    return best


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_hpp_dp_equals_brute_force_over_groupings_and_partitions(objective):
    replicated = 0
    rng = np.random.default_rng(4)
    for trial in range(50):
        profile = random_profile(rng, int(rng.integers(3, 7)))
        pool = random_pool(rng, int(rng.integers(1, 5)), duplicates=trial % 2 == 0)
        beta = int(rng.choice([2, 4, 8]))
        model = HppModel(profile, pool, beta * int(rng.integers(1, 6)), beta, block=int(rng.choice([1, 2])),
                         objective=objective)
        value, stages = solve(model)
        assert same(value, brute_hpp(model))
        if np.isfinite(value):
            assert np.isclose(model.latency(stages), value)  # the DP's recursion is eqs. 4-6
            replicated += any(st.b - st.a > 1 for st in stages)
    assert replicated >= 5  # data-parallel stages (and their AllReduce) are exercised


def test_hpp_dp_on_fewer_layers_than_devices_equals_brute_force():
    """Every stage holds a layer: with more devices than layers, some stages are data-parallel groups."""
    rng = np.random.default_rng(6)
    for _ in range(10):
        profile = random_profile(rng, int(rng.integers(1, 3)))
        model = HppModel(profile, random_pool(rng, int(rng.integers(3, 5)), duplicates=False), 8, 2)
        value, stages = solve(model)
        assert same(value, brute_hpp(model)) and np.isfinite(value)
        assert len(stages) <= profile.num_layers and np.isclose(model.latency(stages), value)


def test_algorithm1_respects_memory_and_beats_proportional():
    rng = np.random.default_rng(5)
    for _ in range(30):
        profile = random_profile(rng, 6)
        beta, g = int(rng.choice([8, 16, 32])), int(rng.integers(2, 5))
        forward, backward = batch_prefix(profile, beta)
        first, end = np.triu_indices(profile.num_layers + 1, k=1)
        times = RangeTimes(forward, backward, first, end, rng.uniform(0.2, 2.0, g))
        caps = rng.integers(0, beta, (len(first), g))
        shares, ok = allocate(times, caps, beta, block=int(rng.integers(1, 4)))
        assert (shares[ok].sum(axis=1) == beta).all()
        assert (shares <= caps).all() and (shares >= 0).all()
        assert (caps[~ok].sum(axis=1) < beta).all()  # it fails only where memory cannot hold a micro-batch
        even = proportional(np.broadcast_to(times.speeds, caps.shape), np.full(len(first), beta))
        fits = (even <= caps).all(axis=1)
        assert ok[fits].all()
        assert (times.total(shares[fits], np.flatnonzero(fits)).max(axis=1)
                <= times.total(even[fits], np.flatnonzero(fits)).max(axis=1) + 1e-12).all()


@pytest.mark.parametrize("planner", ["ecofl", "pipeedge"])
def test_micro_batch_search_picks_the_largest_size_meeting_k_equals_p(planner):
    searched = 0
    rng = np.random.default_rng(6)
    for trial in range(30):
        profile = random_profile(rng, int(rng.integers(4, 7)))
        pool = random_pool(rng, int(rng.integers(2, 4)), duplicates=trial % 2 == 0)
        batch = 64
        sizes = micro_batch_candidates(batch, len(pool))
        orders = (itertools.permutations(range(len(pool))) if planner == "ecofl" else
                  [p for k in range(1, len(pool) + 1) for p in itertools.permutations(range(len(pool)), k)])
        orders = list(orders)
        feasible = [b for b in sizes if np.isfinite(brute_chain(stage_tables(profile, b), pool, orders, True))]
        if not feasible:
            continue
        plan = make_plan(planner, profile, pool, batch, micro_batch_rule="largest")
        assert plan.micro_batch == feasible[0]
        assert plan.micro_batch * plan.num_micro_batches == batch
        stages = len(plan.stages)
        assert [st.in_flight for st in plan.stages] == [target_in_flight(stages, s) for s in range(stages)]
        budgets = [pool.devices[st.devices[0]].memory_bytes for st in plan.stages]
        assert all(m <= u for m, u in zip(memory_per_stage(plan, profile), budgets))
        searched += feasible[0] != sizes[0]
    assert searched >= 1  # some instances had to step down from the largest size


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_every_plan_covers_the_batch_and_respects_memory(planner):
    planned = 0
    for rng, profile, pool in instances(7, 15, layers=(5, 8), devices=(2, 4)):
        try:
            plan = make_plan(planner, profile, pool, 48)
        except UserError:
            assert planner in ("even", "dp")  # the baselines may not fit where the others do
            continue
        planned += 1
        assert plan.planner == planner and plan.batch_size == 48 and plan.schedule == "1f1b"
        assert (sorted(d for st in plan.stages for d in st.devices)
                == sorted(set(d for st in plan.stages for d in st.devices)))
        for s, st in enumerate(plan.stages):
            assert 1 <= st.in_flight <= target_in_flight(len(plan.stages), s)
            for d, share in zip(st.devices, st.shares):  # Asteroid eq. 3 per device, as the cost model counts
                need = stage_memory_bytes(profile, st.layers, share, resident_forwards(plan, s))
                assert need <= pool.devices[d].memory_bytes
    assert planned >= (2 if planner == "dp" else 5)


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_a_model_that_fits_nowhere_names_the_device_and_missing_bytes(planner):
    rng = np.random.default_rng(8)
    profile = random_profile(rng, 5, weight_scale=1e4)  # gigabytes of weights per layer
    pool = load_pool("asteroid-d")
    with pytest.raises(UserError, match=r"device \d \((tx2-maxn|nano-10w)[,)].* \d+ bytes short"):
        make_plan(planner, profile, pool, 32)


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_a_fixed_micro_batch_too_big_for_memory_names_it_and_the_missing_bytes(planner):
    """Fits with small micro-batches, not with the one the user fixed: say so, with bytes."""
    profile = random_profile(np.random.default_rng(8), 5)
    pool = load_pool("asteroid-d")
    make_plan(planner, profile, pool, 64)  # fits when the planner may choose
    stash = float(np.sum(profile.stash_bytes))
    batch = 2 ** int(np.ceil(np.log2(4 * pool.devices[0].memory_bytes * len(pool) / stash)))
    with pytest.raises(UserError, match=rf"micro-batches of {batch}\b.* \d+ bytes short"):
        make_plan(planner, profile, pool, batch, micro_batch=batch)


def test_unknown_planner_and_option_are_user_errors():
    profile, pool = random_profile(np.random.default_rng(9), 4), load_pool("asteroid-a")
    with pytest.raises(UserError, match="ecofl, hpp, pipeedge, even, dp"):
        make_plan("gpipe", profile, pool, 32)
    with pytest.raises(UserError, match="no option speed"):
        make_plan("even", profile, pool, 32, speed=2)
    with pytest.raises(UserError, match="divisor"):
        make_plan("hpp", profile, pool, 32, micro_batch=5)


def test_even_cuts_equal_layers_or_flops():
    profile = random_profile(np.random.default_rng(10), 12)
    assert even_cuts(profile, 4) == [0, 3, 6, 9, 12]
    cuts = even_cuts(profile, 3, "flops")
    shares = [profile.flops[i:j].sum() for i, j in zip(cuts, cuts[1:])]
    assert max(shares) <= profile.flops.sum() / 3 + profile.flops.max()


def test_dp_splits_samples_by_speed_in_one_stage():
    profile, pool = random_profile(np.random.default_rng(11), 4), load_pool("asteroid-b")
    plan = make_plan("dp", profile, pool, 80)
    (stage,) = plan.stages
    assert stage.devices == (0, 1, 2, 3, 4) and stage.layers == (0, 3) and stage.in_flight == 1
    speeds = np.array([d.speed for d in pool.devices])
    assert np.allclose(np.array(stage.shares) / plan.micro_batch, speeds / speeds.sum(), atol=1.0 / plan.micro_batch)


@pytest.mark.parametrize("planner", ["ecofl", "pipeedge"])
def test_fastest_micro_batch_rule_never_estimates_slower_than_largest(planner):
    from ecofl.pipeline.planners.chain import round_estimate

    def estimate(plan, pool, profile):
        tables = stage_tables(profile, plan.micro_batch)
        devices = [st.devices[0] for st in plan.stages]
        cuts = [st.layers[0] for st in plan.stages] + [profile.num_layers]
        return round_estimate(tables, pool, devices, cuts, plan.num_micro_batches)

    compared = 0
    for rng, profile, pool in instances(12, 15, layers=(5, 8), devices=(2, 4)):
        try:
            largest = make_plan(planner, profile, pool, 64, micro_batch_rule="largest")
        except UserError:
            continue
        compared += 1
        fastest = make_plan(planner, profile, pool, 64)  # the default rule
        assert fastest.micro_batch <= largest.micro_batch
        assert estimate(fastest, pool, profile) <= estimate(largest, pool, profile) + 1e-9
    assert compared >= 5
    with pytest.raises(UserError, match="largest, fastest"):
        make_plan(planner, profile, pool, 64, micro_batch_rule="smallest")
