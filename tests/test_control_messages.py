"""Typed control messages: every message round-trips through JSON; a malformed one is refused by type and field."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from ecofl.net.schema import MalformedMessage, MessageSet, encode, message
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import HomePipeline
from ecofl.pipeline.runtime.control_messages import (
    REPLIES,
    REQUESTS,
    Config,
    Done,
    Epoch,
    Error,
    Interrupted,
    Reconfigure,
    Replicate,
    TrainPass,
    Setup,
)
from ecofl.pipeline.runtime.errors import WorkerFailed
from ecofl.pipeline.runtime.stage import Optimization
from pipeline_kit import WITHOUT_BATCH_NORM, assert_gone, pool

EXAMPLES = [
    Config({"kind": "layers"}, 60.0, True, ("127.0.0.1", 5000, 0.1)),
    Epoch(2, None, 1, [("10.0.0.1", 4000), ("10.0.0.2", 4001)]),
    Setup(Optimization(lr=0.1, momentum=0.9)),
    TrainPass(version=3, batch_size=32, num_micro_batches=4, slowdown=2.0, keep=(1,)),
    TrainPass(version=5, batch_size=32, num_micro_batches=4, replicate=Replicate(5, [0, 2], [(1, 2, 0, 3)], 1e6)),
    Reconfigure(3, {"stage": 0}, 0, [("h", 1)], restore=2, moves=[(0, 1, 0)], optimization=Optimization(lr=0.5),
                link_bps=None, recovery=True),
    Done([("F", 0, 1.0, 2.0)], 0.5, 2, 100, 200, None, 1 << 20, []),
    Interrupted("PeerLost: gone", 7, {"3": [0, 1]}),
    Error("ValueError", "bad", 1, 123.0),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: f"{m.TYPE}-{EXAMPLES.index(m)}")
def test_every_message_round_trips_through_json(msg):
    header = json.loads(json.dumps(encode(msg)))
    assert header["type"] == msg.TYPE
    decoded = (REQUESTS if msg.TYPE in REQUESTS.by_type else REPLIES).decode(header)
    assert decoded == msg


@pytest.mark.parametrize("header, says", [
    ({"type": "train_pass", "version": "3", "batch_size": 1, "num_micro_batches": 1},
     "train_pass.version: expected an integer"),
    ({"type": "train_pass", "version": True, "batch_size": 1, "num_micro_batches": 1},
     "train_pass.version: expected an integer"),
    ({"type": "train_pass", "batch_size": 1, "num_micro_batches": 1}, "train_pass: missing field 'version'"),
    ({"type": "train_pass", "version": 1, "batch_size": 1, "num_micro_batches": 1, "extra": 0},
     "train_pass: unknown field"),
    ({"type": "setup", "optimization": {"lr": 1e400}}, "setup.optimization.lr: expected a finite number"),
    ({"type": "setup", "optimization": {"lr": 0.1, "beta": 1}}, "setup.optimization: unknown field"),
    ({"type": "train_pass", "version": 1, "batch_size": 1, "num_micro_batches": 1,
      "replicate": {"version": 1, "to": [], "sources": [[1, 2, 3]], "link_bps": None}},
     r"train_pass.replicate.sources\[0\]: expected 4 items"),
    ({"type": "epoch", "epoch": 0, "role": [], "rank": 0, "addresses": []}, "epoch.role: expected"),
    ({"type": "pickle"}, "unknown message type 'pickle'"),
    (["train_pass"], "must be a JSON object"),
])
def test_a_malformed_request_is_refused_naming_its_type_and_field(header, says):
    with pytest.raises(MalformedMessage, match=says):
        REQUESTS.decode(header)


def test_a_reply_is_not_a_request():
    with pytest.raises(MalformedMessage, match="unknown message type 'done'"):
        REQUESTS.decode(encode(EXAMPLES[6]))


def test_a_message_travels_with_its_arrays_on_the_wire():
    a, b = socket.socketpair()
    with a, b:
        arrays = {"inputs": np.arange(6.0).reshape(2, 3)}
        send_message(a, encode(EXAMPLES[3]), arrays)
        header, received = recv_message(b)
    assert REQUESTS.decode(header) == EXAMPLES[3]
    np.testing.assert_array_equal(received["inputs"], arrays["inputs"])


def test_a_field_with_a_default_may_be_left_out_and_a_defined_one_is_checked():
    @message("ping")
    class Ping:
        count: int = 0

    pings = MessageSet(Ping)
    assert pings.decode({"type": "ping"}) == Ping()
    assert pings.decode({"type": "ping", "count": 3}).count == 3
    with pytest.raises(MalformedMessage, match="ping.count: expected an integer"):
        pings.decode({"type": "ping", "count": 1.5})


def test_a_worker_refuses_a_malformed_request_and_the_portal_says_which_field():
    plan = Plan("hand", (StagePlan((0, 4), (0,), (4,), 1),), micro_batch=4, num_micro_batches=1)
    with HomePipeline(WITHOUT_BATCH_NORM, pool(1), plan, emulate="none", timeout_s=60) as home:
        pid = home.worker_pids[0]
        send_message(home.control.connections[0], {"type": "train_pass", "version": "0", "batch_size": 4,
                                                   "num_micro_batches": 1})
        with pytest.raises(WorkerFailed, match=r"MalformedMessage: train_pass.version: expected an integer"):
            home.control.gather(Done)
    assert_gone([pid])
