"""Per-update group statistics (Eco-FL Fig. 9)."""

from itertools import combinations

import numpy as np
import pytest

from ecofl.fl.grouping import Grouping
from ecofl.fl.metrics import expected_round_latency, group_stats


@pytest.mark.parametrize("k", [1, 2, 4, 7, 9])
def test_expected_round_latency_is_the_mean_slowest_home_over_all_samples(k):
    latencies = np.random.default_rng(0).uniform(1.0, 20.0, size=7).tolist()
    samples = list(combinations(latencies, min(k, len(latencies))))
    assert expected_round_latency(latencies, k) == pytest.approx(np.mean([max(s) for s in samples]))


def test_a_slower_home_joining_a_fast_group_raises_its_round_latency():
    hists = {h: np.eye(2)[h % 2] for h in range(6)}
    latencies = {0: 1.0, 1: 1.0, 2: 1.0, 3: 10.0, 4: 10.0, 5: 5.0}
    apart = Grouping(groups=((0, 1, 2), (3, 4, 5)), centres=(1.0, 10.0), waiting=())
    mixed = Grouping(groups=((0, 1, 2, 5), (3, 4)), centres=(1.0, 10.0), waiting=())
    stats = [group_stats(g, hists, latencies, round_size=2) for g in (apart, mixed)]
    assert stats[1]["group_latency"][0] > stats[0]["group_latency"][0]
    assert stats[1]["mean_group_latency"] > stats[0]["mean_group_latency"]
    assert stats[1]["group_latency"][0] == pytest.approx(expected_round_latency([1, 1, 1, 5], 2))
