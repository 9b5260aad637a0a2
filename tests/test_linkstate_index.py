"""The node index of Flower's in-memory LinkState answers as Flower's own scan does (server/linkstate_index.py)."""

from __future__ import annotations

import secrets
import threading
import uuid
from queue import Queue

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID, SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager

from server.linkstate_index import FLOWER_GET_MESSAGE_INS, index_messages_by_node, sweep_nodes_with_messages

RUN_ID = 7
TASK_ID = 3


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    for name, value in (("_run_id", RUN_ID), ("_node_id", SUPERLINK_NODE_ID), ("_task_id", TASK_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)


def new_state(nodes: int):
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()).state()
    run = Run.create_empty(run_id=RUN_ID)  # registered as run_simulation does
    run.federation_id = NOOP_FEDERATION_ID
    run.primary_task_id = TASK_ID
    state.run_ids[RUN_ID] = RunRecord(run=run)
    state.task_store[TASK_ID] = Task(task_id=TASK_ID, run_id=RUN_ID)
    ids = []
    for _ in range(nodes):
        node = state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), heartbeat_interval=1e9)
        state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=1e9)
        ids.append(node)
    return state, ids


def test_the_index_returns_what_flowers_scan_returns_sweep_after_sweep():
    index_messages_by_node()
    rng = np.random.default_rng(0)
    flower, nodes = new_state(12)
    indexed, indexed_nodes = new_state(12)
    twin = dict(zip(nodes, indexed_nodes))
    sent = []
    for step in range(60):  # several messages per node, some expiring at once, in a random order
        node = nodes[int(rng.integers(len(nodes)))]
        message_id = str(uuid.uuid4())
        for state, dst in ((flower, node), (indexed, twin[node])):
            message = Message(RecordDict(), dst, "query", ttl=3600.0)
            message.metadata.__dict__["_message_id"] = message_id
            assert state.store_message_ins(message) == message_id
            if step % 7 == 0:  # expired since: Flower's checks drop it
                message.metadata.created_at -= 7200.0
        sent.append(message_id)
    gone = set(rng.choice(sent, size=10, replace=False).tolist())  # e.g. replied and pulled
    flower.delete_messages(gone)
    indexed.delete_messages(gone)
    for sweep in range(8):
        for node in [nodes[i] for i in rng.permutation(len(nodes))]:
            limit = int(rng.choice([1, 2])) if sweep % 2 else 1
            expected = [m.metadata.message_id for m in FLOWER_GET_MESSAGE_INS(flower, node, limit)]
            got = [m.metadata.message_id for m in indexed.get_message_ins(twin[node], limit)]
            assert got == expected
    assert all(m.metadata.delivered_at for m in indexed.message_ins_store.values())
    assert not indexed.get_message_ins(indexed_nodes[0], 1)


def test_the_engine_sweep_delivers_every_message_of_the_nodes_it_serves_once_in_order():
    index_messages_by_node()
    state, nodes = new_state(6)
    served = dict.fromkeys(nodes[:5], 0)  # the last node is not the engine's
    expected: dict[int, list[str]] = {node: [] for node in nodes}
    for step in range(20):
        node = nodes[step % len(nodes)]
        message = Message(RecordDict(), node, "query", ttl=3600.0)
        message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        state.store_message_ins(message)
        expected[node].append(message.metadata.message_id)
    queue: Queue = Queue()
    stop = threading.Event()
    sweeping = threading.Thread(target=sweep_nodes_with_messages, args=(state, queue, served, stop), daemon=True)
    sweeping.start()
    got: dict[int, list[str]] = {node: [] for node in nodes}
    wanted = sum(len(expected[node]) for node in served)
    try:
        for _ in range(wanted):
            message = queue.get(timeout=60)
            got[message.metadata.dst_node_id].append(message.metadata.message_id)
    finally:
        stop.set()
        sweeping.join(timeout=60)
    assert not sweeping.is_alive() and queue.empty()
    assert {node: got[node] for node in served} == {node: expected[node] for node in served}
    assert got[nodes[5]] == [] and len(state.get_message_ins(nodes[5], None)) == len(expected[nodes[5]])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("flower_b")  # a Ray instance of its own (tests/test_simulation.py: the groups)
def test_on_a_flower_with_other_internals_nothing_is_patched_and_the_simulation_runs_on_flowers_code(tmp_path):
    """Simulated: the fingerprints of the tested releases do not match this Flower's, so the index refuses to
    patch, says so in one line, and a simulation (the engine in the ServerApp's process, as in flwr-simulation)
    still completes on Flower's own sweep."""
    import subprocess
    import sys
    from pathlib import Path

    script = "\n".join([
        "import sys",
        "from pathlib import Path",
        "import server.linkstate_index as index",
        "index.KNOWN_FLOWER_INTERNALS = {'0.0.0': 'the fingerprint of a Flower with other internals'}",
        "from flwr.server.superlink.fleet.vce import vce_api",
        "flowers_sweep = vce_api.add_messages_to_queue",
        "from flwr.simulation import run_simulation",  # the engine in this process, as flwr-simulation runs it
        "from client.client_app import app as client_app",
        "from server.config import experiment",
        "from server.server_app import make_server_app",
        "exp = experiment({'homes': 12, 'dataset': {'name': 'digits'}, 'latency': {'kind': 'paper'},",
        "                  'train': {'epochs': 1}, 'loop': {'max_updates': 2}, 'server': {'eval_samples': None}})",
        f"run_simulation(server_app=make_server_app(exp, Path({str(tmp_path)!r}), progress=False),",
        "               client_app=client_app, num_supernodes=12, backend_config=exp.simulation.backend_config())",
        "from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState",
        "assert InMemoryLinkState.get_message_ins is index.FLOWER_GET_MESSAGE_INS",
        "assert vce_api.add_messages_to_queue is flowers_sweep",
        "print('flower-own-code')",
    ])
    process = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent,
                             capture_output=True, text=True, timeout=280)
    output = process.stdout + process.stderr
    assert process.returncode == 0, output[-3000:]
    assert "flower-own-code" in output
    [line] = [line for line in output.splitlines() if "is not the one server/linkstate_index.py" in line]
    assert "Flower's own message sweep runs" in line
    import json

    assert json.loads((tmp_path / "summary.json").read_text())["updates"] == 2
