"""GridTransport over an in-memory Grid that serves the real ClientApp (no simulation engine)."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from client.client_app import app as client_app
from ecofl.fl.federation_setup import FederationSetup
from ecofl.fl.loop import EventLoop
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.transport import Route, RunStopped, TrainTask
from ecofl.models import build_model
from ecofl.weights import get_weights
from server.grid_transport import GridTransport, HomesSilent

HOMES = 8
SETUP = FederationSetup(num_homes=HOMES, dataset={"name": "digits"},
                  latency={"kind": "paper", "num_homes": HOMES, "seed": 0}).to_json()


class FakeGrid(Grid):
    """Nodes with random ids, each running the ClientApp as partition ``partition_of[node]``.

    ``silent`` nodes never answer; replies come back in reverse order of pushing.
    """

    def __init__(self, partition_of: dict[int, int], silent: set[int] = frozenset()) -> None:
        self.partition_of = partition_of
        self.silent = set(silent)
        self.crashed: set[int] = set()  # nodes whose ClientApp crashes (as Flower reports an actor Ray killed)
        self.replies: dict[str, Message] = {}

    def set_run(self, run) -> None:
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.partition_of)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            node = message.metadata.dst_node_id
            ids.append(message.metadata.message_id)
            if node in self.silent:
                continue
            if node in self.crashed:
                error = Error(code=ErrorCode.CLIENT_APP_CRASHED, reason="ClientApp crashed: the actor died")
                self.replies[message.metadata.message_id] = Message(error, reply_to=message)
                continue
            context = Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                              node_config={"partition-id": self.partition_of[node], "num-partitions": HOMES})
            self.replies[message.metadata.message_id] = client_app(message, context)
        return ids

    def pull_messages(self, message_ids):
        found = [self.replies.pop(i) for i in list(message_ids) if i in self.replies]
        return found[::-1]

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    """What a running ServerApp has set: messages take their run and source from it."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture()
def weights() -> list[np.ndarray]:
    return get_weights(build_model("cnn", (1, 8, 8), 10))


def nodes(count: int = HOMES) -> dict[int, int]:
    rng = np.random.default_rng(1)
    return {int(node): home for home, node in enumerate(rng.choice(10**9, size=count, replace=False))}


def test_connect_maps_partition_ids_to_node_ids():
    partition_of = nodes()
    transport = GridTransport(FakeGrid(partition_of), SETUP, HOMES)
    reports = transport.connect(timeout_s=5)
    assert sorted(r.home for r in reports) == list(range(HOMES))
    assert transport.node_of == {home: node for node, home in partition_of.items()}


def test_connect_stops_with_a_clear_error_when_homes_are_missing_and_told_to():
    transport = GridTransport(FakeGrid(nodes(HOMES - 1)), SETUP, HOMES, silent_homes="stop")
    with pytest.raises(HomesSilent, match=f"1 of {HOMES} homes did not answer.*only {HOMES - 1} of {HOMES} homes "
                                          "connected.*server.silent_homes=continue"):
        transport.connect(timeout_s=0.1)


