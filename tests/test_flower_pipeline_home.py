"""A home in pipeline mode: the ClientApp's train handler drives the real runtime.

The reply's weights equal the in-process mode's for the same message (the
pipeline's sync-round is train_local's step), a failing pipeline is an error
reply, and no worker process outlives the handler.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, Metadata, RecordDict

import protocol
from client import pipeline_training
from client.client_app import app
from client.federation import federation
from ecofl.errors import UserError
from ecofl.fl import federation_setup
from ecofl.fl.federation_setup import FederationSetup, PipelineHomeSettings
from ecofl.models import build_model
from ecofl.weights import get_weights
from processes import worker_processes

pytestmark = pytest.mark.timeout(240)

HOMES = 40  # digits: 32-39 samples per home
BASE = FederationSetup(
    num_homes=HOMES,
    dataset={"name": "digits"},
    latency={"kind": "paper", "num_homes": HOMES, "seed": 0},
)
torch.manual_seed(0)
WEIGHTS = get_weights(build_model("cnn", (1, 8, 8), 10))  # every request starts from the same model
PIPELINE = {"homes": [0, 3], "pool": "ecofl-hetero", "emulate": "sleep", "timeout_s": 60}


def setup_json(**pipeline: object) -> str:
    return replace(BASE, pipeline_home=PipelineHomeSettings.from_dict(pipeline).to_dict()).to_json()


def request(content: RecordDict) -> Message:
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="",
        group_id="", created_at=time.time(), ttl=3600.0, message_type=MessageType.TRAIN,
    )
    return Message(content=content, metadata=metadata)


def train(setup: str, home: int, config: dict) -> Message:
    context = Context(run_id=1, node_id=7, node_config={"partition-id": home, "num-partitions": HOMES},
                      state=RecordDict(), run_config={})
    train_config = {k: v for k, v in config.items() if k != "virtual_time"}
    return app(request(protocol.train_content(WEIGHTS, train_config, config.get("virtual_time", 0.0), setup)), context)


@pytest.mark.parametrize(
    "home, config",
    [
        # 36 samples, batch 10: three full mini-batches and a partial one of 6 (its own pipeline)
        (3, {"epochs": 1, "batch_size": 10, "lr": 0.05, "mu": 0.05, "seed": 4}),
        # 32 samples, batch 8: every mini-batch full, two epochs in one call, momentum kept
        (0, {"epochs": 2, "batch_size": 8, "lr": 0.05, "momentum": 0.5, "mu": 0.05, "seed": 1}),
    ],
)
def test_pipeline_home_returns_the_in_process_weights(home, config):
    config = {**config, "virtual_time": 5.0}
    in_process = protocol.read_reply(train(BASE.to_json(), home, config), home)
    setup = setup_json(**PIPELINE)
    message = train(setup, home, config)
    assert not message.has_error(), message.error.reason
    piped = protocol.read_reply(message, home)
    assert piped.num_samples == in_process.num_samples == len(federation(setup).parts[home])
    for expected, actual in zip(in_process.weights, piped.weights, strict=True):
        assert expected.shape == actual.shape
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
    assert piped.loss == pytest.approx(in_process.loss, abs=1e-5)
    assert piped.latency_s == in_process.latency_s  # virtual clock: the latency model's value
    metrics = message.content[protocol.METRICS]
    samples, batch = piped.num_samples, config["batch_size"]
    assert metrics["pipeline_sync_rounds"] == config["epochs"] * -(-samples // batch)
    assert metrics["pipeline_train_s"] > 0 and metrics["pipeline_sync_round_mean_s"] > 0
    assert worker_processes() == []


def test_a_pipeline_home_at_host_speed_plans_at_the_micro_batch_predicted_fastest_as_the_cli_does():
    """Its plan is ``ecofl home train``'s (plan_as_run): of the planner's plans at each micro-batch size, the one the
    cost model predicts fastest with the runtime's overheads. The planner's own choice for this home, 16 micro-
    batches of 2, is predicted about 1.5x slower than 8 of 4 on this host; it was once the home's plan."""
    from ecofl.pipeline.planners import plans_by_micro_batch
    from ecofl.pipeline.runtime.emulation import Emulation
    from ecofl.pipeline.runtime.prediction import predict_sync_round

    pool, profile, plan, limits = pipeline_training.home_plan("cnn", (1, 28, 28), 10, "block", "ecofl-3stage",
                                                              "ecofl", 32, Emulation.NONE)
    seconds = [predict_sync_round(p, profile, pool, "none").sync_round_s
               for p in plans_by_micro_batch("ecofl", profile, pool, 32)]
    assert limits is None
    assert predict_sync_round(plan, profile, pool, "none").sync_round_s == pytest.approx(min(seconds))


