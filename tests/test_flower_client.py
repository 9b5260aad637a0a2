"""The ClientApp's handlers, called directly with Flower Messages (no simulation engine)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, Metadata, RecordDict

import protocol
from client.client_app import app
from client.federation import federation
from ecofl.fl.federation_setup import FederationSetup
from ecofl.models import build_model
from ecofl.weights import get_weights

HOMES = 20
SETUP = FederationSetup(
    num_homes=HOMES,
    dataset={"name": "digits"},
    latency={"kind": "paper", "num_homes": HOMES, "seed": 0},
).to_json()


def request(content: RecordDict, kind: str) -> Message:
    """A message as the SuperLink delivers it (ids set), without a running Flower app."""
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="",
        group_id="", created_at=time.time(), ttl=3600.0, message_type=kind,
    )
    return Message(content=content, metadata=metadata)


def train_content(weights, config: dict, setup: str = SETUP) -> RecordDict:
    """protocol.train_content with ``config``'s virtual_time (default 0); any value, even a malformed one, is sent."""
    train = {k: v for k, v in config.items() if k != "virtual_time"}
    content = protocol.train_content(weights, train, 0.0, setup)
    if "virtual_time" in config:
        content[protocol.CONFIG]["virtual_time"] = config["virtual_time"]
    return content


def context(home: int = 3) -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": home, "num-partitions": HOMES},
                   state=RecordDict(), run_config={})


def initial_weights() -> list[np.ndarray]:
    return get_weights(build_model("cnn", (1, 8, 8), 10))


def test_query_reports_latency_and_label_histogram():
    reply = app(request(protocol.query_content(SETUP, 0.0), MessageType.QUERY), context(3))
    report = protocol.read_report(reply)
    fed = federation(SETUP)
    assert report.home == 3
    assert report.latency_s == pytest.approx(fed.latency_model.latency(3, 0.0))
    assert report.num_samples == len(fed.parts[3]) == report.label_histogram.sum()
    assert (report.label_histogram > 0).sum() == 2  # shards: two classes per home


def test_without_a_latency_model_query_reports_a_probed_round_time():
    measured = FederationSetup(num_homes=HOMES, dataset={"name": "digits"}).to_json()
    train = {"epochs": 3, "batch_size": 10, "lr": 0.05}
    report = protocol.read_report(app(request(protocol.query_content(measured, 0.0, train), MessageType.QUERY),
                                      context(3)))
    assert 0 < report.latency_s < 60 and report.home == 3
    bad = app(request(protocol.query_content(measured, 0.0, {"epochs": "three"}), MessageType.QUERY), context(3))
    assert bad.has_error() and "train config.epochs: expected an integer" in bad.error.reason


def test_train_returns_new_weights_samples_loss_and_latency_at_virtual_time():
    weights = initial_weights()
    config = {"epochs": 1, "batch_size": 10, "lr": 0.05, "mu": 0.05, "seed": 1, "virtual_time": 5.0}
    reply = protocol.read_reply(app(request(train_content(weights, config), MessageType.TRAIN),
                                    context(3)), home=3)
    assert reply.error is None
    assert reply.num_samples == len(federation(SETUP).parts[3])
    assert np.isfinite(reply.loss)
    assert reply.latency_s == pytest.approx(federation(SETUP).latency_model.latency(3, 5.0))
    assert [w.shape for w in reply.weights] == [w.shape for w in weights]
    assert any(not np.array_equal(a, b) for a, b in zip(reply.weights, weights))


def test_a_home_trained_by_the_client_app_keeps_freed_memory(monkeypatch):
    """As the pipeline's workers do (ecofl.allocator): a training step's freed tensors are reused, not faulted in
    again, in the ClientApp's process too."""
    kept = []
    monkeypatch.setattr("client.client_app.keep_freed_memory", lambda: kept.append(True) or True)
    config = {"epochs": 1, "batch_size": 10, "lr": 0.05, "seed": 1}
    reply = protocol.read_reply(app(request(train_content(initial_weights(), config), MessageType.TRAIN),
                                    context(3)), home=3)
    assert reply.error is None and kept


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"epochs": "three"}, "train config.epochs: expected an integer"),
        ({"lr": -1.0}, "lr must be positive"),
        ({"lr": float("nan")}, "train config.lr: expected a finite number"),
        ({"batch_size": 0}, "invalid training config"),
        ({"virtual_time": "soon"}, "virtual_time must be a finite number"),
    ],
)
def test_malformed_train_config_gets_an_error_reply(config, reason):
    message = request(train_content(initial_weights(), config), MessageType.TRAIN)
    reply = app(message, context())
    assert reply.has_error() and reply.error.code == protocol.MALFORMED_REQUEST
    assert reason in reply.error.reason
    assert protocol.read_reply(reply, home=3).error == reply.error.reason


def test_wrong_weights_setup_or_home_get_error_replies():
    weights = initial_weights()
    wrong_shapes = app(request(train_content(weights[:-1], {}), MessageType.TRAIN), context())
    assert "expected" in wrong_shapes.error.reason
    bad_setup = app(request(RecordDict({"config": ConfigRecord({"setup": "{not json"})}), MessageType.TRAIN),
                    context())
    assert "malformed home setup" in bad_setup.error.reason
    no_setup = app(request(RecordDict({"config": ConfigRecord({})}), MessageType.QUERY), context())
    assert no_setup.has_error()
    unknown_home = app(request(protocol.query_content(SETUP, 0.0), MessageType.QUERY), context(HOMES))
    assert "not one of" in unknown_home.error.reason


def test_evaluate_scores_the_home_data():
    reply = app(request(protocol.evaluate_content(initial_weights(), SETUP), MessageType.EVALUATE), context(3))
    metrics = reply.content[protocol.METRICS]
    assert metrics[protocol.NUM_EXAMPLES] == len(federation(SETUP).parts[3])
    assert 0.0 <= metrics["accuracy"] <= 1.0
