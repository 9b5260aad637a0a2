"""Device presets, named home pools and their Hydra mirrors."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from ecofl.devices import MBPS, POOLS, PRESETS, DeviceSpec, HomePool, load_pool, make_pool, preset
from ecofl.errors import UserError

CONF_HOME = Path(__file__).resolve().parents[1] / "conf" / "home"


def test_every_pool_uses_presets_and_loads_at_100_mbps():
    for name, devices in POOLS.items():
        pool = load_pool(name)
        assert [d.name for d in pool.devices] == devices
        off_diagonal = pool.bandwidth_bps[~np.eye(len(pool), dtype=bool)]
        assert np.allclose(off_diagonal, 100 * MBPS)


def test_issue_pool_compositions():
    def count(name: str) -> dict[str, int]:
        return {d: POOLS[name].count(d) for d in set(POOLS[name])}

    assert count("asteroid-a") == {"nano-10w": 5}
    assert count("asteroid-b") == {"nx": 3, "tx2-maxn": 2}
    assert count("asteroid-c") == {"nx": 1, "tx2-maxn": 2, "nano-10w": 3}
    assert count("asteroid-d") == {"tx2-maxn": 1, "nano-10w": 3}
    assert count("ecofl-2stage") == {"nano-5w": 1, "nano-10w": 1}
    assert count("ecofl-3stage") == {"nano-10w": 2, "tx2-maxq": 1}
    assert count("ecofl-hetero") == {"nano-10w": 1, "tx2-maxn": 1}


def test_yaml_mirrors_pools():
    files = sorted(CONF_HOME.glob("*.yaml"))
    assert {f.stem for f in files} == set(POOLS)
    for f in files:
        conf = yaml.safe_load(f.read_text())
        assert conf["name"] == f.stem
        assert conf["devices"] == POOLS[f.stem]
        assert conf["bandwidth_mbps"] == 100


def test_bandwidth_override():
    pool = load_pool("asteroid-b", bandwidth_mbps=1000)
    assert pool.bandwidth_bps[0, 1] == pytest.approx(1000 * MBPS)


@pytest.mark.parametrize("mbps", [0, -5, float("nan")])
def test_bad_bandwidth_is_a_user_error(mbps):
    with pytest.raises(UserError, match="bandwidth"):
        load_pool("asteroid-a", bandwidth_mbps=mbps)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UserError, match="asteroid-a"):
        load_pool("asteroid-z")
    with pytest.raises(UserError, match="nano-10w"):
        preset("jetson-orin")
    with pytest.raises(UserError, match="nano-10w"):
        make_pool("home", ["nano-10w", "toaster"])


def test_empty_pool_and_bad_specs_are_user_errors():
    with pytest.raises(UserError, match="no devices"):
        make_pool("empty", [])
    with pytest.raises(UserError, match="speed"):
        DeviceSpec("x", speed=0, memory_bytes=1, bandwidth_bps=1)
    with pytest.raises(UserError, match="positive"):
        HomePool("p", (preset("nano-10w"),) * 2, np.zeros((2, 2)))


def test_speeds_follow_the_papers_order():
    s = {name: spec.speed for name, spec in PRESETS.items()}
    assert s["nano-5w"] < s["nano-10w"] < s["tx2-maxq"] < s["tx2-maxn"] < s["nx"]
    # Asteroid Table 1: a TX2 trains 2.4-3.1x faster than a Nano.
    assert 2.0 < s["tx2-maxn"] / s["nano-10w"] < 3.2
