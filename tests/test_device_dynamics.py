"""Device-level dynamics: pool states name a device gone or loaded; homes move between them and re-plan."""

from __future__ import annotations

import pytest

from ecofl.device_dynamics import device_states, resolve_pool
from ecofl.pools import load_pool
from ecofl.errors import UserError
from ecofl.fl.latency import make_latency_model, pipeline_pool_states


def test_pool_states_are_the_pool_with_one_device_gone_or_loaded():
    base = load_pool("ecofl-3stage")
    states = device_states("ecofl-3stage", 4.0)
    assert states[0] == "ecofl-3stage" and len(states) == 1 + 2 + 3  # the portal never leaves
    gone = resolve_pool("ecofl-3stage~leave1")
    assert [d.name for d in gone.devices] == [base.devices[0].name, base.devices[2].name]
    busy = resolve_pool("ecofl-3stage~load2x4")
    assert busy.devices[2].speed == pytest.approx(base.devices[2].speed / 4)
    for bad in ("ecofl-3stage~leave0", "ecofl-3stage~leave9", "ecofl-3stage~melt1", "nowhere~leave1"):
        with pytest.raises(UserError):
            resolve_pool(bad)


def test_device_dynamics_move_homes_between_states_with_their_own_round_times():
    config = {"kind": "pipeline", "pools": ["ecofl-hetero"], "num_homes": 20, "local_steps": 2, "model_bytes": 0,
              "uplink_mbps": 20, "device_dynamics": True, "change_prob": 1.0, "period_s": 10.0}
    states = pipeline_pool_states(config)
    assert states == device_states("ecofl-hetero")
    round_s = {state: 1.0 + i for i, state in enumerate(states)}  # distinct, to see which state is used
    model = make_latency_model({**config, "round_s": round_s})
    seen = {model.state(h, t)[0] for h in range(20) for t in (0.0, 15.0, 25.0)}
    assert seen == set(states)  # every home changes state every period: all states occur
    for h in range(3):
        state, load = model.state(h, 15.0)
        assert model.latency(h, 15.0) == pytest.approx(round_s[state] * load * 2)
