"""Clocks and latency models (Eco-FL §6.1: collaborative degree, dynamic setting)."""

import pytest

from ecofl.errors import UserError
from ecofl.fl.clock import VirtualClock, WallClock, clock_from_state
from ecofl.fl.latency import PAPER_DEGREES, PaperLatency, PipelineLatency, make_latency_model


def test_virtual_clock_moves_forward_only_and_round_trips():
    clock = VirtualClock()
    clock.advance_to(5.0)
    assert clock.now() == 5.0
    with pytest.raises(ValueError):
        clock.advance_to(4.0)
    assert clock_from_state(clock.state()).now() == 5.0
    wall = clock_from_state(WallClock(elapsed=100.0).state())
    assert isinstance(wall, WallClock) and wall.now() >= 100.0


def test_paper_latency_is_base_delay_times_a_degree_and_static_without_changes():
    model = PaperLatency(num_homes=200, mean_s=10.0, std_s=3.0, seed=1)
    for home in range(200):
        assert model.degree(home, 0.0) in PAPER_DEGREES
        assert model.latency(home, 0.0) == pytest.approx(model.base_s[home] * model.degree(home, 0.0))
        assert model.latency(home, 1e4) == model.latency(home, 0.0)
    assert model.base_s.min() > 0
    assert abs(model.base_s.mean() - 10.0) < 1.0
    assert len({model.degree(h, 0.0) for h in range(200)}) == 5


def test_dynamic_setting_is_deterministic_whatever_is_asked_first():
    config = {"kind": "paper", "num_homes": 50, "seed": 3, "change_prob": 0.3, "period_s": 10.0}
    a, b = make_latency_model(config), make_latency_model(config)
    times = [0.0, 15.0, 99.0, 250.0]
    forward = [[a.latency(h, t) for t in times] for h in range(50)]
    backward = [[b.latency(h, t) for t in reversed(times)][::-1] for h in reversed(range(50))][::-1]
    assert forward == backward
    changes = sum(a.degree(h, 10.0 * p) != a.degree(h, 10.0 * (p + 1)) for h in range(50) for p in range(40))
    assert 0.2 * 2000 < changes < 0.4 * 2000  # each period a change with probability 0.3


def test_pipeline_latency_uses_the_injected_round_time_and_the_uplink():
    calls = []

    def sync_round_s(pool):
        calls.append(pool)
        return {"fast": 0.1, "slow": 0.4, "fast-1": 0.2}[pool]

    model = PipelineLatency(
        pools=["fast", "slow"], sync_round_s=sync_round_s, local_steps=30, model_bytes=10**6, uplink_bps=10**6
    )
    assert model.latency(0, 0.0) == pytest.approx(0.1 * 30 + 2.0)
    assert model.latency(1, 0.0) == pytest.approx(0.4 * 30 + 2.0)
    model.latency(0, 5.0)
    assert calls == ["fast", "slow"]  # cached per pool
    dynamic = PipelineLatency(
        pools=["fast"], sync_round_s=sync_round_s, local_steps=10, model_bytes=0, uplink_bps=1.0,
        variants={"fast": ["fast-1"]}, load_scales=(1.0, 2.0), change_prob=1.0, period_s=1.0, seed=0,
    )
    seen = {dynamic.state(0, float(p)) for p in range(40)}
    assert seen == {("fast", 1.0), ("fast", 2.0), ("fast-1", 1.0), ("fast-1", 2.0)}
    assert all(dynamic.state(0, p) != dynamic.state(0, p + 1) for p in range(39))


def test_make_latency_model_rejects_bad_configs():
    with pytest.raises(UserError, match="paper"):
        make_latency_model({"kind": "gaussian"})
    with pytest.raises(UserError, match="num_homes"):
        make_latency_model({"kind": "paper"})
    with pytest.raises(UserError, match="sync_round_s"):
        make_latency_model({"kind": "pipeline", "num_homes": 2})
    model = make_latency_model(
        {"kind": "pipeline", "num_homes": 6, "pools": ["a", "b"], "local_steps": 2, "model_bytes": 0, "uplink_mbps": 8},
        sync_round_s=lambda pool: {"a": 1.0, "b": 3.0}[pool],
    )
    assert {model.latency(h, 0.0) for h in range(6)} <= {2.0, 6.0}
    assert make_latency_model({"kind": "fixed", "latencies": [1.0, 2.0]}).latency(1, 7.0) == 2.0