def test_a_connect_phase_with_homes_that_never_answer_ends_at_its_timeout_and_goes_on_without_them():
    """Two homes connect but never answer, one never connects; three messages in flight at a time.

    The connect phase must neither hang nor wait past its timeout (bounded
    generously here), and the run goes on with the homes that answered,
    counting them in the summary.
    """
    partition_of = nodes()
    never_connects = list(partition_of)[-1]
    grid = FakeGrid({node: home for node, home in partition_of.items() if node != never_connects},
                    silent=set(list(partition_of)[:2]))
    transport = GridTransport(grid, SETUP, HOMES, window=3, poll_interval_s=0.001, reply_timeout_s=30)
    outcome: dict = {}
    timeout_s = 1.0

    def connect() -> None:
        started = time.monotonic()
        outcome["reports"] = transport.connect(timeout_s=timeout_s)
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the connect phase hung"
    answered = sorted(home for node, home in partition_of.items() if node in grid.partition_of
                      and node not in grid.silent)
    assert sorted(r.home for r in outcome["reports"]) == answered and len(answered) == HOMES - 3
    assert sorted(transport.node_of) == answered
    assert outcome["seconds"] < timeout_s + 30  # ended at its timeout, not at some later wait
    config = LoopConfig(strategy="fedavg", max_concurrent=2, max_updates=2, target_accuracy=None,
                        train={"epochs": 1, "lr": 0.05})
    loop = EventLoop(config, transport, range(HOMES), get_weights(build_model("cnn", (1, 8, 8), 10)),
                     lambda weights: (0.0, 0.0), progress=False)
    loop.run()
    summary = loop.summary()
    assert summary["updates"] == 2 and summary["failed_total"] == 0
    assert summary["num_homes"] == HOMES and summary["homes_answered"] == HOMES - 3
    assert set(loop.grouping.groups[0]) == set(answered)


def test_an_exchange_keeps_at_most_its_window_in_flight():
    grid = FakeGrid(nodes())
    pushed: list[int] = []
    push = grid.push_messages
    grid.push_messages = lambda messages: pushed.append(len(messages := list(messages))) or push(messages)
    transport = GridTransport(grid, SETUP, HOMES, window=3, poll_interval_s=0.001)
    assert len(transport.connect(timeout_s=30)) == HOMES
    assert max(pushed) <= 3 and sum(pushed) == HOMES


def test_no_home_answering_is_an_error_whatever_the_setting():
    grid = FakeGrid(nodes(), silent=set(nodes()))
    with pytest.raises(HomesSilent, match="nothing to train"):
        GridTransport(grid, SETUP, HOMES, poll_interval_s=0.01).connect(timeout_s=0.2)


def test_two_nodes_claiming_one_home_is_an_error():
    partition_of = nodes()
    first, second = list(partition_of)[:2]
    partition_of[second] = partition_of[first]
    with pytest.raises(RuntimeError, match="both are home"):
        GridTransport(FakeGrid(partition_of), SETUP, HOMES).connect(timeout_s=5)


def test_silent_home_is_a_straggler_and_errors_come_back_as_errors(weights):
    partition_of = nodes()
    grid = FakeGrid(partition_of)
    transport = GridTransport(grid, SETUP, HOMES, query_timeout_s=0.2, reply_timeout_s=0.2, poll_interval_s=0.001)
    transport.connect(timeout_s=5)
    grid.silent = {transport.node_of[2]}
    tasks = [TrainTask(h, weights, {"epochs": 1, "lr": 0.05}) for h in (1, 2, 3)]
    tasks.append(TrainTask(4, weights, {"epochs": "one"}))
    replies = {r.home: r for r in transport.train(tasks)}
    assert set(replies) == {1, 3, 4}
    assert replies[1].error is None and replies[1].num_samples > 0
    assert "train config.epochs: expected an integer" in replies[4].error
    reports = transport.query([1, 2, 3], 30.0)
    assert sorted(r.home for r in reports) == [1, 3]


def test_query_at_virtual_time_zero_reuses_the_connect_reports():
    grid = FakeGrid(nodes())
    transport = GridTransport(grid, SETUP, HOMES, query_timeout_s=0.05, poll_interval_s=0.001)
    reports = transport.connect(timeout_s=5)
    grid.silent = set(grid.partition_of)  # nobody answers any more
    assert transport.query(range(HOMES), 0.0) == sorted(reports, key=lambda r: r.home)
    assert transport.query(range(HOMES), 1.0) == []


