"""Aggregation: weighted mean, FedAsync mixing and staleness (Eco-FL §5.1, Xie et al. 2019), FedAT's tier weights."""

import numpy as np
import pytest

from ecofl.errors import UserError
from ecofl.fl.aggregation import (
    fedasync_mix,
    fedat_tier_weights,
    is_finite_and_shaped,
    staleness,
    staleness_factor,
    weighted_mean,
)


def test_weighted_mean_weights_by_samples_and_takes_the_max_of_counters():
    a = [np.array([1.0, 2.0], dtype=np.float32), np.array(3, dtype=np.int64)]
    b = [np.array([4.0, 8.0], dtype=np.float32), np.array(7, dtype=np.int64)]
    mean = weighted_mean([a, b], [1, 2])
    np.testing.assert_allclose(mean[0], [3.0, 6.0])
    assert mean[0].dtype == np.float32
    assert mean[1] == 7 and mean[1].dtype == np.int64
    with pytest.raises(ValueError):
        weighted_mean([a, b], [0, 0])


def test_fedasync_mix_is_the_convex_combination():
    g = [np.array([0.0, 10.0]), np.array(2, dtype=np.int64)]
    n = [np.array([10.0, 0.0]), np.array(5, dtype=np.int64)]
    mixed = fedasync_mix(g, n, 0.3)
    np.testing.assert_allclose(mixed[0], [3.0, 7.0])
    assert mixed[1] == 5
    np.testing.assert_allclose(fedasync_mix(g, n, 1.0)[0], n[0])
    np.testing.assert_allclose(fedasync_mix(g, n, 0.0)[0], g[0])
    with pytest.raises(ValueError):
        fedasync_mix(g, n, 1.5)


@pytest.mark.parametrize("t", [0, 1, 3, 4, 5, 10])
def test_staleness_functions_match_fedasync(t):
    a, b = 0.5, 4.0
    assert staleness_factor("constant", t, a, b) == 1.0
    assert staleness_factor("polynomial", t, a, b) == pytest.approx((t + 1) ** -a)
    expected_hinge = 1.0 if t <= b else 1.0 / (a * (t - b) + 1.0)
    assert staleness_factor("hinge", t, a, b) == pytest.approx(expected_hinge)


def test_staleness_hinge_and_polynomial_values():
    assert staleness_factor("polynomial", 3, a=0.5) == pytest.approx(0.5)
    assert staleness_factor("hinge", 6, a=0.5, b=4) == pytest.approx(0.5)
    with pytest.raises(UserError, match="constant"):
        staleness_factor("exponential", 1)


def test_is_finite_and_shaped_names_the_problem():
    ref = [np.zeros((2, 2), dtype=np.float32), np.zeros(3)]
    assert is_finite_and_shaped([np.ones((2, 2), dtype=np.float32), np.ones(3)], ref) is None
    assert "NaN" in is_finite_and_shaped([np.full((2, 2), np.nan), np.ones(3)], ref)
    assert "NaN" in is_finite_and_shaped([np.ones((2, 2)), np.array([1.0, np.inf, 0.0])], ref)
    assert "shape" in is_finite_and_shaped([np.ones((2, 3)), np.ones(3)], ref)
    assert "expected 2 arrays" in is_finite_and_shaped([np.ones((2, 2))], ref)
    assert is_finite_and_shaped(None, ref) == "no weights"


def test_staleness_is_xie_et_als_t_minus_tau_unless_fresh_updates_count_zero():
    # an update started from version 5 and applied next produces version 6: t - tau = 6 - 5 = 1
    assert staleness(version_now=5, version_started=5) == 1
    assert staleness(version_now=7, version_started=4) == 4  # three updates overtook it
    assert staleness(version_now=5, version_started=5, fresh=0) == 0
    assert staleness(version_now=7, version_started=4, fresh=0) == 3
    with pytest.raises(ValueError):
        staleness(version_now=3, version_started=4)
    with pytest.raises(ValueError):
        staleness(version_now=3, version_started=3, fresh=2)


def test_fedat_weights_mirror_the_update_counts():
    """sum_i T_(M+1-i) / T w_i (Chai et al. SC'21), worked by hand."""
    # counts 4, 2, 1 from the fastest tier to the slowest: T = 7, the slowest tier gets the fastest's count
    np.testing.assert_allclose(fedat_tier_weights([4, 2, 1]), [1 / 7, 2 / 7, 4 / 7])
    # by position, as the paper writes it, also where a slower tier has made more updates than a faster
    # one: tier 2 (of 3) updated 5 times, tier 1 twice; tier i takes tier M+1-i's count, T = 8
    np.testing.assert_allclose(fedat_tier_weights([2, 5, 1]), [1 / 8, 5 / 8, 2 / 8])
    np.testing.assert_allclose(fedat_tier_weights([1, 5, 2]), [2 / 8, 5 / 8, 1 / 8])
    np.testing.assert_allclose(fedat_tier_weights([2, 2, 1]), [1 / 5, 2 / 5, 2 / 5])
    np.testing.assert_allclose(fedat_tier_weights([3]), [1.0])
    with pytest.raises(ValueError):
        fedat_tier_weights([2, 0])
