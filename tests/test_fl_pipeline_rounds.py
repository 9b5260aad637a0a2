"""The FL clock's pipeline latency: round times come from planning each home pool."""

import pytest

from ecofl.errors import UserError
from ecofl.fl.latency import make_latency_model
from ecofl.fl.pipeline_rounds import pipeline_round_times


@pytest.fixture(scope="module")
def round_times(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("profiles"))
    return pipeline_round_times(
        ["ecofl-2stage", "ecofl-hetero", "ecofl-2stage"], "cnn", (1, 28, 28), 10, batch_size=10, cache_dir=cache
    )


def test_faster_pool_gives_a_shorter_sync_round(round_times):
    assert set(round_times) == {"ecofl-2stage", "ecofl-hetero"}
    # Nano-5W + Nano-10W is slower than Nano-10W + TX2 Max-N
    assert 0 < round_times["ecofl-hetero"] < round_times["ecofl-2stage"]


def test_latency_config_with_round_times_is_pure_data(round_times):
    config = {"kind": "pipeline", "num_homes": 6, "pools": list(round_times), "local_steps": 30,
              "model_bytes": 4_000_000, "uplink_mbps": 8, "round_s": round_times}
    server, client = make_latency_model(config), make_latency_model(config)
    transfer = 2 * 4_000_000 / 1e6
    for home in range(6):
        latency = server.latency(home, 0.0)
        assert latency == client.latency(home, 0.0)
        pool, _ = server.state(home, 0.0)
        assert latency == pytest.approx(30 * round_times[pool] + transfer)


def test_pipeline_latency_without_round_times_is_a_user_error():
    with pytest.raises(UserError, match="round_s"):
        make_latency_model({"kind": "pipeline", "num_homes": 2, "pools": ["ecofl-2stage"], "local_steps": 1,
                            "model_bytes": 1, "uplink_mbps": 1})
    with pytest.raises(UserError, match="no pool 'ecofl-2stage'"):
        make_latency_model({"kind": "pipeline", "num_homes": 2, "pools": ["ecofl-2stage"], "local_steps": 1,
                            "model_bytes": 1, "uplink_mbps": 1, "round_s": {"x": 1.0}}).latency(0, 0.0)