def test_collect_brings_replies_with_their_tasks_and_a_silent_home_once_as_an_error(weights):
    grid = FakeGrid(nodes())
    transport = GridTransport(grid, SETUP, HOMES, reply_timeout_s=0.3, poll_interval_s=0.001)
    transport.connect(timeout_s=5)
    grid.silent = {transport.node_of[2]}
    tasks = [TrainTask(h, weights, {"epochs": 1, "lr": 0.05}, Route(dispatch=7)) for h in (1, 2, 3)]
    transport.submit(tasks)
    arrived = transport.collect(wait_s=0.05)
    assert sorted(task.home for task, _ in arrived) == [1, 3]
    assert all(reply.home == task.home and reply.error is None for task, reply in arrived)
    assert arrived[0][0].route.dispatch == 7
    assert transport.collect(wait_s=0.01) == []  # the silent home's timeout has not passed yet
    late = transport.collect(wait_s=None)
    assert [(task.home, reply.error) for task, reply in late] == [(2, "no reply within 0.3 s")]
    assert transport.collect(wait_s=0.01) == []  # reported once
    transport.submit([TrainTask(HOMES + 5, weights, {}, Route(dispatch=8))])  # no such node: an error, at once
    assert [(task.home, reply.error) for task, reply in transport.collect(wait_s=0.01)] == [
        (HOMES + 5, "not delivered: home not connected")]


@pytest.mark.parametrize("wait", ["train", "collect", "connect"])
def test_setting_stop_ends_any_wait_for_homes_at_once(weights, wait):
    """Ctrl-C: a silent home would hold the wait for the whole 600 s reply timeout."""
    partition_of = nodes()
    grid = FakeGrid(partition_of)
    stop = threading.Event()
    transport = GridTransport(grid, SETUP, HOMES, reply_timeout_s=600.0, poll_interval_s=0.01, stop=stop)
    if wait == "connect":
        grid.partition_of = dict(list(partition_of.items())[:-1])  # a home never connects
    else:
        transport.connect(timeout_s=5)
        grid.silent = {transport.node_of[2]}
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RunStopped):
        if wait == "train":
            transport.train([TrainTask(2, weights, {"epochs": 1})])
        elif wait == "collect":
            transport.submit([TrainTask(2, weights, {"epochs": 1})])
            transport.collect(wait_s=None)
        else:
            transport.connect(timeout_s=600)
    assert time.monotonic() - started < 60  # interrupted: the waits themselves run for 600 s or forever


@pytest.mark.parametrize("strategy", ["ecofl", "fedasync"])
@pytest.mark.parametrize("batch_homes", [True, False])
def test_a_dispatch_trains_together_behind_the_client_apps_with_the_numbers_of_the_loop_in_process(batch_homes,
                                                                                                 strategy):
    """Each home is its own node and message; with batching the first message of a dispatch trains the batch
    (client/dispatch_batches.py). The loop's numbers are those of the in-process transport doing the same: the
    server foresees the completions from the homes' latency model and trains its rounds in the background, the
    in-process loop trains each dispatch before the next and takes the completions from the replies."""
    from client.federation import federation
    from ecofl.fl.inprocess import InProcessTransport

    setup = FederationSetup(num_homes=HOMES, dataset={"name": "digits"}, batch_homes="on" if batch_homes else "off",
                            latency={"kind": "paper", "num_homes": HOMES, "seed": 0}).to_json()
    config = LoopConfig(strategy=strategy, num_groups=2, homes_per_round=3, max_concurrent=6, max_updates=4,
                        target_accuracy=None, train={"epochs": 1, "lr": 0.05, "mu": 0.05, "momentum": 0.5})
    initial = get_weights(build_model("cnn", (1, 8, 8), 10))
    fed = federation(setup)
    transport = GridTransport(FakeGrid(nodes()), setup, HOMES, batch_homes=batch_homes)
    transport.connect(timeout_s=5)
    flower_loop = EventLoop(config, transport, range(HOMES), initial, lambda w: (0.0, float(w[0].sum())),
                            progress=False, placement=transport.times.placement, latency_model=fed.latency_model)
    flower_rows = flower_loop.run()

    local = InProcessTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts, fed.latency_model,
                               num_classes=fed.dataset.num_classes, batch_homes=batch_homes)
    local_rows = EventLoop(config, local, range(HOMES), initial, lambda w: (0.0, float(w[0].sum())),
                           progress=False).run()

    times = transport.times
    assert times.train_replies > 0 and times.replies_by_device == {"cpu": times.train_replies}
    assert (times.batched_replies > 0) == batch_homes and local.batched_run == times.batched_replies
    assert flower_loop.summary()["device"] == "cpu" and flower_loop.summary()["batch_homes"] is batch_homes
    keys = ("update", "virtual_time", "group", "homes", "stragglers", "accuracy", "train_loss")
    assert [{k: r[k] for k in keys} for r in flower_rows] == [{k: r[k] for k in keys} for r in local_rows]


