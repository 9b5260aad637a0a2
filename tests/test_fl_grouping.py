"""Grouping (Eco-FL §5.2, eq. 4, Algorithm 1) and the baselines' groupings."""

import numpy as np
import pytest

from ecofl.errors import UserError
from ecofl.fl.baseline_groupings import astraea_mediators, kl_to_uniform, latency_tiers, single_group, singletons
from ecofl.fl.grouping import Grouping, derive_rt, initial_grouping, js_to_uniform, regroup
from scipy.spatial.distance import jensenshannon

CLASSES = 10


def two_class_hists(rng, n, classes_per_group=None, group_of=None):
    hists = {}
    for h in range(n):
        pool = classes_per_group[group_of[h]] if classes_per_group else range(CLASSES)
        a, b = rng.choice(list(pool), size=2, replace=False)
        hist = np.zeros(CLASSES)
        hist[a], hist[b] = rng.integers(20, 40), rng.integers(20, 40)
        hists[h] = hist
    return hists


def rlg_niid(seed=0, sizes=(20, 20, 20, 20, 20), gap=10.0, spread=2.0):
    """5 response-latency groups, each holding 3 classes (Eco-FL §6.1 RLG-NIID)."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    group_of = dict(enumerate(np.repeat(np.arange(len(sizes)), sizes).tolist()))
    latencies = {h: gap * (1 + group_of[h]) + rng.uniform(-spread, spread) for h in range(n)}
    classes = [[(3 * g + c) % CLASSES for c in range(3)] for g in range(5)]
    return list(range(n)), latencies, two_class_hists(rng, n, classes, group_of)


def mean_js(grouping, hists):
    return np.mean([js_to_uniform(sum(hists[h] for h in g)) for g in grouping.groups if g])


def test_js_to_uniform_is_the_squared_scipy_distance_in_base_2():
    hist = np.array([3.0, 1.0, 0.0, 0.0])
    assert js_to_uniform(hist) == pytest.approx(jensenshannon(hist, np.ones(4), base=2) ** 2)
    assert js_to_uniform(np.ones(7)) == pytest.approx(0.0, abs=1e-12)
    one_class = np.eye(10)[0]
    assert 0.5 < js_to_uniform(one_class) <= 1.0
    rows = js_to_uniform(np.stack([hist, np.ones(4)]))
    assert rows.shape == (2,) and rows[0] == pytest.approx(js_to_uniform(hist))


def test_grouped_homes_lie_within_rt_and_waiting_homes_fit_no_group():
    rng = np.random.default_rng(1)
    homes = list(range(60))
    latencies = {h: float(rng.choice([5, 20, 40]) + rng.normal(0, 2.5)) for h in homes}
    hists = two_class_hists(rng, 60)
    rt = 2.5
    grouping = initial_grouping(homes, latencies, hists, num_groups=3, rt=rt, lam=1.0, seed=0)
    assert sorted([h for g in grouping.groups for h in g] + list(grouping.waiting)) == homes
    for members, centre in zip(grouping.groups, grouping.centres):
        assert all(abs(latencies[h] - centre) <= rt for h in members)
    expected_waiting = {h for h in homes if all(abs(latencies[h] - c) > rt for c in grouping.centres)}
    assert expected_waiting, "the setup should leave some homes out"
    assert set(grouping.waiting) == expected_waiting


def test_lambda_zero_groups_by_latency_alone():
    homes, latencies, hists = rlg_niid(seed=2, sizes=(5, 30, 10, 25, 15))
    rng = np.random.default_rng(0)
    shuffled = dict(zip(homes, rng.permutation([hists[h] for h in homes])))
    for rt in (4.0, 9.0):  # below and above half the gap between centres
        grouping = initial_grouping(homes, latencies, hists, num_groups=5, rt=rt, lam=0.0, seed=0)
        assert grouping == initial_grouping(homes, latencies, shuffled, num_groups=5, rt=rt, lam=0.0, seed=0)
    assert grouping != initial_grouping(homes, latencies, hists, num_groups=5, rt=9.0, lam=5.0, seed=0)  # labels count


def test_lambda_zero_with_rt_below_half_the_gap_is_fedats_latency_tiers():
    """No home fits two groups: taking turns by latency alone is nearest-centre assignment (FedAT)."""
    homes, latencies, hists = rlg_niid(seed=2, sizes=(5, 30, 10, 25, 15))
    grouping = initial_grouping(homes, latencies, hists, num_groups=5, rt=4.5, lam=0.0, seed=0)
    assert grouping.waiting == ()
    assert grouping.groups == latency_tiers(homes, latencies, num_tiers=5, seed=0).groups


def test_groups_take_turns_so_a_crowded_latency_cluster_spreads_into_its_neighbours():
    """Eco-FL §5.2: each group in turn takes its cheapest feasible home, so the groups fill evenly."""
    homes, latencies, hists = rlg_niid(seed=2, sizes=(5, 30, 10, 25, 15))
    grouping = initial_grouping(homes, latencies, hists, num_groups=5, rt=12.5, lam=0.0, seed=0)
    assert [len(g) for g in grouping.groups] == [17] * 5 and grouping.waiting == ()  # clusters of 5..30 homes
    for members, centre in zip(grouping.groups, grouping.centres):
        assert all(abs(latencies[h] - centre) <= 12.5 for h in members)


def test_infinite_lambda_and_rt_ignore_latency_and_balance_the_labels():
    homes, latencies, hists = rlg_niid(seed=6)
    grouping = initial_grouping(homes, latencies, hists, num_groups=5, rt=1e9, lam=1e9, seed=0)
    shuffled = {h: latencies[(h + 37) % len(homes)] for h in homes}  # other latencies, same labels
    assert initial_grouping(homes, shuffled, hists, num_groups=5, rt=1e9, lam=1e9, seed=0).groups == grouping.groups
    tiers = mean_js(latency_tiers(homes, latencies, num_tiers=5, seed=0), hists)
    assert mean_js(grouping, hists) < 0.1 * tiers
    assert mean_js(astraea_mediators(homes, latencies, hists, capacity=20), hists) < 0.2 * tiers


def test_astraea_mediators_follow_a_hand_run_of_the_greedy_kl_assignment():
    """Duan et al.: a mediator takes, one at a time, the client minimising D_KL(P_m + P_k || uniform)."""
    hists = {0: np.array([4.0, 0, 0]), 1: np.array([0, 4.0, 0]), 2: np.array([0, 0, 4.0]),
             3: np.array([2.0, 2, 0]), 4: np.array([3.0, 0, 1])}
    latencies = {h: 1.0 + h for h in hists}
    # KL to uniform = ln 3 - H(P). Mediator 1 starts empty: one-class homes 0-2 are at ln 3 = 1.099,
    # home 3 (1/2, 1/2, 0) at 0.405, home 4 (3/4, 0, 1/4) at 0.536: it takes home 3. With home 3's
    # (2, 2, 0): + home 0 or 1 -> (3/4, 1/4, 0) 0.536, + home 2 -> (1/4, 1/4, 1/2) 0.059,
    # + home 4 -> (5/8, 2/8, 1/8) 0.198: it takes home 2 and is full (capacity 2).
    # Mediator 2 from {0, 1, 4}: home 4 alone (0.536), then + home 0 -> (7/8, 0, 1/8) 0.722,
    # + home 1 -> (3/8, 4/8, 1/8) 0.124: home 1. Mediator 3: home 0.
    mediators = astraea_mediators(list(hists), latencies, hists, capacity=2)
    assert mediators.groups == ((2, 3), (1, 4), (0,)) and mediators.waiting == ()
    assert mediators.centres == (3.5, 3.5, 1.0)
    # capacity 3: after homes 3 and 2, (2, 2, 4) + home 4 -> (5, 2, 5)/12 0.070 beats + home 0 or 1 (0.087)
    assert astraea_mediators(list(hists), latencies, hists, capacity=3).groups == ((2, 3, 4), (0, 1))
    assert kl_to_uniform(np.array([[2.0, 2, 4]]))[0] == pytest.approx(np.log(3) - 1.0397, abs=1e-4)
    with pytest.raises(UserError):
        astraea_mediators(list(hists), latencies, hists, capacity=0)


def test_astraea_ties_within_rounding_go_to_the_lower_home_id():
    """[10, 2, 8, 0] and [0, 2, 8, 10] are equally far from uniform; their KL values differ in the last bit
    (0.4429459687908514 and 0.44294596879085135), which once made the higher id win."""
    hists = {0: np.array([10.0, 2, 8, 0]), 1: np.array([0.0, 2, 8, 10])}
    divergence = kl_to_uniform(np.stack(list(hists.values())))
    assert divergence[0] != divergence[1] and divergence[0] == pytest.approx(divergence[1], rel=1e-12)
    mediators = astraea_mediators(list(hists), {0: 1.0, 1: 1.0}, hists, capacity=1)
    assert mediators.groups == ((0,), (1,))


def test_larger_lambda_gives_lower_group_divergence_on_rlg_niid():
    homes, latencies, hists = rlg_niid(seed=3)
    divergences = [
        mean_js(initial_grouping(homes, latencies, hists, num_groups=5, rt=12.0, lam=lam, seed=0), hists)
        for lam in (0.0, 5.0, 50.0)
    ]
    assert divergences[0] > divergences[1] > divergences[2]
    assert divergences[2] < 0.5 * divergences[0]


def test_derived_rt_spans_neighbouring_groups_and_leaves_nobody_waiting():
    homes, latencies, hists = rlg_niid(seed=4, gap=10.0)
    rt = derive_rt([latencies[h] for h in homes], 5, seed=0)
    assert rt == pytest.approx(10.0, abs=1.0)
    grouping = initial_grouping(homes, latencies, hists, num_groups=5, rt=rt, lam=1.0, seed=0)
    assert grouping.waiting == ()
    tight = {h: 10.0 * (h % 3) + 0.1 * h for h in range(30)}  # three clusters 10 apart, spread up to 2.9
    assert derive_rt(list(tight.values()), 3, seed=0) == pytest.approx(10.0, abs=0.2)
    assert derive_rt(list(tight.values()), 1, seed=0) == pytest.approx(
        max(tight.values()) - np.mean(list(tight.values())))


def test_regroup_moves_a_home_that_left_its_range_and_drops_it_when_nothing_fits():
    hists = {h: np.eye(4)[h % 4] * 10 for h in range(6)}
    grouping = Grouping(groups=((0, 1, 2), (3, 4, 5)), centres=(10.0, 30.0), waiting=())
    latencies = {0: 10.0, 1: 11.0, 2: 9.0, 3: 30.0, 4: 31.0, 5: 29.0}
    assert regroup(grouping, latencies, hists, rt=3.0, lam=1.0) == grouping

    moved = regroup(grouping, {**latencies, 1: 29.5}, hists, rt=3.0, lam=1.0)
    assert moved.groups == ((0, 2), (1, 3, 4, 5)) and moved.waiting == ()

    dropped = regroup(grouping, {**latencies, 1: 20.0}, hists, rt=3.0, lam=1.0)
    assert dropped.groups == ((0, 2), (3, 4, 5)) and dropped.waiting == (1,)

    back = regroup(dropped, {**latencies, 1: 12.0}, hists, rt=3.0, lam=1.0)
    assert back.groups == ((0, 1, 2), (3, 4, 5)) and back.waiting == ()


def test_regroup_picks_the_cheapest_group_by_labels_when_two_fit():
    hists = {0: np.array([10.0, 0, 0]), 1: np.array([10.0, 0, 0]), 2: np.array([0, 10.0, 0]), 3: np.array([0, 10.0, 0])}
    grouping = Grouping(groups=((0,), (1,), (2, 3)), centres=(10.0, 20.0, 50.0), waiting=())
    # home 3 leaves group 2 and lies as close to group 0 as to group 1; both hold class 0 only,
    # so the data term ties too; a group 1 with class 1 already would cost more:
    hists_b = {**hists, 1: np.array([0, 10.0, 0])}
    moved = regroup(grouping, {0: 10.0, 1: 20.0, 2: 50.0, 3: 15.0}, hists_b, rt=6.0, lam=1.0)
    assert moved.group_of(3) == 0


def test_latency_in_seconds_outweighs_the_labels_that_latency_over_rt_lets_win():
    """Eq. 4 as printed adds seconds to a divergence; over RT both terms lie in [0, 1] (the default)."""
    hists = {0: np.array([0, 10.0, 0]), 1: np.array([10.0, 0, 0]), 2: np.array([0, 10.0, 0]), 3: np.array([0, 10.0, 0])}
    grouping = Grouping(groups=((0,), (1,), (2, 3)), centres=(10.0, 20.0, 50.0), waiting=())
    # home 3 (class 1) leaves group 2: 4 s from group 0 (class 1 already), 6 s from group 1 (class 0)
    latencies = {0: 10.0, 1: 20.0, 2: 50.0, 3: 14.0}
    over_rt = regroup(grouping, latencies, hists, rt=8.0, lam=1.0)  # 0.50 + JS 0.46 against 0.75 + JS 0.19
    in_seconds = regroup(grouping, latencies, hists, rt=8.0, lam=1.0, latency_units="seconds")  # 4 + 0.46, 6 + 0.19
    assert over_rt.group_of(3) == 1 and in_seconds.group_of(3) == 0
    with pytest.raises(UserError, match="latency_units must be one of rt, seconds"):
        regroup(grouping, latencies, hists, rt=8.0, lam=1.0, latency_units="ms")


def test_baseline_groupings_cover_every_home():
    homes, latencies, hists = rlg_niid(seed=5)
    tiers = latency_tiers(homes, latencies, num_tiers=5, seed=0)
    mediators = astraea_mediators(homes, latencies, hists, capacity=20)
    for grouping in (tiers, mediators, single_group(homes, latencies), singletons(homes, latencies)):
        assert sorted(h for g in grouping.groups for h in g) == homes
        assert grouping.waiting == ()
    assert list(tiers.centres) == sorted(tiers.centres)
    assert [len(g) for g in mediators.groups] == [20] * 5
    assert mean_js(mediators, hists) < 0.5 * mean_js(tiers, hists)


def test_grouping_round_trips_through_json_and_rejects_bad_input():
    grouping = Grouping(groups=((0, 2), (1,)), centres=(1.0, 2.0), waiting=(3,))
    assert Grouping.from_json(grouping.to_json()) == grouping
    with pytest.raises(ValueError):
        Grouping(groups=((0,), (0,)), centres=(1.0, 2.0), waiting=())
    with pytest.raises(UserError):
        initial_grouping([0], {0: 1.0}, {0: np.ones(2)}, num_groups=1, rt=0.0, lam=1.0, seed=0)
