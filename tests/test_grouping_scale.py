"""Eco-FL's initial grouping at scale: the same groups as comparing every home at every turn (eq. 4)."""

import numpy as np
import pytest

from ecofl.fl.grouping import LATENCY_UNITS, CostTable, as_arrays, initial_grouping, kmeans_centres


def every_home_each_turn(homes, latencies, label_hists, num_groups, rt, lam, seed, latency_units="rt"):
    """The grouping as §5.2 states it: each group in turn takes the unassigned home of smallest COST."""
    ids, lat, hists = as_arrays(homes, latencies, label_hists)
    _, centres = kmeans_centres(lat, num_groups, seed)
    table = CostTable(centres, lat, hists, rt, lam, latency_units)
    sums = np.zeros((len(centres), hists.shape[1]))
    members = [[] for _ in centres]
    unassigned = np.arange(len(ids))
    idle_turns = turn = 0
    while unassigned.size and idle_turns < len(centres):
        cost = table.costs(sums[turn:turn + 1], unassigned, groups=[turn])[0]
        if np.isfinite(cost).any():
            pick = int(np.argmin(cost))
            members[turn].append(int(ids[unassigned[pick]]))
            sums[turn] += hists[unassigned[pick]]
            unassigned = np.delete(unassigned, pick)
            idle_turns = 0
        else:
            idle_turns += 1
        turn = (turn + 1) % len(centres)
    return [sorted(m) for m in members], sorted(int(ids[i]) for i in unassigned)


def federation(seed, homes, kind):
    rng = np.random.default_rng(seed)
    latencies = rng.normal(10, 3, homes).clip(0.5) * rng.choice([0.2, 0.4, 0.6, 0.8, 1.0], homes)
    if kind == "tied latencies":
        latencies = np.round(latencies)  # many homes at exactly the same distance from a centre
    if kind == "dirichlet":
        hists = np.stack([rng.multinomial(rng.integers(5, 60), rng.dirichlet(np.full(10, 0.5))) for _ in range(homes)])
    else:  # two classes each, equal shares: few distinct histograms
        hists = np.zeros((homes, 10))
        for h in range(homes):
            hists[h, rng.choice(10, 2, replace=False)] = rng.choice([20, 30])
    return list(range(homes)), dict(enumerate(latencies.tolist())), dict(enumerate(hists))


@pytest.mark.parametrize("kind", ["two classes", "dirichlet", "tied latencies"])
@pytest.mark.parametrize("lam, rt", [(1.0, 3.0), (0.0, 3.0), (50.0, 1.0), (1.0, 0.4), (30.0, 6.0)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("latency_units", ["rt", "seconds"])
def test_initial_grouping_equals_comparing_every_home_every_turn(kind, lam, rt, seed, latency_units):
    homes, latencies, hists = federation(seed, 150, kind)
    grouping = initial_grouping(homes, latencies, hists, 5, rt, lam, seed, latency_units)
    groups, waiting = every_home_each_turn(homes, latencies, hists, 5, rt, lam, seed, latency_units)
    assert [list(g) for g in grouping.groups] == groups
    assert list(grouping.waiting) == waiting


def test_the_latency_terms_units_change_the_initial_groups():
    """At RT 6 s the latency term over RT is a sixth of itself in seconds: lambda weighs the labels more."""
    homes, latencies, hists = federation(0, 150, "two classes")
    over_rt, in_seconds = (initial_grouping(homes, latencies, hists, 5, 6.0, 1.0, 0, units) for units in LATENCY_UNITS)
    assert over_rt.groups != in_seconds.groups
