"""Device presets and pools built from them (pool files: tests/test_pools.py)."""

import numpy as np
import pytest

from ecofl.devices import PRESETS, DeviceSpec, HomePool, make_pool, preset
from ecofl.errors import UserError


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UserError, match="nano-10w"):
        preset("jetson-orin")
    with pytest.raises(UserError, match="nano-10w"):
        make_pool("home", ["nano-10w", "toaster"])


def test_empty_pool_and_bad_specs_are_user_errors():
    with pytest.raises(UserError, match="no devices"):
        make_pool("empty", [])
    with pytest.raises(UserError, match="speed"):
        DeviceSpec("x", speed=0, memory_bytes=1, bandwidth_bps=1)
    with pytest.raises(UserError, match="seconds a byte mapped"):
        DeviceSpec("x", speed=1, memory_bytes=1, bandwidth_bps=1, first_touch_s_per_byte=-1e-9)
    with pytest.raises(UserError, match="positive"):
        HomePool("p", (preset("nano-10w"),) * 2, np.zeros((2, 2)))


def test_speeds_follow_the_papers_order():
    s = {name: spec.speed for name, spec in PRESETS.items()}
    assert s["nano-5w"] < s["nano-10w"] < s["tx2-maxq"] < s["tx2-maxn"] < s["nx"]
    # Asteroid Table 1: a TX2 trains 2.4-3.1x faster than a Nano.
    assert 2.0 < s["tx2-maxn"] / s["nano-10w"] < 3.2