def test_submitted_tasks_keep_at_most_the_window_unanswered_and_the_rest_go_out_as_replies_come(weights):
    grid = FakeGrid(nodes())
    transport = GridTransport(grid, SETUP, HOMES, window=3, poll_interval_s=0.001)
    transport.connect(timeout_s=5)
    tasks = [TrainTask(home, weights, {"epochs": 1, "lr": 0.05}, Route(virtual_time=1.0)) for home in range(HOMES)]
    transport.submit(tasks, batched=True)
    assert len(grid.replies) == 3  # FakeGrid answers at push: one reply per message pushed and not yet pulled
    answered = []
    while len(answered) < HOMES:
        answered += [task.home for task, reply in transport.collect(wait_s=5)]
        assert len(grid.replies) <= 3
    assert sorted(answered) == list(range(HOMES))


def test_home_failures_are_counted_by_kind_with_one_terminal_line_each(weights, tmp_path, caplog):
    """Crashed and silent homes, over and over: summary.json counts them by kind, the terminal gets one line per
    kind (and one per kind at the end), the log file every failure."""
    from ecofl.fl.home_failures import HomeFailures

    grid = FakeGrid(nodes())
    failures = HomeFailures(tmp_path / "home_failures.log")
    transport = GridTransport(grid, SETUP, HOMES, query_timeout_s=0.2, reply_timeout_s=0.5, poll_interval_s=0.001,
                              failures=failures)
    transport.connect(timeout_s=5)
    grid.crashed = {transport.node_of[h] for h in (1, 2, 3)}
    grid.silent = {transport.node_of[4]}
    config = LoopConfig(strategy="fedavg", homes_per_round=HOMES, max_concurrent=HOMES, max_updates=3,
                        round_deadline="none", target_accuracy=None, train={"epochs": 1, "lr": 0.05})
    with caplog.at_level("WARNING"):
        loop = EventLoop(config, transport, range(HOMES), weights, lambda w: (0.0, 0.5), progress=False,
                         failures=failures)
        loop.run()
        for t in (5.0, 10.0):
            transport.query(range(HOMES), t)
    summary = loop.summary()
    counts = {kind: entry["count"] for kind, entry in summary["home_failures"].items()}
    assert counts["train:crashed"] == 3 * 3  # three homes in each of three rounds
    assert counts["query:crashed"] == 2 * 3 and counts["query:silent"] == 2  # two queries
    assert counts["train:silent"] == 3 and summary["home_trainings"] == 3 * (HOMES - 4)
    crash_lines = [r for r in caplog.records if "train:crashed" in r.getMessage()]
    assert len(crash_lines) == 2  # the first crash, and the count at the end
    assert "ClientApp crashed" in summary["home_failures"]["train:crashed"]["first"]
    logged = (tmp_path / "home_failures.log").read_text().splitlines()
    assert len(logged) == sum(counts.values())
    assert loop.state.rows[-1]["home_failures"] == "train:crashed=9;train:silent=3"  # the metrics, as of that update