def test_unselected_homes_train_in_process():
    config = {"epochs": 1, "batch_size": 10, "seed": 4}
    plain = protocol.read_reply(train(BASE.to_json(), 5, config), 5)
    message = train(setup_json(**PIPELINE), 5, config)
    assert "pipeline_train_s" not in message.content[protocol.METRICS]
    for a, b in zip(plain.weights, protocol.read_reply(message, 5).weights):
        np.testing.assert_array_equal(a, b)


def test_a_pipeline_that_fails_gives_an_error_reply_and_leaves_no_worker(monkeypatch):
    config = {"epochs": 1, "batch_size": 10}
    # devices that cannot join, or cannot answer, in time (forked workers may join within 0.01 s)
    unreachable = train(setup_json(**{**PIPELINE, "timeout_s": 0.01}), 3, config)
    assert unreachable.has_error() and unreachable.error.code == protocol.PIPELINE_FAILED
    assert "DeviceUnreachable" in unreachable.error.reason or "WorkerTimeout" in unreachable.error.reason
    assert worker_processes() == []

    # a worker that dies mid-training
    original = pipeline_training.HomePipeline.train

    def kill_a_worker_first(self, *args, **kwargs):
        os.kill(self.worker_pids[1], signal.SIGKILL)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pipeline_training.HomePipeline, "train", kill_a_worker_first)
    died = train(setup_json(**{**PIPELINE, "fault_tolerance": False}), 3, config)
    assert died.has_error() and died.error.code == protocol.PIPELINE_FAILED
    assert "WorkerDied" in died.error.reason and "pipeline home 3" in died.error.reason
    assert protocol.read_reply(died, 3).error == died.error.reason
    assert worker_processes() == []


def test_a_home_whose_device_dies_recovers_and_still_answers_the_round(monkeypatch):
    """Fault tolerance (the default): the portal re-plans on the survivors; the reply equals in-process training."""
    config = {"epochs": 1, "batch_size": 10, "seed": 3}
    original = pipeline_training.HomePipeline.train

    def kill_a_worker_first(self, *args, **kwargs):
        os.kill(self.worker_pids[1], signal.SIGKILL)
        return original(self, *args, **kwargs)

    in_process = protocol.read_reply(train(BASE.to_json(), 3, config), 3)
    monkeypatch.setattr(pipeline_training.HomePipeline, "train", kill_a_worker_first)
    message = train(setup_json(**PIPELINE), 3, config)
    assert not message.has_error()
    survived = protocol.read_reply(message, 3)
    for expected, actual in zip(in_process.weights, survived.weights):
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
    assert message.content[protocol.METRICS]["pipeline_failures_recovered"] >= 1
    assert worker_processes() == []


def test_impossible_requests_are_error_replies():
    partial_with_momentum = train(setup_json(**PIPELINE), 3, {"epochs": 1, "batch_size": 10, "momentum": 0.9})
    assert partial_with_momentum.error.code == protocol.PIPELINE_FAILED
    assert "momentum" in partial_with_momentum.error.reason
    bad_setup = train(BASE.to_json().replace('"pipeline_home": {}',
                                             '"pipeline_home": {"homes": [3], "pool": "mansion"}'),
                      3, {})
    assert (bad_setup.error.code == protocol.MALFORMED_REQUEST
            and "unknown pool or device preset 'mansion'" in bad_setup.error.reason)
    assert worker_processes() == []


def test_settings_parse_and_default_to_off():
    assert PipelineHomeSettings.from_dict({}).to_dict() == {}
    assert PipelineHomeSettings.from_dict({"homes": [], "pool": None}).to_dict() == {}
    assert PipelineHomeSettings.from_dict({"homes": "2, 0"}).homes == (0, 2)
    everyone = PipelineHomeSettings.from_dict({"homes": "all", "pool": ["ecofl-2stage", "ecofl-hetero"]})
    assert everyone.selects(17) and everyone.pool_name(3, None, 0.0) == "ecofl-hetero"
    assert PipelineHomeSettings.from_dict({"homes": [1]}).pool_name(1, None, 0.0) == federation_setup.DEFAULT_POOL
    assert PipelineHomeSettings().planning({"kind": "pipeline", "planner": "hpp", "granularity": "fine"}) == (
        "hpp", "fine")
    assert PipelineHomeSettings().planning({"kind": "paper"}) == ("ecofl", "block")
    for bad in ({"homes": ["x"]}, {"homes": [0], "planner": "magic"}, {"homes": [0], "timeout_s": 0},
                {"home": [0]}):
        with pytest.raises(UserError):
            PipelineHomeSettings.from_dict(bad)
